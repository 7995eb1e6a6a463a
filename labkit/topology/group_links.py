"""Links of a GPU group and the estimated time of a collective over them (model, not measurement).

* ``weakest_link``: the slowest pair inside a group (lowest nominal bandwidth, then farthest path).
* ``ring_bottleneck``: the slowest link of the best ring through the group (NCCL builds rings; on a
  DGX-1 hybrid cube mesh the 8 GPUs have SYS pairs, but a ring over NVLink alone exists).
* ``collective_time``: alpha-beta ring estimate, ``steps * alpha + bytes * busbw_factor / bandwidth``
  (``labkit.core.collectives``: nccl-tests' bus-bandwidth factors), over the ring's bottleneck link.
  alpha per step is NCCL's own ring/Simple hardware latency (src/graph/tuning.cc, ``hwLat``):
  3.4 us over NVLink, 5.7 us over PCIe.

Simplifications, stated: one ring at the bottleneck's nominal per-direction bandwidth (real NCCL runs
several channels and may use trees or NVLS); PCIe sharing behind one switch is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Sequence

from labkit.core.collectives import alpha_beta_time, bus_factor
from labkit.core.errors import LabkitError
from labkit.topology.links import NVLINK, Link
from labkit.topology.model import Topology

# NCCL src/graph/tuning.cc hwLat[.][Ring][Simple], microseconds per ring step.
ALPHA_NVLINK_S = 3.4e-6
ALPHA_PCIE_S = 5.7e-6


@dataclass
class PairLink:
    a: int
    b: int
    link: Link

    @property
    def label(self) -> str:
        return self.link.label


@dataclass
class CollectiveEstimate:
    op: str
    nbytes: int
    gpus: list[int]
    bottleneck: PairLink | None     # the ring's slowest link (None for one GPU)
    bandwidth_Bps: float            # its nominal per-direction bandwidth
    alpha_s: float                  # latency per ring step
    time_s: float
    busbw_factor: float
    source: str = "model: alpha-beta ring over the nominal bandwidth of the slowest ring link"


def _score(link: Link) -> tuple[float, int]:
    """Bigger is better: bandwidth first, then closeness."""
    return (link.bandwidth_Bps, -link.distance)


def _group(topo: Topology, gpus: Sequence[int]) -> list[int]:
    g = list(gpus)
    if len(set(g)) != len(g):
        raise LabkitError(f"GPU group {g} lists a GPU twice")
    for i in g:
        topo._check(i)
    return g


def link(topo: Topology, a: int, b: int) -> Link:
    return topo.link(a, b)


def link_label(topo: Topology, a: int, b: int) -> str:
    return topo.link(a, b).label


def link_kind(topo: Topology, a: int, b: int) -> str:
    return topo.link(a, b).kind


def nominal_bandwidth(topo: Topology, a: int, b: int) -> float:
    """Nominal per-direction bandwidth GPU a -> GPU b in bytes/s (decimal: 1 GB/s = 1e9)."""
    return topo.link(a, b).bandwidth_Bps


def weakest_link(topo: Topology, gpus: Sequence[int]) -> PairLink | None:
    """The slowest pair in the group (None when the group has one GPU)."""
    g = _group(topo, gpus)
    best: PairLink | None = None
    L = topo._links
    for x in range(len(g)):
        for y in range(x + 1, len(g)):
            lk = L[g[x]][g[y]]
            if best is None or _score(lk) < _score(best.link):
                best = PairLink(g[x], g[y], lk)
    return best


def _has_ham_cycle(n: int, ok: list[list[bool]]) -> bool:
    """Is there a Hamiltonian cycle through all n nodes using only edges with ok[i][j]? (bitmask DP)"""
    if n <= 2:
        return n < 2 or ok[0][1]
    full = (1 << n) - 1
    reach = [0] * (1 << n)   # reach[mask] = bitset of end nodes of paths from node 0 covering mask
    reach[1] = 1
    for mask in range(1, 1 << n):
        if not mask & 1 or not reach[mask]:
            continue
        ends = reach[mask]
        for v in range(n):
            if ends >> v & 1:
                for w in range(n):
                    if not mask >> w & 1 and ok[v][w]:
                        reach[mask | 1 << w] |= 1 << w
    ends = reach[full]
    return any(ends >> v & 1 and ok[v][0] for v in range(1, n))


def ring_bottleneck(topo: Topology, gpus: Sequence[int]) -> PairLink | None:
    """The slowest link of the best ring through the group (max over rings of the min link)."""
    g = sorted(_group(topo, gpus))
    if len(g) < 2:
        return None
    key = tuple(g)
    cache = topo.__dict__.setdefault("_ring_cache", {})
    if key in cache:
        return cache[key]
    n = len(g)
    L = topo._links
    links = [[L[g[i]][g[j]] for j in range(n)] for i in range(n)]
    result = None
    if n <= 6:
        # Few rings: try each one (node 0 fixed, each direction once) and keep the best bottleneck.
        best = None
        for rest in permutations(range(1, n)):
            if n > 2 and rest[0] > rest[-1]:
                continue
            cyc = (0,) + rest
            edges = [(cyc[k], cyc[(k + 1) % n]) for k in range(n)]
            i, j = min(edges, key=lambda e: _score(links[e[0]][e[1]]))
            if best is None or _score(links[i][j]) > _score(links[best[0]][best[1]]):
                best = (i, j)
        i, j = sorted(best)
        result = PairLink(g[i], g[j], links[i][j])
        cache[key] = result
        return result
    cands = sorted({_score(links[i][j]) for i in range(n) for j in range(n) if i != j}, reverse=True)
    for thr in cands:
        ok = [[i != j and _score(links[i][j]) >= thr for j in range(n)] for i in range(n)]
        if _has_ham_cycle(n, ok):
            i, j = next((i, j) for i in range(n) for j in range(i + 1, n) if _score(links[i][j]) == thr)
            result = PairLink(g[i], g[j], links[i][j])
            break
    cache[key] = result
    return result


def alpha_for(lk: Link) -> float:
    return ALPHA_NVLINK_S if lk.kind == NVLINK else ALPHA_PCIE_S


def collective_time(topo: Topology, gpus: Sequence[int], op: str, nbytes: int) -> CollectiveEstimate:
    """Estimated time of collective ``op`` ("all_reduce", "all_gather", ...) of ``nbytes`` (nccl-tests'
    size convention) among ``gpus`` over this topology."""
    if not isinstance(nbytes, int) or nbytes < 0:
        raise LabkitError(f"collective size must be a non-negative number of bytes, got {nbytes!r}")
    g = _group(topo, gpus)
    factor = bus_factor(op, max(len(g), 1))
    if len(g) < 2:
        return CollectiveEstimate(op, nbytes, g, None, float("inf"), 0.0, 0.0, factor)
    bn = ring_bottleneck(topo, g)
    assert bn is not None
    alpha = alpha_for(bn.link)
    t = alpha_beta_time(op, nbytes, len(g), bn.link.bandwidth_Bps, alpha)
    return CollectiveEstimate(op, nbytes, g, bn, bn.link.bandwidth_Bps, alpha, t, factor)


def p2p_time(topo: Topology, a: int, b: int, nbytes: int) -> float:
    """Send ``nbytes`` from GPU a to GPU b (a pipeline-parallel activation): alpha + bytes / bandwidth."""
    if a == b:
        return 0.0
    lk = topo.link(a, b)
    return alpha_for(lk) + nbytes / lk.bandwidth_Bps
