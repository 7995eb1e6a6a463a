"""Communication buffers, the CUDA context and the caching allocator's overhead.

Inside PyTorch's allocator (counted by ``max_memory_allocated``):

* DDP buckets: a gradient-sized flat copy, persistent (with ``gradient_as_bucket_view`` the gradients
  are views into it and cost nothing more). Recorded on one H200 (world 1, gpt2-124m, batch 4, bf16
  autocast; data/measurements/comm/comm_buckets.json): the DDP-wrapped ``no_sync`` step peaks where
  the model says (0.04%), synchronised steps ~500 MB (one gradient-sized buffer) higher: not modelled;
* ZeRO-1/2 reduce-scatter and all-gather buckets (``bucket_bytes`` each, transient);
* ZeRO-3 / FSDP2 gathered parameters, in FSDP2's order (the rules and their source lines are in
  :func:`comm_buffers`): the root unit (embeddings, final norm, head) stays gathered from forward to
  backward; at the loss one block more (the last all-gather output, or the prefetched last block); while
  a block runs its backward, its parameters, the next block's prefetched all-gather output and its
  unsharded gradients, whose reduce-scatter input (in the reduce dtype) replaces its parameters; at
  the end of backward the root unit's gradients and their reduce-scatter input;
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
    backward: int          # transient while a layer runs its backward
    backward_start: int    # transient at the loss's backward (the start of backward)
    backward_end: int      # transient at the end of backward (the embeddings' gradients)
    optimizer: int         # transient at the optimizer step
    gathered_after_forward: int  # ZeRO-3: params still gathered between forward and backward


def comm_buffers(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes, pc: ParamCounts,
                 stage: int) -> CommBuffers:
    x = dims(m, par, train)
    persistent = fwd = bwd = opt = after_fwd = z_layer = z_start = z_end = 0  # z_: ZeRO-3's gathered units
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
            # FSDP2's order of all-gathers and frees (torch 2.13, torch/distributed/fsdp/_fully_shard/):
            # a forward keeps each block's flat all-gather output until the next block's copy-out, and the
            # last one until the root's forward ends (_fsdp_param_group.py:483 and :432, _fsdp_state.py:342),
            # so at the loss the root unit (never resharded after forward, _fsdp_state.py:207) and one
            # block are gathered; the root's pre-backward prefetches the last block (_backward_prefetch,
            # _fsdp_param_group.py:795-830), each block's pre-backward the one before it; a block's
            # post-backward reshards its parameters first (:638) and only then fills the reduce-scatter
            # input, in the reduce dtype, from its unsharded gradients (_fsdp_collectives.py:597-606).
            cw = by.compute_weight
            root_params = pc.embedding + pc.head
            root = root_params * cw
            block = pc.layer * cw
            reduce_bytes = 4 if (by.master or by.grad == 4) else by.grad
            block_grads, block_rs = pc.layer * by.grad, pc.layer * reduce_bytes
            if par.reshard_after_forward:
                after_fwd = root
                # the block's own parameters while it computes, or its reduce-scatter input after
                z_layer = root + block + block_grads + max(block, block_rs)
                z_start = root + block                   # the last block, prefetched by the root's pre-backward
            else:  # every block stays gathered until its own post-backward (nothing to prefetch)
                after_fwd = root + pc.layers * block
                z_layer = after_fwd + block_grads + block_rs
                z_start = after_fwd
            fwd += after_fwd + block                     # the last block's all-gather output, freed after the loss
            # the root unit's post-backward ends the backward: its gradients and their reduce-scatter input
            z_end = root + root_params * (by.grad + reduce_bytes)
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
    return CommBuffers(persistent=int(persistent), forward=int(fwd), backward=int(bwd + z_layer),
                       backward_start=int(bwd + z_start), backward_end=int(bwd + z_end), optimizer=int(opt),
                       gathered_after_forward=int(after_fwd))
