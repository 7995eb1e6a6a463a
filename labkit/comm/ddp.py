"""DDP training of the reference GPT: the bucket-size sweep and a profiled step.

Runs inside an initialised process group (:mod:`labkit.comm.launch`); every rank trains its own
replica on its own random batch. For each ``bucket_cap_mb`` (PyTorch counts it in MiB) and
``gradient_as_bucket_view`` setting a fresh DDP model is built, trained ``warmup`` steps (DDP rebuilds
its buckets from the observed gradient order after the first one) and timed ``steps`` steps. A step is
forward + backward + optimizer step, ending in a device synchronisation. The ``no_sync`` row is the
same step without any all-reduce: the compute-only floor the sweep is compared with.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

from labkit.core.errors import LabkitError

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

DEFAULT_BUCKETS_MB = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)


@dataclass
class BucketRow:
    bucket_cap_mb: float | None  # None: the no_sync (compute-only) baseline
    gradient_as_bucket_view: bool
    num_buckets: int | None
    step_ms_median: float
    step_ms_min: float
    step_ms_max: float
    step_ms_p10: float
    step_ms_p90: float
    steps: int
    peak_allocated_bytes: int | None  # max over ranks; None on CPU
    peak_reserved_bytes: int | None
    exposed_ms: float | None = None  # median step minus the no_sync median


@dataclass
class BucketSweep:
    backend: str
    world: int
    nodes: int
    workload: str
    batch_size: int
    param_bytes: int  # fp32 gradient bytes all-reduced per step
    amp: str | None
    rows: list[BucketRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def best(self, gradient_as_bucket_view: bool | None = None) -> BucketRow:
        rows = [r for r in self.rows if r.bucket_cap_mb is not None
                and (gradient_as_bucket_view is None or r.gradient_as_bucket_view == gradient_as_bucket_view)]
        if not rows:
            raise LabkitError("the sweep has no bucket rows")
        return min(rows, key=lambda r: r.step_ms_median)

    def tied_with_best(self, gradient_as_bucket_view: bool | None = None) -> list[BucketRow]:
        """The other bucket rows the fastest median cannot be told apart from: their p10-p90 step-time
        range overlaps the fastest one's, or they split the gradients into the same number of buckets
        with the same gradient_as_bucket_view (then they are one configuration, and the gap is noise).
        Empty when the fastest is distinguishably fastest."""
        best = self.best(gradient_as_bucket_view)
        rows = [r for r in self.rows if r.bucket_cap_mb is not None and r is not best
                and (gradient_as_bucket_view is None or r.gradient_as_bucket_view == gradient_as_bucket_view)]
        return [r for r in rows if r.step_ms_p10 <= best.step_ms_p90
                or (r.num_buckets is not None and r.num_buckets == best.num_buckets
                    and r.gradient_as_bucket_view == best.gradient_as_bucket_view)]

    def best_text(self) -> str:
        """One line: the fastest bucket cap, or that the sizes swept cannot be told apart."""
        best, tied = self.best(), self.tied_with_best()
        if not tied:
            return (f"best: bucket_cap_mb={best.bucket_cap_mb:g} (gradient_as_bucket_view "
                    f"{'on' if best.gradient_as_bucket_view else 'off'}), {best.step_ms_median:.2f} ms per step, "
                    "its p10-p90 range below every other size's")
        caps = sorted({r.bucket_cap_mb for r in [best, *tied]})
        return (f"best: none distinguishable: bucket_cap_mb {', '.join(f'{c:g}' for c in caps)} give step times "
                f"whose p10-p90 ranges overlap or the same bucket count (fastest median {best.step_ms_median:.2f} ms "
                f"at {best.bucket_cap_mb:g}); any of them will do here")


def parse_bucket_sizes(text: str | Sequence[float]) -> list[float]:
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[float] = []
    for it in items:
        try:
            v = float(it)
        except (TypeError, ValueError):
            raise LabkitError(f"--sizes: cannot read {it!r} as a bucket size in MiB (example: 1,25,100)") from None
        if not math.isfinite(v) or not v > 0:
            raise LabkitError(f"--sizes: bucket size must be a positive finite number of MiB, got {it!r}")
        out.append(v)
    if not out:
        raise LabkitError("--sizes: give at least one bucket size in MiB (example: 1,25,100)")
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        raise LabkitError("percentile of no values")
    k = (len(s) - 1) * q
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def _model_and_batch(ctx, workload: str, batch_size: int | None, seed: int = 0):
    import torch

    from labkit.workloads import GPT, get_workload

    w = get_workload(workload)
    torch.manual_seed(seed)
    with torch.device(ctx.device):  # initialise on the device: seconds faster for 100M+ parameters
        model = GPT(w.config)
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    x, y = model.example_batch(batch_size or w.batch_size, generator=g)
    return model, x.to(ctx.device), y.to(ctx.device), (batch_size or w.batch_size)


def _sync(ctx) -> None:
    if ctx.is_cuda:
        import torch

        torch.cuda.synchronize()


def _autocast(ctx, amp: str | None):
    import torch

    if amp and ctx.is_cuda:
        return torch.autocast("cuda", dtype=getattr(torch, amp))
    return contextlib.nullcontext()


def train_steps(ctx, model, opt, x, y, n: int, amp: str | None = None, no_sync: bool = False) -> list[float]:
    """Seconds per step for ``n`` steps (forward, backward, optimizer step, synchronise)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        ctxm = model.no_sync() if no_sync else contextlib.nullcontext()
        with ctxm:
            with _autocast(ctx, amp):
                _, loss = model(x, y)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(ctx)
        out.append(time.perf_counter() - t0)
    return out


def _max_over_ranks(ctx, values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]


def time_left(ctx, deadline: float) -> float:
    """Seconds until ``deadline`` by rank 0's clock (the same answer on every rank)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([deadline - time.time()], dtype=torch.float64, device=ctx.device)
    dist.broadcast(t, 0)
    return float(t.item())


def _num_buckets(ddp) -> int | None:
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return None
    n = data.get("num_buckets_reduced")
    if n:
        return int(n)
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    return len(str(sizes).split(",")) if sizes else None


def measure_config(ctx, workload: str, batch_size: int | None, bucket_cap_mb: float | None, gav: bool,
                   warmup: int, steps: int, amp: str | None) -> BucketRow:
    """One sweep point on a fresh model (``bucket_cap_mb=None``: the no_sync baseline)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if ctx.is_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, x, y, _ = _model_and_batch(ctx, workload, batch_size)
    kwargs = {"device_ids": [ctx.local_rank]} if ctx.is_cuda else {}
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb if bucket_cap_mb else 25, gradient_as_bucket_view=gav, **kwargs)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    no_sync = bucket_cap_mb is None
    train_steps(ctx, ddp, opt, x, y, max(2, warmup), amp, no_sync=no_sync)
    times = train_steps(ctx, ddp, opt, x, y, steps, amp, no_sync=no_sync)
    nb = None if no_sync else _num_buckets(ddp)
    peak = resv = None
    if ctx.is_cuda:
        peak, resv = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    # step i is as slow as its slowest rank
    times = _max_over_ranks(ctx, times)
    mem = _max_over_ranks(ctx, [float(peak or 0), float(resv or 0)])
    del ddp, opt, model
    # DDP sits in a reference cycle: collect it now, so its reducer (which holds the process group)
    # never outlives the group (see labkit.comm.launch._teardown)
    gc.collect()
    ms = [t * 1e3 for t in times]
    return BucketRow(bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gav, num_buckets=nb,
                     step_ms_median=statistics.median(ms), step_ms_min=min(ms), step_ms_max=max(ms),
                     step_ms_p10=percentile(ms, 0.1), step_ms_p90=percentile(ms, 0.9), steps=steps,
                     peak_allocated_bytes=int(mem[0]) if ctx.is_cuda else None,
                     peak_reserved_bytes=int(mem[1]) if ctx.is_cuda else None)


def sweep_buckets(ctx, *, workload: str = "tiny", batch_size: int | None = None,
                  sizes_mb: Sequence[float] = DEFAULT_BUCKETS_MB, gradient_as_bucket_view: Sequence[bool] = (False, True),
                  warmup: int = 2, steps: int = 5, amp: str | None = None,
                  deadline: float | None = None) -> BucketSweep:
    """The bucket sweep on every rank (same result everywhere), with the no_sync baseline first.

    ``deadline`` (a ``time.time()`` value): points that would start after it are skipped with a note
    (rank 0's clock decides, so every rank skips the same points).
    """
    from labkit.workloads import get_workload

    w = get_workload(workload)
    sweep = BucketSweep(backend=ctx.backend, world=ctx.world, nodes=ctx.nodes, workload=workload,
                        batch_size=batch_size or w.batch_size, param_bytes=4 * w.config.num_params,
                        amp=amp if ctx.is_cuda else None)
    if amp and not ctx.is_cuda:
        sweep.notes.append(f"amp={amp} applies to CUDA only; CPU ranks ran in float32")
    base = measure_config(ctx, workload, batch_size, None, False, warmup, steps, amp)
    sweep.rows.append(base)
    for gav in gradient_as_bucket_view:
        for mb in sizes_mb:
            if deadline is not None and time_left(ctx, deadline) <= 0:
                sweep.notes.append(f"bucket {mb:g} MiB, gradient_as_bucket_view={gav}: skipped, time budget spent")
                continue
            row = measure_config(ctx, workload, batch_size, float(mb), bool(gav), warmup, steps, amp)
            row.exposed_ms = row.step_ms_median - base.step_ms_median
            sweep.rows.append(row)
    return sweep


def profile_ddp_step(ctx, trace_path: str, *, workload: str = "tiny", batch_size: int | None = None,
                     bucket_cap_mb: float = 25.0, gradient_as_bucket_view: bool = False, warmup: int = 3,
                     amp: str | None = None) -> str | None:
    """Profile one DDP step (phases wrapped in ``labkit::*`` ranges); rank 0 writes the Chrome trace.

    Returns the trace path on rank 0 (None elsewhere). Reduce it with
    :func:`labkit.comm.timeline.reduce_trace`.
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    model, x, y, _ = _model_and_batch(ctx, workload, batch_size)
    kwargs = {"device_ids": [ctx.local_rank]} if ctx.is_cuda else {}
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view, **kwargs)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    train_steps(ctx, ddp, opt, x, y, max(2, warmup), amp)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
    _sync(ctx)
    with profile(activities=acts) as prof:
        with record_function("labkit::forward"):
            with _autocast(ctx, amp):
                _, loss = ddp(x, y)
        with record_function("labkit::backward"):
            loss.backward()
        with record_function("labkit::optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(ctx)
    if ctx.rank == 0:
        prof.export_chrome_trace(trace_path)
        return trace_path
    return None


def observed_buckets(ctx, bucket_cap_mb: float, *, workload: str = "tiny", batch_size: int | None = None,
                     steps: int = 3) -> list[int]:
    """Byte sizes of the buckets DDP really all-reduces in its ``steps``-th step (after its rebuild),
    seen through a communication hook that then does the default all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, x, y, _ = _model_and_batch(ctx, workload, batch_size)
    kwargs = {"device_ids": [ctx.local_rank]} if ctx.is_cuda else {}
    d = DDP(model, bucket_cap_mb=bucket_cap_mb, **kwargs)
    seen: list[int] = []

    def hook(state, bucket):
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)

    d.register_comm_hook(None, hook)
    for _ in range(max(2, steps)):
        seen.clear()
        _, loss = d(x, y)
        loss.backward()
    _sync(ctx)
    return list(seen)
