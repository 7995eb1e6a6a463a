"""Nominal per-direction GPU-to-GPU link rates, to state measured bus bandwidth as a fraction of them.

Figures (GB = 1e9 B per second, one direction): NVLink4 on H100/H200 is 18 links x 25 GB/s =
450 GB/s; H800 8 links = 200 GB/s; NVLink3 on A100 12 x 25 = 300 GB/s; NVLink5 on B200/B300
18 x 50 = 900 GB/s; PCIe Gen4 x16 ~32 GB/s, Gen5 x16 ~64 GB/s (theoretical). Sources: NVIDIA's
NVLink pages and the H100/H200/A100/B200 data sheets, collected in the lab's FACTS.md section 1.
Published nccl-tests single-node all-reduce bus bandwidth for comparison: 8x A100 ~230 GB/s,
8x H100 ~370 GB/s ring (~480 GB/s with NVLS), from NVIDIA's nccl-tests results.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NominalLink:
    name: str
    GBps_per_direction: float  # GB = 1e9 B
    source: str


_NVLINK = (
    ("H800", NominalLink("NVLink4 x8 (H800)", 200.0, "NVIDIA H800: 8 NVLink4 links x 25 GB/s per direction")),
    ("H100", NominalLink("NVLink4 x18", 450.0, "NVIDIA H100/H200: 18 NVLink4 links x 25 GB/s per direction")),
    ("H200", NominalLink("NVLink4 x18", 450.0, "NVIDIA H100/H200: 18 NVLink4 links x 25 GB/s per direction")),
    ("GH200", NominalLink("NVLink4 x18", 450.0, "NVIDIA GH200: 18 NVLink4 links x 25 GB/s per direction")),
    ("A100", NominalLink("NVLink3 x12", 300.0, "NVIDIA A100 SXM: 12 NVLink3 links x 25 GB/s per direction")),
    ("B200", NominalLink("NVLink5 x18", 900.0, "NVIDIA B200: 18 NVLink5 links x 50 GB/s per direction")),
    ("B300", NominalLink("NVLink5 x18", 900.0, "NVIDIA B300: 18 NVLink5 links x 50 GB/s per direction")),
)

PUBLISHED_ALLREDUCE_BUSBW_GBps = {
    "8x A100 (nccl-tests, ring)": 230.0,
    "8x H100 (nccl-tests, ring)": 370.0,
    "8x H100 (nccl-tests, NVLS)": 480.0,
}


def nominal_nvlink(gpu_name: str | None) -> NominalLink | None:
    """The NVLink rate of an SXM part named ``gpu_name`` (None when unknown or PCIe-only)."""
    if not gpu_name:
        return None
    up = gpu_name.upper()
    if "PCIE" in up:
        return None
    for key, link in _NVLINK:
        if key in up:
            return link
    return None
