"""Speed targets of the analytical memory model and the planner.

    PYTHONPATH=. python benchmarks/bench_estimate.py [--repeat 7] [--json]

1. One estimate (Llama-2-70B, tp=8 pp=4 dp=2 with SP, 16 micro-batches, every pipeline stage)
   under 1 ms, so the notebook's widgets redraw well inside 100 ms.
2. The planner's full search for a 70B model (Llama-2-70B) on 64 GPUs (8 x 8 H100, global batch
   512) under 1 s.
3. The planner at its largest accepted cluster (``PLAN_MAX_GPUS``, 2^20 GPUs, global batch 2^20):
   under 1 s too (shapes refused by heads/layers are counted, not built; larger clusters are refused).
Medians over --repeat runs; measured on this machine.

    PYTHONPATH=. python benchmarks/bench_estimate.py --validate [--no-trace] [--only NAME,NAME]

prints instead the estimator against the fake-mode trace and the H200 recording at tp=pp=dp=1 on
every recorded transformers case of the corpus (labkit.memory.estimate.accuracy), reference and
held-out cases apart; the trace takes about 10 s a case on a 2-core CPU (--no-trace: recorded only).
The T5 and DeBERTa configuration variants (corpus.TRACED_VARIANTS, recorded apart by
benchmarks/gpu/record_plain.py --variants) are compared with their recording and their trace as written by

    PYTHONPATH=. python benchmarks/bench_estimate.py --trace-variants [--only NAME,NAME]

(data/measurements/estimate/traced_variants.json, about 30 s a case here).
Then the same for sharded layouts (FSDP2, DDP, DTensor TP at world 2 to 8, a 2-stage pipeline): the
estimator against one rank (rank 0, or each stage's) of the bundled torchrun scripts (data/scripts/ranks/),
traced here on a fake process group and recorded on the H200 with one
(labkit.memory.estimate.accuracy.check_ranks; 10 s to a minute a launch here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.core.provenance import format_header, header  # noqa: E402
from labkit.memory.estimate import ParallelSpec, TrainSpec, estimate  # noqa: E402
from labkit.memory.estimate.planner import PLAN_MAX_GPUS, h100_cluster, plan  # noqa: E402
from labkit.memory.estimate.presets import get_preset  # noqa: E402

TARGET_ESTIMATE_S = 1e-3
TARGET_PLAN_S = 1.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--validate", action="store_true", help="estimator vs trace vs recorded, per corpus case")
    ap.add_argument("--no-trace", action="store_true", help="--validate without fake mode (recorded only)")
    ap.add_argument("--only", help="--validate: comma-separated case names")
    ap.add_argument("--trace-variants", action="store_true",
                    help="trace corpus.TRACED_VARIANTS in fake mode and write their peaks to "
                         "data/measurements/estimate/traced_variants.json (with --only: those, merged into the file)")
    args = ap.parse_args(argv)
    print(format_header(header()), flush=True)
    if args.trace_variants:
        return write_traced_variants(args)
    if args.validate:
        return validate(args)
    m = get_preset("llama2-70b")
    par = ParallelSpec(tp=8, pp=4, dp=2, sp=True)
    train = TrainSpec(micro_batch=1, global_batch=32, recompute="selective")
    estimate(m, par, train)
    per_est = []
    for _ in range(args.repeat):
        n = 500
        t = time.perf_counter()
        for _ in range(n):
            estimate(m, par, train)
        per_est.append((time.perf_counter() - t) / n)
    cl = h100_cluster(64)
    plan(m, cl, 512)
    per_plan = []
    considered = 0
    for _ in range(args.repeat):
        t = time.perf_counter()
        p = plan(m, cl, 512)
        per_plan.append(time.perf_counter() - t)
        considered = p.considered
    big = h100_cluster(PLAN_MAX_GPUS)
    per_big = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        plan(m, big, PLAN_MAX_GPUS)
        per_big.append(time.perf_counter() - t)
    big_med = statistics.median(per_big)
    est_med, plan_med = statistics.median(per_est), statistics.median(per_plan)
    res = {
        "estimate_median_s": est_med, "estimate_target_s": TARGET_ESTIMATE_S, "estimate_ok": est_med < TARGET_ESTIMATE_S,
        "plan_median_s": plan_med, "plan_target_s": TARGET_PLAN_S, "plan_ok": plan_med < TARGET_PLAN_S,
        "plan_layouts_considered": considered,
        "plan_max_gpus": PLAN_MAX_GPUS, "plan_max_median_s": big_med, "plan_max_ok": big_med < TARGET_PLAN_S,
    }
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"one estimate (llama2-70b, tp8 pp4 dp2 +SP, 4 stages): median {est_med * 1e3:.3f} ms "
              f"(target < {TARGET_ESTIMATE_S * 1e3:.0f} ms) {'OK' if res['estimate_ok'] else 'MISSED'}")
        print(f"planner, llama2-70b on 64 GPUs, {considered} layouts: median {plan_med:.3f} s "
              f"(target < {TARGET_PLAN_S:.0f} s) {'OK' if res['plan_ok'] else 'MISSED'}")
        print(f"planner, llama2-70b on {PLAN_MAX_GPUS} GPUs (the largest accepted): median {big_med:.3f} s "
              f"(target < {TARGET_PLAN_S:.0f} s) {'OK' if res['plan_max_ok'] else 'MISSED'}")
    return 0 if res["estimate_ok"] and res["plan_ok"] and res["plan_max_ok"] else 1


def write_traced_variants(args) -> int:
    from labkit.core.provenance import load_measurement, write_measurement
    from labkit.memory.estimate.accuracy import VARIANT_TRACES, trace_variants

    rows = trace_variants(args.only.split(",") if args.only else None)
    kept = []
    if args.only and VARIANT_TRACES.exists():  # nothing already written is lost: other cases' rows stay
        kept = [r for r in load_measurement(VARIANT_TRACES, "estimate_traced_variants")["data"]
                if r["name"] not in {x["name"] for x in rows}]
    write_measurement(VARIANT_TRACES, "estimate_traced_variants", kept + rows,
                      command="python benchmarks/bench_estimate.py --trace-variants"
                              + (f" --only {args.only}" if args.only else ""))
    for r in rows:
        print(f"{r['name']:40s} traced {r['peak_bytes'] / 2**30:7.2f} GiB  estimated {r['estimated'] / 2**30:7.2f} GiB "
              f"({(r['estimated'] / r['peak_bytes'] - 1) * 100:+.1f}%)")
    print(f"wrote {VARIANT_TRACES.relative_to(ROOT)}")
    return 0


def validate(args) -> int:
    from labkit.core.units import fmt_bytes
    from labkit.memory.estimate.accuracy import (RANK_RECORDING, RECORDING, TOLERANCE_PCT, VARIANT_RECORDING,
                                                 VARIANT_TRACES, check, check_ranks, summary)

    rows = check(args.only.split(",") if args.only else None, trace=not args.no_trace)
    if args.json:
        ranks = check_ranks(args.only.split(",") if args.only else None, trace=not args.no_trace)
        print(json.dumps({"rows": [vars(r) for r in rows], "vs_recorded": summary(rows, "recorded"),
                          "vs_trace": summary(rows, "trace"), "ranks": [vars(r) for r in ranks],
                          "ranks_vs_trace": summary(ranks, "trace"),
                          "ranks_vs_recorded": summary(ranks, "recorded")}, indent=1))
        return 0
    print(f"recorded: {RECORDING.relative_to(ROOT)}; trace: labkit.memory.trace.corpus_check.predict_as_recorded "
          "(fake-cuda, H200 target, the program the recording's transformers ran); the T5 and DeBERTa variants "
          f"(corpus.TRACED_VARIANTS): recorded in {VARIANT_RECORDING.relative_to(ROOT)}, their trace from "
          f"{VARIANT_TRACES.relative_to(ROOT)} (--trace-variants; 'variant' where not recorded)")

    def pct(e):
        return "" if e is None else f"{e:+.1f}%"

    for split in ("reference", "held-out"):
        if not any(r.split == split and r.estimated is not None for r in rows):
            continue
        print(f"\n{split} cases")
        print(f"{'case':46s} {'estimate':>10s} {'trace':>10s} {'recorded':>10s} {'vs trace':>9s} {'vs rec.':>8s}")
        for r in rows:
            if r.split != split or r.estimated is None:
                continue
            print(f"{r.name:46s} {fmt_bytes(r.estimated):>10s} {fmt_bytes(r.traced) if r.traced else '':>10s} "
                  f"{fmt_bytes(r.recorded) if r.recorded else 'variant':>10s} {pct(r.err('trace')):>9s} "
                  f"{pct(r.err('recorded')):>8s}")
        for against in ("trace", "recorded"):
            s = summary(rows, against)[split]
            if s["cases"]:
                print(f"  vs {against}: {s['within']} of {s['cases']} within {TOLERANCE_PCT:g}%, median "
                      f"{s['median_pct']:.1f}%, worst {s['worst_pct']:.1f}%")
    ranks = check_ranks(args.only.split(",") if args.only else None, trace=not args.no_trace)
    if ranks:
        print(f"\nsharded layouts, one rank of each launch (rank 0, or a pipeline stage's): recorded "
              f"{RANK_RECORDING.relative_to(ROOT)} (the rank on one H200 with PyTorch's fake process group); trace: "
              "labkit measure --script S --nproc-per-node N --ranks R")
    for split in ("reference", "held-out"):
        sel = [r for r in ranks if r.split == split and r.estimated is not None]
        if not sel:
            continue
        print(f"\n{split} launches")
        print(f"{'launch':46s} {'estimate':>10s} {'trace':>10s} {'recorded':>10s} {'vs trace':>9s} {'vs rec.':>8s}")
        for r in sel:
            print(f"{r.name:46s} {fmt_bytes(r.estimated):>10s} {fmt_bytes(r.traced) if r.traced else '':>10s} "
                  f"{fmt_bytes(r.recorded) if r.recorded else '':>10s} {pct(r.err('trace')):>9s} "
                  f"{pct(r.err('recorded')):>8s}" + (f"  (not traced: {r.trace_error})" if r.trace_error else ""))
        for against in ("trace", "recorded"):
            s = summary(sel, against)[split]
            if s["cases"]:
                print(f"  vs {against}: {s['within']} of {s['cases']} within {TOLERANCE_PCT:g}%, median "
                      f"{s['median_pct']:.1f}%, worst {s['worst_pct']:.1f}%")
    out = [r for r in ranks if r.estimated is None]
    if out:
        print(f"\nlaunches the estimator does not model ({len(out)}): "
              + "; ".join(f"{r.name} ({r.reason})" for r in out))
    untraced = [r for r in rows if r.estimated is not None and r.reason]
    if untraced:
        print(f"\nnot traced ({len(untraced)}): " + "; ".join(f"{r.name} ({r.reason})" for r in untraced))
    out = [r for r in rows if r.estimated is None]
    if out:
        print(f"\nnot modelled by the estimator ({len(out)}): " + "; ".join(f"{r.name} ({r.reason})" for r in out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
