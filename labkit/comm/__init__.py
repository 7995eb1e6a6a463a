"""The critical path once there is more than one GPU: collectives, DDP buckets and overlap.

Everything multi-process runs through :func:`run_ranks` (torchrun or spawned processes; gloo on CPU,
NCCL on GPUs). Modules: ``bench`` (collective benchmark), ``fit`` (alpha-beta fit), ``ddp`` (bucket
sweep, profiled step), ``timeline`` (trace -> compute/communication intervals), ``simulate``
(overlap simulator), ``levers`` (pinned copies, async_op, persistent buffers), ``dp`` (DataParallel
vs DDP), ``overhead`` (the benchmark's own launch gaps), ``nominal`` (link rates).
"""

from labkit.comm.bench import OPS, BenchResult, CollectiveRow, bench_collectives, row_from_time, size_ladder
from labkit.comm.ddp import BucketRow, BucketSweep, profile_ddp_step, sweep_buckets
from labkit.comm.launch import RankContext, run_ranks, under_torchrun
from labkit.comm.timeline import Timeline, overlap_summary, reduce_trace

__all__ = [
    "OPS", "BenchResult", "BucketRow", "BucketSweep", "CollectiveRow", "RankContext", "Timeline",
    "bench_collectives", "overlap_summary", "profile_ddp_step", "reduce_trace", "row_from_time", "run_ranks",
    "size_ladder", "sweep_buckets", "under_torchrun",
]
