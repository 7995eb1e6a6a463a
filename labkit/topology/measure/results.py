"""What a link measurement produces: one dataclass per result, and their readers from JSON.

The JSON is what :func:`labkit.core.serialize.to_jsonable` writes (a recording under
``data/measurements/topology/`` or the NUMA child's result file); the readers are its inverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.topology.p2ptable import P2PTable


@dataclass
class Point:
    size_bytes: int
    median_s: float
    bytes_per_s: float           # size / median time
    times_s: list[float]


@dataclass
class CopyResult:
    what: str                    # "device copy", "host->device", "device->host"
    gpu: int
    memory: str                  # "device", "pinned", "pageable"
    points: list[Point]
    numa_node: int | None = None       # the NUMA node the process and host buffer were bound to
    gpu_numa_node: int | None = None   # the GPU's own NUMA node
    note: str = ""

    @property
    def peak_Bps(self) -> float:
        """The best size's bandwidth."""
        return max(p.bytes_per_s for p in self.points)

    @property
    def largest(self) -> Point:
        """The largest size's point: the sustained rate (a cache or staging buffer can favour mid sizes)."""
        return max(self.points, key=lambda p: p.size_bytes)


@dataclass
class Skipped:
    part: str
    reason: str


@dataclass
class LinkMeasurements:
    gpus: list[str]
    device_copy: list[CopyResult] = field(default_factory=list)
    host: list[CopyResult] = field(default_factory=list)
    numa: list[CopyResult] = field(default_factory=list)
    p2p: P2PTable | None = None
    skipped: list[Skipped] = field(default_factory=list)
    method: str = ("CUDA events on the copying stream, warm-up then median of repeats; bandwidth = bytes / median time "
                   "(device copy also as read+write = 2 x bytes); P2P via cudaMemcpyPeerAsync with peer access off/on")


def copy_result_from_json(d: dict[str, Any]) -> CopyResult:
    d = dict(d)
    pts = [Point(**p) for p in d.pop("points")]
    return CopyResult(points=pts, **d)


def links_from_json(d: dict[str, Any]) -> LinkMeasurements:
    return LinkMeasurements(
        gpus=d["gpus"], device_copy=[copy_result_from_json(x) for x in d.get("device_copy", [])],
        host=[copy_result_from_json(x) for x in d.get("host", [])], numa=[copy_result_from_json(x) for x in d.get("numa", [])],
        p2p=P2PTable(**d["p2p"]) if d.get("p2p") else None, skipped=[Skipped(**s) for s in d.get("skipped", [])],
        method=d.get("method", ""))
