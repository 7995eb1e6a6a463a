"""The benchmark's own overhead: idle gaps between back-to-back collectives of the timed loop.

The same loop the benchmark times is run under ``torch.profiler``; the collective intervals come
from the trace (NCCL kernels on GPUs, ``gloo:*`` ranges on CPUs). What the loop's span holds beyond
the union of those intervals is time the device spent waiting for the host to issue the next
collective: the fraction ``gap / span`` is the benchmark's overhead at that size.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from labkit.comm import timeline
from labkit.comm.bench import default_iters, make_call, slowest_rank


@dataclass
class LaunchOverhead:
    op: str
    bytes: int
    iters: int
    span_us: float
    busy_us: float
    gap_us: float
    gap_fraction: float
    host_issue_us_per_op: float  # host time to issue one collective (the call's return)


def comm_intervals(trace: dict) -> list[tuple[float, float]]:
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()]
    chosen = kernels or [e for e in events if str(e.get("name", "")).startswith("gloo:")]
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in chosen]


def gaps_from_intervals(intervals: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(span, busy, gap) of a loop's collective intervals."""
    if not intervals:
        return 0.0, 0.0, 0.0
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    busy = timeline.total(intervals)
    return span, busy, max(0.0, span - busy)


def launch_overhead(ctx, op: str, nbytes: int, *, iters: int | None = None, warmup: int = 3) -> LaunchOverhead:
    """Profile ``iters`` back-to-back ``op`` collectives of ``nbytes`` (rank 0's view, same on every rank)."""
    call, total = make_call(op, nbytes, ctx.world, ctx.device)
    k = iters or max(5, default_iters(total, ctx.is_cuda))
    for _ in range(warmup):
        call()
    if ctx.is_cuda:
        torch.cuda.synchronize()
    dist.barrier()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(k):
            call()
        issue = (time.perf_counter() - t0) / k
        if ctx.is_cuda:
            torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="labkit-gaps-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    span, busy, gap = gaps_from_intervals(comm_intervals(trace))
    frac = gap / span if span > 0 else 0.0
    frac = slowest_rank(frac, ctx.device)
    return LaunchOverhead(op=op, bytes=total, iters=k, span_us=span, busy_us=busy, gap_us=gap, gap_fraction=frac,
                          host_issue_us_per_op=issue * 1e6)
