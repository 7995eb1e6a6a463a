"""DataParallel vs DistributedDataParallel on the same model: per-GPU peak memory and step time.

``nn.DataParallel`` is one process driving every GPU: each step it scatters the batch from GPU 0,
replicates the model onto the others, gathers every output (here the logits) back on GPU 0 and
reduces the gradients there, so GPU 0 holds more than the rest and one Python thread feeds all GPUs.
DDP runs one process per GPU with a replica each and all-reduces gradient buckets during backward.
Both train the same reference GPT on the same global batch (``per_gpu_batch * n`` sequences).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.comm.ddp import _max_over_ranks, _model_and_batch
from labkit.core.errors import LabkitError
from labkit.workloads import GPT, get_workload


@dataclass
class ParallelRun:
    mode: str  # "DataParallel" or "DistributedDataParallel"
    gpus: int
    workload: str
    per_gpu_batch: int
    step_ms_median: float
    step_ms_min: float
    step_ms_max: float
    steps: int
    peak_allocated_bytes: list[int] = field(default_factory=list)  # per GPU, index = GPU
    peak_reserved_bytes: list[int] = field(default_factory=list)


def _train(model, opt, x, y, steps: int, amp: str | None, dp: bool) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with (torch.autocast("cuda", dtype=getattr(torch, amp)) if amp else contextlib.nullcontext()):
            _, loss = model(x, y)
        if dp:
            loss = loss.mean()  # one loss per replica, gathered on GPU 0
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def run_data_parallel(gpus: int = 2, *, workload: str = "gpt2-124m", per_gpu_batch: int | None = None,
                      warmup: int = 3, steps: int = 10, amp: str | None = "bfloat16") -> ParallelRun:
    """``nn.DataParallel`` over GPUs 0..gpus-1 in this process (needs ``gpus`` CUDA devices)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < gpus:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise LabkitError(f"DataParallel over {gpus} GPUs needs {gpus} CUDA devices; this machine has {have}")
    w = get_workload(workload)
    b = per_gpu_batch or w.batch_size
    for i in range(gpus):
        torch.cuda.reset_peak_memory_stats(i)
    torch.manual_seed(0)
    model = GPT(w.config).to("cuda:0")
    dp = torch.nn.DataParallel(model, device_ids=list(range(gpus)))
    opt = torch.optim.AdamW(dp.parameters(), lr=1e-4)
    x, y = model.example_batch(b * gpus, generator=torch.Generator().manual_seed(1000))
    x, y = x.to("cuda:0"), y.to("cuda:0")
    _train(dp, opt, x, y, warmup, amp, True)
    ms = [t * 1e3 for t in _train(dp, opt, x, y, steps, amp, True)]
    run = ParallelRun(mode="DataParallel", gpus=gpus, workload=workload, per_gpu_batch=b,
                      step_ms_median=statistics.median(ms), step_ms_min=min(ms), step_ms_max=max(ms), steps=steps,
                      peak_allocated_bytes=[int(torch.cuda.max_memory_allocated(i)) for i in range(gpus)],
                      peak_reserved_bytes=[int(torch.cuda.max_memory_reserved(i)) for i in range(gpus)])
    del dp, opt, model
    torch.cuda.empty_cache()
    return run


def run_ddp(ctx, *, workload: str = "gpt2-124m", per_gpu_batch: int | None = None, warmup: int = 3,
            steps: int = 10, amp: str | None = "bfloat16", bucket_cap_mb: float = 25.0) -> ParallelRun:
    """DDP in the current process group (one CUDA GPU per rank); every rank returns the same result."""
    if not ctx.is_cuda:
        raise LabkitError("run_ddp compares against DataParallel and needs CUDA ranks (backend nccl)")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, x, y, b = _model_and_batch(ctx, workload, per_gpu_batch)
    ddp = DDP(model, device_ids=[ctx.local_rank], bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    _train(ddp, opt, x, y, warmup, amp, False)
    times = _max_over_ranks(ctx, _train(ddp, opt, x, y, steps, amp, False))
    mine = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()], dtype=torch.int64,
                        device=ctx.device)
    every = [torch.zeros_like(mine) for _ in range(ctx.world)]
    dist.all_gather(every, mine)
    ms = [t * 1e3 for t in times]
    del ddp, opt, model
    return ParallelRun(mode="DistributedDataParallel", gpus=ctx.world, workload=workload, per_gpu_batch=b,
                       step_ms_median=statistics.median(ms), step_ms_min=min(ms), step_ms_max=max(ms), steps=steps,
                       peak_allocated_bytes=[int(t[0]) for t in every], peak_reserved_bytes=[int(t[1]) for t in every])
