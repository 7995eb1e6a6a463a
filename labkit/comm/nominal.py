"""Nominal per-direction GPU-to-GPU link rates, to state measured bus bandwidth as a fraction of them.

The figures and their sources are :mod:`labkit.core.interconnect`'s (GB = 1e9 B per second, one
direction): an SXM part's NVLinks, all together.
Published nccl-tests single-node all-reduce bus bandwidth for comparison: 8x A100 ~230 GB/s,
8x H100 ~370 GB/s ring (~480 GB/s with NVLS), from NVIDIA's nccl-tests results.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.interconnect import NVLINK_GENERATIONS, NVLINK_PARTS


@dataclass(frozen=True)
class NominalLink:
    name: str
    GBps_per_direction: float  # GB = 1e9 B
    source: str


_NVLINK = tuple((key, NominalLink(f"{NVLINK_GENERATIONS[p.generation].name} x{p.links}", p.Bps / 1e9, p.source))
                for key, p in NVLINK_PARTS.items())

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
