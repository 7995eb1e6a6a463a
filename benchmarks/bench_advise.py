"""Speed targets and the step-time check of `labkit advise` (issue 13).

    .venv/bin/python benchmarks/bench_advise.py              # speed: 70B on 64 GPUs (< 2 s), 7B HF config
                                                             # on 8 GPUs with the fake-mode trace (< 90 s)
    .venv/bin/python benchmarks/bench_advise.py --validate   # predicted vs recorded H200 step times
                                 [--only NAME ...] [--split reference|held-out]
    .venv/bin/python benchmarks/bench_advise.py --calibrate-host   # the host scale from the whole-step issues
    .venv/bin/python benchmarks/bench_advise.py --shrunk   # the shrunk steps (record_host.py --shrink) vs priced

Medians of --repeats runs, in one process, after a reproducibility header.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from labkit.core.provenance import format_header, header

LLAMA_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
            "max_position_embeddings": 4096}


def _time(fn, repeats: int) -> tuple[float, object]:
    ts, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def speed(repeats: int) -> int:
    import json
    import tempfile

    from labkit.advise import Job, MachineSource, ModelSource, advise

    ok = True
    t, adv = _time(lambda: advise(ModelSource(preset="llama2-70b"), Job(seq=4096, global_batch=512),
                                  MachineSource(gpus=64, gpu_memory_bytes=80 * 2**30), trace=False), repeats)
    print(f"70B (llama2-70b) on 64 x 80 GiB, seq 4096, global batch 512: median {t:.2f} s (target 2 s); "
          f"advice {adv.layout}")
    ok &= t < 2.0
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(LLAMA_7B, f)
    t, adv = _time(lambda: advise(ModelSource(hf_config=f.name), Job(seq=4096, global_batch=64, micro_batch=1,
                                                                   precision="bf16"),
                                  MachineSource(sample="h100_nv18_8gpu_dual_numa", gpu_memory_bytes=80 * 2**30),
                                  trace=True), max(1, repeats // 3))
    print(f"7B HF config on 8 GPUs with the fake-mode trace, seq 4096: median {t:.1f} s (target 90 s); "
          f"alloc_conf {adv.alloc_conf!r}")
    ok &= t < 90.0
    return 0 if ok else 1


def validate(only: list[str] | None = None, split: str | None = None) -> int:
    """Predicted step times against every H200 recording of the plain loops (the same predictions): run 1,
    which the pricing was built on and held out from (for cases added to the corpus later, run 2 comes
    first), run 2, and the median of all recordings (run 1, run 2 and the three host-split runs); and the
    predicted GPU time against the kernels' time recorded back to back (host_split__chunks400.json and
    __per_block.json, where no chunk outlasted its sleep)."""
    from labkit.advise.host_calibration import recorded_gpu_times
    from labkit.advise.validate import SECOND_RUN, check, recorded_runs, recorded_step_times
    from labkit.memory.trace.step import FakeModeUnsupported

    rec = recorded_step_times()
    run2 = recorded_step_times(SECOND_RUN)
    runs = recorded_runs()
    gpu = recorded_gpu_times()
    first = {**{n: SECOND_RUN for n in run2}, **{n: None for n in rec}}   # cases recorded after run 1: run 2 first
    todo = [n for n in sorted(first) if (not only or any(o in n for o in only))
            and (not split or (rec.get(n) or run2[n]).get("split") == split)]
    rows = []
    print(f"{'case':36s} {'split':9s} {'H200 ms':>8s} {'pred ms':>8s} {'error':>7s} {'run 2':>7s} {'median':>7s} {'runs':>4s}"
          f" {'gpu ms':>7s} {'H200 gpu':>8s} {'error':>7s} {'host ms':>7s} syncs")
    for name in todo:
        try:
            got = check([name]) if first[name] is None else check([name], path=first[name])
        except FakeModeUnsupported as exc:      # the installed transformers may not run a recorded case
            print(f"{name:36s} refused: {str(exc).splitlines()[0][:160]}", flush=True)
            continue
        if not got:
            continue
        r = got[0]
        m2 = run2.get(name, {}).get("median_step_s") if first[name] is None else None
        med = statistics.median(runs[name]) if runs.get(name) else None
        g = gpu.get(name)
        e = {"run2": r.predicted_s / m2 - 1 if m2 else None, "median": r.predicted_s / med - 1 if med else None,
             "gpu": r.gpu_busy_s / g - 1 if g else None}
        rows.append((r, e))
        pct = (lambda x: f"{x * 100:+6.1f}%" if x is not None else f"{'-':>7s}")
        print(f"{r.name:36s} {r.split:9s} {r.measured_s * 1e3:8.1f} {r.predicted_s * 1e3:8.1f} {r.rel_error * 100:+6.1f}% "
              f"{pct(e['run2'])} {pct(e['median'])} {len(runs.get(name, [])):4d} {r.gpu_busy_s * 1e3:7.1f} "
              + (f"{g * 1e3:8.1f}" if g else f"{'-':>8s}") + f" {pct(e['gpu'])} {r.host_s * 1e3:7.1f} {r.syncs:5d}",
              flush=True)
    for part in ("reference", "held-out"):
        for label, errs in (("first recording: run 1, or run 2 for the cases added since", [abs(r.rel_error) for r, _ in rows if r.split == part]),
                            ("run 2", [abs(e["run2"]) for r, e in rows if r.split == part and e["run2"] is not None]),
                            ("median of runs", [abs(e["median"]) for r, e in rows if r.split == part and e["median"] is not None]),
                            ("GPU time", [abs(e["gpu"]) for r, e in rows if r.split == part and e["gpu"] is not None])):
            if errs:
                print(f"{part} ({label}): {len(errs)} cases, median |error| {statistics.median(errs) * 100:.1f}%, "
                      f"worst {max(errs) * 100:.1f}%, within 20%: {sum(x <= 0.2 for x in errs)}")
    return 0


def shrunk() -> int:
    """The plain steps recorded shrunk (record_host.py --shrink: the GPU outruns the host) against the priced
    shrunk steps: whether checkpointed steps' host work is priced like plain steps' (the ratios by group)."""
    from labkit.advise.validate import SHRUNK_FILES, shrunk_checks

    for f in SHRUNK_FILES:
        rows = shrunk_checks(f)
        print(f"\n# {os.path.relpath(f)}: {len(rows)} steps")
        print(f"{'case':36s} {'split':9s} {'H200 ms':>8s} {'pred ms':>8s} {'ratio':>6s} {'host ms':>8s} {'gpu ms':>7s}")
        for r in sorted(rows, key=lambda r: (r.checkpointed, r.name)):
            print(f"{r.name:36s} {r.split:9s} {r.measured_s * 1e3:8.1f} {r.predicted_s * 1e3:8.1f} {r.ratio:6.2f} "
                  f"{r.predicted_host_s * 1e3:8.1f} {r.predicted_gpu_s * 1e3:7.1f}")
        for label, group in (("checkpointed", [r for r in rows if r.checkpointed]),
                             ("not checkpointed", [r for r in rows if not r.checkpointed])):
            if group:
                ratios = sorted(r.ratio for r in group)
                print(f"{label}: {len(group)} steps, measured / priced median {statistics.median(ratios):.2f} "
                      f"(from {ratios[0]:.2f} to {ratios[-1]:.2f})")
    return 0


def calibrate_host() -> int:
    """Recompute the host scale (labkit.advise.host_calibration) from the whole-step issues recorded
    on the H200's host and write data/measurements/advise/host_scale.json."""
    from labkit.advise import host_calibration as hc
    from labkit.advise.kernel_table import recorded_table
    from labkit.advise.validate import predict_step_time
    from labkit.core.provenance import load_measurement, write_measurement
    from labkit.workloads import corpus

    measured = hc.whole_step_issues()
    raw = recorded_table(host_calibrated=False)
    priced = {n: predict_step_time(corpus.get_case(n), table=raw)["host_s"] for n in measured}
    d = hc.derive(priced, measured)
    for r in d["cases"]:
        print(f"{r['name']:28s} measured {r['measured_host_s'] * 1e3:6.1f} ms  priced {r['priced_host_s'] * 1e3:6.1f} ms"
              f"  ratio {r['ratio']:.2f}")
    print(f"host scale (median of {len(d['cases'])}): {d['scale']:.3f}")
    src = load_measurement(hc.HOST_SPLIT_FILE)["provenance"]
    d["source"] = {"file": os.path.relpath(hc.HOST_SPLIT_FILE, hc.paths.REPO_ROOT), "provenance": src}
    write_measurement(hc.SCALE_FILE, "host_scale", d, command="benchmarks/bench_advise.py --calibrate-host")
    print(f"wrote {hc.SCALE_FILE}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--only", action="append", help="with --validate: cases whose name contains this (repeatable)")
    ap.add_argument("--split", choices=("reference", "held-out"), help="with --validate: one split only")
    ap.add_argument("--calibrate-host", action="store_true", help="recompute data/measurements/advise/host_scale.json")
    ap.add_argument("--shrunk", action="store_true", help="the shrunk recorded steps against their priced steps")
    args = ap.parse_args(argv)
    print(format_header(header()), flush=True)
    if args.calibrate_host:
        return calibrate_host()
    if args.shrunk:
        return shrunk()
    return validate(args.only, args.split) if args.validate else speed(args.repeats)


if __name__ == "__main__":
    sys.exit(main())
