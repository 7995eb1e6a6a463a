"""Notebook 02 (parallel memory): the model checked against real peaks, then DP/ZeRO, TP, PP,
recomputation and precision, the explorer and the planner, each as one section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from labkit.core.errors import LabkitError
from labkit.core.machine import probe
from labkit.core.units import GiB, fmt_bytes
from labkit.memory.estimate import DEFAULTS_SOURCE, ModelSpec, ParallelSpec, TrainSpec, estimate, total_params
from labkit.memory.estimate.accuracy import RANK_RECORDING, case_inputs, check_ranks, rank_case_inputs, recorded_peaks
from labkit.memory.estimate.activations import attention_path, layer_terms
from labkit.memory.estimate.planner import cluster_from_topology, explain, plan
from labkit.memory.estimate.presets import get_preset
from labkit.memory.estimate.rates import measured_rates
from labkit.memory.estimate.recorded import compare_parallel_dir, compare_tracer
from labkit.memory.estimate.states import precision_bytes
from labkit.memory.trace.recorded import measure_dir as default_dir
from labkit.viz import memory as vm
from labkit.viz.section import Section
from labkit.workloads import corpus

MODEL = "model (labkit.memory.estimate)"


@dataclass
class Setup:
    """The model and the GPU the chapter plans for."""

    model: ModelSpec
    gpu_memory_gib: float

    @property
    def capacity(self) -> int:
        return int(self.gpu_memory_gib * GiB)

    def section(self) -> Section:
        here = probe()
        m = self.model
        sec = Section(f"The model: {m.name}", source="model")
        sec.claim("Parameters", round(total_params(m) / 1e9, 2), "x 1e9")
        sec.claim("Dimensions", f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads "
                                f"({m.kv_heads or m.heads} KV), seq {m.seq}, vocab {m.vocab}")
        sec.claim("Memory per GPU planned for", self.gpu_memory_gib, "GiB (2^30 bytes)")
        sec.claim(f"This machine ({here.hostname})", len(here.gpus), "NVIDIA GPUs", source="measured here")
        return sec.note("Figures below are the model's unless they say 'recorded on'.")

    def _ipython_display_(self) -> None:
        self.section()._ipython_display_()


def setup_for(model_name: str, seq: int, gpu_memory_gib: float) -> Setup:
    """A preset at the chosen sequence length, and the GPU memory to plan for."""
    return Setup(dataclasses.replace(get_preset(model_name), seq=seq), gpu_memory_gib)


def _fits(total: int, s: Setup) -> str:
    return "yes" if total <= s.capacity else "no"


# -- the model against real peaks ---------------------------------------------------------------


def model_check(measure_dir: Path | None = None) -> Section:
    """The model's peak beside ``torch.cuda.max_memory_allocated`` of real steps: the reference set
    (used to set the model's defaults) and the held-out set (recorded after), each with its own error."""
    d = Path(measure_dir) if measure_dir is not None else default_dir()
    sec = Section("Is the model right? Its peaks against real GPU peaks", source=MODEL)
    try:
        comps = compare_tracer(d / "reference_peaks.json")
    except LabkitError as exc:
        return sec.note(f"No recorded peaks here ({exc}): run benchmarks/gpu/record_measure.py on a GPU machine "
                        "(its --smoke mode makes a fixture on a CPU).")
    held = compare_tracer(d / "heldout_peaks.json") if (d / "heldout_peaks.json").exists() else []
    src = comps[0].source + " vs model"
    worst = max(comps + held, key=lambda c: abs(c.error_pct))
    sec.claim("Largest deviation of the model over both sets", round(abs(worst.error_pct), 3), "%",
              name="model_vs_h200_max_abs_error_pct", source=src, digits=2, direction="lower")
    sec.claim("Largest deviation on the reference set (used to set the defaults)",
              round(max(abs(c.error_pct) for c in comps), 2), "%", source=src, digits=2)
    if held:
        sec.claim("Largest deviation on the held-out set (recorded after the defaults were set)",
                  round(max(abs(c.error_pct) for c in held), 2), "%", name="model_vs_h200_heldout_max_abs_error_pct",
                  source=src, digits=2, direction="lower")
    else:
        sec.note("No held-out recording (heldout_peaks.json): only the reference set is shown.")
    sec.claim("Cases whose peak falls in the phase the model predicts",
              sum(c.model_phase == c.measured_phase for c in comps + held), f"of {len(comps + held)}", source=src)
    sec.table(["case", "set", "measured peak", "model peak", "model - measured", "phase (measured / model)"],
              [[c.name, kind, fmt_bytes(c.measured_peak), fmt_bytes(c.model_peak), f"{c.error_pct:+.2f}%",
                f"{c.measured_phase} / {c.model_phase}"] for kind, cs in (("reference", comps), ("held out", held))
               for c in cs],
              caption=f"Steady-step peak allocated, lab GPT on one GPU; measured: {comps[0].source}")
    sec.note(f"Defaults no formula gives: {DEFAULTS_SOURCE}")
    return sec.figure(vm.model_vs_measured([c.name for c in comps + held], [c.model_peak for c in comps + held],
                                           [c.measured_peak for c in comps + held], title="Model vs measured peak",
                                           source=src))


# -- the estimator against the trace on a Hugging Face model --------------------------------------

ONE_GPU_CASE = "llama-gqa-b4-fp32"


def estimator_vs_trace(case_name: str = ONE_GPU_CASE, smoke: bool = False) -> Section:
    """One Hugging Face model on one GPU (tp=pp=dp=1): the estimator without and with its transformers
    rules, the fake-mode trace of the same step and the H200's recorded peak, and the rules' bytes.
    ``smoke``: the case at CI size (``corpus.tiny``, no recording at that size)."""
    case = corpus.get_case(case_name + ("@tiny" if smoke else ""))
    m, par, train = case_inputs(case)
    generic = estimate(dataclasses.replace(m, hf=None), par, train)
    est = estimate(m, par, train)
    traced = corpus.predict(case).peak_bytes
    rec = None if smoke else recorded_peaks().get(case.name)
    sec = Section(f"The estimator against the trace: {case.describe()}, one GPU", source=MODEL)
    sec.claim("Estimator, generic PyTorch layer", fmt_bytes(generic.peak_allocated),
              f"({(generic.peak_allocated / traced - 1) * 100:+.1f}% vs the trace)")
    sec.claim("Estimator with the transformers rules", fmt_bytes(est.peak_allocated),
              f"({(est.peak_allocated / traced - 1) * 100:+.1f}% vs the trace)",
              name="estimator_vs_trace_one_gpu_pct" if not smoke else None)
    sec.claim("Fake-mode trace of the same step", fmt_bytes(traced), "",
              source="model: labkit.memory.trace fake-cuda (labkit.workloads.corpus.predict)")
    if rec:
        sec.claim("Recorded peak of the plain loop", fmt_bytes(rec), f"(trace {(traced / rec - 1) * 100:+.1f}%)",
                  source="recorded on 1 x NVIDIA H200 (data/measurements/measure/plain__fresh.json)")
    by = precision_bytes(train)
    mine = {n: v for n, v, _ in layer_terms(m, par, train, by)}
    theirs = {n: v for n, v, _ in layer_terms(dataclasses.replace(m, hf=None), par, train, by)}
    rows = []
    for name in dict.fromkeys(list(theirs) + list(mine)):
        a, b = theirs.get(name, 0), mine.get(name, 0)
        if a != b:
            rows.append([name, fmt_bytes(a), fmt_bytes(b), fmt_bytes((b - a) * m.layers)])
    sec.table(["saved tensor (one layer, one micro-batch)", "generic", "transformers", f"difference x {m.layers} layers"],
              rows, caption="What the transformers implementation keeps beyond the generic block "
                            "(labkit.memory.estimate.activations; each rule cites the modeling code)")
    sec.note(f"Attention path: {attention_path(m, train)} (fused: flash/cuDNN/memory-efficient; math keeps the "
             "(batch, heads, s, s) probabilities). The whole corpus: `python benchmarks/bench_estimate.py --validate`.")
    return sec


#: one model (the Llama-style model of data/scripts/ranks/) under each layout: (layout, launch name)
LAYOUTS = (("DDP, bf16 autocast", "ddp-llama-w2"), ("FSDP2 (ZeRO-3), bf16 policy", "fsdp2-llama-mp-w2"),
           ("FSDP2 (ZeRO-3), bf16 policy", "fsdp2-llama-mp-w8"),
           ("FSDP2 (ZeRO-3), bf16 policy, checkpointing", "fsdp2-llama-mp-ckpt-w8"),
           ("TP (DTensor), bf16 autocast", "tp-llama-w2"), ("TP (DTensor), bf16 autocast", "tp-llama-w4"),
           ("PP, GPipe, 4 micro-batches: stage 0 (another model*)", "pp-gpipe-w2-r0"),
           ("PP, GPipe, 4 micro-batches: stage 1 (another model*)", "pp-gpipe-w2-r1"),
           ("PP, 1F1B, 4 micro-batches: stage 0 (another model*)", "pp-1f1b-w2-r0"),
           ("PP, 1F1B, 4 micro-batches: stage 1 (another model*)", "pp-1f1b-w2-r1"))


def layouts_traced(smoke: bool = False) -> Section:
    """One model's per-GPU peak under DDP, FSDP2 and TP, and both stages of a pipeline: rank 0 (each stage's
    rank for PP) of each torchrun launch traced here on a fake process group (``smoke``: not traced, the H200's
    recording where there is one), the estimator beside it (:func:`labkit.memory.estimate.accuracy.check_ranks`)."""
    rows = {r.name: r for r in check_ranks([n for _, n in LAYOUTS], trace=not smoke)}
    table, errs = [], []
    for layout, name in LAYOUTS:
        r = rows[name]
        ref, src = (r.traced, "traced here") if r.traced else (r.recorded, "recorded on the H200") if r.recorded \
            else (None, "traced in the full profile")
        if r.trace_error:
            src += " (tracing here failed: below)"
        err = None if not ref else (r.estimated / ref - 1) * 100
        if err is not None:
            errs.append(abs(err))
        world = name.rsplit("-w", 1)[1].split("-")[0]
        table.append([layout, world, fmt_bytes(ref) if ref else "-", src, fmt_bytes(r.estimated),
                      "-" if err is None else f"{err:+.1f}%"])
    m, _, _ = rank_case_inputs("ranks/ddp_llama.py", [], 1)
    sec = Section(f"One model, every layout: a rank traced, the estimator beside it ({m.name}, "
                  f"{total_params(m) / 1e9:.2f}e9 parameters, batch 4 x 2048)",
                  source="traced: model (labkit measure --script S --nproc-per-node N: rank 0 on a fake process "
                         "group, validated against the H200's recordings of rank 0 within 0.05%, "
                         "benchmarks/bench_script.py --ranks); recorded: " + str(RANK_RECORDING.name)
                         + " (1 x NVIDIA H200, fake process group); estimator: " + MODEL)
    sec.claim("Launches compared", len(errs), "launches")
    if errs:
        sec.claim("Estimator's largest difference from the traced rank", round(max(errs), 1), "%", digits=1,
                  name=None if smoke else "estimator_vs_traced_ranks_max_abs_pct", direction="lower",
                  tolerance=3.0, source="model: the estimator vs " + ("the H200 recordings" if smoke else "ranks traced here"))
    sec.table(["layout", "world", "the rank's peak allocated", "from", "estimator", "estimator vs the rank"], table,
              caption="Peak allocated (torch.cuda.max_memory_allocated), GiB = 2^30 bytes. *PP: "
                      "data/scripts/ranks/pp_gpipe.py, a GPT-style fp32 model (8 blocks of width 1024, batch 16 x "
                      "1024) cut in two stages with torch.distributed.pipelining. Outside the allocator a real run "
                      "holds the CUDA context and NCCL's buffers besides (labkit measure --script reports them per "
                      "rank, as a model).")
    for layout, name in LAYOUTS:
        if rows[name].trace_error:
            sec.note(f"{layout} ({name}): fake mode could not trace this rank here: {rows[name].trace_error}")
    return sec.note("DDP keeps a full copy of everything on each GPU: its gradients live in the reducer's buckets "
                    "(gradient_as_bucket_view), so adding GPUs frees nothing. FSDP2 shards the fp32 parameters, "
                    "gradients and Adam states over the ranks, but the activations, the float32 logits and the "
                    "gathered units (the root's embeddings and head, one or two blocks, a block's gradients and "
                    "their reduce-scatter input) stay whole: from 2 to 8 GPUs the peak falls much less than 4x. "
                    "TP splits the layers' weights and their inner activations, but not the replicated embeddings, "
                    "head, logits, norms and residual stream, nor the 16-bit copy of a norm's output that each of "
                    "q, k, v, gate and up makes under autocast. The estimator follows FSDP2's gather-and-free order from "
                    "its source (labkit.memory.estimate.buffers) and autocast's one-copy-per-linear rule "
                    "(labkit.memory.estimate.activations). A pipeline's stages differ: the first holds the embedding "
                    "and the activations of every micro-batch in flight (all of them under GPipe, as many as "
                    "stages under 1F1B), the last the head and, under torch.distributed.pipelining, the logits of "
                    "every micro-batch of the step, kept to be merged into step()'s result.")


# -- data parallelism and sharding ----------------------------------------------------------------


def data_parallel(s: Setup) -> Section:
    """DDP keeps everything on every GPU; ZeRO 1/2/3 shard optimizer states, gradients, then weights."""
    train = TrainSpec(micro_batch=1, precision="bf16-mixed", recompute="selective")
    layouts = [(1, 0)] + [(dp, z) for dp in (2, 8) for z in (0, 1, 2, 3)]
    ests = {(dp, z): estimate(s.model, ParallelSpec(dp=dp, zero=z), dataclasses.replace(train, global_batch=dp))
            for dp, z in layouts}
    labels = [f"dp={dp} ZeRO-{z}" for dp, z in layouts]
    e1, e8, e8z3 = ests[(1, 0)], ests[(8, 0)], ests[(8, 3)]
    sec = Section("Data parallelism does not lower per-GPU memory", source="model")
    sec.claim("Per GPU with dp=8 (DDP) over dp=1: the buckets add, nothing shrinks", round(e8.total / e1.total, 3),
              "x", name="dp8_over_dp1_per_gpu", digits=3)
    sec.claim("Per GPU with dp=8 and ZeRO-3 (weights, gradients and states sharded)", round(e8z3.total / GiB, 2),
              "GiB", name="zero3_dp8_per_gpu_gib", digits=2)
    rows = []
    for (dp, z), lab in zip(layouts, labels):
        e = ests[(dp, z)]
        bwd = e.by_stage[0].phase_breakdown["backward"]
        rows.append([lab, fmt_bytes(e.model_states["total"]), fmt_bytes(bwd["activations"] + bwd["logits"]),
                     fmt_bytes(e.total), e.peak_phase, _fits(e.total, s)])
    sec.table(["layout", "weights+grads+optimizer", "activations+logits (backward)", "total per GPU", "peak phase",
               f"fits {s.gpu_memory_gib:g} GiB"], rows,
              caption=f"{MODEL}, bf16 weights with fp32 master and Adam states, micro-batch 1")
    return sec.figure(vm.stacked_bars(labels, [ests[k].per_gpu_bytes for k in layouts],
                                      title=f"{s.model.name}: per-GPU memory vs data parallelism", source="model",
                                      capacity_bytes=s.capacity))


def sharding(s: Setup, smoke: bool = False) -> Section:
    """Where ZeRO-3 pays: the share of the model states in the peak decides it, per model."""
    names = ["gpt2", "llama3-8b"] if smoke else ["gpt2", "llama3.2-1b", "llama3-8b", "llama2-13b"]
    t = TrainSpec(micro_batch=1, global_batch=8, precision="bf16-mixed", recompute="selective")
    rows = []
    for name in names:
        m = dataclasses.replace(get_preset(name), seq=min(s.model.seq, 4096))
        d0, d3 = estimate(m, ParallelSpec(dp=8, zero=0), t), estimate(m, ParallelSpec(dp=8, zero=3), t)
        verdict = ("ZeRO-3 needed" if d0.total > s.capacity >= d3.total else
                   "either" if d3.total <= s.capacity and d0.total <= s.capacity else
                   "ZeRO-3 only" if d3.total <= s.capacity else "neither fits")
        rows.append([name, f"{d0.model_states['total'] / d0.peak_allocated:.0%}", fmt_bytes(d0.total), fmt_bytes(d3.total),
                     f"{1 - d3.total / d0.total:.0%}", verdict])
    sec = Section("When sharding beats plain data parallelism", source="model")
    best = max(rows, key=lambda r: float(r[4].rstrip("%")))
    sec.claim(f"Largest saving of ZeRO-3 over DDP here ({best[0]}, model states {best[1]} of the DDP peak)",
              best[4])
    return sec.table(["model", "model states / peak (DDP)", "DDP per GPU", "ZeRO-3 per GPU", "saved",
                      f"on {s.gpu_memory_gib:g} GiB"], rows,
                     caption="model; dp=8, micro-batch 1, selective recompute, bf16 mixed precision")


# -- tensor and pipeline parallelism ---------------------------------------------------------------


def tensor_parallel(s: Setup) -> Section:
    """TP splits the weights and the activations inside the blocks; SP also splits the rest."""
    t = TrainSpec(micro_batch=2, global_batch=2, precision="bf16-mixed")
    layouts = [(1, False)] + [(tp, sp) for tp in (2, 4, 8) for sp in (False, True)]
    ests = [estimate(s.model, ParallelSpec(tp=tp, sp=sp), t) for tp, sp in layouts]
    labels = [f"tp={tp}{' +SP' if sp else ''}" for tp, sp in layouts]
    transient = t.micro_batch * s.model.seq * s.model.hidden * 2
    sec = Section("Tensor parallelism: split weights, and transient all-gathers", source="model")
    sec.claim("Per GPU with tp=8 and sequence parallelism", round(ests[-1].total / GiB, 2), "GiB",
              name="tp8_sp_per_gpu_gib", digits=2)
    sec.claim(f"One TP collective's output, s x b x h x 2 bytes (seq {s.model.seq}, micro-batch {t.micro_batch}, "
              f"hidden {s.model.hidden}), at every layer boundary in forward and backward", fmt_bytes(transient))
    sec.table(["layout", "weights", "activations", "comm buffers (incl. NCCL)", "total per GPU"],
              [[lab, fmt_bytes(e.per_gpu_bytes["params"]), fmt_bytes(e.per_gpu_bytes["activations"]),
                fmt_bytes(e.per_gpu_bytes["comm_buffers"]), fmt_bytes(e.total)] for lab, e in zip(labels, ests)],
              caption="model; micro-batch 2, no recompute; comm buffers include NCCL's own (assumed) and the TP transient")
    return sec.figure(vm.stacked_bars(labels, [e.per_gpu_bytes for e in ests], title=f"{s.model.name}: tensor parallelism",
                                      source="model", capacity_bytes=s.capacity))


def tp_recorded(directory: Path | None = None) -> Section:
    """Real 2-rank tensor-parallel steps (benchmarks/gpu/record_parallel_memory.py) beside the model."""
    sec = Section("Recorded: real tensor-parallel steps, per rank", source=MODEL)
    try:
        pcs = compare_parallel_dir(directory)
    except LabkitError as exc:
        return sec.note(f"No recording in this checkout ({exc}): run benchmarks/gpu/record_parallel_memory.py on a "
                        "GPU machine (its --smoke mode makes a fixture on a CPU).")
    src = pcs[0].source + " vs model"
    worst = max(pcs, key=lambda c: abs(c.error_pct))
    sec.claim(f"Largest deviation of the model ({worst.name})", round(abs(worst.error_pct), 2), "%",
              name="model_vs_tp_ranks_max_abs_error_pct", source=src, digits=2, direction="lower")
    by = {c.name.split(" (")[0]: c for c in pcs}
    single, tp = by.get("gpt2-124m single fp32"), by.get("gpt2-124m tp fp32")
    if single and tp:
        sec.claim("gpt2-124m fp32, batch 8: one rank alone peaks at", fmt_bytes(single.measured_peak), source=src)
        sec.claim("... and with tp=2 each rank peaks at (TP halves the blocks, not the embeddings, norm inputs "
                  "and full logits)", fmt_bytes(tp.measured_peak), source=src)
        sec.claim("... of the single-rank peak", round(tp.measured_peak / single.measured_peak * 100), "%", source=src)
    sec.table(["configuration", "rank peaks (measured)", "model", "model - measured", "phase (measured / model)"],
              [[c.name, ", ".join(fmt_bytes(p) for p in c.per_rank_peaks), fmt_bytes(c.model_peak),
                f"{c.error_pct:+.1f}%", f"{c.measured_phase} / {c.model_phase}"] for c in pcs],
              caption=f"measured: {pcs[0].source} (data/measurements/parallel_memory/); model: labkit.memory.estimate")
    return sec.figure(vm.model_vs_measured([c.name for c in pcs], [c.model_peak for c in pcs],
                                           [c.measured_peak for c in pcs],
                                           title="Tensor parallelism, 2 ranks: model vs measured", source=src))


def pipeline(s: Setup) -> Section:
    """1F1B, interleaved and GPipe: micro-batches in flight per stage, and the first stage's load."""
    base = dict(tp=2, pp=4, sp=True)
    t = TrainSpec(micro_batch=1, global_batch=16, precision="bf16-mixed")
    schedules = {"1F1B": ParallelSpec(**base), "interleaved v=2": ParallelSpec(**base, vpp=2, schedule="interleaved"),
                 "GPipe": ParallelSpec(**base, schedule="gpipe")}
    ests = {name: estimate(s.model, par, t) for name, par in schedules.items()}
    e = ests["1F1B"]
    first, last = e.by_stage[0].per_gpu_bytes["activations"], max(1, e.by_stage[-1].per_gpu_bytes["activations"])
    sec = Section("Pipeline parallelism: micro-batches in flight", source="model")
    sec.claim("1F1B: the first stage's activations over the last stage's", round(first / last, 2), "x",
              name="pp4_1f1b_stage0_over_last", digits=2)
    sec.claim("GPipe over 1F1B, most loaded GPU", round(ests["GPipe"].total / e.total, 2), "x", digits=2)
    sec.table(["schedule", "in flight per stage", "activations per stage", "most loaded stage", "its total"],
              [[name, ", ".join(f"{st.in_flight:.2f}" for st in x.by_stage),
                ", ".join(fmt_bytes(st.per_gpu_bytes["activations"]) for st in x.by_stage), x.most_loaded_stage,
                fmt_bytes(x.total)] for name, x in ests.items()],
              caption="model; tp=2 +SP, pp=4, 16 micro-batches of 1")
    return sec.figure(vm.stage_bars(e, title=f"{s.model.name}, tp=2 +SP, pp=4, 1F1B, 16 micro-batches",
                                    capacity_bytes=s.capacity))


def recompute_precision(s: Setup) -> Section:
    """Recomputation and precision on tp=2 +SP: activations at the backward peak and where the peak moves."""
    rows, totals = [], {}
    for prec in ("fp32", "amp-bf16", "bf16-mixed"):
        for rc in ("none", "selective", "full"):
            e = estimate(s.model, ParallelSpec(tp=2, sp=True),
                         TrainSpec(micro_batch=2, global_batch=2, precision=prec, recompute=rc))
            totals[(prec, rc)] = e.total
            rows.append([prec, rc, fmt_bytes(e.by_stage[0].phase_breakdown["backward"]["activations"]),
                         fmt_bytes(e.by_stage[0].phases["backward"]), fmt_bytes(e.total), e.peak_phase])
    sec = Section("Recomputation and precision: spending compute to save memory", source="model")
    sec.claim("bf16-mixed: full recomputation's total per GPU over none's",
              round(totals[("bf16-mixed", "full")] / totals[("bf16-mixed", "none")], 2), "x", digits=2)
    return sec.table(["precision", "recompute", "activations at the backward peak", "allocated at the backward peak",
                      "total per GPU (at its peak)", "peak phase"], rows, caption="model; tp=2 +SP, micro-batch 2")


# -- the explorer and the planner ------------------------------------------------------------------


def explorer(s: Setup, model_name: str) -> Section:
    """The widgets (interactive in JupyterLab) and the default layout's figure as the static result."""
    e = estimate(s.model, ParallelSpec(tp=2, pp=2, dp=2, zero=1, sp=True),
                 TrainSpec(micro_batch=1, global_batch=16, precision="bf16-mixed", recompute="selective"))
    sec = Section("Explore", source="model")
    sec.claim("Most loaded GPU, static default (tp=2 +SP, pp=2, dp=2, ZeRO-1)", fmt_bytes(e.total))
    sec.note("Pick a preset (its dimensions fill the boxes) or edit a dimension: the bars redraw. "
             "The dashed line is the memory per GPU set above.")
    sec.figure(vm.stage_bars(e, title=f"{s.model.name}: tp=2 +SP, pp=2, dp=2, ZeRO-1 (static)", capacity_bytes=s.capacity))
    return sec.widget(vm.explorer({"preset": model_name, "seq": s.model.seq}, capacity_bytes=s.capacity))


def planner(s: Setup, planner_model: str, nodes: int, topology_sample: str, global_batch: int) -> Section:
    """The planner's ranked layouts for a cluster of nodes shaped like a topology sample."""
    cl = cluster_from_topology(topology_sample, nodes=nodes, gpu_memory_bytes=s.capacity)
    pm = get_preset(planner_model)
    gb = max(global_batch, cl.gpus)
    # the compute rate `labkit estimate --plan` and `labkit advise` charge (one rate for one GPU)
    p = plan(pm, cl, gb, precision="bf16-mixed", rate=measured_rates(pm, "bf16-mixed", pm.seq))
    src = f"model; sample: {topology_sample}"
    sec = Section(f"The planner's answer: {pm.name} on {cl.gpus} GPUs ({nodes} x {topology_sample})", source=src)
    sec.claim(f"Layouts considered (global batch {gb}, {s.gpu_memory_gib:g} GiB per GPU)", p.considered)
    sec.claim("Layouts that fit with a 10% margin", p.fitting)
    if p.best:
        sec.claim("Fastest layout that fits", p.best.label, name="planner_best_layout")
        sec.claim("Its step time (model)", round(p.best.step_time_s, 3), "s", name="planner_best_step_s", digits=3)
    else:
        sec.note(f"No layout of {pm.name} fits: give it more GPUs or more memory per GPU.")
    sec.table(["the planner's reasons"], [[line] for line in explain(p, top=3)])
    return sec.note("Assumptions: " + "; ".join(p.assumptions))
