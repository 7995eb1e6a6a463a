"""Links of a GPU group and the estimated time of a collective over them (model, not measurement).

* ``weakest_link``: the slowest pair inside a group (lowest nominal bandwidth, then farthest path).
* ``ring_bottleneck``: the slowest link of the best ring through the group (NCCL builds rings; on a
  DGX-1 hybrid cube mesh the 8 GPUs have SYS pairs, but a ring over NVLink alone exists).
* ``collective_time``: alpha-beta ring estimate, ``steps * alpha + bytes * busbw_factor / bandwidth``
  (``labkit.core.collectives``: nccl-tests' bus-bandwidth factors), over the ring's bottleneck link.
  alpha per step is NCCL's own ring/Simple hardware latency (``labkit.core.interconnect.NCCL_RING_STEP_S``:
  NCCL's src/graph/tuning.cc, ``hwLat``), one figure over NVLink, one over PCIe.

Simplifications, stated: one ring at the bottleneck's nominal per-direction bandwidth (real NCCL runs
several channels and may use trees or NVLS); PCIe sharing behind one switch is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Sequence

from labkit.core.collectives import alpha_beta_time, bus_factor
from labkit.core.errors import LabkitError
from labkit.core.interconnect import NCCL_RING_STEP_S
from labkit.topology.links import NVLINK, Link
from labkit.topology.model import Topology

# numpy is imported where a group is searched: `labkit --help` imports this module.

ALPHA_NVLINK_S = NCCL_RING_STEP_S["NVLINK"]
ALPHA_PCIE_S = NCCL_RING_STEP_S["PCIE"]


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


HAM_EXACT_MAX = 10          # groups up to this size: the exact bitmask search (2^n states)
HAM_SEARCH_STEPS = 2_000   # larger groups: a depth-first search with this many steps per threshold


def _has_ham_cycle(n: int, ok: list[list[bool]]) -> bool:
    """Is there a Hamiltonian cycle through all n nodes using only edges with ok[i][j]?

    Up to ``HAM_EXACT_MAX`` nodes an exact bitmask DP. Beyond, the necessary conditions (every node
    has two usable edges, the graph is connected), then a depth-first search that extends the path
    through the node with the fewest onward edges first (Warnsdorff's rule) for at most
    ``HAM_SEARCH_STEPS`` steps; a search that runs out answers False, so a ring it reports is real
    while a better one may exist (on server topologies, whose good links form cliques, it does not
    run out)."""
    if n <= 2:
        return n < 2 or ok[0][1]
    adj = [[w for w in range(n) if ok[v][w]] for v in range(n)]
    if any(len(a) < 2 for a in adj) or not _connected(adj):
        return False
    if n > HAM_EXACT_MAX:
        return _ham_cycle_search(n, ok, adj)
    adjm = [sum(1 << w for w in a) for a in adj]   # neighbours as bit masks
    full = (1 << n) - 1
    reach = [0] * (1 << n)   # reach[mask] = bit set of end nodes of paths from node 0 covering mask
    reach[1] = 1
    for mask in range(1, 1 << n, 2):
        ends = reach[mask]
        if not ends:
            continue
        onward = 0
        while ends:
            low = ends & -ends
            onward |= adjm[low.bit_length() - 1]
            ends ^= low
        onward &= ~mask
        while onward:
            low = onward & -onward
            reach[mask | low] |= low
            onward ^= low
    ends = reach[full]
    return any(ends >> v & 1 and ok[v][0] for v in range(1, n))


def _connected(adj: list[list[int]]) -> bool:
    seen, todo = {0}, [0]
    while todo:
        for w in adj[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return len(seen) == len(adj)


def _ham_cycle_search(n: int, ok: list[list[bool]], adj: list[list[int]]) -> bool:
    on_path = [False] * n
    on_path[0] = True
    path = [0]
    steps = 0

    def onward(v: int) -> int:
        return sum(not on_path[x] for x in adj[v])

    # iterative DFS: a stack of candidate lists, each sorted by fewest onward edges
    stack = [sorted(adj[0], key=onward)]
    while stack:
        steps += 1
        if steps > HAM_SEARCH_STEPS:
            return False
        cands = stack[-1]
        if len(path) == n:
            if ok[path[-1]][0]:
                return True
            stack.pop()
            on_path[path.pop()] = False
            continue
        while cands and on_path[cands[0]]:
            cands.pop(0)
        if not cands:
            stack.pop()
            if len(path) > 1:
                on_path[path.pop()] = False
            continue
        w = cands.pop(0)
        on_path[w] = True
        path.append(w)
        stack.append(sorted((x for x in adj[w] if not on_path[x]), key=onward))
    return False


def score_ranks(topo: Topology):
    """(distinct link scores worst first, N x N int matrix of each pair's index into them), cached on
    the topology: group questions become integer comparisons."""
    cached = topo.__dict__.get("_score_ranks")
    if cached is None:
        import numpy as np

        L = topo._links
        levels = sorted({_score(lk) for row in L for lk in row})
        index = {v: k for k, v in enumerate(levels)}
        cached = (levels, np.array([[index[_score(lk)] for lk in row] for row in L], dtype=np.int64))
        topo.__dict__["_score_ranks"] = cached
    return cached


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
    import numpy as np

    levels, rank = score_ranks(topo)
    sub = rank[np.ix_(g, g)].copy()       # bigger is better; the diagonal is no link
    np.fill_diagonal(sub, -1)
    # A ring uses two links of every GPU: no ring is better than the worst GPU's second-best link.
    bound = int(np.sort(sub, axis=1)[:, -2].min())
    for thr in sorted({int(v) for v in np.unique(sub) if 0 <= v <= bound}, reverse=True):
        ok = sub >= thr
        # Dirac: every GPU linked to half the group or more at this threshold -> a ring exists
        if int(ok.sum(axis=1).min()) * 2 >= n or _has_ham_cycle(n, ok.tolist()):
            i, j = next((i, j) for i in range(n) for j in range(i + 1, n) if sub[i, j] == thr)
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
