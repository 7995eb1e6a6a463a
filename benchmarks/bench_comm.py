"""Speed targets of the comm chapter.

    PYTHONPATH=. python benchmarks/bench_comm.py [--gpu]

1. The CI smoke versions of ``labkit comm bench`` and ``labkit comm buckets`` (gloo, world 2, their
   default sizes) finish in under 120 s together on the 2-core CI machine (wall time, process start
   included, as CI runs them).
2. With 2+ GPUs (``--gpu``): NCCL all-reduce bus bandwidth from 64 MiB up, as a fraction of the
   NVLink's nominal rate, and the benchmark's own overhead (idle launch gaps between back-to-back
   collectives, from a profiler trace) under 5 % at those sizes.
Medians are quoted; every figure here is measured on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.core.provenance import format_header, header  # noqa: E402

SMOKE = (["comm", "bench", "--backend", "gloo", "--world", "2", "--json"],
         ["comm", "buckets", "--backend", "gloo", "--world", "2", "--sizes", "1,25,100", "--json"])
TARGET_SMOKE_S = 120.0
TARGET_GAP = 0.05


def smoke(repeats: int) -> bool:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    totals = []
    for _ in range(repeats):
        total = 0.0
        for argv in SMOKE:
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-W", "ignore", "-m", "labkit", *argv], capture_output=True, text=True,
                               env=env, cwd=REPO)
            dt = time.perf_counter() - t0
            if r.returncode:
                print(f"labkit {' '.join(argv)} failed:\n{r.stderr[-2000:]}")
                return False
            print(f"  labkit {' '.join(argv)}: {dt:.1f} s")
            total += dt
        totals.append(total)
    med = statistics.median(totals)
    ok = med < TARGET_SMOKE_S
    print(f"smoke bench + buckets: median {med:.1f} s over {repeats} run(s); target < {TARGET_SMOKE_S:.0f} s: "
          f"{'OK' if ok else 'MISSED'}")
    return ok


def _gpu_rank(ctx):
    from labkit.comm.bench import bench_collectives, size_ladder
    from labkit.comm.overhead import launch_overhead

    sizes = size_ladder("64MiB", "1GiB", 4)
    res = bench_collectives(ctx, ["all_reduce"], sizes, warmup=5, repeats=10)
    gaps = [launch_overhead(ctx, "all_reduce", s) for s in sizes]
    return res, gaps


def gpu() -> bool:
    import torch

    from labkit.comm.launch import run_ranks
    from labkit.comm.nominal import nominal_nvlink

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print(f"GPU targets skipped: {n} CUDA GPU(s) here, 2 needed")
        return True
    res, gaps = run_ranks(_gpu_rank, backend="nccl", world=2)
    link = nominal_nvlink(res.device)
    ok = True
    for r, g in zip(res.rows, gaps):
        frac = f"{r.busbw_GBps / link.GBps_per_direction:.0%} of {link.name} {link.GBps_per_direction:.0f} GB/s" if link else "no nominal rate"
        good = g.gap_fraction < TARGET_GAP
        ok &= good
        print(f"  all_reduce {r.bytes >> 20} MiB: median {r.time_us:.0f} us, busbw {r.busbw_GBps:.1f} GB/s ({frac}); "
              f"launch gaps {g.gap_fraction:.2%} of the loop (target < 5%: {'OK' if good else 'MISSED'})")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="also the NCCL targets (needs 2 GPUs)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of the smoke pair (default 1)")
    args = ap.parse_args()
    print(format_header(header()), flush=True)
    ok = smoke(args.repeats)
    if args.gpu:
        ok &= gpu()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
