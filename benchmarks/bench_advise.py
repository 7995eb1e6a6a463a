"""Speed targets and the step-time check of `labkit advise` (issue 13).

    .venv/bin/python benchmarks/bench_advise.py              # speed: 70B on 64 GPUs (< 2 s), 7B HF config
                                                             # on 8 GPUs with the fake-mode trace (< 90 s)
    .venv/bin/python benchmarks/bench_advise.py --validate   # predicted vs recorded H200 step times
                                 [--only NAME ...] [--split reference|held-out]

Medians of --repeats runs, in one process, after a reproducibility header.
"""

from __future__ import annotations

import argparse
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
    """Predicted step times against both H200 recordings of the plain loops (the same predictions): run 1,
    which the pricing was built on and held out from, and run 2, recorded later the same way."""
    from labkit.advise.validate import SECOND_RUN, check, recorded_step_times

    rec = recorded_step_times()
    run2 = recorded_step_times(SECOND_RUN)
    todo = [n for n in sorted(rec) if (not only or any(o in n for o in only)) and (not split or rec[n].get("split") == split)]
    rows = []
    print(f"{'case':36s} {'split':9s} {'H200 ms':>8s} {'pred ms':>8s} {'error':>7s} {'gpu ms':>7s} {'host ms':>7s} syncs"
          f" {'run 2 ms':>8s} {'error':>7s}")
    for name in todo:
        got = check([name])
        if not got:
            continue
        r = got[0]
        m2 = run2.get(name, {}).get("median_step_s")
        e2 = r.predicted_s / m2 - 1 if m2 else None
        rows.append((r, e2))
        print(f"{r.name:36s} {r.split:9s} {r.measured_s * 1e3:8.1f} {r.predicted_s * 1e3:8.1f} {r.rel_error * 100:+6.1f}% "
              f"{r.gpu_busy_s * 1e3:7.1f} {r.host_s * 1e3:7.1f} {r.syncs:5d} "
              + (f"{m2 * 1e3:8.1f} {e2 * 100:+6.1f}%" if m2 else f"{'-':>8s} {'-':>7s}"), flush=True)
    for part in ("reference", "held-out"):
        for label, errs in (("run 1", [abs(r.rel_error) for r, _ in rows if r.split == part]),
                            ("run 2", [abs(e) for r, e in rows if r.split == part and e is not None])):
            if errs:
                print(f"{part} ({label}): {len(errs)} cases, median |error| {statistics.median(errs) * 100:.1f}%, "
                      f"worst {max(errs) * 100:.1f}%, within 20%: {sum(x <= 0.2 for x in errs)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--only", action="append", help="with --validate: cases whose name contains this (repeatable)")
    ap.add_argument("--split", choices=("reference", "held-out"), help="with --validate: one split only")
    args = ap.parse_args(argv)
    print(format_header(header()), flush=True)
    return validate(args.only, args.split) if args.validate else speed(args.repeats)


if __name__ == "__main__":
    sys.exit(main())
