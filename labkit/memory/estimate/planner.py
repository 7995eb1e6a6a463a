"""Planner: for a model, a cluster and a global batch, enumerate (tp, pp, dp, ZeRO stage,
micro-batch, recompute) layouts, drop those that do not fit with a margin, rank the rest by an
estimated step time, and say why.

Step time (a model, stated so it can be checked):

* compute: training FLOPs per GPU (``6 N`` per token for the matmuls plus ``12 L s h`` per token
  for attention, +1 forward with full recomputation, +the attention core's forward with selective)
  divided by ``cluster.achievable_flops``; the pipeline bubble multiplies it by
  ``1 + (p - 1) / (v m)``;
* communication: alpha-beta ring time (``labkit.core.collectives.alpha_beta_time``) over the link
  the group uses: TP all-reduces (or all-gather + reduce-scatter with SP) of ``s b h`` activations,
  4 per layer and micro-batch; pipeline sends of ``s b h`` per micro-batch; data-parallel gradient
  all-reduce (ZeRO-1/2: reduce-scatter + all-gather; ZeRO-3: 2 all-gathers + 1 reduce-scatter per
  micro-batch), overlapped with backward up to backward's compute time. TP and PP traffic is not
  overlapped.

Ranks are laid out tensor-parallel fastest, then data, then pipeline (Megatron's order), so a TP
group is ``tp`` neighbouring GPUs of one node and a DP or PP group crosses nodes once the groups
inside it outgrow a node. Links come from a :class:`Cluster` (two :class:`LinkSpec`: inside a node
by group size, between nodes), built by hand or from a ``labkit.topology`` topology.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import labkit.topology as T
from labkit.core.collectives import alpha_beta_time
from labkit.core.errors import LabkitError
from labkit.core.interconnect import (NCCL_RING_STEP_S, NIC_400G_Bps, NIC_SOURCE, NIC_STEP_S, NVLINK4_NODE_Bps,
                                     NVLINK4_NODE_SOURCE)
from labkit.core.spec import default
from labkit.core.units import GiB, fmt_bytes
from labkit.core.vocab import Recompute
from labkit.memory.estimate import ModelSpec, Overheads, ParallelSpec, TrainSpec, estimate, total_params
from labkit.memory.estimate.accuracy import ESTIMATOR_ERROR

# About 40% of the dense bf16 peak of an H100/H200 (989 TFLOP/s): a typical training MFU.
DEFAULT_ACHIEVABLE_FLOPS = 400e12


@dataclass(frozen=True)
class LinkSpec:
    """A link as the alpha-beta model sees it: per-direction bandwidth and per-step latency."""

    bandwidth_Bps: float
    latency_s: float
    name: str = ""


def nvswitch_nvlink4(name: str = "NVLink4 (NV18)") -> LinkSpec:
    """Inside an H100/H200 node: every GPU on the NVSwitches with its 18 NVLink4 links, NCCL's ring step
    latency over NVLink (figures and sources: :mod:`labkit.core.interconnect`)."""
    return LinkSpec(NVLINK4_NODE_Bps, NCCL_RING_STEP_S["NVLINK"], name)


def nic_400g(name: str = "400 Gb/s NIC") -> LinkSpec:
    """Between nodes: one 400 Gb/s NIC per GPU (:mod:`labkit.core.interconnect`; its latency assumed)."""
    return LinkSpec(NIC_400G_Bps, NIC_STEP_S, name)


@dataclass(frozen=True)
class Cluster:
    """GPUs, memory per GPU, links, and the achievable compute rate."""

    name: str
    gpus: int
    gpus_per_node: int
    gpu_memory_bytes: int
    intra: dict[int, LinkSpec]          # group size inside a node -> its ring's slowest link
    inter: LinkSpec                     # per GPU between nodes (its NIC)
    achievable_flops: float = DEFAULT_ACHIEVABLE_FLOPS
    source: str = ""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise LabkitError(f"cluster {self.name}: gpus and gpus_per_node must be >= 1")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise LabkitError(f"cluster {self.name}: {self.gpus} GPUs is not a whole number of "
                              f"{self.gpus_per_node}-GPU nodes")
        if self.gpu_memory_bytes < 1:
            raise LabkitError(f"cluster {self.name}: GPU memory must be positive")

    def link(self, size: int, span: int) -> LinkSpec:
        """The link a group of ``size`` ranks uses when its members lie within ``span`` consecutive GPUs."""
        if span > self.gpus_per_node:
            return self.inter
        best = min((k for k in self.intra if k >= span), default=max(self.intra))
        return self.intra[best]


def uniform_cluster(name: str, gpus: int, gpus_per_node: int, gpu_memory_bytes: int, intra: LinkSpec,
                    inter: LinkSpec, achievable_flops: float = DEFAULT_ACHIEVABLE_FLOPS, source: str = "") -> Cluster:
    """A cluster whose GPUs inside a node are all connected alike (NVSwitch)."""
    sizes = {k: intra for k in _pow2_upto(gpus_per_node)}
    return Cluster(name, gpus, gpus_per_node, gpu_memory_bytes, sizes, inter, achievable_flops, source)


def cluster_from_topology(topo, *, nodes: int = 1, gpu_memory_bytes: int | None = None,
                          inter: LinkSpec | None = None, achievable_flops: float = DEFAULT_ACHIEVABLE_FLOPS,
                          name: str | None = None) -> Cluster:
    """A cluster of ``nodes`` copies of a ``labkit.topology`` Topology (or a sample name): inside a
    node, a group of k neighbouring GPUs uses its ring's slowest link (``labkit.topology``'s
    ``collective_time`` bottleneck and latency)."""
    if isinstance(topo, str):
        topo = T.load_topology(topo)
    n = len(topo.gpus)
    if n < 1:
        raise LabkitError("topology has no GPUs")
    intra: dict[int, LinkSpec] = {}
    for k in _pow2_upto(n):
        if k == 1:
            continue
        ce = T.collective_time(topo, list(range(k)), "all_reduce", 1 << 20)
        intra[k] = LinkSpec(ce.bandwidth_Bps, ce.alpha_s, ce.bottleneck.link.label if ce.bottleneck else "")
    if not intra:
        intra[1] = LinkSpec(1e12, 1e-6, "self")
    mem = gpu_memory_bytes or next((g.memory_bytes for g in topo.gpus if g.memory_bytes), None)
    if not mem:
        raise LabkitError("the topology does not say the GPU memory: pass gpu_memory_bytes")
    inter = inter or nic_400g("400 Gb/s NIC per GPU (assumed)")
    return Cluster(name or f"{nodes} x {n}-GPU node", nodes * n, n, int(mem), intra, inter, achievable_flops,
                   source=f"topology: {getattr(topo, 'source', None) or 'given'}; inter-node {inter.name}")


# The micro-batches `labkit advise` and `labkit estimate --plan` both search (one best layout for one job).
SEARCHED_MICRO_BATCHES = (1, 2, 4, 8, 16)

PLAN_MAX_GPUS = 1 << 20   # 1,048,576 GPUs: beyond any cluster built; larger counts are refused


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    if n not in out:
        out.append(n)
    return out


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending, by trial division up to sqrt(n)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


# ------------------------------------------------------------------ time model

@dataclass
class StepTime:
    compute_s: float
    bubble_s: float
    tp_s: float
    pp_s: float
    dp_s: float             # exposed (not hidden behind backward)
    dp_total_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + self.tp_s + self.pp_s + self.dp_s


def training_flops_per_token(m: ModelSpec, seq: int, recompute: "Recompute | str") -> float:
    """Matmul FLOPs (6 per parameter and token, embeddings' lookup excluded, LM head included) plus
    attention (12 L s h: scores and weighted values, forward and backward), with recomputation
    (``full`` and ``every-K`` rerun every layer's forward, ``selective`` the attention core)."""
    rc = Recompute.parse(recompute)
    n = total_params(m) - (m.seq * m.hidden if m.learned_pos_emb else 0)
    if not m.tied_embeddings:
        n -= m.vocab * m.hidden  # the input embedding is a lookup; a tied matrix counts once, as the head
    attn = 4 * m.layers * seq * m.heads * m.d_head   # forward, per token
    mat = 2 * n                                       # forward, per token
    fwd = mat + attn
    total = 3 * fwd
    if rc.segment is not None:
        total += fwd
    elif rc.kind == "selective":
        total += attn
    return total


def step_time(m: ModelSpec, par: ParallelSpec, train: TrainSpec, cluster: Cluster, n_micro: int,
              traced: "TracedStep | None" = None) -> StepTime:
    """The step time of one layout. ``traced``: one unsharded step of the real model priced op by op
    (advise's fake-mode trace); the compute is then its forward and backward x micro-batches / (tp x pp)
    plus its optimizer step once / (tp x pp, x dp under ZeRO), instead of FLOPs / ``cluster.achievable_flops``."""
    seq = train.seq or m.seq
    tokens = train.micro_batch * n_micro * seq  # per data-parallel replica
    if traced is not None and traced.step_s is not None:
        opt = min(traced.optimizer_s, traced.step_s)
        shard = par.tp * par.pp * (par.dp if par.zero else 1)
        compute = (traced.step_s - opt) * n_micro / (par.tp * par.pp) + opt / shard
    else:
        flops = training_flops_per_token(m, seq, train.recompute) * tokens / (par.tp * par.pp)
        compute = flops / cluster.achievable_flops
    bubble = compute * (par.pp - 1) / (par.v * n_micro) if par.pp > 1 else 0.0
    act = 2 if train.precision != "fp32" else 4
    # TP: 4 all-reduce-sized collectives of s*b*h per layer and micro-batch (fwd 2, bwd 2), on the node's link
    tp = 0.0
    if par.tp > 1:
        lk = cluster.link(par.tp, par.tp)
        nbytes = seq * train.micro_batch * m.hidden * act
        per = alpha_beta_time("all_reduce", nbytes, par.tp, lk.bandwidth_Bps, lk.latency_s)
        n_coll = 4 + (2 if train.recompute.segment is not None else 0)
        tp = per * n_coll * (m.layers // par.pp) * n_micro
    pp = 0.0
    if par.pp > 1:
        span = par.tp * par.dp * 2
        lk = cluster.link(2, span)
        nbytes = seq * train.micro_batch * m.hidden * act // (par.tp if par.sp else 1)
        pp = 2 * n_micro * (lk.latency_s + nbytes / lk.bandwidth_Bps) * par.v
    dp_total = 0.0
    if par.dp > 1:
        lk = cluster.link(par.dp, par.tp * par.dp)
        local = total_params(m) / (par.tp * par.pp)
        g = 2 if train.precision != "fp32" else 4
        if par.zero == 0:
            dp_total = alpha_beta_time("all_reduce", int(local * g), par.dp, lk.bandwidth_Bps, lk.latency_s)
        elif par.zero in (1, 2):
            dp_total = (alpha_beta_time("reduce_scatter", int(local * g), par.dp, lk.bandwidth_Bps, lk.latency_s)
                        + alpha_beta_time("all_gather", int(local * g), par.dp, lk.bandwidth_Bps, lk.latency_s))
        else:
            per_mb = (2 * alpha_beta_time("all_gather", int(local * g), par.dp, lk.bandwidth_Bps, lk.latency_s)
                      + alpha_beta_time("reduce_scatter", int(local * g), par.dp, lk.bandwidth_Bps, lk.latency_s))
            dp_total = per_mb * n_micro
    exposed = max(0.0, dp_total - compute * 2 / 3)
    return StepTime(compute, bubble, tp, pp, exposed, dp_total)


# ------------------------------------------------------------------ search

@dataclass
class Candidate:
    tp: int
    pp: int
    dp: int
    zero: int
    micro_batch: int
    recompute: str
    sp: bool
    micro_batches: int
    fits: bool
    reason: str                     # why rejected ('' if it fits)
    total_bytes: int | None = None  # most loaded GPU, with context, NCCL and allocator overhead
    peak_phase: str | None = None
    step_time_s: float | None = None
    time: StepTime | None = None
    tokens_per_s: float | None = None

    @property
    def label(self) -> str:
        sp = "+SP" if self.sp else ""
        return (f"tp={self.tp}{sp} pp={self.pp} dp={self.dp} ZeRO-{self.zero} mb={self.micro_batch} "
                f"recompute={self.recompute}")


@dataclass
class Plan:
    cluster: str
    model: str
    global_batch: int
    usable_bytes: int               # GPU memory x (1 - margin)
    considered: int
    fitting: int
    ranked: list[Candidate]         # fitting candidates, fastest first
    rejected: dict[str, int]        # reason class -> count
    examples: dict[str, Candidate]  # one example per reason class
    assumptions: list[str] = field(default_factory=list)

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


def plan(model: ModelSpec, cluster: Cluster, global_batch: int, *, seq: int | None = None,
         precision: str = default("precision"), optimizer: str = default("optimizer"), margin: float = 0.10,
         micro_batches: tuple[int, ...] = (1, 2, 4, 8), recompute: tuple[str, ...] = ("none", "selective", "full"),
         zero_stages: tuple[int, ...] = (0, 1, 2, 3), framework: str = "megatron", overheads: Overheads | None = None,
         keep: int = 20, rate=None) -> Plan:
    """Search the layouts; see the module docstring for the time model. ``rate``: a function
    ``micro_batch -> Rate`` (:func:`labkit.memory.estimate.rates.measured_rates`, what advise uses)
    replacing ``cluster.achievable_flops`` for each micro-batch."""
    if not 0 <= margin < 1:
        raise LabkitError(f"margin must be in [0, 1), got {margin}")
    if global_batch < 1:
        raise LabkitError(f"global batch must be >= 1, got {global_batch}")
    usable = int(cluster.gpu_memory_bytes * (1 - margin))
    oh = overheads or Overheads()
    fitting: list[Candidate] = []
    rejected: dict[str, int] = {}
    examples: dict[str, Candidate] = {}
    considered = 0

    def reject(c: Candidate, cls: str) -> None:
        rejected[cls] = rejected.get(cls, 0) + 1
        old = examples.get(cls)
        # the example shown is the nearest miss (smallest memory need) of its class
        if old is None or (c.total_bytes is not None and old.total_bytes is not None and c.total_bytes < old.total_bytes):
            examples[cls] = c

    measured: dict[int, Any] = {}

    def rates_used(mb: int):
        if mb not in measured:
            measured[mb] = rate(mb)
        return measured[mb]

    n = cluster.gpus
    if n > PLAN_MAX_GPUS:
        raise LabkitError(f"cluster {cluster.name}: {n} GPUs is more than the planner searches (up to {PLAN_MAX_GPUS})")
    per_layout = len(micro_batches) * len(recompute)
    for tp in [d for d in _divisors(n) if d <= cluster.gpus_per_node]:
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            zeros = [z for z in zero_stages if not (z and dp == 1)]  # ZeRO needs dp > 1 to shard over
            # A whole (tp, pp) refused by its shape is counted without building each candidate.
            shape = (f"heads {model.heads} not divisible by tp {tp}", "heads not divisible by tp") if model.heads % tp \
                else (f"layers {model.layers} not divisible by pp {pp}", "layers not divisible by pp") if model.layers % pp \
                else None
            if shape and zeros and per_layout:
                considered += len(zeros) * per_layout
                rejected[shape[1]] = rejected.get(shape[1], 0) + len(zeros) * per_layout - 1
                reject(Candidate(tp, pp, dp, zeros[0], micro_batches[0], recompute[0], tp > 1, 0, False, shape[0]),
                       shape[1])
                continue
            for zero in zeros:
                for mb in micro_batches:
                    cl_mb = cluster if rate is None else replace(cluster, achievable_flops=rates_used(mb).flops_per_s)
                    for rec in recompute:
                        considered += 1
                        c = Candidate(tp, pp, dp, zero, mb, rec, tp > 1, 0, False, "")
                        if global_batch % (mb * dp):
                            c.reason = f"global batch {global_batch} not divisible by micro-batch {mb} x dp {dp}"
                            reject(c, "batch not divisible by micro-batch x dp")
                            continue
                        par = ParallelSpec(tp=tp, pp=pp, dp=dp, zero=zero, sp=tp > 1)
                        train = TrainSpec(micro_batch=mb, global_batch=global_batch, seq=seq, precision=precision,
                                          optimizer=optimizer, recompute=rec, framework=framework)
                        try:
                            est = estimate(model, par, train, oh, all_stages=False)
                        except LabkitError as exc:
                            c.reason = str(exc)
                            reject(c, "invalid: " + str(exc).split(" is ")[0][:40])
                            continue
                        c.micro_batches = est.micro_batches
                        c.total_bytes = est.total
                        c.peak_phase = est.peak_phase
                        if est.total > usable:
                            c.reason = (f"needs {fmt_bytes(est.total)} on its most loaded GPU (stage "
                                        f"{est.most_loaded_stage}, {est.peak_phase}) > {fmt_bytes(usable)} usable")
                            reject(c, "does not fit in memory")
                            continue
                        c.fits = True
                        c.time = step_time(model, par, train, cl_mb, est.micro_batches)
                        c.step_time_s = c.time.total_s
                        c.tokens_per_s = global_batch * (seq or model.seq) / c.step_time_s
                        fitting.append(c)
    fitting.sort(key=lambda c: (c.step_time_s, c.total_bytes))
    if measured:
        r = sorted(measured.items())
        compute = ("compute rate per micro-batch " + ", ".join(f"{mb}: {v.flops_per_s / 1e12:.0f}" for mb, v in r)
                   + f" TFLOP/s per GPU (matmul rate at the MLP GEMM, {r[0][1].source})")
    else:
        compute = f"achievable compute {cluster.achievable_flops / 1e12:.0f} TFLOP/s per GPU (model)"
    assumptions = [
        compute,
        f"memory margin {margin:.0%}: usable {fmt_bytes(usable)} of {fmt_bytes(cluster.gpu_memory_bytes)} per GPU",
        "ranks: tensor-parallel fastest, then data, then pipeline; SP on whenever tp > 1",
        "DP gradient traffic overlaps backward; TP and PP traffic does not (alpha-beta ring model)",
        f"precision {precision}, optimizer {optimizer}, {framework} activation layout",
        f"memory: the analytical estimator, not traced; its measured error: {ESTIMATOR_ERROR}",
    ]
    return Plan(cluster=cluster.name, model=model.name, global_batch=global_batch, usable_bytes=usable,
                considered=considered, fitting=len(fitting), ranked=fitting[:keep], rejected=rejected,
                examples=examples, assumptions=assumptions)


# ------------------------------------------------------------------ one headline for both verbs

@dataclass
class TracedStep:
    """One unsharded step (tp=pp=dp=1) of the real model at a candidate's micro-batch and recompute,
    run in fake mode: its peak, and that step priced op by op on the target GPU (None: not priced)."""

    micro_batch: int
    recompute: str
    peak_bytes: int
    step_s: float | None
    source: str                    # where the step time comes from (the kernel recordings)
    optimizer_s: float = 0.0       # the optimizer phase's part of step_s (its GPU or host time, the longer)


@dataclass
class Headline:
    """The per-GPU peak and step time ``labkit advise`` and ``labkit estimate --plan`` both print for
    a plan's best layout, each with its source."""

    peak_bytes: int
    peak_source: str
    estimator_peak_bytes: int
    step_s: float
    step_source: str
    flops_step_s: float            # the FLOPs-model figure the layouts were ranked by
    time: StepTime
    estimator_error: float | None = None   # the estimator vs the trace on the unsharded step (0.05: 5% high)


def headline(model: ModelSpec, best: Candidate, cluster: Cluster, *, global_batch: int, seq: int | None = None,
             precision: str = default("precision"), optimizer: str = default("optimizer"), framework: str = "pytorch",
             traced: TracedStep | None = None) -> Headline:
    """The best layout's per-GPU peak and step time: from the trace of the real model where there is
    one (:func:`traced_headline`; the step priced op by op and scaled to the layout by
    :func:`step_time`), else the estimator and the FLOPs model."""
    if best.time is None or best.step_time_s is None:
        raise LabkitError(f"{best.label}: not a fitting candidate")
    par = ParallelSpec(tp=best.tp, pp=best.pp, dp=best.dp, zero=best.zero, sp=best.sp)
    train = TrainSpec(micro_batch=best.micro_batch, global_batch=global_batch, seq=seq, precision=precision,
                      optimizer=optimizer, recompute=best.recompute, framework=framework)
    est = estimate(model, par, train, all_stages=False)
    if traced is None:
        return Headline(est.peak_allocated, f"model: labkit.memory.estimate; its measured error: {ESTIMATOR_ERROR}",
                        est.peak_allocated, best.step_time_s,
                        "model: training FLOPs / the compute rate + alpha-beta communication (labkit.memory.estimate."
                        "planner; the model was not traced)", best.step_time_s, best.time)
    if (traced.micro_batch, str(traced.recompute)) != (best.micro_batch, str(best.recompute)):
        raise LabkitError(f"the traced step (micro-batch {traced.micro_batch}, recompute {traced.recompute}) is not "
                          f"{best.label}'s")
    one = estimate(model, ParallelSpec(), replace(train, global_batch=None), all_stages=False)
    peak, how = traced_headline(est.peak_allocated, one.peak_allocated, traced.peak_bytes, best)
    err = one.peak_allocated / traced.peak_bytes - 1 if traced.peak_bytes else None
    if traced.step_s is None:
        return Headline(peak, how, est.peak_allocated, best.step_time_s, "model: training FLOPs / the compute rate + "
                        "alpha-beta communication (the traced step was not priced)", best.step_time_s, best.time, err)
    t = step_time(model, par, train, cluster, best.micro_batches, traced=traced)
    single = best.tp * best.pp * best.dp == 1 and best.micro_batches == 1
    src = (f"model: the traced step priced op by op ({traced.source})" if single else
           f"model: the traced unsharded step priced op by op ({traced.source}): forward and backward x "
           f"{best.micro_batches} micro-batches, the optimizer once, / the layout's sharding, + alpha-beta "
           "communication")
    return Headline(peak, how, est.peak_allocated, t.total_s, src, best.step_time_s, t, err)


def traced_headline(est_layout: int, est_single: int, traced_single: int, best: Candidate) -> tuple[int, str]:
    """The per-GPU peak headlined when the model was traced: the trace itself for one GPU
    (tp=pp=dp=1); for data-parallel layouts (tp=pp=1, DDP or ZeRO) the estimator's figure for the layout
    plus what it missed on the traced unsharded step (the missed bytes are activations and temporaries,
    which data parallelism and ZeRO do not shard); for tensor and pipeline parallelism the estimator's."""
    if best.tp == best.pp == best.dp == 1 and best.micro_batches == 1:
        return traced_single, "model: labkit.memory.trace fake-cuda, this very step (the same call as `labkit measure`)"
    if best.tp == best.pp == 1:
        return (est_layout + traced_single - est_single,
                "model: the estimator for this layout plus what it missed on the traced unsharded step "
                "(labkit.memory.trace fake-cuda); per-rank traces of sharded layouts are not built yet")
    return est_layout, ("model: labkit.memory.estimate (tensor/pipeline layouts are not traced per rank yet); "
                        "its error on the unsharded step is beside it")


def explain(p: Plan, top: int = 3) -> list[str]:
    """Sentences: the top choices and what holds them back, and why the others were rejected."""
    lines: list[str] = []
    if not p.ranked:
        lines.append(f"No layout of {p.model} fits on {p.cluster} with global batch {p.global_batch}.")
    best = p.best
    for i, c in enumerate(p.ranked[:top]):
        t = c.time
        assert t is not None and c.step_time_s is not None and c.total_bytes is not None
        parts = {"compute": t.compute_s, "pipeline bubble": t.bubble_s, "TP communication": t.tp_s,
                 "PP sends": t.pp_s, "exposed DP communication": t.dp_s}
        worst = max((k for k in parts if k != "compute"), key=lambda k: parts[k])
        why = (f"{i + 1}. {c.label}: {c.step_time_s * 1e3:.0f} ms/step ({c.tokens_per_s:,.0f} tokens/s), "
               f"{fmt_bytes(c.total_bytes)} on the most loaded GPU; compute {t.compute_s * 1e3:.0f} ms")
        if parts[worst] > 0:
            why += f", largest overhead: {worst} {parts[worst] * 1e3:.0f} ms"
        if best is not None and c is not best:
            why += f" ({(c.step_time_s / best.step_time_s - 1) * 100:.1f}% slower than the best)"
        lines.append(why)
    for cls, count in sorted(p.rejected.items(), key=lambda kv: -kv[1]):
        ex = p.examples[cls]
        lines.append(f"rejected {count} x {cls}; e.g. {ex.label}: {ex.reason}")
    return lines


def h200_cluster(gpus: int = 2, gpus_per_node: int = 8) -> Cluster:
    """H200 nodes (NVLink4 through NVSwitch), 400 Gb/s NIC per GPU: :func:`nvswitch_nvlink4`, :func:`nic_400g`."""
    return uniform_cluster(f"{gpus} x H200 (141 GB)", gpus, min(gpus, gpus_per_node), 141 * 10**9,
                           nvswitch_nvlink4(), nic_400g(), source=f"nominal figures: {NVLINK4_NODE_SOURCE}; {NIC_SOURCE}")


def h100_cluster(gpus: int = 64, gpus_per_node: int = 8) -> Cluster:
    return uniform_cluster(f"{gpus} x H100 80GB", gpus, min(gpus, gpus_per_node), 80 * GiB,
                           nvswitch_nvlink4(), nic_400g(), source=f"nominal figures: {NVLINK4_NODE_SOURCE}; {NIC_SOURCE}")


__all__ = ["Candidate", "Cluster", "DEFAULT_ACHIEVABLE_FLOPS", "LinkSpec", "Plan", "StepTime", "cluster_from_topology",
           "Headline", "SEARCHED_MICRO_BATCHES", "TracedStep", "explain", "h100_cluster", "headline", "traced_headline", "h200_cluster", "nic_400g", "nvswitch_nvlink4", "plan", "step_time",
           "training_flops_per_token", "uniform_cluster"]
