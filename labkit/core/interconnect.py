"""Nominal GPU interconnect figures, each with its public source: the one place they are written.

Bandwidths are per direction in bytes/s, decimal (GB = 1e9 B), as vendors quote them (vendors'
"900 GB/s" for NVLink4 is both directions together). The topology chapter (link labels), the comm
chapter (measured bus bandwidth as a fraction of the link), the memory planner and ``labkit advise``
(clusters without a topology) all read them from here. These are peaks on paper: measured figures
(``labkit.topology.measure``, ``labkit.comm``) are lower.
"""

from __future__ import annotations

from dataclasses import dataclass

NVLINK_PAGE = "https://www.nvidia.com/en-us/data-center/nvlink/"
HOPPER_WHITEPAPER = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"


@dataclass(frozen=True)
class NVLinkGeneration:
    """One NVLink generation: what one link carries per direction, and the document that states it."""

    name: str
    per_link_Bps: float
    document: str   # what the document says, in its own terms
    url: str

    @property
    def source(self) -> str:
        return f"{self.document} ({self.url})"


# Per link, per direction. NVLink2-4 links carry 50 GB/s both ways, NVLink5 100 GB/s; GA102's four
# links 112.5 GB/s both ways together.
NVLINK_GENERATIONS: dict[int | str, NVLinkGeneration] = {
    1: NVLinkGeneration("NVLink1", 20e9, "NVIDIA Tesla P100 whitepaper: 4 NVLinks, 160 GB/s both ways",
                        "https://images.nvidia.com/content/pdf/tesla/whitepaper/pascal-architecture-whitepaper.pdf"),
    2: NVLinkGeneration("NVLink2", 25e9, "NVIDIA Tesla V100 whitepaper: 6 NVLinks, 300 GB/s both ways",
                        "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"),
    3: NVLinkGeneration("NVLink3", 25e9, "NVIDIA A100 whitepaper: 12 NVLinks, 600 GB/s both ways",
                        "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"),
    "GA102": NVLinkGeneration("NVLink3 (GA102)", 112.5e9 / 2 / 4,
                              "NVIDIA GA102 whitepaper: 4 NVLinks, 112.5 GB/s both ways",
                              "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"),
    4: NVLinkGeneration("NVLink4", 25e9, "NVIDIA H100 whitepaper: 18 NVLink4 links, 900 GB/s both ways",
                        HOPPER_WHITEPAPER),
    5: NVLinkGeneration("NVLink5", 50e9, "NVIDIA NVLink: 18 links x 100 GB/s both ways per Blackwell GPU",
                        NVLINK_PAGE),
}


@dataclass(frozen=True)
class NVLinkPart:
    """An SXM part's NVLinks: how many, of which generation, and the document that states it."""

    links: int
    generation: int
    document: str
    url: str = ""

    @property
    def Bps(self) -> float:
        """All its links together, per direction (bytes/s)."""
        return self.links * NVLINK_GENERATIONS[self.generation].per_link_Bps

    @property
    def source(self) -> str:
        return f"{self.document} ({self.url})" if self.url else self.document


# Parts by the name NVML reports (first match wins: keep specific names before general ones).
NVLINK_PARTS: dict[str, NVLinkPart] = {
    "H800": NVLinkPart(8, 4, "NVIDIA H800 SXM data sheet: NVLink 400 GB/s both ways, i.e. 8 NVLink4 links"),
    "GH200": NVLinkPart(18, 4, "NVIDIA NVLink: Hopper GPUs, 18 NVLink4 links, 900 GB/s both ways", NVLINK_PAGE),
    "H100": NVLinkPart(18, 4, NVLINK_GENERATIONS[4].document, HOPPER_WHITEPAPER),
    "H200": NVLinkPart(18, 4, "NVIDIA H200: NVLink 900 GB/s both ways (the H100's 18 NVLink4 links)", H200_PAGE),
    "A100": NVLinkPart(12, 3, NVLINK_GENERATIONS[3].document, NVLINK_GENERATIONS[3].url),
    "B200": NVLinkPart(18, 5, NVLINK_GENERATIONS[5].document, NVLINK_PAGE),
    "B300": NVLinkPart(18, 5, NVLINK_GENERATIONS[5].document, NVLINK_PAGE),
}

# An H100/H200 node: every GPU on the NVSwitches with all 18 NVLink4 links (450 GB/s per direction).
NVLINK4_NODE_Bps = NVLINK_PARTS["H200"].Bps
NVLINK4_NODE_SOURCE = NVLINK_PARTS["H200"].source

# PCIe x16 per direction: lanes x GT/s x 128/130 (encoding) / 8 bits. Source: the PCI-SIG PCI Express base
# specifications 3.0, 4.0 and 5.0 (8, 16 and 32 GT/s per lane, 128b/130b encoding), https://pcisig.com/specifications
PCIE_X16_Bps: dict[int, float] = {3: 16 * 8e9 * 128 / 130 / 8, 4: 16 * 16e9 * 128 / 130 / 8,
                                  5: 16 * 32e9 * 128 / 130 / 8}

# NCCL's own per-step latency of a ring with the Simple protocol, over NVLink and over PCIe. Source: NCCL
# src/graph/tuning.cc, hwLat[NVLINK|PCI][Ring][Simple] in microseconds,
# https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc
NCCL_RING_STEP_S = {"NVLINK": 3.4e-6, "PCIE": 5.7e-6}

# Between nodes: one 400 Gb/s NIC per GPU (InfiniBand NDR / 400GbE), 400e9 / 8 bytes/s per direction.
# Its per-step latency is an assumption of this lab (a few microseconds), not a vendor figure.
NIC_400G_Bps = 400e9 / 8
NIC_STEP_S = 5e-6
NIC_SOURCE = (f"a 400 Gb/s NIC per GPU (NDR InfiniBand / 400GbE: {NIC_400G_Bps / 1e9:g} GB/s per direction); "
              f"{NIC_STEP_S * 1e6:g} us per step assumed")
