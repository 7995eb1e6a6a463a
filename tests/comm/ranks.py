"""What every spawned gloo rank of the shared test run does (module-level: it is pickled into them)."""

from __future__ import annotations

from labkit.comm import bench, ddp, levers

SIZES = (0.05, 0.2)


def hooked_buckets(ctx, mb):
    """Bucket byte sizes DDP really all-reduces in its third step (after the rebuild)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, x, y, _ = ddp._model_and_batch(ctx, "tiny", 2)
    d = DDP(model, bucket_cap_mb=mb)
    seen: list[int] = []

    def hook(state, bucket):
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)

    d.register_comm_hook(None, hook)
    for _ in range(3):
        seen.clear()
        _, loss = d(x, y)
        loss.backward()
    return seen


def everything(ctx, trace_path):
    import torch
    import torch.distributed as dist

    x = torch.full((8,), float(ctx.rank + 1))
    dist.all_reduce(x)
    out = torch.empty(8 * ctx.world)
    dist.all_gather_into_tensor(out, torch.full((8,), float(ctx.rank)))
    return {
        "ctx": ctx, "sum": x.tolist(), "gathered": out.tolist(),
        "bench": bench.bench_collectives(ctx, bench.OPS, [4096, 65536], warmup=1, repeats=2),
        "sweep": ddp.sweep_buckets(ctx, workload="tiny", sizes_mb=SIZES, warmup=2, steps=2),
        "real_buckets": {mb: hooked_buckets(ctx, mb) for mb in SIZES},
        "trace": ddp.profile_ddp_step(ctx, trace_path, workload="tiny", bucket_cap_mb=0.05),
        "async": levers.async_overlap(ctx, 1 << 20, repeats=2),
        "buffers": levers.buffer_reuse(ctx, n_tensors=8, nbytes=1 << 20, steps=4),
    }
