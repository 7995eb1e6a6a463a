"""Record the comm chapter's measurements on a GPU machine (hard budget: --budget, default 150 s).

    PYTHONPATH=. NCCL_NVLS_ENABLE=0 python3 benchmarks/gpu/record_comm.py --out DIR [--smoke] [--budget S]

With 2+ GPUs (one process per GPU, spawned, backend nccl, world 2):
  comm_collectives.json   all_reduce/all_gather/reduce_scatter/broadcast, 4 KiB .. 4 GiB, busbw as a
                          fraction of the nominal NVLink rate
  comm_launch_overhead.json  idle gaps between back-to-back collectives (the benchmark's own overhead)
  comm_buckets.json       the DDP bucket sweep of gpt2-124m (1..200 MiB, gradient_as_bucket_view off/on)
  comm_ddp_timeline.json  one profiled DDP step reduced to backward compute and all-reduce intervals
                          (+ comm_ddp_step_trace.json.gz, the raw Chrome trace)
  comm_async_overlap.json, comm_buffer_reuse.json   async_op overlap; persistent vs in-loop buffers
  comm_dp_vs_ddp.json     DataParallel vs DDP, same model and global batch
With exactly 1 GPU: comm_pinned_pageable.json (non_blocking H2D copy on a side stream vs compute), and
one NCCL rank (world 1: no peer, so no collectives) for what a single GPU shows: the DDP sweep's
memory and step time, the profiled step's backward compute, the buffer-reuse lever.
Without a GPU (dry run, e.g. --smoke on a laptop): the multi-process parts on 2 gloo CPU processes
with tiny sizes, and CUDA-only parts skipped with a printed reason.
The budget is hard: a watchdog ends the script (and its ranks) when it is spent, keeping what was
written; each part also checks the time left before it starts.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from labkit.core.provenance import format_header, header, write_measurement  # noqa: E402
from labkit.core.units import GiB, KiB, MiB  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[comm {time.time() - T0:6.1f}s] {msg}", flush=True)


def plan(smoke: bool, ngpu: int) -> dict:
    """Sizes and steps of each part: full on GPUs, tiny for --smoke or CPU dry runs."""
    if ngpu >= 2 and not smoke:
        return dict(sizes=(4 * KiB, 4 * GiB), warmup=5, repeats=10, gap_sizes=[64 * MiB, 1 * GiB],
                    workload="gpt2-124m", batch=4, buckets=[1, 5, 10, 25, 50, 100, 200], sweep_warmup=3,
                    sweep_steps=8, amp="bfloat16", async_bytes=1 * GiB, buf_bytes=256 * MiB, buf_steps=30,
                    copy_bytes=1 * GiB, trace_bucket=25.0)
    if ngpu == 1 and not smoke:
        return dict(sizes=None, warmup=0, repeats=0, gap_sizes=[], workload="gpt2-124m", batch=4,
                    buckets=[1, 25, 200], sweep_warmup=3, sweep_steps=8, amp="bfloat16", async_bytes=0,
                    buf_bytes=256 * MiB, buf_steps=30, copy_bytes=1 * GiB, trace_bucket=25.0)
    if ngpu >= 1:
        return dict(sizes=(4 * KiB, 64 * MiB), warmup=2, repeats=3, gap_sizes=[64 * MiB], workload="tiny", batch=2,
                    buckets=[0.05, 1, 25], sweep_warmup=2, sweep_steps=3, amp="bfloat16", async_bytes=16 * MiB,
                    buf_bytes=16 * MiB, buf_steps=5, copy_bytes=64 * MiB, trace_bucket=0.1)
    return dict(sizes=(4 * KiB, 256 * KiB), warmup=1, repeats=2, gap_sizes=[256 * KiB], workload="tiny", batch=2,
                buckets=[0.05, 1], sweep_warmup=2, sweep_steps=2, amp=None, async_bytes=1 * MiB,
                buf_bytes=1 * MiB, buf_steps=4, copy_bytes=0, trace_bucket=0.1)


def watchdog(deadline: float) -> None:
    """End the whole script (and any spawned ranks) when the budget is spent."""
    import multiprocessing
    import signal
    import threading

    def fire() -> None:
        log("HARD BUDGET reached: stopping the ranks and exiting; files written so far are kept")
        for child in multiprocessing.active_children():
            try:
                os.kill(child.pid, signal.SIGKILL)
            except OSError:
                pass
        sys.stdout.flush()
        os._exit(3)

    t = threading.Timer(max(1.0, deadline - time.time()), fire)
    t.daemon = True
    t.start()


def _part(name: str, fn, deadline: float) -> None:
    left = deadline - time.time()
    if left < 5:
        log(f"SKIP {name}: only {left:.0f} s of the budget left")
        return
    t = time.time()
    log(f"start {name}")
    try:
        fn()
        log(f"done {name} in {time.time() - t:.1f} s")
    except Exception as exc:  # record what ran; one failing part must not lose the rest
        log(f"FAILED {name}: {exc!r}")
        traceback.print_exc()
        sys.stdout.flush()


def worker(ctx, out: str, p: dict, prov: dict, deadline: float) -> None:
    """Every multi-process part, in one process group (rank 0 writes the files)."""
    from labkit.comm import bench, ddp, levers, overhead, timeline
    from labkit.comm.nominal import PUBLISHED_ALLREDUCE_BUSBW_GBps, nominal_nvlink

    outp = Path(out)
    r0 = ctx.rank == 0

    def save(name: str, kind: str, data) -> None:
        if r0:
            write_measurement(outp / name, kind, data, provenance=dict(prov, world=ctx.world, backend=ctx.backend))
            log(f"wrote {name}")

    def collectives() -> None:
        sizes = bench.size_ladder(*p["sizes"])
        res = bench.bench_collectives(ctx, bench.OPS, sizes, warmup=p["warmup"], repeats=p["repeats"])
        link = nominal_nvlink(res.device) if ctx.is_cuda else None
        if link:
            for r in res.rows:
                r.busbw_fraction_of_nominal = r.busbw_GBps / link.GBps_per_direction
        save("comm_collectives.json", "comm.collectives",
             {"bench": res, "nominal_link": link, "published_allreduce_busbw_GBps": PUBLISHED_ALLREDUCE_BUSBW_GBps,
              "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")})

    def gaps() -> None:
        rows = [overhead.launch_overhead(ctx, op, s) for s in p["gap_sizes"] for op in ("all_reduce", "all_gather")]
        save("comm_launch_overhead.json", "comm.launch_overhead", {"rows": rows, "limit_fraction": 0.05})

    def sweep() -> None:
        res = ddp.sweep_buckets(ctx, workload=p["workload"], batch_size=p["batch"], sizes_mb=p["buckets"],
                                warmup=p["sweep_warmup"], steps=p["sweep_steps"], amp=p["amp"],
                                deadline=deadline - 25)
        save("comm_buckets.json", "comm.buckets", res)

    def trace() -> None:
        raw = str(outp / "comm_ddp_step_trace.json")
        path = ddp.profile_ddp_step(ctx, raw, workload=p["workload"], batch_size=p["batch"],
                                    bucket_cap_mb=p["trace_bucket"], amp=p["amp"])
        if r0 and path:
            tl = timeline.reduce_trace(path)
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.unlink(path)
            if os.path.getsize(path + ".gz") > 8 * MiB:
                log(f"raw trace is {os.path.getsize(path + '.gz')} B gzipped: not kept (the reduced timeline is)")
                os.unlink(path + ".gz")
            save("comm_ddp_timeline.json", "comm.timeline",
                 {"timeline": tl, "workload": p["workload"], "batch_size": p["batch"], "bucket_cap_mb": p["trace_bucket"],
                  "world": ctx.world, "trace_file": "comm_ddp_step_trace.json.gz"})

    def async_ovl() -> None:
        save("comm_async_overlap.json", "comm.async_overlap", levers.async_overlap(ctx, p["async_bytes"]))

    def buffers() -> None:
        save("comm_buffer_reuse.json", "comm.buffer_reuse",
             levers.buffer_reuse(ctx, nbytes=p["buf_bytes"], steps=p["buf_steps"]))

    def ddp_half() -> None:
        from labkit.comm.dp import run_ddp

        if not ctx.is_cuda:
            if r0:
                log("SKIP DDP half of DP vs DDP: needs CUDA ranks")
            return
        res = run_ddp(ctx, workload=p["workload"], per_gpu_batch=p["batch"], amp=p["amp"])
        if r0:
            from labkit.core.serialize import dumps

            (outp / "_ddp_half.json").write_text(dumps(res))

    parts = [("collectives", collectives), ("DDP bucket sweep", sweep), ("DDP (for DP vs DDP)", ddp_half),
             ("profiled DDP step", trace), ("launch overhead", gaps), ("async_op overlap", async_ovl),
             ("buffer reuse", buffers)]
    if ctx.world < 2:
        if r0:
            log("world 1: no peer, so collectives, launch overhead, async_op overlap and DP vs DDP are skipped")
        parts = [pt for pt in parts if pt[0] in ("DDP bucket sweep", "profiled DDP step", "buffer reuse")]
    for name, fn in parts:
        # every rank must take the same decision: use rank 0's clock
        if ddp.time_left(ctx, deadline) < 10:
            if r0:
                log(f"SKIP {name}: budget exhausted")
            continue
        if r0:
            log(f"start {name}")
        ts = time.time()
        try:
            fn()
        except Exception as exc:
            log(f"rank {ctx.rank} FAILED {name}: {exc!r}")
            traceback.print_exc()
            sys.stdout.flush()
            continue
        if r0:
            log(f"done {name} in {time.time() - ts:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the JSON results")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), for a dry run")
    ap.add_argument("--budget", type=float, default=150.0, help="hard limit in seconds for the whole script (default 150)")
    ap.add_argument("--world", type=int, default=2, help="processes for the multi-process parts (default 2)")
    args = ap.parse_args(argv)
    deadline = T0 + args.budget
    watchdog(deadline)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"start; hard budget {args.budget:.0f} s")
    import torch

    from labkit.comm.launch import run_ranks

    command = "PYTHONPATH=. NCCL_NVLS_ENABLE=0 python3 " + " ".join(["benchmarks/gpu/record_comm.py"] + (argv or sys.argv[1:]))
    prov = header(command)
    print(format_header(prov), flush=True)
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    p = plan(args.smoke, ngpu)
    log(f"{ngpu} CUDA GPU(s); NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}; smoke={args.smoke}")

    if ngpu >= 2:
        backend, world = "nccl", min(args.world, ngpu)
    elif ngpu == 1:
        backend, world = "nccl", 1
        log("1 GPU: the multi-process parts that need a peer are skipped; one NCCL rank records the rest")
    else:
        backend, world = "gloo", args.world
        log(f"no GPU: the multi-process parts run on {world} gloo CPU processes (dry run, not NCCL)")
    _part(f"multi-process parts ({backend}, world {world})",
          lambda: run_ranks(worker, str(out), p, prov, deadline, backend=backend, world=world,
                            timeout_s=max(30.0, deadline - time.time())), deadline)

    if ngpu >= 1:
        def pinned() -> None:
            from labkit.comm.levers import pinned_vs_pageable

            write_measurement(out / "comm_pinned_pageable.json", "comm.pinned_pageable",
                              pinned_vs_pageable(p["copy_bytes"]), provenance=prov)
            log("wrote comm_pinned_pageable.json")

        _part("pinned vs pageable (1 GPU)", pinned, deadline)
    else:
        log("SKIP pinned vs pageable: needs a CUDA GPU (no side streams on CPU)")

    if ngpu >= 2 and (out / "_ddp_half.json").exists():
        def dp_vs_ddp() -> None:
            import json

            from labkit.comm.dp import run_data_parallel

            ddp_res = json.loads((out / "_ddp_half.json").read_text())
            dp_res = run_data_parallel(world, workload=p["workload"], per_gpu_batch=p["batch"], amp=p["amp"])
            write_measurement(out / "comm_dp_vs_ddp.json", "comm.dp_vs_ddp", {"runs": [dp_res, ddp_res]},
                              provenance=dict(prov, world=world))
            (out / "_ddp_half.json").unlink()
            log("wrote comm_dp_vs_ddp.json")

        _part("DataParallel (vs DDP)", dp_vs_ddp, deadline)
    elif ngpu < 2:
        log("SKIP DataParallel vs DDP: needs 2 CUDA GPUs")
    log(f"finished in {time.time() - T0:.1f} s; files: {sorted(f.name for f in out.iterdir())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
