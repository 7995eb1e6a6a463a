"""Map tensor-, pipeline- and data-parallel ranks onto a server's GPUs.

Rank order is Megatron-LM's default (tp fastest, then dp, then pp):
``rank = t + tp * (d + dp * s)`` for tp rank t, dp rank d, pipeline stage s. A placement is the GPU of
each rank; ``CUDA_VISIBLE_DEVICES`` in that order makes local rank r use that GPU.

Objective (lexicographic, smaller is better), every time in integer picoseconds so sums are exact:

1. TP: the slowest TP group's all-reduce of ``tp_bytes``, then the sum over groups, then the sum of
   each group's weakest-pair distance (PIX < PXB < PHB < NODE < SYS);
2. PP: the slowest neighbour send of ``pp_bytes``, then the sum, then the sum of distances;
3. DP: the slowest DP group's all-reduce of ``dp_bytes``, then the sum, then the sum of distances;
4. the number of TP and DP groups spanning NUMA nodes.

Ties go to the lexicographically smallest GPU order, so the naive order 0, 1, 2, ... is kept when
it is as good as any. Up to 8 GPUs the search is exhaustive (vectorised over all ordered choices of
GPUs). From 9 to ``MAX_GPUS`` GPUs it is structured: the GPUs' locality order (complete-linkage
clustering on link score, so NVLink domains, PCIe switches, NUMA nodes and sockets are contiguous
runs), the ranks laid along it in two nestings, then a bounded polish by swaps (stated in ``method``;
not proven optimal). Larger matrices are refused.

Fewer ranks than GPUs is allowed (a job may leave GPUs to another): the best subset is chosen and
the idle GPUs are named in ``unused_gpus`` and in the first suggestion, never silently.
Collective times come from :mod:`labkit.topology.group_links` (alpha-beta over nominal bandwidth: a
model, not a measurement).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import permutations

from labkit.core.errors import LabkitError
from labkit.core.units import GiB, MiB
from labkit.topology.group_links import PairLink, alpha_for, collective_time, score_ranks, weakest_link
from labkit.topology.links import NVLINK
from labkit.topology.model import Topology

# numpy is imported where a placement is searched: `labkit --help` imports this module.

EXHAUSTIVE_MAX_GPUS = 8
MAX_GPUS = 72               # beyond: refused (one NVLink domain of an NVL72 rack is the largest matrix in use)
POLISH_EVALUATIONS = 300   # mappings the structured search evaluates while polishing
DEFAULT_TP_BYTES = 64 * MiB   # one layer's activation all-reduce: seq 4096 x hidden 8192 x 2 B
DEFAULT_PP_BYTES = 64 * MiB   # one micro-batch's activation between stages
DEFAULT_DP_BYTES = 1 * GiB    # a gradient all-reduce (0.5 B params in bf16)


@dataclass
class Sizes:
    tp_bytes: int = DEFAULT_TP_BYTES
    pp_bytes: int = DEFAULT_PP_BYTES
    dp_bytes: int = DEFAULT_DP_BYTES


@dataclass
class Layout:
    """One rank-to-GPU mapping and what it costs (model)."""

    gpu_of_rank: list[int]
    tp_groups: list[list[int]]
    pp_groups: list[list[int]]
    dp_groups: list[list[int]]
    weakest_tp_link: str | None        # label of the weakest pair over all TP groups
    weakest_tp_pair: list[int] | None
    tp_allreduce_s: float              # slowest TP group, all-reduce of tp_bytes
    pp_send_s: float                   # slowest pipeline neighbour send of pp_bytes
    dp_allreduce_s: float              # slowest DP group, all-reduce of dp_bytes
    numa_spanning_groups: int
    cost: tuple[int, ...] = field(repr=False)


@dataclass
class RankAffinity:
    rank: int
    gpu: int
    numa: int | None
    cpus: str | None
    advice: str


@dataclass
class Comparison:
    naive: Layout
    placed: Layout
    tp_allreduce_speedup: float     # naive time / placed time (1.0: the same)
    dp_allreduce_speedup: float
    pp_send_speedup: float
    summary: str


@dataclass
class Placement:
    tp: int
    pp: int
    dp: int
    topology: str
    sizes: Sizes
    tp_groups: list[list[int]]
    pp_groups: list[list[int]]
    dp_groups: list[list[int]]
    rank_order: list[int]             # GPU of rank 0, 1, ...
    cuda_visible_devices: str
    weakest_tp_link: str | None
    affinity: list[RankAffinity]
    comparison: Comparison
    good: bool
    verdict: str
    suggestions: list[str]
    method: str
    unused_gpus: list[int] = field(default_factory=list)   # GPUs no rank runs on (tp x pp x dp < GPUs)
    source: str = "model: alpha-beta ring over nominal link bandwidth (labkit.topology.group_links)"


def _ps(t: float) -> int:
    return int(round(t * 1e12))


@lru_cache(maxsize=256)
def _rank_groups(tp: int, pp: int, dp: int):
    tpg, ppg, dpg = rank_groups(tp, pp, dp)
    return tuple(map(tuple, tpg)), tuple(map(tuple, ppg)), tuple(map(tuple, dpg))


def rank_groups(tp: int, pp: int, dp: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """(TP, PP, DP) groups as lists of ranks, Megatron order (tp fastest, then dp, then pp)."""
    r = lambda t, d, s: t + tp * (d + dp * s)  # noqa: E731
    tpg = [[r(t, d, s) for t in range(tp)] for s in range(pp) for d in range(dp)]
    ppg = [[r(t, d, s) for s in range(pp)] for d in range(dp) for t in range(tp)]
    dpg = [[r(t, d, s) for d in range(dp)] for s in range(pp) for t in range(tp)]
    return tpg, ppg, dpg


def _check(topo: Topology, tp: int, pp: int, dp: int) -> int:
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp)):
        if not isinstance(v, int) or v < 1:
            raise LabkitError(f"{name} must be a positive integer, got {v!r}")
    world = tp * pp * dp
    if world > topo.n:
        raise LabkitError(f"tp x pp x dp = {tp} x {pp} x {dp} = {world} ranks, but {topo.source} has {topo.n} GPUs")
    return world


class _Tables:
    """Per-group and per-pair costs, computed once per (topology, sizes, tp, dp)."""

    def __init__(self, topo: Topology, sizes: Sizes, tp: int, dp: int):
        self.topo, self.sizes = topo, sizes
        self._group: dict[tuple[str, tuple[int, ...]], tuple[int, int, int]] = {}
        n = topo.n
        L = topo._links
        self.pp_ps = [[0 if a == b else _ps(alpha_for(L[a][b]) + sizes.pp_bytes / L[a][b].bandwidth_Bps)
                       for b in range(n)] for a in range(n)]   # p2p_time, without its per-call checks
        self.dist = [[L[a][b].distance for b in range(n)] for a in range(n)]
        self.levels, self.rank = score_ranks(topo)

    def _weakest_distance(self, gpus: tuple[int, ...]) -> int:
        """The distance of the group's weakest pair (as :func:`weakest_link` picks it)."""
        if len(gpus) < 2:
            return 0
        import numpy as np

        sub = self.rank[np.ix_(gpus, gpus)].copy()
        np.fill_diagonal(sub, len(self.levels))
        return -self.levels[int(sub.min())][1]

    def group(self, kind: str, gpus) -> tuple[int, int, int]:
        """(time ps, weakest-pair distance, spans NUMA nodes 0/1) of a TP or DP group."""
        key = (kind, tuple(sorted(gpus)))
        v = self._group.get(key)
        if v is None:
            nbytes = self.sizes.tp_bytes if kind == "tp" else self.sizes.dp_bytes
            est = collective_time(self.topo, key[1], "all_reduce", nbytes)
            numas = {self.topo.gpus[g].numa for g in key[1]}
            v = (_ps(est.time_s), self._weakest_distance(key[1]), int(len(numas) > 1 and None not in numas))
            self._group[key] = v
        return v


def _cost(gpu_of_rank, tp: int, pp: int, dp: int, T: _Tables):
    """The objective tuple of one mapping, and its (TP, PP, DP) groups as GPU lists."""
    tpr, ppr, dpr = _rank_groups(tp, pp, dp)
    G = lambda ranks: [gpu_of_rank[r] for r in ranks]  # noqa: E731
    tpg, ppg, dpg = [G(x) for x in tpr], [G(x) for x in ppr], [G(x) for x in dpr]
    tpv = [T.group("tp", g) for g in tpg] if tp > 1 else [(0, 0, 0)]
    dpv = [T.group("dp", g) for g in dpg] if dp > 1 else [(0, 0, 0)]
    edges = [(g[s], g[s + 1]) for g in ppg for s in range(pp - 1)]
    ppv = [T.pp_ps[a][b] for a, b in edges] or [0]
    ppd = [T.dist[a][b] for a, b in edges] or [0]
    numa_span = sum(v[2] for v in tpv) + sum(v[2] for v in dpv)
    cost = (max(v[0] for v in tpv), sum(v[0] for v in tpv), sum(v[1] for v in tpv),
            max(ppv), sum(ppv), sum(ppd),
            max(v[0] for v in dpv), sum(v[0] for v in dpv), sum(v[1] for v in dpv),
            numa_span)
    return cost, (tpg, ppg, dpg)


def evaluate(topo: Topology, gpu_of_rank: list[int], tp: int, pp: int = 1, dp: int = 1,
             sizes: Sizes | None = None, _tables: _Tables | None = None) -> Layout:
    """Cost of one mapping (rank r runs on GPU ``gpu_of_rank[r]``)."""
    world = _check(topo, tp, pp, dp)
    sizes = sizes or Sizes()
    if len(gpu_of_rank) != world or len(set(gpu_of_rank)) != world:
        raise LabkitError(f"a mapping needs {world} distinct GPUs, got {gpu_of_rank}")
    for g in gpu_of_rank:
        topo._check(g)
    T = _tables or _Tables(topo, sizes, tp, dp)
    cost, (tpg, ppg, dpg) = _cost(gpu_of_rank, tp, pp, dp, T)
    numa_span = cost[-1]
    weakest: PairLink | None = None
    if tp > 1:
        for g in tpg:
            w = weakest_link(topo, g)
            if w and (weakest is None or (w.link.bandwidth_Bps, -w.link.distance) < (weakest.link.bandwidth_Bps, -weakest.link.distance)):
                weakest = w
    return Layout(gpu_of_rank=list(gpu_of_rank), tp_groups=tpg, pp_groups=ppg, dp_groups=dpg,
                  weakest_tp_link=weakest.label if weakest else None,
                  weakest_tp_pair=[weakest.a, weakest.b] if weakest else None,
                  tp_allreduce_s=cost[0] / 1e12, pp_send_s=cost[3] / 1e12, dp_allreduce_s=cost[6] / 1e12,
                  numa_spanning_groups=numa_span, cost=cost)


@lru_cache(maxsize=64)
def _perms(n: int, k: int):
    """All ordered choices of k of n GPUs, lexicographic, as an int64 numpy array (k columns)."""
    import numpy as np

    if k == 0:
        P = np.zeros((1, 0), dtype=np.int64)
    else:
        sub = _perms(n - 1, k - 1)   # choices among n-1 values, renumbered around the first one
        m = sub.shape[0]
        P = np.empty((n * m, k), dtype=np.int64)
        for f in range(n):
            P[f * m:(f + 1) * m, 0] = f
            P[f * m:(f + 1) * m, 1:] = sub + (sub >= f)
    P.setflags(write=False)
    return P


def _search_exhaustive(topo: Topology, tp: int, pp: int, dp: int, T: _Tables) -> list[int]:
    import numpy as np

    n, world = topo.n, tp * pp * dp
    P = _perms(n, world)
    tpr, ppr, dpr = rank_groups(tp, pp, dp)
    bits = np.left_shift(1, P)

    def group_keys(kind: str, groups: list[list[int]], size: int):
        if size == 1:
            z = np.zeros(P.shape[0], dtype=np.int64)
            return z, z, z, z
        table = np.zeros((3, 1 << n), dtype=np.int64)
        for mask in range(1 << n):
            if bin(mask).count("1") == size:
                table[:, mask] = T.group(kind, [g for g in range(n) if mask >> g & 1])
        vals = [table[:, bits[:, g].sum(axis=1)] for g in groups]        # each (3, M)
        t = np.stack([v[0] for v in vals])
        return t.max(axis=0), t.sum(axis=0), sum(v[1] for v in vals), sum(v[2] for v in vals)

    tmax, tsum, tdist, tspan = group_keys("tp", tpr, tp)
    dmax, dsum, ddist, dspan = group_keys("dp", dpr, dp)
    pp_ps, dist = np.array(T.pp_ps, dtype=np.int64), np.array(T.dist, dtype=np.int64)
    edges = [(g[s], g[s + 1]) for g in ppr for s in range(pp - 1)]
    if edges:
        pv = np.stack([pp_ps[P[:, a], P[:, b]] for a, b in edges])
        pd = np.stack([dist[P[:, a], P[:, b]] for a, b in edges])
        pmax, psum, pdist = pv.max(axis=0), pv.sum(axis=0), pd.sum(axis=0)
    else:
        pmax = psum = pdist = np.zeros(P.shape[0], dtype=np.int64)
    keys = [tmax, tsum, tdist, pmax, psum, pdist, dmax, dsum, ddist, tspan + dspan]
    # Lexicographic minimum: keep the rows tied on each key in turn; the first survivor is the
    # lexicographically smallest GPU order among the best.
    idx = np.arange(P.shape[0])
    for k in keys:
        kv = k[idx]
        idx = idx[kv == kv.min()]
    return [int(x) for x in P[int(idx[0])]]


def locality_order(topo: Topology, gpus: list[int] | None = None) -> list[int]:
    """The GPUs in an order that keeps close GPUs next to each other: complete-linkage clustering on
    the link score (bandwidth, then closeness, then the same NUMA node), so an NVLink domain, then a PCIe switch, a NUMA node,
    a socket, each form one contiguous run; of two merged clusters the tighter one comes first."""
    L, numa = topo._links, [g.numa for g in topo.gpus]
    score = lambda a, b: (L[a][b].bandwidth_Bps, -L[a][b].distance, numa[a] == numa[b])  # noqa: E731
    clusters = [([g], (float("inf"), 0, True)) for g in (range(topo.n) if gpus is None else gpus)]
    # linkage[i][j]: the worst pair between clusters i and j (complete linkage)
    link = {(i, j): score(clusters[i][0][0], clusters[j][0][0])
            for i in range(len(clusters)) for j in range(i + 1, len(clusters))}
    alive = set(range(len(clusters)))
    while len(alive) > 1:
        (i, j), lk = max(link.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))
        (gi, ti), (gj, tj) = clusters[i], clusters[j]
        members = gi + gj if (ti, -gi[0]) >= (tj, -gj[0]) else gj + gi
        clusters.append((members, lk))
        k = len(clusters) - 1
        alive -= {i, j}
        for m in alive:
            a, b = (min(m, i), max(m, i)), (min(m, j), max(m, j))
            link[(m, k)] = min(link[a], link[b])
        link = {key: v for key, v in link.items() if i not in key and j not in key}
        alive.add(k)
    return clusters[alive.pop()][0]


def _nestings(order: list[int], tp: int, pp: int, dp: int) -> list[list[int]]:
    """Rank-to-GPU mappings that lay the ranks along ``order``: tp fastest, then dp (Megatron's own
    rank order: a stage's DP replicas close), or tp fastest, then pp (pipeline neighbours close)."""
    world = tp * pp * dp
    s = order[:world]
    megatron = list(s)
    pp_next = [s[t + tp * (st + pp * d)] for st in range(pp) for d in range(dp) for t in range(tp)]
    return [megatron, pp_next]


def _search_structured(topo: Topology, tp: int, pp: int, dp: int, T: _Tables) -> list[int]:
    """Beyond ``EXHAUSTIVE_MAX_GPUS``: the best of the structured candidates (ranks laid along the
    locality order, two nestings, and the naive order), then improving swaps between ranks and moves
    onto unused GPUs, at most ``POLISH_EVALUATIONS`` evaluated mappings."""
    world = tp * pp * dp
    cands = _nestings(locality_order(topo), tp, pp, dp) + [list(range(world))]
    cur, cur_cost = None, None
    for c in cands:
        k = _cost(c, tp, pp, dp, T)[0]
        if cur_cost is None or k < cur_cost:
            cur, cur_cost = c, k
    budget = POLISH_EVALUATIONS
    improved = True
    while improved and budget > 0:
        improved = False
        unused = [g for g in range(topo.n) if g not in set(cur)]
        moves = [(i, j, None) for i in range(world) for j in range(i + 1, world)]
        moves += [(i, None, u) for i in range(world) for u in unused]
        for i, j, u in moves:
            if budget <= 0:
                break
            cand = list(cur)
            if u is None:
                cand[i], cand[j] = cand[j], cand[i]
            elif u in cand:
                continue
            else:
                cand[i] = u
            budget -= 1
            k = _cost(cand, tp, pp, dp, T)[0]
            if k < cur_cost:
                cur, cur_cost, improved = cand, k, True
    return cur


def nvlink_clique(topo: Topology, gpus: list[int] | None = None) -> list[int]:
    """The largest set of GPUs whose every pair is NVLink (exhaustive over subsets up to 16 GPUs,
    Bron-Kerbosch with pivoting beyond; both exact)."""
    g = list(range(topo.n)) if gpus is None else list(gpus)
    if len(g) > 16:
        return _max_clique(g, lambda a, b: topo.link(a, b).kind == NVLINK and topo.link(b, a).kind == NVLINK)
    best: list[int] = g[:1]
    for mask in range(1, 1 << len(g)):
        members = [g[i] for i in range(len(g)) if mask >> i & 1]
        if len(members) <= len(best):
            continue
        if all(topo.link(a, b).kind == NVLINK for x, a in enumerate(members) for b in members[x + 1:]):
            best = members
    return best


def _max_clique(nodes: list[int], edge) -> list[int]:
    """The largest clique (ties: the smallest sorted list), Bron-Kerbosch with pivoting."""
    nb = {v: {w for w in nodes if w != v and edge(v, w)} for v in nodes}
    best: list[int] = sorted(nodes)[:1]

    def grow(r: list[int], p: set[int], x: set[int]) -> None:
        nonlocal best
        if not p and not x:
            c = sorted(r)
            if (len(c), [-v for v in c]) > (len(best), [-v for v in best]):
                best = c
            return
        if len(r) + len(p) < len(best):
            return
        pivot = max(p | x, key=lambda v: len(nb[v] & p))
        for v in sorted(p - nb[pivot]):
            grow(r + [v], p & nb[v], x & nb[v])
            p = p - {v}
            x = x | {v}

    grow([], set(nodes), set())
    return best


def _affinity(topo: Topology, rank: int, gpu: int) -> RankAffinity:
    g = topo.gpus[gpu]
    if g.numa is not None:
        adv = f"numactl --cpunodebind={g.numa} --membind={g.numa}"
    elif g.cpu_affinity:
        adv = f"taskset -c {g.cpu_affinity}"
    else:
        adv = "unknown: the topology source gives no CPU/NUMA affinity for this GPU"
    return RankAffinity(rank=rank, gpu=gpu, numa=g.numa, cpus=g.cpu_affinity, advice=adv)


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return a / b


def place(topo: Topology, tp: int, pp: int = 1, dp: int = 1, *, sizes: Sizes | None = None) -> Placement:
    """Choose the rank-to-GPU mapping for tp x pp x dp ranks (see the module docstring)."""
    world = _check(topo, tp, pp, dp)
    if topo.n > MAX_GPUS:
        raise LabkitError(f"{topo.source}: {topo.n} GPUs; placement searches up to {MAX_GPUS} GPUs in one matrix "
                          f"(place each node's or NVLink domain's GPUs separately)")
    sizes = sizes or Sizes()
    for name in ("tp_bytes", "pp_bytes", "dp_bytes"):
        v = getattr(sizes, name)
        if not isinstance(v, int) or v < 0:
            raise LabkitError(f"{name} must be a non-negative number of bytes, got {v!r}")
    T = _Tables(topo, sizes, tp, dp)
    if topo.n <= EXHAUSTIVE_MAX_GPUS:
        best = _search_exhaustive(topo, tp, pp, dp, T)
        method = f"exhaustive over all {len(_perms(topo.n, world))} ordered choices of {world} of {topo.n} GPUs"
    else:
        best = _search_structured(topo, tp, pp, dp, T)
        method = (f"structured search ({topo.n} GPUs > {EXHAUSTIVE_MAX_GPUS}): ranks laid along the GPUs' locality "
                  f"order (NVLink domain, PCIe switch, NUMA node, socket), then at most {POLISH_EVALUATIONS} improving "
                  f"swaps; not proven optimal")
    placed = evaluate(topo, best, tp, pp, dp, sizes, T)
    naive = evaluate(topo, list(range(world)), tp, pp, dp, sizes, T)

    good, verdict, suggestions = True, "good: ", []
    has_nv = any(topo.link(a, b).kind == NVLINK for a in range(topo.n) for b in range(a + 1, topo.n))
    if tp > 1 and placed.weakest_tp_link is not None and not placed.weakest_tp_link.startswith("NV"):
        good = False
        if has_nv:
            clique = nvlink_clique(topo)
            c = len(clique)
            verdict = (f"no good placement: TP={tp} cannot keep every pair of a TP group on NVLink here; the weakest TP "
                       f"link is {placed.weakest_tp_link}. The largest all-NVLink group has {c} GPUs ({clique}).")
            alt = max((d for d in range(1, c + 1) if world % d == 0), default=1)
            if alt < tp:
                rest = world // alt
                suggestions.append(f"tp={alt} keeps TP on NVLink; cover the other factor {tp // alt if tp % alt == 0 else '?'} "
                                   f"with pp or dp (e.g. tp={alt}, pp={pp * (tp // alt) if tp % alt == 0 else pp}, "
                                   f"dp={dp if tp % alt == 0 else rest // pp}).")
        elif placed.weakest_tp_link in ("PIX", "PXB"):
            good = True
            verdict = (f"acceptable: no NVLink on this server; every TP group stays behind one PCIe switch "
                       f"(weakest TP link {placed.weakest_tp_link}), the closest path there is.")
            suggestions.append("PCIe-only: keep tp at this size or smaller and scale with dp/FSDP or pp.")
        else:
            verdict = (f"no good placement: this server has no NVLink and no PCIe switch joins a whole TP group, so "
                       f"TP all-reduces cross host bridges (weakest TP link {placed.weakest_tp_link}).")
            suggestions.append("keep tp small (1, or 2 on the closest PCIe pairs) and scale with dp/FSDP or pp instead.")
        if placed.weakest_tp_link == "SYS":
            verdict += " A TP group also crosses the inter-socket link (SYS)."
    else:
        verdict = "good: " + ("every TP group is on NVLink" if tp > 1 else "no tensor parallelism")
        if placed.numa_spanning_groups:
            verdict += f"; {placed.numa_spanning_groups} group(s) span NUMA nodes"

    speed = (_ratio(naive.tp_allreduce_s, placed.tp_allreduce_s), _ratio(naive.dp_allreduce_s, placed.dp_allreduce_s),
             _ratio(naive.pp_send_s, placed.pp_send_s))
    if naive.cost == placed.cost:
        summary = "the naive order 0, 1, 2, ... is already as good as any on this model"
    else:
        parts = []
        if tp > 1:
            parts.append(f"TP all-reduce of {sizes.tp_bytes} B: naive {naive.tp_allreduce_s * 1e3:.3f} ms vs placed "
                         f"{placed.tp_allreduce_s * 1e3:.3f} ms ({speed[0]:.2f}x)")
        if pp > 1:
            parts.append(f"PP send of {sizes.pp_bytes} B: naive {naive.pp_send_s * 1e3:.3f} ms vs placed "
                         f"{placed.pp_send_s * 1e3:.3f} ms ({speed[2]:.2f}x)")
        if dp > 1:
            parts.append(f"DP all-reduce of {sizes.dp_bytes} B: naive {naive.dp_allreduce_s * 1e3:.3f} ms vs placed "
                         f"{placed.dp_allreduce_s * 1e3:.3f} ms ({speed[1]:.2f}x)")
        summary = "; ".join(parts)
        if all(abs(x - 1) < 1e-9 for x in speed):
            summary += (" - equal nominal times: the placed order only keeps groups on closer paths "
                        "(fewer bridges / host bridges / socket crossings), which the nominal figures do not price")
    unused = sorted(set(range(topo.n)) - set(placed.gpu_of_rank))
    if unused:
        suggestions.insert(0, f"tp x pp x dp = {world} ranks use {world} of the {topo.n} GPUs; GPU(s) "
                              f"{','.join(map(str, unused))} stay idle. Raise dp (or tp/pp) to use them all.")
    comp = Comparison(naive=naive, placed=placed, tp_allreduce_speedup=speed[0], dp_allreduce_speedup=speed[1],
                      pp_send_speedup=speed[2], summary=summary)
    return Placement(tp=tp, pp=pp, dp=dp, topology=topo.source, sizes=sizes, tp_groups=placed.tp_groups,
                     pp_groups=placed.pp_groups, dp_groups=placed.dp_groups, rank_order=placed.gpu_of_rank,
                     cuda_visible_devices=",".join(map(str, placed.gpu_of_rank)),
                     weakest_tp_link=placed.weakest_tp_link,
                     affinity=[_affinity(topo, r, g) for r, g in enumerate(placed.gpu_of_rank)],
                     comparison=comp, good=good, verdict=verdict, suggestions=suggestions, method=method,
                     unused_gpus=unused)


def brute_force(topo: Topology, tp: int, pp: int = 1, dp: int = 1, sizes: Sizes | None = None) -> Layout:
    """The best mapping by evaluating every ordered choice of GPUs one by one (slow; for tests)."""
    world = _check(topo, tp, pp, dp)
    sizes = sizes or Sizes()
    T = _Tables(topo, sizes, tp, dp)
    best, best_cost = None, None
    for perm in permutations(range(topo.n), world):
        c = _cost(perm, tp, pp, dp, T)[0]
        if best_cost is None or c < best_cost:
            best, best_cost = perm, c
    assert best is not None
    return evaluate(topo, list(best), tp, pp, dp, sizes, T)
