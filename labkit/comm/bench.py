"""Collective benchmark on ``torch.distributed``: all_reduce, all_gather, reduce_scatter, broadcast.

Runs inside an initialised process group (see :mod:`labkit.comm.launch`); every rank calls
:func:`bench_collectives` and gets the same rows. Sizes follow nccl-tests: ``bytes`` is the
all-reduce/broadcast buffer, and for all_gather / reduce_scatter the *total* (gathered) buffer, each
rank contributing ``bytes / world``. Times are the median over repeats of a timed loop (CUDA events
on GPUs, ``perf_counter`` on CPUs), after warm-up, and the slowest rank's median is reported.
``algbw = bytes / time`` and ``busbw = algbw * factor`` with nccl-tests' factors
(:func:`labkit.core.collectives.bus_factor`).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

from labkit.core import collectives
from labkit.core.errors import LabkitError
from labkit.core.units import GiB, KiB, MiB, parse_bytes

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


@dataclass
class CollectiveRow:
    op: str
    bytes: int  # as nccl-tests counts it
    world: int
    time_us: float  # median over repeats, slowest rank
    algbw_GBps: float  # GB = 1e9 bytes
    busbw_GBps: float
    time_us_min: float
    time_us_max: float
    repeats: int
    iters_per_repeat: int
    predicted_us: float | None = None  # the topology model's prediction, when one exists
    busbw_fraction_of_nominal: float | None = None


@dataclass
class BenchResult:
    backend: str
    world: int
    nodes: int
    device: str
    dtype: str
    rows: list[CollectiveRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def size_ladder(lo: int | str = 4 * KiB, hi: int | str = 64 * MiB, factor: int = 2) -> list[int]:
    """Sizes from ``lo`` to ``hi`` (bytes, inclusive), each ``factor`` times the previous one."""
    lo_b, hi_b = parse_bytes(lo, what="smallest size"), parse_bytes(hi, what="largest size")
    if lo_b < 1 or hi_b < lo_b:
        raise LabkitError(f"size range {lo!r}..{hi!r} is empty: the smallest size must be >= 1 byte and <= the largest")
    if factor < 2:
        raise LabkitError(f"size factor must be >= 2, got {factor}")
    out, s = [], lo_b
    while s <= hi_b:
        out.append(s)
        s *= factor
    return out


def parse_ops(text: str | Sequence[str] | None) -> list[str]:
    if text is None or text == "all":
        return list(OPS)
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    bad = [n for n in names if n not in OPS]
    if bad or not names:
        raise LabkitError(f"--op {text!r}: unknown collective {bad or text}; choose from {', '.join(OPS)}")
    return names


def element_count(op: str, nbytes: int, world: int, elem_size: int) -> tuple[int, int]:
    """(elements per rank's input, total bytes actually moved as nccl-tests counts them).

    The size is rounded down so that it divides evenly among ``world`` ranks.
    """
    unit = elem_size * (world if op in ("all_gather", "reduce_scatter") else 1)
    total = (nbytes // unit) * unit
    if total == 0:
        raise LabkitError(f"{op}: {nbytes} bytes is smaller than one element per rank ({unit} bytes)")
    n = total // elem_size
    return (n // world if op == "all_gather" else n), total


def _dist():
    import torch.distributed as dist

    return dist


def rank_buffer_bytes(op: str, nbytes: int, world: int) -> int:
    """Bytes one rank allocates for a collective of ``nbytes`` (as nccl-tests counts them): the one
    buffer of all_reduce / broadcast; input and output of all_gather / reduce_scatter (the total and
    one rank's share)."""
    if op in ("all_gather", "reduce_scatter"):
        return nbytes + nbytes // max(1, world)
    return nbytes


# Buffers of all the ranks that share one machine's host memory (gloo on CPUs), together.
CPU_BUFFER_BUDGET = 1 * GiB


def buffer_budget(is_cuda: bool) -> tuple[int, str]:
    """(bytes, what it is) available to the benchmark's buffers: a quarter of the free GPU memory per
    GPU on CUDA (each rank has its own), else :data:`CPU_BUFFER_BUDGET` or a quarter of the available
    RAM (free pages), whichever is smaller, for all the machine's ranks together."""
    if is_cuda:
        import torch

        return torch.cuda.mem_get_info()[0] // 4, "a quarter of the GPU's free memory"

    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        avail = 0
    if avail:
        return min(CPU_BUFFER_BUDGET, avail // 4), "all ranks of the machine together: 1 GiB or a quarter of free RAM"
    return CPU_BUFFER_BUDGET, "all ranks of the machine together: 1 GiB"


def machine_buffer_bytes(op: str, nbytes: int, world: int, ranks_here: int, is_cuda: bool) -> int:
    """What one collective's buffers take from the memory the budget covers: one GPU's on CUDA,
    the host's for all ``ranks_here`` CPU ranks of this machine."""
    return rank_buffer_bytes(op, nbytes, world) * (1 if is_cuda else ranks_here)


def make_call(op: str, nbytes: int, world: int, device: str, dtype_name: str = "float32"):
    """Allocate the buffers of one collective and return ``(call(async_op=False), bytes_counted)``."""
    import torch

    dist = _dist()
    dtype = getattr(torch, dtype_name)
    esz = torch.empty((), dtype=dtype).element_size()
    n_in, total = element_count(op, nbytes, world, esz)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        buf = torch.ones(n_in, dtype=dtype, device=device)
        return (lambda async_op=False: dist.all_reduce(buf, async_op=async_op)), total
    if op == "broadcast":
        buf = torch.ones(n_in, dtype=dtype, device=device)
        return (lambda async_op=False: dist.broadcast(buf, src=0, async_op=async_op)), total
    if op == "all_gather":
        inp = torch.ones(n_in, dtype=dtype, device=device)
        out = torch.empty(n_in * world, dtype=dtype, device=device)
        return (lambda async_op=False: ag(out, inp, async_op=async_op)), total
    if op == "reduce_scatter":
        inp = torch.ones(n_in, dtype=dtype, device=device)
        out = torch.empty(n_in // world, dtype=dtype, device=device)
        return (lambda async_op=False: rs(out, inp, async_op=async_op)), total
    raise LabkitError(f"unknown collective {op!r}; choose from {', '.join(OPS)}")


def default_iters(nbytes: int, is_cuda: bool) -> int:
    """Ops per timed loop: several on GPUs so that a loop lasts well above event resolution."""
    if not is_cuda:
        return 1
    if nbytes <= 4 * MiB:
        return 20
    if nbytes <= 256 * MiB:
        return 10
    return 3


def time_op(call, device: str, *, warmup: int, repeats: int, iters: int) -> list[float]:
    """Seconds per op for each repeat (each repeat a loop of ``iters`` ops)."""
    import torch

    dist = _dist()
    for _ in range(warmup):
        call()
    out: list[float] = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(repeats):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / iters)
    else:
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            out.append((time.perf_counter() - t0) / iters)
    return out


def slowest_rank(value: float, device: str) -> float:
    import torch

    dist = _dist()
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def bench_collectives(ctx, ops: Sequence[str], sizes: Sequence[int], *, warmup: int = 3, repeats: int = 5,
                      iters: int | None = None, dtype: str = "float32", max_bytes: int | None = None) -> BenchResult:
    """Benchmark ``ops`` at ``sizes`` in the current process group; every rank returns the same result.

    ``ctx`` is the :class:`~labkit.comm.launch.RankContext`. A size whose buffers would take more
    than ``max_bytes`` (default :func:`buffer_budget`: a quarter of the free memory of each GPU on
    CUDA; on CPUs, for all of this machine's ranks together) is skipped with a note.
    """
    import torch

    res = BenchResult(backend=ctx.backend, world=ctx.world, nodes=ctx.nodes, device=_device_name(ctx.device), dtype=dtype)
    what = "the limit given"
    if max_bytes is None:
        max_bytes, what = buffer_budget(ctx.is_cuda)
    for op in parse_ops(list(ops)):
        for nbytes in sizes:
            need = machine_buffer_bytes(op, nbytes, ctx.world, ctx.local_world, ctx.is_cuda)
            if need > max_bytes:
                res.notes.append(f"{op} {nbytes} B skipped: its buffers take {need} B here, above the {max_bytes} B "
                                 f"limit ({what})")
                continue
            call, total = make_call(op, nbytes, ctx.world, ctx.device, dtype)
            k = iters or default_iters(total, ctx.is_cuda)
            times = time_op(call, ctx.device, warmup=warmup, repeats=repeats, iters=k)
            med = slowest_rank(statistics.median(times), ctx.device)
            lo, hi = slowest_rank(min(times), ctx.device), slowest_rank(max(times), ctx.device)
            res.rows.append(row_from_time(op, total, ctx.world, med, lo, hi, repeats, k))
            del call
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    return res


def row_from_time(op: str, nbytes: int, world: int, seconds: float, lo: float | None = None,
                  hi: float | None = None, repeats: int = 1, iters: int = 1) -> CollectiveRow:
    """A benchmark row from a measured time, with nccl-tests' algbw and busbw (GB = 1e9 B per second)."""
    if seconds <= 0:
        raise LabkitError(f"{op} {nbytes} B: time must be positive, got {seconds}")
    return CollectiveRow(op=op, bytes=int(nbytes), world=world, time_us=seconds * 1e6,
                         algbw_GBps=collectives.algbw(nbytes, seconds) / 1e9,
                         busbw_GBps=collectives.busbw(op, nbytes, seconds, world) / 1e9,
                         time_us_min=(lo if lo is not None else seconds) * 1e6,
                         time_us_max=(hi if hi is not None else seconds) * 1e6, repeats=repeats, iters_per_repeat=iters)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))

    return platform.processor() or "cpu"


def sanity_check(ctx) -> bool:
    """True when all_reduce and all_gather give the right values on this group (every rank agrees)."""
    import torch

    dist = _dist()
    x = torch.full((8,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(x)
    ok = bool(torch.all(x == ctx.world * (ctx.world + 1) / 2))
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out = torch.empty(8 * ctx.world, device=ctx.device)
    ag(out, torch.full((8,), float(ctx.rank), device=ctx.device))
    expect = torch.arange(ctx.world, device=ctx.device, dtype=out.dtype).repeat_interleave(8)
    ok &= bool(torch.equal(out, expect))
    flag = torch.tensor([0.0 if ok else 1.0], device=ctx.device)
    dist.all_reduce(flag)
    return float(flag.item()) == 0.0
