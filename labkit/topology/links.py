"""Link labels as ``nvidia-smi topo -m`` prints them, and their nominal per-direction bandwidth.

Labels (driver 470+ legend): ``X`` self; ``NV#`` a bonded set of # NVLinks; ``PIX`` at most one
PCIe bridge; ``PXB`` several PCIe bridges, no host bridge; ``PHB`` through a PCIe host bridge (the
CPU); ``NODE`` between host bridges inside one NUMA node; ``SYS`` across the inter-socket link
(QPI/UPI). Drivers of 2016 (367.x) print ``SOC`` for what is now ``SYS`` and have no ``NODE``.

Nominal bandwidth is per direction, in bytes/s (decimal GB = 1e9, as vendors quote it), from
:mod:`labkit.core.interconnect` (each figure with its source):

* NVLink, per link per direction, by generation; a label ``NV12`` means 12 links bonded, so 12 x the
  per-link figure.
* PCIe x16 per direction. ``PIX``..``SYS`` all move over the GPU's own PCIe link, so its nominal
  figure is that link's; what differs is the path (bridges, host bridge, inter-socket link) and
  therefore latency and contention, not the nominal peak. The ``distance`` rank keeps that order
  for placement.

These are peaks on paper. Measured figures (``labkit.topology.measure``) are lower: that is the point
of the lab's measured-beside-nominal tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.core.errors import LabkitError
from labkit.core.interconnect import NVLINK_GENERATIONS, PCIE_X16_Bps

# Link kinds, from closest to farthest.
SELF = "X"
NVLINK = "NVLINK"
PIX = "PIX"
PXB = "PXB"
PHB = "PHB"
NODE = "NODE"
SYS = "SYS"
KINDS = (SELF, NVLINK, PIX, PXB, PHB, NODE, SYS)
PCIE_KINDS = (PIX, PXB, PHB, NODE, SYS)
DISTANCE = {k: i for i, k in enumerate(KINDS)}

LEGEND = {
    SELF: "self",
    NVLINK: "a bonded set of NVLinks",
    PIX: "at most one PCIe bridge",
    PXB: "several PCIe bridges, no host bridge",
    PHB: "through a PCIe host bridge (the CPU)",
    NODE: "between PCIe host bridges inside one NUMA node",
    SYS: "across the inter-socket link (QPI/UPI) between NUMA nodes",
}

_NV = re.compile(r"^NV([0-9]{1,6})$")

# Per-link, per-direction NVLink bandwidth (bytes/s) by NVLink generation, and PCIe x16 per direction.
NVLINK_PER_LINK_BPS = {g: v.per_link_Bps for g, v in NVLINK_GENERATIONS.items()}
PCIE_X16_BPS = PCIE_X16_Bps


def pcie_bps(gen: int, width: int = 16) -> float:
    """Nominal per-direction PCIe bandwidth in bytes/s for a link generation and lane count."""
    if gen not in PCIE_X16_BPS:
        raise LabkitError(f"PCIe generation {gen} is not in the table (known: {sorted(PCIE_X16_BPS)})")
    return PCIE_X16_BPS[gen] * width / 16


@dataclass(frozen=True)
class Generation:
    """What the bandwidth of a GPU's links depends on: its NVLink generation and PCIe generation."""

    family: str                 # e.g. "Hopper (H100/H200)"
    nvlink: int | str | None    # NVLink generation (1..5, "GA102") or None: no NVLink
    pcie_gen: int
    pcie_width: int = 16
    source: str = ""

    @property
    def nvlink_per_link_Bps(self) -> float | None:
        return None if self.nvlink is None else NVLINK_PER_LINK_BPS[self.nvlink]

    @property
    def pcie_Bps(self) -> float:
        return pcie_bps(self.pcie_gen, self.pcie_width)


def _source(nvlink: int | str, pcie_gen: int) -> str:
    g = NVLINK_GENERATIONS[nvlink]
    return f"{g.name} {g.per_link_Bps / 1e9:g} GB/s per link per direction: {g.document}; PCIe Gen{pcie_gen}"


# (pattern on the GPU name, generation). First match wins: keep specific names before general ones.
_GENERATIONS: list[tuple[str, Generation]] = [
    (r"\bGB?[23]00\b|\bB[23]00\b", Generation("Blackwell (B200/B300)", 5, 5,
                                            source=_source(5, 5))),
    (r"\bH100\b|\bH200\b|\bH800\b|\bGH200\b|\bH20\b", Generation("Hopper (H100/H200)", 4, 5,
                                                          source=_source(4, 5))),
    (r"\bA100\b|\bA800\b|\bA30\b", Generation("Ampere GA100 (A100/A30)", 3, 4,
                                              source=_source(3, 4))),
    (r"RTX 3090|RTX A6000|\bA40\b", Generation("Ampere GA102 (RTX 3090/A6000/A40)", "GA102", 4,
                                               source=_source("GA102", 4))),
    (r"\bV100\b", Generation("Volta (V100)", 2, 3, source=_source(2, 3))),
    (r"\bP100\b", Generation("Pascal (P100)", 1, 3, source=_source(1, 3))),
    (r"RTX 4090|RTX 6000 Ada|\bL40S?\b|\bL4\b|Ada Generation", Generation("Ada (RTX 4090/RTX 6000 Ada/L40)", None, 4,
                                                                        source="NVIDIA Ada: no NVLink; PCIe Gen4")),
    (r"\bK80\b|\bK40\b|Tesla K", Generation("Kepler (K80)", None, 3, source="NVIDIA Tesla K80: no NVLink; PCIe Gen3")),
]

# When the GPU is not known (a topology text carries no GPU names): stated as a warning, never silent.
FALLBACK_ASSUMES = f"NVLink {NVLINK_PER_LINK_BPS[3] / 1e9:g} GB/s per link and PCIe Gen4 x16"
FALLBACK = Generation(f"unknown GPU (assumed {FALLBACK_ASSUMES})", 3, 4,
                      source="fallback: GPU model unknown; " + _source(3, 4))


def generation_for(name: str | None) -> Generation | None:
    """The generation whose pattern matches a GPU name ("NVIDIA H200", "Tesla V100-SXM2-16GB")."""
    if not name:
        return None
    for pattern, gen in _GENERATIONS:
        if re.search(pattern, name, re.I):
            return gen
    return None


@dataclass(frozen=True)
class Link:
    """One GPU pair's connection."""

    label: str          # as nvidia-smi prints it: "X", "NV12", "PIX", ..., "SYS"
    kind: str           # one of KINDS
    nvlinks: int        # number of bonded NVLinks (0 unless kind is NVLINK)
    bandwidth_Bps: float  # nominal per-direction bandwidth in bytes/s (inf for X)
    distance: int       # 0 (X) .. 6 (SYS): order of closeness


MAX_NVLINKS = 64  # B200 has 18 NVLink 5 links; a bond label beyond 64 is not a real server


def parse_label(label: str) -> tuple[str, int]:
    """``"NV12"`` -> ``("NVLINK", 12)``; ``"PIX"`` -> ``("PIX", 0)``. Legacy ``SOC`` -> ``SYS``.

    Raises ``LabkitError`` for anything else (callers add the line number)."""
    lab = label.strip().upper()
    m = _NV.match(lab)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise LabkitError(f"link label {label!r}: an NVLink bond needs at least one link")
        if n > MAX_NVLINKS:
            raise LabkitError(f"link label {label!r}: {n} NVLinks between two GPUs, more than any GPU has "
                              f"(at most {MAX_NVLINKS} read)")
        return NVLINK, n
    if lab == "SOC":
        return SYS, 0
    if lab in (SELF, PIX, PXB, PHB, NODE, SYS):
        return lab, 0
    raise LabkitError(f"unknown link label {label!r} (expected X, NV#, PIX, PXB, PHB, NODE, SYS or legacy SOC)")


def make_link(label: str, gen: Generation) -> Link:
    kind, n = parse_label(label)
    if kind == SELF:
        bw = float("inf")
    elif kind == NVLINK:
        per = gen.nvlink_per_link_Bps
        # A GPU family without NVLink but an NV label: trust the label, use the NVLink3 figure.
        bw = n * (per if per is not None else NVLINK_PER_LINK_BPS[3])
    else:
        bw = gen.pcie_Bps
    label = "SYS" if kind == SYS else label.strip().upper()
    return Link(label=label, kind=kind, nvlinks=n, bandwidth_Bps=bw, distance=DISTANCE[kind])
