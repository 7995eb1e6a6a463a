"""The other overlap levers, each measured.

* :func:`pinned_vs_pageable` (one CUDA GPU): a host-to-device ``non_blocking`` copy issued on a side
  stream, then compute launched on the default stream (a prefetch). From pageable memory the copy call
  holds the host until the data is staged through a pinned bounce buffer, so the compute is launched
  late and little overlaps; from pinned memory the call returns at once and the two run together.
* :func:`async_overlap` (process group): a collective issued with ``async_op=True``, independent
  compute, then ``wait()``, against the same collective issued synchronously before the compute.
* :func:`buffer_reuse` (process group): flatten-and-all-reduce of gradient-like tensors into a
  persistent pre-allocated buffer vs a buffer allocated inside the loop (step-time spread and
  allocator events from ``torch.cuda.memory_stats``).

Every function returns a plain dataclass; CUDA-only parts raise :class:`LabkitError` without CUDA.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from labkit.comm.bench import make_call, slowest_rank
from labkit.comm.ddp import percentile
from labkit.core.errors import LabkitError
from labkit.core.units import MiB


@dataclass
class CopyOverlapRow:
    host_memory: str  # "pageable" or "pinned"
    bytes: int
    copy_ms: float  # copy alone, side stream, to completion
    compute_ms: float  # compute alone
    both_ms: float  # compute on the default stream + copy on the side stream, to completion
    host_call_ms: float  # how long the non_blocking .copy_() call held the host thread
    copy_GBps: float  # GB = 1e9 B
    overlap_fraction: float  # (copy + compute - both) / min(copy, compute), clipped to [0, 1]


@dataclass
class CopyOverlap:
    device: str
    rows: list[CopyOverlapRow] = field(default_factory=list)


@dataclass
class AsyncOverlap:
    backend: str
    world: int
    op: str
    bytes: int
    comm_ms: float
    compute_ms: float
    sequential_ms: float  # collective (async_op=False) then compute
    overlapped_ms: float  # collective (async_op=True), compute, wait()
    hidden_fraction: float  # (sequential - overlapped) / min(comm, compute), clipped to [0, 1]
    repeats: int


@dataclass
class BufferRow:
    mode: str  # "persistent", "in_loop", "in_loop_empty_cache"
    step_ms_median: float
    step_ms_stdev: float
    step_ms_p10: float
    step_ms_p90: float
    allocator_requests_per_step: float | None  # torch.cuda.memory_stats allocation.all.allocated delta
    device_mallocs_per_step: float | None  # new segments from cudaMalloc (segment.all.allocated delta)


@dataclass
class BufferReuse:
    backend: str
    world: int
    n_tensors: int
    bytes: int
    steps: int
    rows: list[BufferRow] = field(default_factory=list)


def _clip01(x: float) -> float:
    return 0.0 if x < 0 else 1.0 if x > 1 else x


def overlap_fraction(a: float, b: float, both: float) -> float:
    """How much of the shorter of two activities was hidden under the other: (a + b - both) / min(a, b)."""
    if a <= 0 or b <= 0:
        raise LabkitError(f"overlap_fraction needs positive durations, got {a} and {b}")
    return _clip01((a + b - both) / min(a, b))


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise LabkitError(f"{what} needs a CUDA GPU; this machine has none")


def pinned_vs_pageable(nbytes: int = 256 * MiB, *, device: str = "cuda:0", matmul_n: int = 4096,
                       repeats: int = 5) -> CopyOverlap:
    """Copy ``nbytes`` host-to-device with ``non_blocking=True`` on a side stream while computing."""
    _need_cuda("pinned_vs_pageable")

    dev = torch.device(device)
    torch.cuda.set_device(dev)
    a = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(device=dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out = CopyOverlap(device=torch.cuda.get_device_name(dev))

    def compute(k: int) -> None:
        for _ in range(k):
            a @ a

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    compute(3)
    t_mm = statistics.median(timed(lambda: compute(5)) for _ in range(3)) / 5
    for mode in ("pageable", "pinned"):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(mode == "pinned"))
        src.fill_(1)

        def copy() -> float:
            with torch.cuda.stream(side):
                t0 = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                return time.perf_counter() - t0

        copy()
        t_copy = statistics.median(timed(copy) for _ in range(repeats))
        k = max(1, math.ceil(t_copy / t_mm))
        t_comp = statistics.median(timed(lambda: compute(k)) for _ in range(repeats))
        host_calls: list[float] = []

        def both() -> None:
            # a prefetch: issue the next batch's copy, then launch this step's compute
            host_calls.append(copy())
            compute(k)

        t_both = statistics.median(timed(both) for _ in range(repeats))
        out.rows.append(CopyOverlapRow(host_memory=mode, bytes=nbytes, copy_ms=t_copy * 1e3, compute_ms=t_comp * 1e3,
                                       both_ms=t_both * 1e3, host_call_ms=statistics.median(host_calls) * 1e3,
                                       copy_GBps=nbytes / t_copy / 1e9,
                                       overlap_fraction=overlap_fraction(t_copy, t_comp, t_both)))
        del src
    return out


def _compute_fn(ctx, n: int):
    a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16 if ctx.is_cuda else torch.float32)

    def run(k: int) -> None:
        for _ in range(k):
            a @ a

    return run


def _sync(ctx) -> None:
    if ctx.is_cuda:
        torch.cuda.synchronize()


def async_overlap(ctx, nbytes: int = 64 * MiB, *, matmul_n: int | None = None, repeats: int = 5,
                  op: str = "all_reduce") -> AsyncOverlap:
    """A collective overlapped with independent compute through ``async_op=True``; same on every rank."""
    call, total = make_call(op, nbytes, ctx.world, ctx.device)
    n = matmul_n or (4096 if ctx.is_cuda else 256)
    compute = _compute_fn(ctx, n)

    def timed(fn) -> float:
        dist.barrier()
        _sync(ctx)
        t0 = time.perf_counter()
        fn()
        _sync(ctx)
        return time.perf_counter() - t0

    call()
    compute(2)
    t_comm = statistics.median(timed(call) for _ in range(repeats))
    t_one = statistics.median(timed(lambda: compute(2)) for _ in range(3)) / 2
    k = max(1, round(slowest_rank(t_comm, ctx.device) / max(t_one, 1e-9)))
    k = int(slowest_rank(float(k), ctx.device))  # every rank runs the same amount of compute
    t_comp = statistics.median(timed(lambda: compute(k)) for _ in range(repeats))

    def sequential() -> None:
        call()
        compute(k)

    def overlapped() -> None:
        work = call(async_op=True)
        compute(k)
        work.wait()

    t_seq = statistics.median(timed(sequential) for _ in range(repeats))
    t_ovl = statistics.median(timed(overlapped) for _ in range(repeats))
    vals = [slowest_rank(v, ctx.device) for v in (t_comm, t_comp, t_seq, t_ovl)]
    t_comm, t_comp, t_seq, t_ovl = vals
    hidden = _clip01((t_seq - t_ovl) / min(t_comm, t_comp)) if min(t_comm, t_comp) > 0 else 0.0
    return AsyncOverlap(backend=ctx.backend, world=ctx.world, op=op, bytes=total, comm_ms=t_comm * 1e3,
                        compute_ms=t_comp * 1e3, sequential_ms=t_seq * 1e3, overlapped_ms=t_ovl * 1e3,
                        hidden_fraction=hidden, repeats=repeats)


def _alloc_counters() -> tuple[int, int]:
    s = torch.cuda.memory_stats()
    # segment.all.allocated counts the segments the allocator obtained from cudaMalloc
    return int(s.get("allocation.all.allocated", 0)), int(s.get("segment.all.allocated", 0))


def buffer_reuse(ctx, *, n_tensors: int = 64, nbytes: int = 64 * MiB, steps: int = 20,
                 modes: tuple[str, ...] = ("persistent", "in_loop", "in_loop_empty_cache")) -> BufferReuse:
    """Flatten ``n_tensors`` gradient-like tensors (``nbytes`` in all), all-reduce, copy back, per step.

    ``persistent`` copies into one buffer allocated before the loop; ``in_loop`` allocates the flat
    buffer each step (the caching allocator usually serves it from its cache); ``in_loop_empty_cache``
    also empties the cache each step, as memory pressure would, so every step pays ``cudaMalloc``
    (CUDA only).
    """
    numel = max(n_tensors, nbytes // 4) // n_tensors
    grads = [torch.ones(numel, device=ctx.device) for _ in range(n_tensors)]
    total = numel * n_tensors
    res = BufferReuse(backend=ctx.backend, world=ctx.world, n_tensors=n_tensors, bytes=total * 4, steps=steps)
    persistent = torch.empty(total, device=ctx.device)

    def step(buf) -> None:
        off = 0
        for g in grads:
            buf[off:off + numel].copy_(g)
            off += numel
        dist.all_reduce(buf)
        off = 0
        for g in grads:
            g.copy_(buf[off:off + numel])
            off += numel

    for mode in modes:
        if mode == "in_loop_empty_cache" and not ctx.is_cuda:
            continue
        if mode not in ("persistent", "in_loop", "in_loop_empty_cache"):
            raise LabkitError(f"buffer_reuse: unknown mode {mode!r}")
        times: list[float] = []
        c0 = _alloc_counters() if ctx.is_cuda else (0, 0)
        for i in range(steps + 2):
            dist.barrier()
            _sync(ctx)
            t0 = time.perf_counter()
            if mode == "persistent":
                step(persistent)
            else:
                buf = torch.empty(total, device=ctx.device)
                step(buf)
                del buf
                if mode == "in_loop_empty_cache":
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            _sync(ctx)
            if i >= 2:
                times.append(time.perf_counter() - t0)
            if i == 1 and ctx.is_cuda:
                c0 = _alloc_counters()
        c1 = _alloc_counters() if ctx.is_cuda else (0, 0)

        ms = [t * 1e3 for t in times]
        res.rows.append(BufferRow(mode=mode, step_ms_median=statistics.median(ms),
                                  step_ms_stdev=statistics.stdev(ms) if len(ms) > 1 else 0.0,
                                  step_ms_p10=percentile(ms, 0.1), step_ms_p90=percentile(ms, 0.9),
                                  allocator_requests_per_step=(c1[0] - c0[0]) / steps if ctx.is_cuda else None,
                                  device_mallocs_per_step=(c1[1] - c0[1]) / steps if ctx.is_cuda else None))
    return res
