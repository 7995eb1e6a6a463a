"""Per-GPU totals: for every pipeline stage, what is alive at the forward, backward and optimizer
peaks of a steady-state step (step 2 onwards: optimizer states exist), which phase wins, and the
breakdown there; the most loaded GPU is the stage with the largest total.

Timeline of one stage with ``k`` micro-batches in flight (1 without pipelining), ``A`` the
activations of one micro-batch, ``S`` the persistent states:

* forward peak (loss of the newest micro-batch): ``S + G0 + k A + logits(forward) + transients``;
* backward, at its start: ``S + G0 + k A + logits(backward)`` or the recompute/gradient work of the
  last layer; at its end: ``S + all grads + (k - 1) A`` (activations freed layer by layer while
  gradients appear: the peak is at one of the two ends);
* optimizer step: ``S + all grads + the optimizer's temporaries`` (foreach AdamW: one
  ``sqrt(v)`` list as large as the parameters it updates).

``G0`` is the gradients already present: all of them when earlier micro-batches of the step have
run their backward (gradient accumulation, or a pipeline with more micro-batches than in flight),
or when the framework keeps a persistent gradient buffer (Megatron); none otherwise
(``zero_grad(set_to_none=True)``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from labkit.core.errors import LabkitError
from labkit.core.vocab import Category, CategoryBytes, Phase
from labkit.memory.estimate.activations import in_flight, layer_activations, logits_bytes, stage_activations
from labkit.memory.estimate.buffers import Overheads, comm_buffers, communicators
from labkit.memory.estimate.spec import ModelSpec, ParallelSpec, TrainSpec, micro_batches, validate
from labkit.memory.estimate.states import (ModelStates, lora_params, lora_states, model_states, precision_bytes,
                                          stage_params, total_params)

# The model's subsets of the lab's vocabulary (labkit.core.vocab): the categories it separates
# ("context" holds the CUDA context and the libraries' workspaces) and the phases it has peaks for.
CATEGORIES: tuple[Category, ...] = ("parameters", "gradients", "optimizer_state", "activations", "logits",
                                    "comm_buffers", "context", "allocator_overhead")
PHASES: tuple[Phase, ...] = ("forward", "backward", "optimizer")


@dataclass
class StageEstimate:
    """One pipeline stage's GPU (every TP/DP rank of the stage holds the same)."""

    stage: int
    layers: int
    in_flight: float
    peak_phase: str
    per_gpu_bytes: dict[str, int]       # the CATEGORIES and total, at the peak
    peak_allocated: int                 # what max_memory_allocated would show
    peak_reserved: int                  # with the allocator's overhead
    phases: dict[str, int]              # allocated bytes at each phase's peak
    steady_bytes: int                   # allocated between steps
    params_local: int                   # parameters on this GPU before ZeRO sharding
    phase_breakdown: dict[str, dict[str, int]]  # allocator-side categories at each phase's peak


@dataclass
class Estimate:
    """Bytes on the most loaded GPU and on every pipeline stage."""

    model: dict
    parallel: dict
    train: dict
    params_total: int
    micro_batches: int
    per_gpu_bytes: dict[str, int]
    peak_phase: str
    most_loaded_stage: int
    peak_allocated: int
    peak_reserved: int
    steady_bytes: int
    by_stage: list[StageEstimate]
    model_states: dict[str, int]        # persistent weights, grads, optimizer (ZeRO accounting), most loaded GPU
    layer_activations: dict[str, int] = field(default_factory=dict)  # one layer, one micro-batch, this GPU
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.per_gpu_bytes["total"]


def _optimizer_temp(n_opt: float, train: TrainSpec, by) -> float:
    if train.optimizer not in ("adamw", "adam") or train.optimizer_impl == "fused" or train.framework == "megatron":
        return 0.0  # fused kernels (Megatron uses a fused Adam) update in place
    elem = train.lora.adapter_bytes if train.lora else 4 if by.master else by.states / 2
    if train.optimizer_impl == "foreach":
        return n_opt * elem
    return 0.0  # for-loop: one parameter's temporary at a time (small next to the rest)


def estimate_stage(m: ModelSpec, par: ParallelSpec, train: TrainSpec, stage: int, oh: Overheads,
                   by=None, la=None) -> StageEstimate:
    by = by or precision_bytes(train)
    la = la or layer_activations(m, par, train, by)
    pc = stage_params(m, par, stage)
    ms = model_states(pc.total, par, train, by) if train.lora is None else lora_states(m, pc, train, by)
    if par.zero == 0 and par.dp * par.cp > 1 and train.framework == "pytorch" and par.ddp_bucket_view:
        ms = ModelStates(params=ms.params, grads=0, optimizer=ms.optimizer)  # grads live in the DDP buckets
    sa = stage_activations(m, par, train, by, stage, la)
    last = stage == par.pp - 1
    lg = logits_bytes(m, par, train, by) if last else None
    cb = comm_buffers(m, par, train, by, pc, stage)
    n_micro = micro_batches(par, train)
    k = in_flight(par, stage, n_micro)
    A = sa.layers + sa.embedding + sa.head
    # Autocast caches a 16-bit copy of every matmul weight until the forward's autocast region ends;
    # the linears save them for backward, except inside fully recomputed layers (there only the
    # segment being recomputed holds copies again).
    ac_all = by.autocast * (pc.layer_matmul * pc.layers + pc.head_matmul)
    full_rc = train.recompute.segment is not None  # full or every-K: whole layers are recomputed
    ac_held = by.autocast * pc.head_matmul if full_rc else ac_all
    ac_segment = by.autocast * pc.layer_matmul * min(train.recompute.every, pc.layers) if full_rc else 0
    persistent_grads = train.framework == "megatron"
    g0 = ms.grads if (persistent_grads or n_micro > math.ceil(k)) else 0
    held = lg.held if lg else 0
    # torch.distributed.pipelining's last stage keeps every micro-batch's output (the logits) until the step ends,
    # to merge them into step()'s return value, unless step(return_outputs=False) (torch 2.13
    # pipelining/stage.py:908 output_chunks, detached but kept after the micro-batch's backward, :1056; cleared
    # at the next step, :611): the micro-batches before this one at the forward's loss, all of them in backward
    outs = lg.output if (lg and par.pp > 1 and train.framework == "pytorch" and par.pp_return_outputs) else 0
    ws = oh.workspace

    def cat(params, grads, acts, logits, comm, extra_opt=0.0):
        return {"parameters": params, "gradients": grads, "optimizer_state": ms.optimizer + extra_opt,
                "activations": acts, "logits": logits, "comm_buffers": comm, "context": ws}

    kv = sa.kv_cache  # a transformers model's KV cache: alive in forward and through backward
    fwd = cat(ms.params + (k - 1) * ac_held + ac_all, g0, k * A + kv,
              (k - 1) * held + (n_micro - 1) * outs + (lg.forward_peak if lg else 0),
              cb.persistent + cb.forward)
    # backward starts with the loss's backward (last stage), then the last layer's recompute and work
    bwd_loss = cat(ms.params + k * ac_held, g0, k * A + kv,
                   (k - 1) * held + n_micro * outs + (lg.backward_peak if lg else 0),
                   cb.persistent + cb.backward_start)
    # the LM head's weight gradient appears before the layers' backward (unsharded until ZeRO-2/3 reduce it)
    head_grad = pc.head_matmul * by.grad if (last and (par.zero >= 2 or not g0) and train.lora is None) else 0
    bwd_layer = cat(ms.params + k * ac_held + ac_segment, g0 + head_grad,
                    k * A + kv + sa.recompute_work + sa.backward_work, (k - 1) * held + n_micro * outs,
                    cb.persistent + cb.backward)
    # the end of backward still holds the KV cache (under checkpointing, with what it keeps alive)
    bwd_end = cat(ms.params + (k - 1) * ac_held + (ac_segment if sa.cache_retained else 0), ms.grads,
                  (k - 1) * A + (sa.cache_retained or kv) + sa.backward_work, (k - 1) * held + n_micro * outs,
                  cb.persistent + cb.backward_end)
    cands_bwd = [bwd_loss, bwd_layer, bwd_end]
    if sa.tail:
        # the first segment's last layer at its backward, the cache's retained set beside it (kv_cache_terms);
        # the segment's layers and the embedding have no gradients yet
        not_yet = sa.tail_layers * pc.layer + (pc.embedding if not m.tied_embeddings else pc.embedding - pc.head_matmul)
        cands_bwd.append(cat(ms.params + (k - 1) * ac_held + ac_segment, ms.grads * (1 - not_yet / pc.total),
                             (k - 1) * A + sa.cache_retained + sa.tail, (k - 1) * held + n_micro * outs,
                             cb.persistent + cb.backward_end))
    trained = pc.total if train.lora is None else lora_params(m, train) * pc.layers
    n_opt = trained / (par.shard_group if par.zero >= 1 else 1)
    opt = cat(ms.params, ms.grads, 0, 0, cb.persistent + cb.optimizer, _optimizer_temp(n_opt, train, by))
    cands = {"forward": fwd, "backward": max(cands_bwd, key=lambda c: sum(c.values())), "optimizer": opt}
    phases = {p: int(sum(c.values())) for p, c in cands.items()}
    phase = max(PHASES, key=lambda p: phases[p])
    peak = CategoryBytes({kk: int(v) for kk, v in cands[phase].items()})
    allocated = sum(peak.values())
    overhead = int(allocated * oh.allocator_overhead)
    peak["comm_buffers"] += oh.nccl_per_communicator * communicators(par)
    peak["context"] += oh.cuda_context
    peak["allocator_overhead"] = overhead
    peak["total"] = sum(peak[c] for c in CATEGORIES)
    steady = int(ms.params + ms.optimizer + cb.persistent + ws + (ms.grads if persistent_grads else 0))
    return StageEstimate(stage=stage, layers=pc.layers, in_flight=k, peak_phase=phase, per_gpu_bytes=peak,
                         peak_allocated=allocated, peak_reserved=allocated + overhead, phases=phases,
                         steady_bytes=steady, params_local=pc.total,
                         phase_breakdown={p: CategoryBytes({kk: int(v) for kk, v in c.items()}) for p, c in cands.items()})


def estimate(model: ModelSpec, parallel: ParallelSpec | None = None, train: TrainSpec | None = None,
             overheads: Overheads | None = None, *, all_stages: bool = True) -> Estimate:
    """The analytical per-GPU memory of one training step. Raises LabkitError for impossible
    configurations (heads not divisible by tp, layers by pp x vpp, batch by micro-batch x dp...).

    ``all_stages=False`` computes only the first and last pipeline stages (one of them is always the
    most loaded: middle stages hold the same layers with fewer micro-batches in flight and neither
    the embeddings nor the head); the planner uses it."""
    par = parallel or ParallelSpec()
    train = train or TrainSpec()
    validate(model, par, train)
    oh = overheads or Overheads()
    by = precision_bytes(train)
    la = layer_activations(model, par, train, by)
    which = _stages_to_compute(par) if all_stages else sorted({0, par.pp - 1})
    stages = [estimate_stage(model, par, train, s, oh, by, la) for s in which]
    worst = max(stages, key=lambda s: s.per_gpu_bytes["total"])
    ms = (model_states(worst.params_local, par, train, by) if train.lora is None
          else lora_states(model, stage_params(model, par, worst.stage), train, by))
    notes = []
    if train.framework == "pytorch" and par.tp > 1 and not par.vocab_parallel:
        notes.append("embeddings and LM head replicated over tp: every TP rank computes the full logits")
    if by.autocast:
        notes.append("autocast keeps a 16-bit copy of every matmul weight from forward to backward (counted in params)")
    return Estimate(
        model=spec_dict(model), parallel=spec_dict(par), train=spec_dict(train), params_total=total_params(model),
        micro_batches=micro_batches(par, train), per_gpu_bytes=CategoryBytes(worst.per_gpu_bytes), peak_phase=worst.peak_phase,
        most_loaded_stage=worst.stage, peak_allocated=worst.peak_allocated, peak_reserved=worst.peak_reserved,
        steady_bytes=worst.steady_bytes, by_stage=stages,
        model_states=CategoryBytes(parameters=ms.params, gradients=ms.grads, optimizer_state=ms.optimizer,
                                   total=ms.total),
        layer_activations={"kept": la.kept, "without_recompute": la.full, "attention_core": la.core,
                           "layer_input": la.layer_input},
        notes=notes)


def _stages_to_compute(par: ParallelSpec) -> list[int]:
    return list(range(par.pp))


def spec_dict(obj) -> dict:
    """A spec's fields as plain values (a recompute policy as its spelling; the deprecated
    ``recompute_every`` alias, always folded into ``recompute``, left out)."""
    out = {k: getattr(obj, k) for k in obj.__dataclass_fields__ if k != "recompute_every"}
    for k, v in out.items():
        if k == "recompute":
            out[k] = str(v)
        elif dataclasses.is_dataclass(v):
            out[k] = dataclasses.asdict(v)
    return out


def model_states_only(n_params: int, parallel: ParallelSpec | None = None, train: TrainSpec | None = None) -> ModelStates:
    """Weights, gradients and optimizer states of ``n_params`` parameters per GPU (what the ZeRO and
    DeepSpeed tables compare): the parameters are divided by tp x pp first, then ZeRO-sharded."""
    par = parallel or ParallelSpec()
    train = train or TrainSpec()

    if n_params < 1:
        raise LabkitError(f"--params must be positive, got {n_params}")
    return model_states(n_params / (par.tp * par.pp), par, train)
