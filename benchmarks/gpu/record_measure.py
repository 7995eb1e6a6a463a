"""Record real training-step memory peaks (and step times) on a GPU, for the tracer's chapter.

For each case it runs ``labkit.memory.measure_step(device="cuda")`` (the storage tracker,
cross-checked with ``torch.cuda.max_memory_allocated``/``memory_stats`` per phase) and writes one
JSON per case plus ``reference_peaks.json`` (all cases in one table, for the estimator). Each case
also stores what the CPU-side fake prediction needs (``fake_inputs``) so tests on a machine without
a GPU can compare fake-mode predictions with these peaks.

Then: the checkpointing-granularity and precision sweeps with step times (``sweep_*.json``), the
tracer's overhead on a real step (``tracer_overhead.json``) and per-op allocator logs for the fake
mode's calibration (``oplog_*.json.gz``).

    PYTHONPATH=. python3 benchmarks/gpu/record_measure.py --out DIR [--budget 170] [--smoke]

``--smoke`` runs tiny sizes (on the CPU and in fake mode when there is no GPU) to check the script.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from labkit.core.provenance import header, write_measurement
from labkit.memory.trace.step import Probes, measure_step
from labkit.workloads import GPT, get_workload
from labkit.workloads.gpt import GPTConfig
from labkit.core.vocab import OptimizerSpec
from labkit.workloads.harness import StepPolicy, TrainStep, gpt_batch, gpt_call, gpt_loss, move_batch

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def cleanup(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.reset_peak_memory_stats()


def gpt_case(name: str, cfg: GPTConfig, batch: int, precision: str, ckpt: str, optimizer: str = "adamw",
             impl: str = "fused") -> dict:
    return {"name": name, "model": "labkit-gpt", "config": cfg.__dict__.copy(), "batch": batch,
            "seq": cfg.seq_len, "precision": precision, "recompute": ckpt, "optimizer": optimizer,
            "optimizer_impl": impl, "num_params": cfg.num_params}


def hf_case(name: str, spec: Any, batch: int, seq: int, precision: str, ckpt: str, optimizer: str = "adamw",
            impl: str = "fused") -> dict:
    return {"name": name, "model": "hf-gpt2", "config": spec.as_dict(), "batch": batch, "seq": seq,
            "precision": precision, "recompute": ckpt, "optimizer": optimizer, "optimizer_impl": impl,
            "num_params": spec.num_params}


def case_optimizer(case: dict) -> OptimizerSpec:
    return OptimizerSpec(case["optimizer"], case["optimizer_impl"])


def case_inputs(case: dict) -> tuple[Any, Any, dict]:
    """(model factory, CPU batch, extra kwargs for measure_step) for a case description."""
    if case["model"] == "labkit-gpt":
        cfg = GPTConfig(**case["config"])
        return (lambda: GPT(cfg)), gpt_batch(cfg, case["batch"]), {"loss_fn": gpt_loss, "call": gpt_call}
    from labkit.workloads.hf import HFGPT2Spec, hf_gpt2_factory, hf_lm_batch

    spec = HFGPT2Spec(**case["config"])
    return hf_gpt2_factory(spec), hf_lm_batch(spec.vocab_size, case["batch"], case["seq"]), {}


def run_case(case: dict, device: str, out: Path, op_log: bool = False) -> dict | None:
    cuda = device == "cuda"
    cleanup(cuda)
    factory, batch, kw = case_inputs(case)
    t = time.perf_counter()
    try:
        rep = measure_step(factory, batch,
                           StepPolicy(precision=case["precision"], optimizer=case_optimizer(case), recompute=case["recompute"]),
                           device=device, steps=2, probes=Probes(op_log=op_log), **kw)
    except torch.cuda.OutOfMemoryError as exc:  # type: ignore[attr-defined]
        log(f"  {case['name']}: out of memory ({str(exc).splitlines()[0]}), skipped")
        cleanup(cuda)
        return None
    row = dict(case)
    row.update({
        "device": device,
        "peak_allocated": rep.cuda["steady_peak_allocated"] if rep.cuda else rep.peak_bytes,
        "peak_reserved": rep.cuda["reserved_peak"] if rep.cuda else None,
        "tracker_peak": rep.storage_peak_bytes,
        "tracker_peak_phase": max(rep.by_phase, key=lambda p: p.storage_peak_bytes).phase,
        "phase_peaks_allocated": (rep.cuda["steady_phase_peaks"] if rep.cuda else rep.phase_peaks),
        "phase_peaks_tracker": {p.phase: p.storage_peak_bytes for p in rep.by_phase},
        "by_category": rep.by_category,
        "init_allocated": rep.cuda["init_allocated"] if rep.cuda else rep.init_bytes,
        "cuda": rep.cuda,
        "by_phase": rep.by_phase,
        "fake_inputs": {"model": case["model"], "config": case["config"], "batch": case["batch"], "seq": case["seq"],
                        "precision": case["precision"], "recompute": case["recompute"],
                        "optimizer": case["optimizer"], "optimizer_impl": case["optimizer_impl"], "steps": 2},
        "wall_s": time.perf_counter() - t,
    })
    if op_log:
        ops = [r.__dict__ for r in getattr(rep, "op_log", []) if not r.name.startswith("prim.")]
        with gzip.open(out / f"oplog_{case['name']}.json.gz", "wt") as f:
            json.dump({"case": case, "ops": ops}, f)
        row["op_log_file"] = f"oplog_{case['name']}.json.gz"
    del rep
    cleanup(cuda)
    return row


def time_steps(case: dict, device: str, n: int = 6) -> dict:
    """Median step time without the tracker, and the allocator's peak over the timed steps."""
    cuda = device == "cuda"
    cleanup(cuda)
    factory, batch, kw = case_inputs(case)
    with torch.device(device):
        model = factory()
    b = move_batch(batch, lambda x: x.to(device))
    policy = StepPolicy(precision=case["precision"], optimizer=case_optimizer(case), recompute=case["recompute"])
    step = TrainStep(model, b, policy=policy, device_type=device, loss_fn=kw.get("loss_fn"), call=kw.get("call"),
                     fused=None if cuda else False)
    step.run()
    step.run()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step.run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    del step, model, b
    cleanup(cuda)
    return {"median_s": statistics.median(times), "times_s": times, "peak_allocated": peak}


def tracer_overhead(case: dict, device: str, n: int = 6) -> dict:
    plain = time_steps(case, device, n)
    factory, batch, kw = case_inputs(case)
    cleanup(device == "cuda")
    rep = measure_step(factory, batch,
                       StepPolicy(precision=case["precision"], optimizer=case_optimizer(case), recompute=case["recompute"]),
                       device=device, steps=n + 2, probes=Probes(timing=True), **kw)
    traced = rep.step_time_s
    cleanup(device == "cuda")
    return {"case": case, "plain_median_s": plain["median_s"], "traced_median_s": traced,
            "overhead_pct": 100.0 * (traced - plain["median_s"]) / plain["median_s"] if traced else None}


def api_checks(out: Path, device: str, prov: dict, cli: bool = True) -> None:
    """phase_snapshots and profiler_memory_timeline on a small loop, and `labkit measure --json`, on this device."""
    import subprocess

    from labkit.memory.trace.phases import phase_snapshots, profiler_memory_timeline, read_profiler_timeline

    cleanup(device == "cuda")
    net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(device)
    x = torch.randn(256, 1024, device=device)
    opt = torch.optim.AdamW(net.parameters())
    snaps = phase_snapshots(device)
    for _ in range(2):
        with snaps.phase("forward"):
            loss = net(x).square().mean()
        with snaps.phase("backward"):
            loss.backward()
        with snaps.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    write_measurement(out / "api_phase_snapshots.json", "measure_api_snapshots",
                      {"device": device, "snapshots": snaps.snapshots, "peaks": snaps.peaks,
                       "params_bytes": sum(p.numel() * 4 for p in net.parameters())}, provenance=prov)
    log("phase_snapshots:\n" + snaps.table())

    def one():
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    dev = "cuda:0" if device == "cuda" else "cpu"
    p = profiler_memory_timeline(one, out / "api_profiler_timeline.json", device=dev, steps=2)
    tl = read_profiler_timeline(p)
    log(f"profiler timeline: {len(tl.times_us)} points, peak {tl.peak_bytes / 2**20:.1f} MiB")
    del net, x, opt
    cleanup(device == "cuda")
    if not cli:
        return
    wl = "gpt-small-ref" if device == "cuda" else "tiny"
    r = subprocess.run([sys.executable, "-m", "labkit", "measure", "--workload", wl, "--precision",
                        "amp-bf16", "--device", device, "--json"], capture_output=True, text=True, timeout=120)
    doc = {"returncode": r.returncode, "stderr_tail": r.stderr[-2000:]}
    if r.returncode == 0:
        doc["report"] = json.loads(r.stdout)
    write_measurement(out / "api_cli_measure.json", "measure_api_cli", doc, provenance=prov)
    log(f"labkit measure --device {device} --json: exit {r.returncode}"
        + (f", peak {doc['report']['peak_bytes'] / 2**20:.1f} MiB" if r.returncode == 0 else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget", type=float, default=170.0, help="seconds; later parts are skipped past it")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (runs on a CPU: device cpu, fake-cuda)")
    args = ap.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # the budget is this run's: main() may be called in a process that ran before (the tests)
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = "python3 benchmarks/gpu/record_measure.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    prov = header(cmd)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda:
        log("no CUDA GPU: recording on the CPU (smoke check only; these are not GPU numbers)")
    log(f"device {device}; torch {torch.__version__}")

    def budget_left(need: float) -> bool:
        left = args.budget - (time.perf_counter() - T0)
        return left > need

    # ---- cases ---------------------------------------------------------------------------------
    cases: list[dict] = []
    extra_cases: list[dict] = []
    heldout_cases: list[dict] = []
    if args.smoke:   # one case of each model, both precisions, both ends of recompute: the script's paths, not a sweep
        w = get_workload("tiny")
        for prec, ck in (("fp32", "none"), ("amp-bf16", "full")):
            cases.append(gpt_case(f"tiny-{prec}-{ck}", w.config, w.batch_size, prec, ck))
        from labkit.workloads.hf import HFGPT2Spec

        tiny_hf = HFGPT2Spec(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=512)
        cases.append(hf_case("hf-tiny-amp-bf16-none", tiny_hf, 2, 64, "amp-bf16", "none"))
    else:
        from labkit.workloads.hf import HFGPT2Spec

        # in order of priority (the budget guard skips from the end)
        for wname in ("gpt-small-ref", "gpt2-124m"):
            w = get_workload(wname)
            for prec in ("fp32", "amp-bf16"):
                for ck in ("none", "full"):
                    cases.append(gpt_case(f"{wname}-{prec}-{ck}", w.config, w.batch_size, prec, ck))
        for size, batch in (("gpt2", 8), ("gpt2-medium", 4)):
            spec = HFGPT2Spec.named(size)
            for prec in ("fp32", "amp-bf16"):
                for ck in ("none", "full"):
                    cases.append(hf_case(f"hf-{size}-b{batch}-{prec}-{ck}", spec, batch, 1024, prec, ck))
        w = get_workload("gpt2-350m")
        for prec in ("fp32", "amp-bf16"):
            for ck in ("none", "full"):
                extra_cases.append(gpt_case(f"gpt2-350m-{prec}-{ck}", w.config, w.batch_size, prec, ck))
        spec = HFGPT2Spec.named("gpt2-large")
        for prec in ("fp32", "amp-bf16"):
            for ck in ("none", "full"):
                extra_cases.append(hf_case(f"hf-gpt2-large-b4-{prec}-{ck}", spec, 4, 1024, prec, ck))
        w = get_workload("gpt-small-ref")
        for prec, ck in (("amp-fp16", "none"), ("bf16", "none"), ("amp-bf16", "selective"), ("amp-bf16", "every-2")):
            extra_cases.append(gpt_case(f"gpt-small-ref-{prec}-{ck}", w.config, w.batch_size, prec, ck))
        # held out (the fake mode was calibrated on the cases above): other shapes, optimizers, policies
        xl = HFGPT2Spec.named("gpt2-xl")
        for ck in ("none", "full"):
            heldout_cases.append(hf_case(f"hf-gpt2-xl-b4-amp-bf16-{ck}", xl, 4, 1024, "amp-bf16", ck))
        odd = GPTConfig(n_layer=8, n_head=8, n_embd=1024, seq_len=1000, vocab_size=32000)   # head_dim 128, T=1000
        for prec in ("fp32", "amp-bf16"):
            for ck in ("none", "selective"):
                heldout_cases.append(gpt_case(f"gpt-d128-t1000-{prec}-{ck}", odd, 6, prec, ck))
        for name, opt in (("adamw-foreach", "adamw"), ("sgd", "sgd")):
            heldout_cases.append(gpt_case(f"gpt-small-ref-fp32-none-{name}", w.config, w.batch_size, "fp32", "none",
                                          optimizer=opt, impl="foreach"))
        g2 = HFGPT2Spec.named("gpt2")
        for prec, ck in (("amp-fp16", "none"), ("amp-bf16", "every-3"), ("amp-bf16", "selective")):
            heldout_cases.append(hf_case(f"hf-gpt2-b8-{prec}-{ck}", g2, 8, 1024, prec, ck))
        w124 = get_workload("gpt2-124m")
        heldout_cases.append(gpt_case("gpt2-124m-bf16-full", w124.config, w124.batch_size, "bf16", "full"))

    table_rows: dict[str, list[dict]] = {}
    try:
        import transformers  # noqa: F401
        have_hf = True
    except ImportError:
        have_hf = False
        log("transformers not installed: Hugging Face cases skipped")
    def run_cases(todo: list[dict], table: str = "reference_peaks.json") -> None:
        rows = table_rows.setdefault(table, [])
        for case in todo:
            if case["model"] == "hf-gpt2" and not have_hf:
                continue
            if not budget_left(25):
                log(f"budget: skipping case {case['name']}")
                continue
            row = run_case(case, device, args.out)
            if row is None:
                continue
            rows.append(row)
            write_measurement(args.out / f"case_{case['name']}.json", "measure_step", row, provenance=prov)
            log(f"{case['name']}: peak allocated {row['peak_allocated'] / 2**20:.1f} MiB "
                f"(tracker {row['tracker_peak'] / 2**20:.1f} MiB, reserved "
                f"{(row['peak_reserved'] or 0) / 2**20:.1f} MiB) in {row['wall_s']:.1f}s")
        write_measurement(args.out / table, "measure_peaks",
                          {"device": device, "cases": [{k: v for k, v in r.items() if k not in ("by_phase",)}
                                                       for r in rows]},
                          provenance=prov)

    run_cases(cases)

    # ---- per-op allocator logs (calibration of the fake mode) ---------------------------------
    diag = [c for c in cases if c["name"] in (
        "gpt-small-ref-fp32-none", "gpt-small-ref-amp-bf16-none", "gpt-small-ref-amp-bf16-full",
        "hf-gpt2-b8-amp-bf16-none", "hf-gpt2-b8-fp32-none", "tiny-fp32-none", "tiny-amp-bf16-none")]
    for case in diag:
        if case["model"] == "hf-gpt2" and not have_hf:
            continue
        if not budget_left(40):
            log(f"budget: skipping op log of {case['name']}")
            continue
        run_case(case, device, args.out, op_log=True)
        log(f"op log of {case['name']} written")

    # ---- sweeps with step times ---------------------------------------------------------------
    wname = "tiny" if args.smoke else "gpt2-124m"
    w = get_workload(wname)
    L = w.config.n_layer
    ks = [k for k in (2, 3, 4, 6) if k < L] + [L]
    sweeps = {
        "checkpointing": [gpt_case(f"{wname}-amp-bf16-{ck}", w.config, w.batch_size, "amp-bf16", ck)
                          for ck in (["none", "selective", "full"] + [f"every-{k}" for k in ks])[:3 if args.smoke else None]],
        "precision": [gpt_case(f"{wname}-{p}-none", w.config, w.batch_size, p, "none")
                      for p in (("fp32", "bf16") if args.smoke else ("fp32", "amp-bf16", "amp-fp16", "bf16"))],
    }
    for sname, scases in sweeps.items():
        res = []
        for case in scases:
            if not budget_left(20):
                log(f"budget: skipping sweep point {case['name']}")
                continue
            if case["precision"] == "amp-fp16" and not cuda:
                log(f"{case['name']}: amp-fp16 needs a GPU here, skipped")
                continue
            row = run_case(case, device, args.out)
            if row is None:
                continue
            tm = time_steps(case, device, 2 if args.smoke else 6)
            row.update({"step_time_s": tm["median_s"], "step_times_s": tm["times_s"]})
            res.append({k: v for k, v in row.items() if k != "by_phase"} | {"by_phase": row["by_phase"]})
            log(f"sweep {sname} {case['name']}: peak {row['peak_allocated'] / 2**20:.1f} MiB, "
                f"step {tm['median_s'] * 1e3:.1f} ms")
        write_measurement(args.out / f"sweep_{sname}.json", "measure_sweep",
                          {"workload": wname, "sweep": sname, "device": device, "points": res}, provenance=prov)

    # ---- tracer overhead ----------------------------------------------------------------------
    overheads = []
    ov_cases = [gpt_case(f"{wname}-amp-bf16-none", w.config, w.batch_size, "amp-bf16", "none")]
    if not args.smoke and have_hf:
        from labkit.workloads.hf import HFGPT2Spec

        ov_cases.append(hf_case("hf-gpt2-medium-b4-amp-bf16-none", HFGPT2Spec.named("gpt2-medium"), 4, 1024,
                                "amp-bf16", "none"))
    for case in ov_cases:
        if not budget_left(20):
            log(f"budget: skipping the tracer overhead on {case['name']}")
            continue
        ov = tracer_overhead(case, device, 2 if args.smoke else 6)
        overheads.append(ov)
        log(f"tracer overhead on {case['name']}: plain {ov['plain_median_s'] * 1e3:.1f} ms, traced "
            f"{(ov['traced_median_s'] or 0) * 1e3:.1f} ms ({ov['overhead_pct']:.1f}%)")
    if overheads:
        write_measurement(args.out / "tracer_overhead.json", "measure_overhead",
                          dict(overheads[0], cases=overheads), provenance=prov)
    run_cases(extra_cases)
    # ---- held-out cases: recorded after the fake mode was calibrated, to test it out of sample ----
    run_cases(heldout_cases, "heldout_peaks.json")
    # ---- the user-facing tools on this device: phase_snapshots, the profiler timeline, the CLI ---------
    if budget_left(15):
        try:
            api_checks(args.out, device, prov, cli=not args.smoke)
        except Exception as exc:  # noqa: BLE001 - report and go on: the measurements above are written
            log(f"api checks failed: {type(exc).__name__}: {exc}")
    log("done")


if __name__ == "__main__":
    main()
