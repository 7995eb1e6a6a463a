"""``advise()``: the whole plan of a training job on a machine, with the evidence for each part.

One code path per number: the per-GPU peak is ``labkit.memory.estimate.estimate`` (what
``labkit estimate`` prints) for a preset or a Hugging Face config, and ``measure_step`` in fake
mode (what ``labkit measure`` prints) for a user's factory; the layout search is the planner's;
the placement is ``labkit.topology.place`` (``labkit place``); the allocator setting is a replay
through ``labkit.allocator``'s simulator; the bucket size is ``labkit.comm.simulate``'s.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any

from labkit.advise.cluster import Machine, resolve
from labkit.advise.request import MAX_GPUS, Job, MachineSource, ModelSource
from labkit.advise.settings import ALLOC_CANDIDATES, BucketChoice, choose_alloc_conf, choose_buckets
from labkit.memory.estimate import ParallelSpec, TrainSpec, estimate
from labkit.memory.estimate.rates import measured_rates
from labkit.memory.estimate.accuracy import ESTIMATOR_ERROR
from labkit.memory.estimate.planner import SEARCHED_MICRO_BATCHES as MICRO_BATCHES, TracedStep, headline
from labkit.memory.estimate.planner import plan, uniform_cluster
from labkit.core.errors import LabkitError
from labkit.core.units import fmt_bytes
from labkit.topology import Sizes, place

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

RECOMPUTE = ("none", "selective", "full")


@dataclass
class Evidence:
    what: str
    value: Any
    unit: str
    source: str


@dataclass
class Advice:
    model: str
    machine: str
    gpus: int
    nodes: int
    fits: bool
    layout: dict[str, Any]                # tp, pp, dp, zero, micro_batch, micro_batches, recompute, sp
    peak_bytes: int | None                # allocated, most loaded GPU (max_memory_allocated)
    reserved_peak_bytes: int | None       # what the caching allocator holds at that peak
    total_bytes: int | None               # + CUDA context, NCCL buffers: what nvidia-smi shows
    usable_bytes: int
    step_time_s: float | None
    tokens_per_s: float | None
    runners_up: list[dict[str, Any]]
    why_not: list[str]                    # why the alternatives lost, with their numbers
    placement: dict[str, Any]
    alloc_conf: str
    bucket_cap_mb: float | None
    gradient_as_bucket_view: bool
    command: str
    env: dict[str, str]
    evidence: list[Evidence]
    smallest_fitting_gpus: int | None = None
    dominant: str | None = None           # what dominates memory when nothing fits
    # the best layout by the FLOPs model the layouts are ranked by (runners_up' step times are on that model)
    ranking_step_time_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The advice as text (the CLI's table form)."""
        out = [f"model {self.model} on {self.machine}"]
        if not self.fits:
            out.append(f"NO LAYOUT FITS: {self.why_not[0] if self.why_not else ''}")
            out.append(f"smallest cluster of these GPUs that fits: {self.smallest_fitting_gpus} GPUs"
                       if self.smallest_fitting_gpus else
                       f"no cluster of up to {MAX_GPUS} such GPUs fits (micro-batch 1, ZeRO-3, full recomputation)")
            if self.dominant:
                out.append(f"what dominates: {self.dominant}")
            return out + [f"note: {n}" for n in self.notes]
        lay = self.layout
        out += [
            f"layout: tp={lay['tp']}{'+SP' if lay['sp'] else ''} pp={lay['pp']} dp={lay['dp']} ZeRO-{lay['zero']} "
            f"micro-batch {lay['micro_batch']} x {lay['micro_batches']} recompute={lay['recompute']}",
            f"per-GPU peak: {fmt_bytes(self.peak_bytes)} allocated, {fmt_bytes(self.reserved_peak_bytes)} reserved"
            + (f", {fmt_bytes(self.total_bytes)} with context and NCCL" if self.total_bytes else "")
            + f" (usable {fmt_bytes(self.usable_bytes)})",
            (f"step time: {self.step_time_s * 1e3:.1f} ms ({self.tokens_per_s:,.0f} tokens/s)" if self.step_time_s
             else "step time: not predicted"),
            f"placement: CUDA_VISIBLE_DEVICES={self.placement.get('cuda_visible_devices')}; "
            f"{self.placement.get('verdict', '')}",
            f"allocator: PYTORCH_ALLOC_CONF={self.alloc_conf or '(default)'}",
            "DDP: " + (f"bucket_cap_mb={self.bucket_cap_mb:g}, gradient_as_bucket_view=True" if self.bucket_cap_mb
                       else "no DDP buckets"),
            f"launch: {self.command}",
            "why not the others:",
        ]
        out += [f"  {w}" for w in self.why_not]
        out.append("evidence:")
        out += [f"  {e.what}: {e.value}{(' ' + e.unit) if e.unit else ''} ({e.source})" for e in self.evidence]
        out += [f"note: {n}" for n in self.notes]
        return out


def _spec(model: ModelSource, seq: int):
    if model.preset:
        from labkit.memory.estimate.presets import get_preset

        spec = get_preset(model.preset)
        if model.layers or model.hidden:
            spec = dataclasses.replace(spec, layers=model.layers or spec.layers, hidden=model.hidden or spec.hidden,
                                       name=f"{spec.name} (modified)")
        return dataclasses.replace(spec, seq=max(spec.seq, seq))
    if model.hf_config:
        from labkit.memory.estimate.hf_config import load_hf_config, spec_from_hf_config

        return spec_from_hf_config(load_hf_config(model.hf_config), seq=seq, layers=model.layers,
                                   hidden=model.hidden, name=str(model.hf_config))
    return None


def _plan(spec, machine: Machine, job: Job):
    """The planner over the micro-batches, each with the measured matmul rate of its GEMMs."""

    mbs = (job.micro_batch,) if job.micro_batch else tuple(m for m in MICRO_BATCHES if job.global_batch % m == 0)
    rec = (job.recompute,) if job.recompute else RECOMPUTE
    plans, rates = [], {}
    rate_of = measured_rates(spec, job.precision, job.seq)   # the rate `labkit estimate --plan` charges too
    for mb in mbs:
        rates[mb] = rate_of(mb)
        plans.append(plan(spec, machine.cluster, job.global_batch, seq=job.seq, precision=job.precision,
                          optimizer=job.optimizer, margin=machine.margin, micro_batches=(mb,), recompute=rec,
                          framework="pytorch", keep=50, rate=lambda _mb, r=rates[mb]: r))
    ranked = sorted((c for p in plans for c in p.ranked), key=lambda c: (c.step_time_s, c.total_bytes))
    rejected: dict[str, int] = {}
    examples: dict[str, Any] = {}
    for p in plans:
        for cls, n in p.rejected.items():
            rejected[cls] = rejected.get(cls, 0) + n
            ex = p.examples[cls]
            old = examples.get(cls)
            if old is None or (ex.total_bytes or 0) < (old.total_bytes or 0):
                examples[cls] = ex
    return ranked, rejected, examples, rates, plans[0].usable_bytes if plans else 0


def _smallest_fit(spec, machine: Machine, job: Job) -> tuple[int | None, str | None]:
    """Double the GPU count (the same GPUs, in nodes of 8 once past one node) until a layout with
    ZeRO-3, micro-batch 1 and full recomputation fits; and what dominates at this size."""

    # what dominates: the per-GPU breakdown of the most sharded layout at this size
    n = machine.gpus
    tp = min(machine.gpus_per_node, max(d for d in range(1, n + 1) if n % d == 0 and spec.heads % d == 0
                                        and d <= machine.gpus_per_node))
    dp = n // tp
    zero = 3 if dp > 1 else 0
    est = estimate(spec, ParallelSpec(tp=tp, dp=dp, zero=zero, sp=tp > 1),
                   TrainSpec(micro_batch=1, seq=job.seq, precision=job.precision, optimizer=job.optimizer,
                             recompute="full", framework="pytorch"), all_stages=False)
    cats = {k: v for k, v in est.per_gpu_bytes.items() if k != "total"}
    top = max(cats, key=cats.get)
    dominant = (f"{top} {fmt_bytes(cats[top])} of {fmt_bytes(est.total)} per GPU even at tp={tp} dp={dp} "
                f"ZeRO-{zero}, micro-batch 1, full recomputation")
    g = machine.gpus
    node = max(machine.gpus_per_node, 8)  # growing past one node: nodes of 8 such GPUs (the usual server)
    while g < MAX_GPUS:
        g *= 2
        per_node = min(node, g)
        cl = uniform_cluster(f"{g} GPUs", g, per_node, machine.gpu_memory_bytes, machine.cluster.intra[max(machine.cluster.intra)],
                             machine.cluster.inter)
        gb = max(job.global_batch, g)
        p = plan(spec, cl, gb, seq=job.seq, precision=job.precision, optimizer=job.optimizer,
                 margin=machine.margin, micro_batches=(1,), recompute=("full",), zero_stages=(3,),
                 framework="pytorch", keep=1)
        if p.ranked:
            return g, dominant
    return None, dominant


def _naive_and_placement(machine: Machine, lay) -> dict[str, Any]:
    if machine.topology is None or lay.tp * lay.pp * lay.dp > len(machine.topology.gpus):
        order = ",".join(str(i) for i in range(min(machine.gpus_per_node, lay.tp * lay.pp * lay.dp)))
        return {"cuda_visible_devices": order, "verdict": "no topology to place on: GPUs in index order",
                "source": "none", "naive": None}

    pl = place(machine.topology, lay.tp, lay.pp, lay.dp, sizes=Sizes())
    return {"cuda_visible_devices": pl.cuda_visible_devices, "tp_groups": pl.tp_groups, "dp_groups": pl.dp_groups,
            "pp_groups": pl.pp_groups, "verdict": pl.verdict, "naive": pl.comparison.summary,
            "weakest_tp_link": pl.weakest_tp_link, "source": pl.source}


def _trace(model: ModelSource, job: Job, micro_batch: int, recompute: str) -> Any:
    """The fake-mode trace of one unsharded step of the user's model (what `labkit measure` runs)."""
    from labkit.advise.fake_step import trace_step

    return trace_step(model, job, micro_batch=micro_batch, recompute=recompute, alloc_confs=ALLOC_CANDIDATES)


def traced_step(hf_config: str, *, layers: int | None, hidden: int | None, seq: int, micro_batch: int, precision: str,
                optimizer: str, recompute: str) -> TracedStep | None:
    """One unsharded step of a Hugging Face model at this micro-batch and recompute, traced in fake
    mode and priced op by op: what advise headlines, offered to ``labkit estimate --plan``
    (:mod:`labkit.memory.estimate.step_tracer`)."""
    rep = _trace(ModelSource(hf_config=hf_config, layers=layers, hidden=hidden),
                 Job(seq=seq, global_batch=micro_batch, micro_batch=micro_batch, precision=precision,
                     optimizer=optimizer, recompute=recompute), micro_batch, recompute)
    return _traced(rep, micro_batch, recompute)


def _traced(rep, micro_batch: int, recompute: str) -> TracedStep | None:
    if rep is None:
        return None
    rl = getattr(rep, "roofline", None)
    if not rl:
        return TracedStep(micro_batch, recompute, rep.peak_bytes, None, "")
    opt = rl["per_phase"].get("optimizer", {})
    return TracedStep(micro_batch, recompute, rep.peak_bytes, rl["step_s"], rl["source"],
                      max(opt.get("gpu_s", 0.0), opt.get("host_s", 0.0)))


def _command(machine: Machine, ranks: int, env: dict[str, str]) -> str:
    per_node = min(machine.gpus_per_node, ranks)
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    if machine.nodes > 1:
        run = (f"torchrun --nnodes {machine.nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
               f"--rdzv-endpoint HOST0:29500 --rdzv-id job1")
    else:
        run = f"torchrun --standalone --nproc-per-node {per_node}"
    return f"{envs} {run} train.py".strip()


def advise(model: ModelSource, job: Job, machine_src: MachineSource, *, trace: bool | None = None) -> Advice:
    """Plan the job; ``trace`` (default: on for --hf-config and --factory) runs one fake-mode step of
    the real model for the allocator replay and as a check of the estimator."""
    machine = resolve(machine_src)
    spec = _spec(model, job.seq)
    evidence: list[Evidence] = []
    notes = list(machine.notes)
    notes.append("step time is a model (the traced step priced op by op where the model is traced, else FLOPs / "
                 "matmul rate; + alpha-beta communication); multi-GPU time stays a model until multi-GPU recordings "
                 "exist")
    if spec is None:
        return _advise_factory(model, job, machine, evidence, notes)
    ranked, rejected, examples, rates, usable = _plan(spec, machine, job)
    if not ranked:
        g, dom = _smallest_fit(spec, machine, job)
        why = [f"rejected {n} x {cls}; nearest: {examples[cls].label}: {examples[cls].reason}"
               for cls, n in sorted(rejected.items(), key=lambda kv: -kv[1])]
        return Advice(spec.name, machine.name, machine.gpus, machine.nodes, False, {}, None, None, None, usable, None,
                      None, [], why, {}, "", None, False, "", {}, evidence, g, dom,
                      notes + [f"global batch {job.global_batch}, sequence {job.seq}, {job.precision}"])
    best = ranked[0]

    par = ParallelSpec(tp=best.tp, pp=best.pp, dp=best.dp, zero=best.zero, sp=best.sp)
    train = TrainSpec(micro_batch=best.micro_batch, global_batch=job.global_batch, seq=job.seq,
                      precision=job.precision, optimizer=job.optimizer, recompute=best.recompute, framework="pytorch")
    est = estimate(spec, par, train)
    rate = rates[best.micro_batch]
    evidence += [
        Evidence("per-GPU peak allocated (most loaded GPU)", fmt_bytes(est.peak_allocated), "",
                 "model: labkit.memory.estimate (the same call as `labkit estimate`)"),
        Evidence("compute rate used for the step time", round(rate.flops_per_s / 1e12, 1), "TFLOP/s", rate.source),
        Evidence("layouts considered / fitting", f"{sum(rejected.values()) + len(ranked)} / {len(ranked)}", "",
                 "model: labkit.memory.estimate.planner"),
    ]
    reserved = est.peak_reserved
    alloc = choose_alloc_conf(None)
    want_trace = trace if trace is not None else bool(model.hf_config)
    rep = _trace(model, job, best.micro_batch, best.recompute) if want_trace else None
    traced = _traced(rep, best.micro_batch, best.recompute)
    # the same call `labkit estimate --plan` makes for its best layout
    head = headline(spec, best, machine.cluster, global_batch=job.global_batch, seq=job.seq, precision=job.precision,
                    optimizer=job.optimizer, framework="pytorch", traced=traced)
    step_time = head.step_s
    evidence[0] = Evidence("per-GPU peak allocated (most loaded GPU)", fmt_bytes(head.peak_bytes), "", head.peak_source)
    evidence.insert(1, Evidence("step time", round(step_time * 1e3, 1), "ms", head.step_source))
    if rep is not None:
        alloc = choose_alloc_conf(getattr(rep, "reserved_by_conf", None))
        evidence.append(Evidence("fake-mode peak of one unsharded step (tp=pp=dp=1)", fmt_bytes(rep.peak_bytes), "",
                                 "model: labkit.memory.trace fake-cuda (the same call as `labkit measure`)"))
        one = estimate(spec, ParallelSpec(), dataclasses.replace(train, global_batch=None))
        err = (one.peak_allocated / rep.peak_bytes - 1) * 100
        evidence.append(Evidence("estimator for the same unsharded step", fmt_bytes(one.peak_allocated),
                                 f"({err:+.1f}% vs the trace)", "model: labkit.memory.estimate"))
        evidence.insert(2, Evidence("estimator's per-GPU peak for this layout", fmt_bytes(est.peak_allocated),
                                    f"(its measured error on this model's unsharded step: {err:+.1f}%)",
                                    "model: labkit.memory.estimate (the same call as `labkit estimate`)"))
        evidence.insert(3, Evidence("step time by the FLOPs model (what the layouts are ranked by)",
                                    round(head.flops_step_s * 1e3, 1), "ms", "model: labkit.memory.estimate.planner"))
        if head.peak_bytes > usable:
            notes.append(f"the traced per-GPU peak {fmt_bytes(head.peak_bytes)} is above the usable "
                         f"{fmt_bytes(usable)}: the layout the estimator chose may not fit; give --micro-batch "
                         "or --recompute to try a smaller step")
        picked = alloc.replay.get(alloc.conf) if alloc.replay else None
        if picked and picked.get("peak_allocated"):
            ratio = picked["reserved_peak"] / picked["peak_allocated"]
            reserved = int(head.peak_bytes * ratio)
            evidence.append(Evidence("reserved / allocated in the replay under the chosen setting", round(ratio, 3),
                                     "", alloc.source))
    evidence.append(Evidence("allocator setting", alloc.conf or "(default)", "", alloc.reason))
    backward_s = head.time.compute_s * 2 / 3
    buckets: BucketChoice = choose_buckets(spec, best, job, machine.cluster, backward_s)
    if buckets.bucket_cap_mb is not None:
        evidence.append(Evidence("DDP bucket_cap_mb", buckets.bucket_cap_mb, "MiB", f"{buckets.source}: {buckets.reason}"))
    placement = _naive_and_placement(machine, best)
    if placement.get("naive"):
        evidence.append(Evidence("placement vs the naive order", placement["naive"], "", placement["source"]))
    env = {"CUDA_VISIBLE_DEVICES": placement["cuda_visible_devices"]}
    if alloc.conf:
        env["PYTORCH_ALLOC_CONF"] = alloc.conf
    why_not = []
    for c in ranked[1:4]:
        why_not.append(f"{c.label}: {(c.step_time_s / best.step_time_s - 1) * 100:+.1f}% step time by the FLOPs "
                       f"model ({c.step_time_s * 1e3:.1f} vs {best.step_time_s * 1e3:.1f} ms), "
                       f"{fmt_bytes(c.total_bytes)} per GPU")
    for cls, n in sorted(rejected.items(), key=lambda kv: -kv[1]):
        ex = examples[cls]
        why_not.append(f"rejected {n} x {cls} (memory or shape); nearest: {ex.label}: {ex.reason}")
    lay = {"tp": best.tp, "pp": best.pp, "dp": best.dp, "zero": best.zero, "micro_batch": best.micro_batch,
           "micro_batches": best.micro_batches, "recompute": best.recompute, "sp": best.sp,
           "fsdp": best.zero == 3}
    runners = [{"label": c.label, "step_time_s": c.step_time_s, "total_bytes": c.total_bytes} for c in ranked[1:4]]
    if rep is None:
        notes.append(f"per-GPU peak from the estimator (the model was not traced); its measured error: "
                     f"{ESTIMATOR_ERROR}")
    return Advice(spec.name, machine.name, machine.gpus, machine.nodes, True, lay, head.peak_bytes, reserved,
                  est.total + head.peak_bytes - est.peak_allocated, usable, step_time, job.global_batch * job.seq / step_time,
                  runners, why_not, placement,
                  alloc.conf,
                  buckets.bucket_cap_mb, buckets.gradient_as_bucket_view, _command(machine, best.tp * best.pp * best.dp, env), env, evidence,
                  notes=notes, ranking_step_time_s=head.flops_step_s)


def _advise_factory(model: ModelSource, job: Job, machine: Machine, evidence: list[Evidence], notes: list[str]) -> Advice:
    """A user's own nn.Module: no dimensions to plan TP/PP with, so data parallelism (one replica per
    GPU) with the traced per-GPU peak; the micro-batch is the one given (or 1)."""
    mb = job.micro_batch or 1
    recompute = job.recompute or "none"
    rep = _trace(model, job, mb, recompute)
    usable = int(machine.gpu_memory_bytes * (1 - machine.margin))
    step = rep.roofline["step_s"] if getattr(rep, "roofline", None) else None
    if step:
        evidence.append(Evidence("op-by-op step time of one micro-batch on the target GPU", round(step * 1e3, 1), "ms",
                                 f"model: {rep.roofline['source']}"))
    alloc = choose_alloc_conf(rep.reserved_by_conf)
    picked = alloc.replay.get(alloc.conf, {})
    reserved = picked.get("reserved_peak", rep.reserved_bytes)
    fits = rep.peak_bytes <= usable
    evidence.append(Evidence("per-GPU peak allocated", fmt_bytes(rep.peak_bytes), "",
                             "model: labkit.memory.trace fake-cuda (the same call as `labkit measure`)"))
    evidence.append(Evidence("allocator setting", alloc.conf or "(default)", "", alloc.reason))
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(min(machine.gpus_per_node, machine.gpus)))}
    if alloc.conf:
        env["PYTORCH_ALLOC_CONF"] = alloc.conf
    notes.append("a factory model has no dimensions for the TP/PP search: data parallelism only; the step time "
                 "is one micro-batch's, priced op by op (give --hf-config or a preset for the full search)")
    return Advice(model.factory or "factory", machine.name, machine.gpus, machine.nodes, fits,
                  {"tp": 1, "pp": 1, "dp": machine.gpus, "zero": 0, "micro_batch": mb,
                   "micro_batches": job.global_batch // (mb * machine.gpus) if job.global_batch % (mb * machine.gpus) == 0 else None,
                   "recompute": recompute, "sp": False, "fsdp": False},
                  rep.peak_bytes, reserved, None, usable, step, (mb * job.seq / step) if step else None, [],
                  [] if fits else
                  [f"the traced step needs {fmt_bytes(rep.peak_bytes)} > {fmt_bytes(usable)} usable"],
                  {"cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"], "verdict": "data parallel: any order"},
                  alloc.conf, None, True, _command(machine, machine.gpus, env), env, evidence, notes=notes)


def ensure_valid(*, model: ModelSource, job: Job, machine: MachineSource) -> None:
    """Contradictions between the three parts, refused in one line before any work."""
    if model.factory and machine.gpus and job.global_batch % machine.gpus:
        raise LabkitError(f"--global-batch {job.global_batch} is not divisible by the {machine.gpus} data-parallel "
                          "ranks a factory model runs on")
