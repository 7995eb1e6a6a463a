"""Communication buffers, the CUDA context and the caching allocator's overhead.

Inside PyTorch's allocator (counted by ``max_memory_allocated``):

* DDP buckets: a gradient-sized flat copy, persistent (with ``gradient_as_bucket_view`` the gradients
  are views into it and cost nothing more). Recorded on one H200 (world 1, gpt2-124m, batch 4, bf16
  autocast; data/measurements/comm/comm_buckets.json): the DDP-wrapped ``no_sync`` step peaks where
  the model says (0.04%), synchronised steps ~500 MB (one gradient-sized buffer) higher: not modelled;
* ZeRO-1/2 reduce-scatter and all-gather buckets (``bucket_bytes`` each, transient);
* ZeRO-3 / FSDP2 gathered parameters: the root unit (embeddings, final norm, head) stays gathered
  from forward to backward, one block is gathered and the next one prefetched (two blocks) plus the
  all-gather's flat output being copied out (a third); a block's unsharded gradients and the
  reduce-scatter input they are copied into (in the reduce dtype);
* tensor parallelism: the output of the all-reduce (or all-gather with SP) of one activation;
* context parallelism: the gathered keys and values of the full sequence;
* pipeline parallelism: one receive buffer for activations and one for gradients;
* library workspaces: cuBLAS and cuBLASLt (32 MiB each on sm90 by default) and kernel scratch:
  70 MiB measured (the recorded H200 cases' CUDA peak minus the tensors the tracer saw).

Outside it (visible to ``nvidia-smi`` / ``mem_get_info``, not to ``memory_allocated``): the CUDA
context and NCCL's own buffers per communicator. Their defaults and the allocator's overhead
(reserved / allocated at the peak) come from the recordings under ``data/measurements/``
(see :data:`DEFAULTS_SOURCE`); ``tests/memory/test_estimate_measured.py`` recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.memory.estimate.activations import dims
from labkit.memory.estimate.spec import ModelSpec, ParallelSpec, TrainSpec
from labkit.memory.estimate.states import Bytes, ParamCounts

MiB = 1024**2

# Defaults. Bytes are ints. See DEFAULTS_SOURCE; tests/memory/test_estimate_measured.py recomputes
# the measured ones from the recordings and fails if they drift.
ALLOCATOR_OVERHEAD = 0.109           # median reserved/allocated - 1 at the peak, 16 recorded H200 cases
WORKSPACE_BYTES = 70 * MiB           # median CUDA peak - tracked tensors, same cases
CUDA_CONTEXT_BYTES = 619 * MiB       # device memory used after creating the context, minus torch's reserve
# Not measured here (no 2-GPU machine was lent): hundreds of MB, growing with each communicator and its channels
# (NCCL's maintainers, https://github.com/NVIDIA/nccl/issues/864; 544-688 MB per communicator on 4 x A100 NVLink,
# https://github.com/NVIDIA/nccl/issues/964).
NCCL_BYTES_PER_COMMUNICATOR = 300 * MiB
DEFAULTS_SOURCE = ("allocator overhead and workspace: recorded on 1 x NVIDIA H200, 2026-11-29 "
                   "(data/measurements/measure/, the lab GPT's 16 reference cases); CUDA context: recorded on "
                   "1 x NVIDIA H200, 2026-11-29 (data/measurements/parallel_memory/summary.json, torch 2.11, "
                   "CUDA 13.0); NCCL buffers per communicator: assumed (300 MiB), not measured")


@dataclass(frozen=True)
class Overheads:
    """Terms that do not follow from the model: measured defaults, overridable."""

    cuda_context: int = CUDA_CONTEXT_BYTES
    nccl_per_communicator: int = NCCL_BYTES_PER_COMMUNICATOR
    allocator_overhead: float = ALLOCATOR_OVERHEAD   # reserved = allocated x (1 + this) at the peak
    workspace: int = WORKSPACE_BYTES


def communicators(par: ParallelSpec) -> int:
    """NCCL communicators a rank belongs to (one per parallel dimension of size > 1; hybrid shard
    has a sharding and a replication group)."""
    n = sum(1 for k in (par.tp, par.pp, par.cp) if k > 1)
    dpg = par.dp * par.cp if par.cp > 1 else par.dp
    if dpg > 1:
        n += 1
        if par.zero and par.shard_size is not None and par.shard_size < par.dp * par.cp:
            n += 1
    return n


@dataclass(frozen=True)
class CommBuffers:
    """Bytes inside the allocator, by when they are alive."""

    persistent: int        # DDP buckets
    forward: int           # transient at the forward peak
    backward: int          # transient at the backward peak
    optimizer: int         # transient at the optimizer step
    gathered_after_forward: int  # ZeRO-3: params still gathered between forward and backward


def comm_buffers(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes, pc: ParamCounts,
                 stage: int) -> CommBuffers:
    x = dims(m, par, train)
    persistent = fwd = bwd = opt = after_fwd = 0
    dp_group = par.dp * par.cp
    local = pc.total
    if dp_group > 1 or par.zero:
        if par.zero == 0 and dp_group > 1:
            if train.framework == "pytorch":
                # the reducer's flat buckets exist from construction on; with gradient_as_bucket_view
                # the gradients are views into them (model_totals then counts no separate grads)
                persistent += local * by.grad
        elif par.zero in (1, 2):
            bwd += par.bucket_bytes
            opt += par.bucket_bytes
        elif par.zero == 3:
            cw = by.compute_weight
            root = (pc.embedding + pc.head) * cw
            block = pc.layer * cw
            # the all-gather's flat output is copied out into the parameters: one more block transiently
            if par.reshard_after_forward:
                fwd += root + 3 * block
                after_fwd = root
                bwd_params = root + 3 * block
            else:
                fwd += root + pc.layers * block + block
                after_fwd = root + pc.layers * block
                bwd_params = after_fwd + block
            reduce_bytes = 4 if (by.master or by.grad == 4) else by.grad
            # a block's unsharded gradients and the reduce-scatter input they are copied into
            unsharded_grads = pc.layer * by.grad + pc.layer * reduce_bytes
            bwd += bwd_params + unsharded_grads
    if par.tp > 1:
        t_out = x.s * x.b * x.h * by.act
        fwd += t_out
        bwd += t_out
    if par.cp > 1:
        kv_full = 2 * x.s * par.cp * x.b * max(x.kv // x.t, 1) * x.d * by.act
        fwd += kv_full
        bwd += 2 * kv_full  # gathered K, V and their gradients
    if par.pp > 1:
        p2p = x.s * x.b * x.h * by.act // x.t_sp
        fwd += p2p
        bwd += 2 * p2p
    return CommBuffers(persistent=int(persistent), forward=int(fwd), backward=int(bwd), optimizer=int(opt),
                       gathered_after_forward=int(after_fwd))
