"""The notebook's live run: every multi-process measurement of the chapter in one process group.

One spawn (or torchrun) costs seconds of process start, so the notebook asks for everything at once:
collectives over sizes, the DDP bucket sweep, one profiled DDP step reduced to a timeline, the
async_op overlap and the buffer-reuse lever. Rank 0's results come back as one dict.
"""

from __future__ import annotations

import os
import tempfile
from typing import Sequence

from labkit.comm import bench, ddp, levers, timeline


def live_tour(ctx, *, sizes: Sequence[int], bucket_sizes_mb: Sequence[float], workload: str = "tiny",
              batch_size: int | None = None, steps: int = 3, repeats: int = 3, trace_bucket_mb: float = 0.05,
              lever_bytes: int = 4 << 20, amp: str | None = None,
              observe_buckets_mb: Sequence[float] = ()) -> dict:
    """Everything at once; ``observe_buckets_mb``: also DDP's real bucket sizes for those caps
    (:func:`labkit.comm.ddp.observed_buckets`), to set beside the simulator's."""
    out: dict = {"backend": ctx.backend, "world": ctx.world, "ctx": ctx, "sane": bench.sanity_check(ctx)}
    out["bench"] = bench.bench_collectives(ctx, bench.OPS, sizes, warmup=1, repeats=repeats)
    out["sweep"] = ddp.sweep_buckets(ctx, workload=workload, batch_size=batch_size, sizes_mb=bucket_sizes_mb,
                                     warmup=2, steps=steps, amp=amp)
    fd, path = tempfile.mkstemp(suffix=".json", prefix="labkit-ddp-step-")
    os.close(fd)
    path = ddp.profile_ddp_step(ctx, path, workload=workload, batch_size=batch_size, bucket_cap_mb=trace_bucket_mb,
                                amp=amp) or path
    if ctx.rank == 0:
        out["timeline"] = timeline.reduce_trace(path)
    os.unlink(path)
    out["async"] = levers.async_overlap(ctx, lever_bytes, repeats=repeats)
    out["buffers"] = levers.buffer_reuse(ctx, n_tensors=16, nbytes=lever_bytes, steps=max(4, steps))
    out["observed_buckets"] = {mb: ddp.observed_buckets(ctx, mb, workload=workload, batch_size=batch_size)
                               for mb in observe_buckets_mb}
    return out
