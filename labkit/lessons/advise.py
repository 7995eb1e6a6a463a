"""Notebook 06 (advise): one section per call, each a ``Section`` that displays itself."""

from __future__ import annotations

from labkit.advise import Job, MachineSource, ModelSource, advise, host_calibration, validate
from labkit.core.errors import LabkitError
from labkit.core.machine import probe
import statistics

from labkit.core.units import fmt_bytes, parse_bytes
from labkit.topology import load_sample
from labkit.viz.advise import explorer as make, layouts_figure
from labkit.viz.display import progress
from labkit.viz.section import Section


def advice(adv, *, title: str | None = None) -> Section:
    """The advice for one job on one machine: the layout and its numbers, the settings, the launch
    line, why the runners-up lost, and the evidence with the source of each number."""
    sec = Section(title or f"Advice: {adv.model} on {adv.machine}", source="model")
    if not adv.fits:
        sec.claim("No layout fits; the smallest cluster of these GPUs that would", adv.smallest_fitting_gpus or "none",
                  "GPUs", name="advise_smallest_fitting_gpus")
        sec.note(f"What dominates: {adv.dominant}")
        sec.table(["why not"], [[w] for w in adv.why_not])
        return sec
    lay = adv.layout
    label = (f"tp={lay['tp']}{'+SP' if lay['sp'] else ''} pp={lay['pp']} dp={lay['dp']} ZeRO-{lay['zero']}, "
             f"micro-batch {lay['micro_batch']}, recompute {lay['recompute']}")
    sec.claim(f"Fastest layout that fits ({label}): predicted step time", round(adv.step_time_s * 1e3, 1), "ms",
              name="advise_step_time_ms", direction="lower")
    sec.claim("Per-GPU peak allocated on the most loaded GPU", adv.peak_bytes, "bytes",
              name="advise_peak_bytes", direction="lower")
    sec.claim("Reserved by the caching allocator at that peak", adv.reserved_peak_bytes, "bytes")
    sec.claim("Memory usable per GPU after the margin", adv.usable_bytes, "bytes")
    sec.table(["setting", "value"], [
        ["CUDA_VISIBLE_DEVICES", adv.placement.get("cuda_visible_devices")],
        ["placement", adv.placement.get("verdict")],
        ["PYTORCH_ALLOC_CONF", adv.alloc_conf or "(default)"],
        ["DDP bucket_cap_mb", adv.bucket_cap_mb if adv.bucket_cap_mb else "(no DDP buckets)"],
        ["launch", adv.command],
    ] + [[f"runner-up / rejected {i + 1}", w] for i, w in enumerate(adv.why_not[:6])]
      + [[f"evidence: {e.what}", f"{e.value} {e.unit} ({e.source})".strip()] for e in adv.evidence])
    for n in adv.notes:
        sec.note(n)
    return sec


def step_time_check(checks, gpu: dict[str, float] | None = None, host_scale: float | None = None,
                    runs: dict[str, list[float]] | None = None) -> Section:
    """Predicted against recorded single-GPU step times, reference and held-out cases apart; with
    ``gpu`` (case -> the H200's kernel time back to back) the GPU side of the model alone too, and with
    ``runs`` (case -> its step time in every recording) how much the recordings disagree."""
    gpu, runs = gpu or {}, runs or {}
    sec = Section("Step time: advise's op-by-op model against the H200's plain loops",
                  source="recorded on 1 x NVIDIA H200 (plain loops; GPU time: the kernels back to back, "
                         "record_host.py) vs model")
    if not checks:
        return sec.note("No recorded step times under data/measurements/measure/: run "
                        "benchmarks/gpu/record_plain.py on a GPU")
    for split in ("reference", "held-out"):
        errs = [abs(c.rel_error) for c in checks if c.split == split]
        if errs:
            sec.claim(f"Median |error| on {len(errs)} {split} case(s)", round(100 * statistics.median(errs), 1), "%",
                      name=f"advise_step_time_median_error_{split.replace('-', '_')}", direction="lower")
            sec.claim(f"Worst |error| on the {split} cases", round(100 * max(errs), 1), "%")
            sec.claim(f"{split.capitalize()} cases predicted within 20%", sum(e <= 0.20 for e in errs),
                      f"of {len(errs)}")
    gerrs = [abs(c.gpu_busy_s / gpu[c.name] - 1) for c in checks if gpu.get(c.name)]
    if gerrs:
        sec.claim(f"GPU time alone (kernels back to back): median |error| on {len(gerrs)} case(s)",
                  round(100 * statistics.median(gerrs), 1), "%", name="advise_gpu_time_median_error",
                  direction="lower")
    spread = [(max(runs[c.name]) / min(runs[c.name]) - 1, c.name) for c in checks if len(runs.get(c.name, [])) > 1]
    if spread:
        worst = max(spread)
        sec.claim(f"Widest spread of one loop's step time over its recordings ({worst[1]})", round(100 * worst[0], 1),
                  "%")
    if host_scale:
        sec.claim("Host cost scale: whole steps issued on the H200's host over their per-op microbenchmark price",
                  round(host_scale, 2), "x")
    sec.table(["case", "split", "H200 (ms)", "predicted (ms)", "error", "H200 GPU (ms)", "predicted GPU (ms)",
               "predicted host (ms)"],
              [[c.name, c.split, f"{c.measured_s * 1e3:.1f}", f"{c.predicted_s * 1e3:.1f}", f"{c.rel_error * 100:+.1f}%",
                f"{gpu[c.name] * 1e3:.1f}" if gpu.get(c.name) else "-", f"{c.gpu_busy_s * 1e3:.1f}",
                f"{c.host_s * 1e3:.1f}"] for c in checks])
    return sec


def live_advice(job, model, *, margin: float = 0.10) -> Section:
    """The advice for this machine (NVML and nvidia-smi topo -m); without a GPU, a stated gap."""
    m = probe()
    if not m.gpus:
        return Section("Advice for this machine", source="measured here").note(
            "No GPU here (NVML found none): the advice above is for the bundled topology. On a GPU server this "
            "section plans the same job for the live machine: `labkit advise --live ...`.")
    try:
        adv = advise(model, job, MachineSource(live=True, margin=margin))
    except LabkitError as exc:
        return Section("Advice for this machine", source="measured here").note(f"advise --live: {exc}")
    return advice(adv, title=f"Advice for this machine ({fmt_bytes(adv.usable_bytes)} usable per GPU)")


def layouts(adv) -> Section:
    """The advised layout's step time beside its runners-up (a figure)."""
    sec = Section("The advised layout and the runners-up", source="model")
    if adv.runners_up:
        slower = adv.runners_up[0]["step_time_s"] / (adv.ranking_step_time_s or adv.step_time_s) - 1
        sec.claim("The nearest runner-up is slower by", round(100 * slower, 1), "%")   # by the ranking's model
    return sec.figure(layouts_figure(adv))


def explorer(model, job, *, sample: str, gpu_memory: str, gpu_choices=(1, 2, 4, 8), initial: int = 8) -> Section:
    """Re-plan the same job on fewer or more GPUs of the sample's kind (one node, NVSwitch assumed
    past the sample's size is not done: counts above the sample's GPUs are left out)."""
    n = len(load_sample(sample).gpus)
    mem = parse_bytes(gpu_memory, what="gpu_memory")
    choices = [g for g in gpu_choices if g <= n] or [n]

    plans = {}

    def advise_for(g: int):  # each count planned once: the static table and the explorer share them
        if g not in plans:
            src = (MachineSource(sample=sample, gpu_memory_bytes=mem) if g == n
                   else MachineSource(gpus=g, gpu_memory_bytes=mem))
            plans[g] = advise(model, job, src, trace=False)
        return plans[g]

    sec = Section("Explorer: the same job on other GPU counts", source="model")
    rows = []
    for g in choices:
        adv = advise_for(g)
        lay = adv.layout or {}
        rows.append([g, "yes" if adv.fits else "no",
                     (f"tp={lay['tp']}{'+SP' if lay['sp'] else ''} pp={lay['pp']} dp={lay['dp']} ZeRO-{lay['zero']} "
                      f"mb={lay['micro_batch']} recompute={lay['recompute']}") if adv.fits else "-",
                     fmt_bytes(adv.peak_bytes) if adv.peak_bytes else "-",
                     f"{adv.step_time_s * 1e3:.1f}" if adv.fits and adv.step_time_s else "-"])
    sec.table(["GPUs", "fits", "layout", "per-GPU peak allocated", "step time ms"], rows,
              caption="Static result: the job re-planned on each GPU count the explorer offers (model)")
    sec.note(f"Counts below the sample's {n} GPUs assume identical GPUs on NVSwitch.")
    return sec.widget(make(advise_for, choices, initial if initial in choices else choices[-1]))


def plan(model: str, *, sample: str, gpu_memory: str, seq: int, global_batch: int, precision: str = "amp-bf16",
         hf_config: str = ""):
    """The notebook's job on a bundled topology (whose GPUs have ``gpu_memory``, e.g. "80GiB"):
    (advice, model source, job)."""
    src = ModelSource(hf_config=hf_config) if hf_config else ModelSource(preset=model)
    job = Job(seq=seq, global_batch=global_batch, precision=precision)
    mem = parse_bytes(gpu_memory, what="gpu_memory")
    return advise(src, job, MachineSource(sample=sample, gpu_memory_bytes=mem)), src, job


# Recorded decoder-LM cases whose step the notebook re-predicts (the cheapest first); smoke: the first two.
STEP_TIME_CASES = ("opt-b4-bf16", "gpt-neox-b4-bf16", "gpt2-b8-amp-bf16", "llama-gqa-b4-amp-bf16",
                   "mistral-b4-bf16", "phi3-b4-amp-bf16", "qwen2-b4-bf16", "gpt2-medium-b4-amp-bf16",
                   "falcon-b4-amp-bf16", "mistral-b4-amp-bf16", "llama-gqa-b4-bf16", "opt-b4-fp32",
                   "mixtral-b4-bf16")


def step_time_validation(smoke: bool) -> Section:
    """Re-predict recorded H200 steps op by op here (fake mode) and compare (a progress bar: ~10 s a case)."""
    try:
        rec = validate.recorded_step_times()
    except LabkitError as exc:
        return step_time_check([]).note(str(exc))
    names = [n for n in STEP_TIME_CASES if n in rec][: 1 if smoke else None]
    checks = [c for n in progress(names, "predicting recorded steps") for c in validate.check([n])]
    return step_time_check(checks, host_calibration.recorded_gpu_times(), host_calibration.host_scale(),
                           validate.recorded_runs())
