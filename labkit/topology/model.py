"""The server's model: GPUs, NICs and each GPU pair's link label."""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.core.errors import LabkitError
from labkit.topology.links import FALLBACK, FALLBACK_ASSUMES, Generation, Link, generation_for, make_link


MAX_GPUS = 512  # GPUs in one topology; beyond, a matrix of link labels is not one server's


@dataclass
class GPU:
    index: int
    name: str | None = None
    memory_bytes: int | None = None
    bus_id: str | None = None
    numa: int | None = None           # NUMA node of the GPU's CPU side (NUMA Affinity column)
    cpu_affinity: str | None = None   # CPU list as nvidia-smi prints it, e.g. "0-31,64-95"
    gpu_numa_id: int | None = None    # the GPU's own memory NUMA id (Grace systems), usually None


@dataclass
class NIC:
    name: str                     # row name: "NIC0", "mlx5_2"
    device: str | None = None     # from the NIC legend: "mlx5_0", "mlx5_bond_0"
    to_gpus: list[str] = field(default_factory=list)   # label to each GPU, in GPU order


@dataclass
class Topology:
    """A server's GPU interconnect. ``matrix[i][j]`` is the label nvidia-smi prints for GPU i -> j."""

    source: str                       # "live (NVML)", "file: <path>", "sample: <name>"
    gpus: list[GPU]
    matrix: list[list[str]]
    nics: list[NIC] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    origin: str | None = None         # the '# source:' line of a saved file
    gpu_model: str | None = None      # GPU name used to pick the bandwidth table
    generation: Generation = FALLBACK
    p2p: list[list[bool | None]] | None = None   # NVML P2P read status, live only
    raw_text: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if n == 0:
            raise LabkitError(f"{self.source}: no GPUs in the topology")
        if n > MAX_GPUS:
            raise LabkitError(f"{self.source}: {n} GPUs, more than labkit reads in one topology ({MAX_GPUS})")
        if len(self.matrix) != n or any(len(r) != n for r in self.matrix):
            raise LabkitError(f"{self.source}: link matrix is not {n} x {n}")
        self._links = [[make_link(lab, self.generation) for lab in row] for row in self.matrix]

    @property
    def n(self) -> int:
        return len(self.gpus)

    def link(self, a: int, b: int) -> Link:
        self._check(a)
        self._check(b)
        return self._links[a][b]

    def _check(self, i: int) -> None:
        if not isinstance(i, int) or not 0 <= i < self.n:
            raise LabkitError(f"{self.source}: no GPU {i!r} (this topology has GPUs 0..{self.n - 1})")

    def numa_nodes(self) -> list[int]:
        return sorted({g.numa for g in self.gpus if g.numa is not None})

    def describe(self) -> str:
        """One line: "8 x A100 (sample: ...): NV12 pairs, ..."."""
        kinds: dict[str, int] = {}
        for i in range(self.n):
            for j in range(i + 1, self.n):
                lab = self.matrix[i][j]
                kinds[lab] = kinds.get(lab, 0) + 1
        mix = ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        model = self.gpu_model or "unknown GPU"
        numa = self.numa_nodes()
        return (f"{self.n} x {model} ({self.source}); pair links: {mix or 'none (1 GPU)'}; "
                f"NUMA nodes: {numa if numa else 'unknown'}; {len(self.nics)} NIC(s)")


def build(source: str, gpus: list[GPU], matrix: list[list[str]], *, nics: list[NIC] | None = None,
          warnings: list[str] | None = None, origin: str | None = None, gpu_model: str | None = None,
          p2p=None, raw_text: str | None = None) -> Topology:
    """Make a Topology, picking the bandwidth table from the GPU name (a warning when unknown)."""
    warnings = list(warnings or [])
    name = gpu_model or next((g.name for g in gpus if g.name), None)
    gen = generation_for(name)
    if gen is None:
        gen = FALLBACK
        what = f"GPU {name!r} is not in the bandwidth table" if name else "the GPU model is not known"
        warnings.append(f"{what}: nominal bandwidths assume {FALLBACK_ASSUMES} "
                        f"(pass gpu_name= / --gpu-name to choose)")
    return Topology(source=source, gpus=gpus, matrix=matrix, nics=nics or [], warnings=warnings, origin=origin,
                    gpu_model=name, generation=gen, p2p=p2p, raw_text=raw_text)
