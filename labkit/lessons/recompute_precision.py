"""Notebook 04, recompute and precision: one function per section, each returning a Section.

The numbers come from ``labkit.memory`` (``measure_step`` on this machine or in fake mode, the sweeps,
the recorded H200 steps, the estimator); the figures from ``labkit.viz.trace``. Long runs show a
tqdm progress bar, one tick per policy or case.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit.core.errors import LabkitError
from labkit.core.machine import probe
from labkit.core.units import fmt_bytes
from labkit.memory import (ModelSpec, ParallelSpec, TrainSpec, load_recorded_peaks, measure_step, phase_snapshots,
                           predict_case, profiler_memory_timeline, read_profiler_timeline, recorded_label)
from labkit.memory.estimate import estimate
from labkit.memory.trace import corpus_check as cc
from labkit.memory.trace import moe_sweep
from labkit.memory.trace.recorded import load_recorded, measure_dir
from labkit.memory.trace.sweeps import fit_segments, recorded_sweep, run_sweep, segment_lengths
from labkit.viz import trace as vm
from labkit.viz.display import bar, busy, progress
from labkit.viz.section import Section, ShowsSection
from labkit.workloads import GPT, GPTConfig, StepPolicy, get_workload, gpt_batch, gpt_call, gpt_loss
from labkit.workloads.corpus import compat_cases, layer_count

GIB = 2**30
SMOKE_CASES = ("gpt-small-ref-fp32-none", "gpt-small-ref-amp-bf16-full", "hf-gpt2-b8-amp-bf16-none")


def _gpt_kw() -> dict:
    return {"loss_fn": gpt_loss, "call": gpt_call}


def _progress(items, desc: str):
    return progress(items, desc)


def _sweep(factory, batch, policies, *, device: str, desc: str, time_steps: int = 0):
    """run_sweep one policy at a time, with a progress bar (each policy is seconds to tens of seconds)."""
    return [run_sweep(factory, batch, [p], device=device, kw=_gpt_kw(), time_steps=time_steps)[0]
            for p in _progress(policies, desc)]


@dataclass
class Machine(ShowsSection):
    """This machine, where live steps run, and the recorded H200 cases."""

    hostname: str
    gpus: int
    gpu_name: str
    torch_version: str
    live: str                 # "cuda" or "cpu"
    asked: str
    recorded_source: str
    recorded_cases: int

    def section(self) -> Section:
        sec = Section("This machine", source="measured here")
        sec.claim(f"CUDA GPUs on {self.hostname}{' (' + self.gpu_name + ')' if self.gpu_name else ''}; torch "
                  f"{self.torch_version}", self.gpus)
        sec.claim("Live steps run on", self.live)
        sec.claim("Recorded steps of the H200 run", self.recorded_cases, source=self.recorded_source)
        if self.asked == "cuda" and self.live != "cuda":
            sec.note("device='cuda' was asked for, but torch sees no GPU here: live steps run on the CPU.")
        return sec


def this_machine(device: str = "auto") -> Machine:
    if device not in ("auto", "cuda", "cpu"):
        raise LabkitError(f"device {device!r}: use auto, cuda or cpu")
    m = probe()
    live = "cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    cases = load_recorded_peaks()
    return Machine(m.hostname, len(m.gpus), m.gpu_name or "", m.torch_version, live, device,
                   recorded_label(cases[0].provenance), len(cases))


# -- where a step's memory goes ------------------------------------------------------------------------------

def step_phases_recorded(workload: str = "gpt2-124m") -> Section:
    """The recorded steady-state step of the workload under amp-bf16, phase by phase."""
    name = f"{workload}-amp-bf16-none"
    try:
        doc = load_recorded(f"case_{name}.json", "measure_step")
    except LabkitError as exc:
        return Section(f"{name}: one steady-state step").note(
            f"Not recorded here: {exc} (run benchmarks/gpu/record_measure.py on a GPU).")
    src = recorded_label(doc["provenance"])
    phases = doc["data"]["by_phase"]
    top = max(phases, key=lambda p: p["peak_bytes"])
    sec = Section(f"{name}: one steady-state step", source=src)
    sec.claim(f"Peak allocated, in phase '{top['phase']}'", round(doc["data"]["peak_allocated"] / GIB, 3), "GiB",
              name=f"{name}_peak_allocated_gib")
    for cat, v in top["peak_by_category"].items():
        if v:
            sec.claim(f"... of which {cat.replace('_', ' ')}", v, "bytes")
    sec.figure(vm.phase_timeline(phases, title=f"{name}: one steady-state step", source=src))
    return sec


def step_phases_here(machine: Machine, *, smoke: bool = False, workload: str = "gpt2-124m") -> Section:
    """The same kind of step measured here: tiny on a CPU in smoke mode, the workload itself on a GPU."""
    wl = get_workload("tiny" if smoke else ("gpt-small-ref" if machine.live == "cpu" else workload))
    with busy(f"{wl.name} fp32 on {machine.live}: two steps"):
        rep = measure_step(lambda: GPT(wl.config), gpt_batch(wl.config, wl.batch_size), StepPolicy(precision="fp32"),
                           device=machine.live, **_gpt_kw())
    sec = Section(f"{wl.name} fp32 on {machine.live}, steps 1 and 2", source="measured here")
    sec.claim(f"Peak, in phase '{rep.peak_phase}'", rep.peak_bytes, "bytes")
    sec.figure(vm.phase_timeline(rep.all_phases, title=f"{wl.name} fp32 on {machine.live}, steps 1 and 2",
                                 source="measured here"))
    sec.note("Step 1 has no optimizer state yet; step 2 is the steady state the peak refers to.")
    return sec


# -- recompute granularity -------------------------------------------------------------------------------------

def _sweep_table(sec: Section, pts) -> None:
    base = pts[0]
    sec.table(["recompute", "peak", "peak minus model states", "peak phase", "step ms", "vs none"],
              [(p.label, fmt_bytes(p.peak_bytes), fmt_bytes(p.beyond_states_bytes), p.peak_phase,
                "-" if p.step_time_s is None else f"{p.step_time_s * 1e3:.1f}",
                "-" if not (p.step_time_s and base.step_time_s) else
                f"{100 * (p.step_time_s - base.step_time_s) / base.step_time_s:+.0f}%") for p in pts])


def _full_claims(sec: Section, pts, kind: str | None) -> None:
    base = pts[0]
    full = next((p for p in pts if p.recompute == "full"), None)
    if full is None:
        return
    sec.claim(f"Full recompute lowers the peak ({fmt_bytes(base.peak_bytes)} -> {fmt_bytes(full.peak_bytes)}) by",
              round(100 * (1 - full.peak_bytes / base.peak_bytes), 2), "%",
              name="full_checkpointing_peak_saving_pct" if kind == "recorded" else None)
    if full.step_time_s and base.step_time_s:
        sec.claim("... and costs in step time", round(100 * (full.step_time_s - base.step_time_s) / base.step_time_s, 2),
                  "%", name="full_checkpointing_step_overhead_pct" if kind == "recorded" else None)


def recompute_sweep_recorded() -> Section:
    """The recorded H200 sweep of the reference workload: peak and step time per recompute policy."""
    try:
        doc = load_recorded("sweep_checkpointing.json", "measure_sweep")
    except LabkitError as exc:
        return Section("Recompute granularity, recorded").note(f"Not recorded here: {exc}.")
    src = recorded_label(doc["provenance"])
    pts = recorded_sweep(doc)
    title = f"{doc['data']['workload']} amp-bf16, recompute policies"
    sec = Section(title, source=src)
    _full_claims(sec, pts, "recorded")
    _sweep_table(sec, pts)
    sec.figure(vm.sweep_bars([p.label for p in pts], [p.peak_bytes for p in pts], [p.step_time_s for p in pts],
                             title=doc["data"]["workload"], source=src))
    return sec


def recompute_sweep_here(machine: Machine, *, smoke: bool = False, workload: str = "gpt2-124m") -> Section:
    """The granularity sweep on this machine: the workload on a GPU, a small GPT in float32 on a CPU."""
    if machine.live == "cuda" and not smoke:
        w = get_workload(workload)
        cfg, batch, prec = w.config, w.batch_size, "amp-bf16"
    else:  # CPU bf16 matmuls are slow and CPU autocast is not CUDA's: float32 on a CPU
        cfg, batch, prec = GPTConfig(n_layer=4, n_head=2, n_embd=64, seq_len=64, vocab_size=256), 4, "fp32"
    pols = [(prec, "none"), (prec, "selective"), (prec, "full")] + [(prec, f"every-{k}") for k in (2, 3) if k < cfg.n_layer]
    pts = _sweep(lambda: GPT(cfg), gpt_batch(cfg, batch), pols, device=machine.live, time_steps=1 if smoke else 5,
                 desc=f"recompute sweep on {machine.live}")
    title = f"{cfg.n_layer}-layer GPT, {prec} on {machine.live}"
    sec = Section(title, source="measured here")
    _full_claims(sec, pts, None)
    _sweep_table(sec, pts)
    sec.figure(vm.sweep_bars([p.label for p in pts], [p.peak_bytes for p in pts], [p.step_time_s for p in pts],
                             title=f"{cfg.n_layer}-layer GPT", source=f"measured here ({machine.live})"))
    if machine.live == "cpu":
        sec.note("CPU step times are noisy: read them as a direction, not a number.")
    return sec


def segment_sweep(deep_layers: int = 24, *, smoke: bool = False) -> Section:
    """Memory beyond the model states against the segment length K, predicted for an H200 in fake mode,
    and the segment model ``(L/K) input + K layer`` fitted to those points."""
    L = 4 if smoke else deep_layers
    deep = GPTConfig(n_layer=L, n_head=4 if smoke else 16, n_embd=128 if smoke else 1024, seq_len=128 if smoke else 2048,
                     vocab_size=512 if smoke else 8192)
    pols = [("amp-bf16", "none")] + [("amp-bf16", f"every-{k}") for k in segment_lengths(L)]
    pts = _sweep(lambda: GPT(deep), gpt_batch(deep, 2 if smoke else 4), pols, device="fake-cuda",
                 desc=f"{L}-layer GPT in fake mode")
    for p in pts:
        p.label = "none" if p.recompute == "none" else f"K={p.recompute.split('-')[1]}"
    src = "model: fake-mode prediction for an H200"
    best = min(pts[1:], key=lambda p: p.beyond_states_bytes)
    sec = Section(f"{L}-layer GPT: memory beyond the model states against K", source="model")
    sec.claim("No recompute", pts[0].beyond_states_bytes, "bytes")
    sec.claim("Every layer (K=1)", pts[1].beyond_states_bytes, "bytes")
    sec.claim(f"The best segment length ({fmt_bytes(best.beyond_states_bytes)})", int(best.recompute.split("-")[1]),
              "layers", name="deep_best_segment_k")
    fit = fit_segments(pts, L) if len(pts) >= 4 else None
    if fit is not None and fit.boundary > 0 and fit.layer > 0:
        sec.claim(f"The fit: a boundary keeps {fmt_bytes(fit.boundary)}, a layer being recomputed holds "
                  f"{fmt_bytes(fit.layer)} ({fit.layer / fit.boundary:.0f}x its input); K* = sqrt(L x input / layer), "
                  f"not sqrt(L) = {L ** 0.5:.1f}", round(fit.k_star, 2), "layers", name="deep_segment_k_star")
    else:
        sec.note("Too few or too small layers here for the segment-model fit.")
    sec.figure(vm.sweep_bars([p.label for p in pts], [p.beyond_states_bytes for p in pts], [None] * len(pts),
                             title=f"{L} layers, beyond model states", source=src))
    return sec


# -- precision -----------------------------------------------------------------------------------------------

def _precision_table(sec: Section, pts) -> None:
    sec.table(["precision", "peak", "parameters", "optimizer state", "activations", "step ms"],
              [(p.label, fmt_bytes(p.peak_bytes), fmt_bytes(p.by_category.get("parameters", 0)),
                fmt_bytes(p.by_category.get("optimizer_state", 0)), fmt_bytes(p.by_category.get("activations", 0)),
                "-" if p.step_time_s is None else f"{p.step_time_s * 1e3:.1f}") for p in pts])


def precision_recorded() -> Section:
    """The recorded precisions of the reference workload: what bf16 halves and what it does not."""
    try:
        doc = load_recorded("sweep_precision.json", "measure_sweep")
    except LabkitError as exc:
        return Section("Precision, recorded").note(f"Not recorded here: {exc}.")
    src = recorded_label(doc["provenance"])
    pts = recorded_sweep(doc)
    fp32 = next(p for p in pts if p.precision == "fp32")
    amp = next(p for p in pts if p.precision == "amp-bf16")
    b16 = next(p for p in pts if p.precision == "bf16")
    sec = Section(f"{doc['data']['workload']}: tensor storages at the peak, by precision", source=src)
    sec.claim("amp-bf16 keeps the float32 parameters", amp.by_category["parameters"], "bytes")
    sec.claim("... and the float32 AdamW state", amp.by_category.get("optimizer_state", 0), "bytes")
    sec.claim("amp-bf16 lowers the peak against fp32 by", round(100 * (1 - amp.peak_bytes / fp32.peak_bytes), 2), "%",
              name="amp_bf16_peak_saving_pct")
    sec.claim(f"Pure bf16 halves the parameters (fp32: {fmt_bytes(fp32.by_category['parameters'])})",
              b16.by_category["parameters"], "bytes")
    _precision_table(sec, pts)
    sec.figure(vm.category_bars([p.label for p in pts], [p.by_category for p in pts], title="by precision", source=src))
    return sec


def precision_here(machine: Machine, *, smoke: bool = False, workload: str = "gpt2-124m") -> Section:
    """The same precisions on this machine (a GPU: the workload; a CPU: a tiny model)."""
    w = get_workload(workload if machine.live == "cuda" and not smoke else "tiny")
    precs = ["fp32", "amp-bf16", "bf16"] + (["amp-fp16"] if machine.live == "cuda" else [])
    pts = _sweep(lambda: GPT(w.config), gpt_batch(w.config, w.batch_size), [(p, "none") for p in precs],
                 device=machine.live, time_steps=0 if smoke else 3, desc=f"precisions on {machine.live}")
    for p in pts:
        p.label = p.precision
    sec = Section(f"{w.name}: precisions on {machine.live}", source="measured here")
    sec.claim("fp32 parameters", pts[0].by_category.get("parameters", 0), "bytes")
    sec.claim("bf16 parameters", pts[2].by_category.get("parameters", 0), "bytes")
    _precision_table(sec, pts)
    if machine.live == "cpu":
        sec.note("On a CPU, autocast casts other ops than on a GPU.")
    return sec


# -- fake mode against the H200 --------------------------------------------------------------------------------

def _predictions(cases, desc: str):
    return [predict_case(c) for c in _progress(cases, desc)]


def _prediction_rows(preds) -> list[tuple]:
    return [(p.name, f"{p.recorded_peak / GIB:.3f}", f"{p.predicted_peak / GIB:.3f}", f"{p.error_pct:+.2f}%",
             "-" if p.reserved_error_pct is None else f"{p.reserved_error_pct:+.1f}%") for p in preds]


def fake_vs_recorded(*, validate_all: bool = True, smoke: bool = False, path: str | Path | None = None,
                     subset: tuple[str, ...] = SMOKE_CASES) -> Section:
    """Every recorded H200 step (or, in smoke mode or without ``validate_all``, the ``subset``) predicted
    in fake mode on this CPU."""
    cases = load_recorded_peaks(path)
    src = recorded_label(cases[0].provenance)
    chosen = cases if (validate_all and not smoke) else [c for c in cases if c.name in subset]
    preds = _predictions(chosen, "fake-mode predictions")
    worst = max(preds, key=lambda p: abs(p.error_pct))
    sec = Section("Fake mode on this CPU against the H200", source="model")
    sec.claim(f"Worst peak error over {len(preds)} recorded steps ({worst.name}: {fmt_bytes(worst.predicted_peak)} "
              f"predicted vs {fmt_bytes(worst.recorded_peak)})", round(abs(worst.error_pct), 3), "%",
              name="fake_vs_h200_worst_abs_error_pct", direction="lower")
    sec.claim("Recorded steps predicted", len(preds), "cases", name="fake_vs_h200_cases")
    sec.table(["case", "recorded peak GiB", "predicted GiB", "error", "reserved error"], _prediction_rows(preds),
              caption=f"recorded: {src}; predicted: model (fake mode on this machine)")
    sec.figure(vm.prediction_scatter([p.name for p in preds], [p.recorded_peak for p in preds],
                                     [p.predicted_peak for p in preds], title="fake-mode prediction vs H200 peak",
                                     source=f"model vs {src}"))
    if len(chosen) < len(cases):
        sec.note(f"{len(chosen)} of {len(cases)} recorded steps predicted (smoke mode or validate_all=False).")
    return sec


def heldout(*, smoke: bool = False, path: str | Path | None = None) -> Section:
    """Held-out steps, recorded after the fake mode was calibrated (a third of the set, never tuned on)."""
    title = "Held-out steps (recorded after calibration)"
    p = Path(path) if path is not None else measure_dir() / "heldout_peaks.json"
    if not p.exists():
        return Section(title).note(f"Not recorded here: {p.name} (run benchmarks/gpu/record_measure.py on a GPU).")
    held = load_recorded_peaks(p)
    chosen = [min(held, key=lambda c: c.peak_allocated)] if smoke else held  # smoke: the smallest
    preds = _predictions(chosen, "held-out predictions")
    worst = max(preds, key=lambda q: abs(q.error_pct))
    sec = Section(title, source="model")
    sec.claim(f"Worst held-out peak error ({worst.name})", round(abs(worst.error_pct), 3), "%",
              name="fake_vs_h200_heldout_worst_abs_error_pct", direction="lower")
    sec.table(["held-out case", "recorded GiB", "predicted GiB", "error", "reserved error"], _prediction_rows(preds),
              caption=f"recorded: {recorded_label(held[0].provenance)}; predicted: model")
    if smoke:
        sec.note(f"Smoke mode: 1 of {len(held)} held-out steps predicted.")
    return sec


# -- the estimator ------------------------------------------------------------------------------------------

def estimator_vs_recorded(workload: str = "gpt2-124m") -> Section:
    """The analytical estimator (formulas, no tensors) beside the recorded steps of the workload."""
    cases = {c.name: c for c in load_recorded_peaks()}
    w = get_workload(workload)
    spec = ModelSpec(layers=w.config.n_layer, hidden=w.config.n_embd, heads=w.config.n_head,
                     vocab=w.config.vocab_size, seq=w.config.seq_len, name=workload)
    rows, errs = [], []
    for prec in ("fp32", "amp-bf16"):
        for ck in ("none", "full"):
            c = cases.get(f"{workload}-{prec}-{ck}")
            if c is None:
                continue
            est = estimate(spec, ParallelSpec(), TrainSpec(micro_batch=w.batch_size, precision=prec, optimizer="adamw",
                                                           optimizer_impl="fused", recompute=ck, framework="pytorch"))
            err = 100 * (est.peak_allocated - c.peak_allocated) / c.peak_allocated
            errs.append(err)
            rows.append((f"{prec}, recompute {ck}", f"{c.peak_allocated / GIB:.2f}", f"{est.peak_allocated / GIB:.2f}",
                         f"{err:+.1f}%"))
    src = recorded_label(next(iter(cases.values())).provenance)
    sec = Section("The analytical estimator beside the measurement", source=f"model vs {src}")
    if not rows:
        return sec.note(f"Not recorded here: no recorded steps of {workload!r} (run benchmarks/gpu/record_measure.py).")
    sec.claim("Largest estimator error against the recorded peaks", round(max(abs(e) for e in errs), 2), "%")
    sec.table(["policy", "recorded peak GiB", "estimator GiB", "estimator error"], rows)
    return sec


# -- your own loop ------------------------------------------------------------------------------------------

def _small_loop(device: str):
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(device)
    x = torch.randn(64, 256, device=device)
    return net, x, torch.optim.AdamW(net.parameters())


def own_loop(machine: Machine, steps: int = 2) -> Section:
    """``phase_snapshots()`` around the phases of a small loop (the code the notebook shows)."""
    net, x, opt = _small_loop(machine.live)
    snaps = phase_snapshots(machine.live)
    snaps.track_existing(list(net.parameters()) + [x])
    for _ in range(steps):
        with snaps.phase("forward"):
            loss = net(x).square().mean()
        with snaps.phase("backward"):
            loss.backward()
        with snaps.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    sec = Section(f"phase_snapshots() on a small loop ({machine.live})", source="measured here")
    top = max(snaps.snapshots, key=lambda s: s.peak_allocated)
    sec.claim(f"The highest phase peak, in '{top.name}'", top.peak_allocated, "bytes")
    sec.table(["phase", "start", "peak", "end", "how"],
              [(s.name, fmt_bytes(s.start_allocated), fmt_bytes(s.peak_allocated), fmt_bytes(s.end_allocated), s.source)
               for s in snaps.snapshots])
    return sec


def tracer_overhead() -> Section:
    """What the storage tracker costs per step against an untraced step (recorded)."""
    try:
        ov = load_recorded("tracer_overhead.json", "measure_overhead")
    except LabkitError as exc:
        return Section("What tracing costs").note(f"Not recorded here: {exc}.")
    src = recorded_label(ov["provenance"])
    cases = ov["data"].get("cases", [ov["data"]])
    sec = Section("What tracing costs", source=src)
    for c in cases:
        sec.claim(f"Tracer overhead on {c['case']['name']} ({c['plain_median_s'] * 1e3:.1f} ms per step untraced, "
                  f"{c['traced_median_s'] * 1e3:.1f} ms traced)", round(c["overhead_pct"], 1), "%")
    sec.note("The storage tracker intercepts every op in Python; phase_snapshots() on a GPU only reads the "
             "allocator's statistics at phase boundaries, so it is the one to leave in a production loop.")
    return sec


def profiler_timeline(machine: Machine, steps: int = 2) -> Section:
    """The small loop under torch.profiler with memory profiling: its memory timeline by category."""
    net, x, opt = _small_loop(machine.live)

    def one_step() -> None:
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    dev = "cuda:0" if machine.live == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as d:
        tl = read_profiler_timeline(profiler_memory_timeline(one_step, Path(d) / "memory_timeline.json", device=dev,
                                                             steps=steps))
    sec = Section(f"torch.profiler memory timeline, {steps} steps ({dev})", source="measured here")
    sec.claim("The profiler's peak", tl.peak_bytes, "bytes")
    sec.figure(vm.profiler_timeline(tl.times_us, tl.by_category, title=f"torch.profiler memory timeline, {steps} steps",
                                    source="measured here"))
    return sec


# The cheapest cases of each kind, for the smoke profile (CI); the full profile runs them all.
SMOKE_SUPPORT = 4
SMOKE_VALIDATION = 2


def supported_models(*, smoke: bool = False) -> Section:
    """The compatibility corpus in fake mode here: what is predicted, what is refused and why."""
    cases = compat_cases()
    picked = cases[:SMOKE_SUPPORT] if smoke else cases
    sec = support_section(cc.support(_progress(picked, "corpus cases")))
    if smoke:
        sec.note(f"Smoke profile: the first {len(picked)} of {len(cases)} corpus cases; the full profile runs "
                 "all of them (README: 'Your model in fake mode' has the whole table).")
    return sec


def moe_routing(*, smoke: bool = False) -> Section:
    """A mixture-of-experts step under balanced and skewed routings, per experts implementation (fake mode)."""
    return routing_section(smoke=smoke)


def kv_cache_under_checkpointing() -> Section:
    """Recorded on the H200: the same torch.utils.checkpoint step with transformers' KV cache on (the default)
    and off (``use_cache=False``)."""
    pairs = cc.cache_pairs()
    sec = Section("The KV cache under activation checkpointing",
                  source=recorded_label(pairs[0][1].provenance) if pairs else None)
    if not pairs:
        return sec.note("No use_cache=False cases are recorded here.")
    rows = []
    for on, off in pairs:
        saved = on.peak_allocated - off.peak_allocated
        rows.append([on.case.describe(), fmt_bytes(on.peak_allocated),
                     fmt_bytes(off.peak_allocated), fmt_bytes(saved), f"{100 * saved / on.peak_allocated:.0f}%"])
    sec.table(["case (torch.utils.checkpoint)", "peak, use_cache on (default)", "use_cache=False", "saved", "saved %"],
              rows, caption="plain training loops on the H200, peak of steps 2-4 by torch.cuda.max_memory_allocated")
    on, off = max(pairs, key=lambda p: (p[0].peak_allocated - p[1].peak_allocated) / p[0].peak_allocated)
    sec.claim(f"Peak saved by use_cache=False on {on.case.describe()}",
              round(100 * (on.peak_allocated - off.peak_allocated) / on.peak_allocated), "%",
              name="kv_cache_saving_pct")
    return sec


def plain_loop_validation(*, smoke: bool = False, validate_all: bool = True, process: str = "fresh") -> Section:
    """Fake mode against the H200's plain, untraced training loops of the ``process`` recording (``fresh``: each
    case in its own new process, as a user runs it; ``in-process``: one after another), reference and held-out
    apart (``validate_all=False``: the transformers cases of at most 6 layers, those CI checks)."""
    records = cc.load_plain(process=process)
    if not validate_all and not smoke:
        records = [r for r in records if r.case.family == "transformers" and layer_count(r.case) <= 6]
    if smoke:  # the cheapest recorded cases, of both splits
        cheap = sorted((r for r in records if r.case.family == "transformers"), key=lambda r: layer_count(r.case))
        records = [r for s in ("reference", "held-out") for r in [c for c in cheap if c.split == s][:SMOKE_VALIDATION // 2]]
    sec = validation_section(_validated(records), process=process)
    if smoke:
        sec.note(f"Smoke profile: {len(records)} of the recorded cases; the full profile predicts every one "
                 "(benchmarks/bench_tracer.py --validate prints the same table, for both recordings).")
    return sec


def _validated(records: list) -> list:
    """:func:`cc.validate` with a progress bar, in as many processes as this machine gives (``cc.validation_jobs``:
    every recorded case in the full profile is minutes of one core)."""
    b = bar("recorded steps", len(records))
    try:
        out = []
        for v in cc.iter_validate(records, jobs=cc.validation_jobs(len(records))):
            out.append(v)
            b.update(1)
        return out
    finally:
        b.close()


def one_loop_two_processes() -> Section:
    """Recorded on the H200, no model: the corpus in fresh processes beside the same loops run one after
    another in one process (:func:`process_section`)."""
    return process_section()


# -- sections of the corpus checks and the MoE routing sweep (labkit.memory.trace) --------------------------------

def support_section(results: list[cc.Support] | None = None) -> Section:
    """The table of what fake mode supports (case, status, reason), for notebook 04."""
    results = results if results is not None else cc.support()
    by_name = {c.name: c for c in compat_cases()}
    sec = Section("What fake mode can predict: the model corpus", source="model: fake mode computed here (CI sizes)")
    n_ok = sum(r.status == "predicted" for r in results)
    sec.claim("Corpus cases fake mode predicts (the others are refused with the op and module named)",
              n_ok, f"of {len(results)}", name="fake_corpus_predicted", direction="higher")
    rows = []
    for r in results:
        c = by_name.get(r.case)
        rows.append([r.case.removesuffix("@tiny"), c.describe() if c else "", r.status, cc.short_reason(r.reason)])
    sec.table(["case", "what", "status", "reason"], rows,
              caption="Each case of labkit.workloads.corpus at CI size (2 layers, hidden 64) in fake mode.",
              failed=[r.status != "predicted" for r in results])
    if any(r.status == "unavailable" for r in results):
        sec.note("unavailable: a package the case needs (torchvision, peft) is not installed here.")
    return sec


def validation_section(vals: list[cc.Validation] | None = None, *, process: str = "fresh") -> Section:
    """Fake-mode peaks vs the recorded untraced H200 peaks of the ``process`` recording, reference and
    held-out cases separately."""
    records = cc.load_plain(process=process)
    vals = vals if vals is not None else cc.validate(records)
    label = recorded_label(records[0].provenance) if records else "not recorded"
    sec = Section(f"Fake mode against plain training loops on the H200 ({cc.PROCESS_WORDS[process]})", source=label)
    s = cc.summary(vals)
    tag = "" if process == "fresh" else "_in_process"
    for split in ("reference", "held-out"):
        d = s[split]
        sec.claim(f"{split} cases within {cc.PEAK_TOLERANCE_PCT:g}% (peak) and {cc.RESERVED_TOLERANCE_PCT:g}% "
                  "(reserved)",
                  d["within_targets"], f"of {d['cases']}", source=f"model: fake mode computed here vs {label}",
                  name=f"fake_plain{tag}_{split.replace('-', '_')}_within", direction="higher")
        if d["median_abs_peak_error_pct"] is not None:
            sec.claim(f"{split}: median |peak error|", round(d["median_abs_peak_error_pct"], 2), "%",
                      source=f"model: fake mode computed here vs {label}")
        misses = d["cases"] - d["within_targets"]
        if d["within_placement_range"]:
            sec.claim(f"{split} misses whose recorded reserved bytes lie within {cc.PLACEMENT_ORDERS} segment-address "
                      "orders' range (a warm process: its history placed the segments)", d["within_placement_range"],
                      f"of {misses}", source=f"model: fake mode computed here vs {label}")
    sec.table(cc.VALIDATION_HEADERS, cc.validation_rows(vals),
              failed=[not v.within_targets for v in cc.validation_order(vals)],
              caption="Recorded: torch.cuda.max_memory_allocated / max_memory_reserved of steps 2-4 of a plain "
                      f"loop without labkit (benchmarks/gpu/record_plain.py), {cc.PROCESS_WORDS[process]}. Held-out "
                      "cases (a hash of the name) take no part in tuning fake mode.")
    return sec


def process_section(pairs: list[cc.ProcessPair] | None = None, *, rows: int = 8) -> Section:
    """Recorded, no model: the same loops in a fresh process and after other loops in one process. The
    allocated peak is the program's; the reserved peak also depends on which segments the process already
    holds and where the driver placed them (the caching allocator's best fit breaks ties by address)."""
    pairs = pairs if pairs is not None else cc.process_pairs()
    if not pairs:
        raise LabkitError("process_section: no corpus case is recorded both in a fresh process and in-process")
    label = pairs[0].source
    sec = Section("One loop, two processes: the allocated peak is the program's, reserved is the process's",
                  source=label)
    peak = max((p.peak_change_pct for p in pairs), key=abs)
    sec.claim("largest allocated-peak difference, in-process vs fresh", round(peak, 2), "%",
              source=f"{label}, {len(pairs)} cases")
    moved = [p for p in pairs if abs(p.reserved_change_pct) > cc.RESERVED_TOLERANCE_PCT]
    sec.claim(f"cases whose reserved peak differs by more than {cc.RESERVED_TOLERANCE_PCT:g}%", len(moved),
              f"of {len(pairs)}", source=label)
    top = sorted(pairs, key=lambda p: -abs(p.reserved_change_pct))[:rows]
    sec.table(["case", "split", "fresh peak GiB", "in-process peak GiB", "fresh reserved GiB",
               "in-process reserved GiB", "reserved change"],
              [[p.name, p.split, f"{p.fresh_peak / GIB:.2f}", f"{p.in_process_peak / GIB:.2f}",
                f"{p.fresh_reserved / GIB:.2f}", f"{p.in_process_reserved / GIB:.2f}",
                f"{p.reserved_change_pct:+.1f}%"] for p in top],
              caption=f"The {len(top)} cases whose reserved peak moved most (benchmarks/gpu/record_plain.py with "
                      "--fresh and without).")
    return sec


def routing_section(points: list[moe_sweep.RoutingPoint] | None = None, *, smoke: bool = False) -> Section:
    """Notebook 04: the peak of each experts implementation under balanced and skewed routings."""
    size: dict = dict(moe_sweep.SMOKE) if smoke else {}
    pts = points if points is not None else moe_sweep.routing_sweep(**size)
    base = {p.implementation: p.peak_bytes for p in pts if p.routing == "balanced"}
    src = "model: fake mode computed here (the routing is an assumption, not a measurement)"
    sec = Section("MoE routing: when the token distribution changes the peak", source=src)
    if "grouped_mm" in base:
        sec.claim("grouped_mm (transformers' default): peak spread over the routings",
                  moe_sweep.spread(pts, "grouped_mm"), "bytes", name="moe_grouped_mm_peak_spread_bytes")
    if "eager" in base:
        sec.claim("eager per-expert loop: peak spread over the routings", moe_sweep.spread(pts, "eager"), "bytes",
                  name="moe_eager_peak_spread_bytes")
    rows = []
    for p in pts:
        ref = base.get(p.implementation)
        change = "" if ref is None or p.routing == "balanced" else f"{(p.peak_bytes - ref) / ref * 100:+.2f}%"
        rows.append([p.implementation, p.routing, ", ".join(str(r) for r in p.rows), fmt_bytes(p.peak_bytes),
                     p.peak_phase, change])
    case = moe_sweep.moe_case("eager", **size)
    o = case.overrides
    sec.table(["experts implementation", "routing (shares by expert)", "rows per expert", "peak", "phase",
               "vs balanced"], rows,
              caption=f"Mixtral, {o['num_hidden_layers']} layer, {o['num_local_experts']} experts, top-"
                      f"{o['num_experts_per_tok']}, hidden {o['hidden_size']}, experts' width "
                      f"{o['intermediate_size']}, {case.micro_batch} x {case.seq} tokens, fp32; {src}")
    sec.note("grouped_mm and batched_mm run all tokens x top-k rows at once: the routing decides which rows go "
             "where, not how large the tensors are. The eager loop runs each expert on its own rows; autograd "
             "runs the experts' backward in reverse loop order, so the expert last in the loop adds its "
             "transients on top of everything the layer saved: its share moves the peak most, the same share "
             "on the first expert much less.")
    sec.note("Give your own distribution with labkit measure --moe-routing SHARES (measure_step(fake=FakeCuda(moe_routing=...))); "
             "the report names the routing it assumed and the modules that used it.")
    return sec
