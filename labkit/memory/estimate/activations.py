"""Activations kept for backward: per transformer layer, per pipeline stage with its micro-batches
in flight, and the logits and loss buffers of the last stage.

Per layer, the tensors saved for backward of a pre-norm block, as in Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", section 4 and Table 2), with
``s`` sequence (per context-parallel rank), ``b`` micro-batch, ``h`` hidden, ``a`` heads, ``t`` the
tensor-parallel size and ``t_sp`` = t with sequence parallelism, else 1:

====================================  ===================  =========
tensor                                elements             split by
====================================  ===================  =========
norm 1 input (residual stream)        sbh                  t_sp
QKV input (norm 1 output)             sbh                  t_sp (*)
Q, K                                  sb(a + kv) d         t
V                                     sb kv d              t
softmax output, dropout mask+output   as^2b (x3 w/ drop)   t  (math attention only)
projection input (attention output)   sbh                  t
attention dropout mask (1 byte)       sbh                  t_sp
norm 2 input, MLP input               2 sbh                t_sp (*)
MLP: up output, activation output     2 sbf (gated: 4 sbf  t
                                      PyTorch, 3 Megatron)
MLP dropout mask (1 byte)             sbh                  t_sp
====================================  ===================  =========

With 16-bit activations, 1-byte masks, f = 4h and kv = a this is the paper's
``sbh(34 + 5as/h)``. PyTorch-specific terms (``framework="pytorch"``, what the lab's GPT, nanoGPT
and Hugging Face models do): ``F.scaled_dot_product_attention`` with flash/efficient kernels also
keeps the fp32 log-sum-exp (its output is the projection's input: the kernels write it in
(b, s, a, d) layout, so ``y.transpose(1, 2).contiguous()`` copies nothing); the norms keep their
fp32 mean and rstd; and DTensor sequence parallelism (*) saves the *gathered* inputs of the
column-parallel linears, where Megatron keeps the sequence-sharded ones and gathers again in
backward. Under autocast the residual stream (and so the norm inputs) stays fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.memory.estimate.spec import ModelSpec, ParallelSpec, TrainSpec
from labkit.memory.estimate.states import Bytes


@dataclass(frozen=True)
class LayerActivations:
    """Bytes per layer and micro-batch on one GPU."""

    kept: int              # saved for backward under the recompute policy
    full: int              # saved without recomputation (what recomputation rebuilds)
    core: int              # the attention core's share of ``full`` (selective recompute drops it)
    layer_input: int       # the layer's input (what full recomputation keeps)
    backward_work: int     # transient gradient buffers while one layer's backward runs


@dataclass(frozen=True)
class Dims:
    s: int
    b: int
    h: int
    a: int
    kv: int
    d: int
    f: int
    t: int
    t_sp: int
    V: int
    tv: int


def dims(m: ModelSpec, par: ParallelSpec, train: TrainSpec) -> Dims:
    seq = (train.seq or m.seq) // par.cp
    return Dims(s=seq, b=train.micro_batch, h=m.hidden, a=m.heads, kv=m.kv, d=m.d_head, f=m.ffn_size,
                t=par.tp, t_sp=par.tp if par.sp else 1, V=m.vocab, tv=par.tp if par.vocab_parallel else 1)


def layer_terms(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes) -> list[tuple[str, float, bool]]:
    """(name, bytes, is_attention_core) of every saved tensor of one layer and micro-batch."""
    x = dims(m, par, train)
    sb = x.s * x.b
    act, res = by.act, by.resid
    pt = train.framework == "pytorch"
    drop = train.dropout > 0
    gathered = pt and par.sp  # DTensor SP saves the all-gathered linear inputs
    kv_local = max(x.kv // x.t, 1) * x.d if x.kv < x.t else x.kv * x.d / x.t
    q_local = x.a * x.d / x.t
    terms: list[tuple[str, float, bool]] = [
        ("norm 1 input (residual stream)", sb * x.h * res / x.t_sp, False),
        ("QKV input", sb * x.h * act / (1 if gathered else x.t_sp), False),
        ("Q, K", sb * (q_local + kv_local) * act, False),
        ("V", sb * kv_local * act, False),
    ]
    if train.flash:
        if pt:
            # SDPA keeps its output too, but that is the projection's input: the flash and
            # efficient kernels write it in (b, s, a, d) layout, so the transpose back is free.
            terms.append(("attention log-sum-exp (fp32)", sb * (x.a / x.t) * 4, True))
    else:
        scores = (x.a / x.t) * x.s * x.s * x.b
        terms.append(("softmax output", scores * act, True))
        if drop:
            terms.append(("attention dropout mask", scores * 1, True))
            terms.append(("attention dropout output", scores * act, True))
    terms.append(("projection input", sb * q_local * act, False))
    if drop:
        terms.append(("attention residual dropout mask", sb * x.h / x.t_sp, False))
    terms.append(("norm 2 input (residual stream)", sb * x.h * res / x.t_sp, False))
    terms.append(("MLP input", sb * x.h * act / (1 if gathered else x.t_sp), False))
    if m.gated_mlp:
        n_f = 4 if pt else 3
        terms.append(("MLP gate/up and activation outputs", n_f * sb * x.f / x.t * act, False))
    else:
        terms.append(("MLP up output, activation output", 2 * sb * x.f / x.t * act, False))
    if drop:
        terms.append(("MLP residual dropout mask", sb * x.h / x.t_sp, False))
    if pt:
        stats = 8 if m.norm == "layernorm" else 4  # mean and rstd (fp32) per token
        terms.append(("norm statistics", 2 * sb * stats / x.t_sp, False))
    return terms


def layer_activations(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes) -> LayerActivations:
    terms = layer_terms(m, par, train, by)
    full = sum(v for _, v, _ in terms)
    core = sum(v for _, v, c in terms if c)
    x = dims(m, par, train)
    layer_input = x.s * x.b * x.h * by.resid / x.t_sp
    if train.recompute.kind == "selective":
        kept = full - core
    elif train.recompute.segment is not None:
        kept = layer_input  # per layer on average; see stage_activations for every-k segments
    else:
        kept = full
    # Backward of the MLP holds the gradient of its hidden activation twice (input and output of
    # the activation's backward), plus the residual stream's gradient.
    n_f = 2 if not m.gated_mlp else 3
    backward_work = n_f * x.s * x.b * x.f / x.t * by.act + 2 * x.s * x.b * x.h * by.resid / x.t_sp
    return LayerActivations(kept=int(kept), full=int(full), core=int(core), layer_input=int(layer_input),
                            backward_work=int(backward_work))


@dataclass(frozen=True)
class StageActivations:
    """Activations of one micro-batch on one pipeline stage (bytes) and the recompute transient."""

    layers: int            # all transformer layers of the stage, one micro-batch
    embedding: int         # token ids, embedding dropout mask (stage 0)
    head: int              # final norm input and output (last stage)
    recompute_work: int    # what recomputation rebuilds at once in backward (one segment)
    backward_work: int


def stage_activations(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes, stage: int,
                      la: LayerActivations | None = None) -> StageActivations:
    la = la or layer_activations(m, par, train, by)
    x = dims(m, par, train)
    n = m.layers // par.pp
    k = train.recompute.segment
    if k is not None:
        segments = -(-n // k)
        layers = segments * la.layer_input
        recompute_work = min(k, n) * la.full
    else:
        layers = n * la.kept
        recompute_work = la.core if train.recompute.kind == "selective" else 0
    sb = x.s * x.b
    emb = 0
    if stage == 0:
        emb = sb * 8  # token ids (int64), kept by the embedding's backward
        if train.dropout > 0:
            emb += sb * x.h / x.t_sp
    head = 0
    if stage == par.pp - 1:
        # final norm input and output, targets; PyTorch SP gathers the sequence before the final norm
        gathered = train.framework == "pytorch" and par.sp
        head = sb * x.h * by.resid / (1 if gathered else x.t_sp) + sb * x.h * by.act + sb * 8
    return StageActivations(layers=int(layers), embedding=int(emb), head=int(head), recompute_work=int(recompute_work),
                            backward_work=la.backward_work)


@dataclass(frozen=True)
class LogitsBytes:
    """Logits and loss buffers of one micro-batch on the last stage."""

    held: int              # kept from forward to backward
    forward_peak: int      # alive while the loss is computed in forward (includes ``held``)
    backward_peak: int     # alive while the loss's backward runs (includes ``held``)


def logits_bytes(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes) -> LogitsBytes:
    """PyTorch's ``F.cross_entropy(logits.float(), ...)``: log_softmax keeps its fp32 output; its
    backward allocates the gradient of nll_loss and of log_softmax (two more fp32 copies).
    Megatron's fused vocab-parallel cross-entropy keeps one fp32 copy and works in place."""
    x = dims(m, par, train)
    n = x.s * x.b * x.V / x.tv
    a = by.act
    kept = n * a if train.keep_logits else 0
    if train.framework == "megatron":
        held = n * 4 + kept
        fwd = n * a + n * 4
        bwd = n * 4 + n * a + kept
        return LogitsBytes(held=int(held), forward_peak=int(fwd), backward_peak=int(bwd))
    upcast = n * 4 if a != 4 else 0
    held = n * 4 + kept
    logits_alive = n * a  # the logits themselves while the loss is computed
    fwd = logits_alive + upcast + n * 4
    bwd = held + 2 * n * 4
    return LogitsBytes(held=int(held), forward_peak=int(fwd), backward_peak=int(bwd))


def in_flight(par: ParallelSpec, stage: int, n_micro: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at once, in units of the stage's
    layers. GPipe: all m. 1F1B: ``min(p - stage, m)``. Interleaved 1F1B with v chunks per rank:
    rank i runs ``2(p - i - 1) + (v - 1)p + 1`` chunk forwards before its first backward (Megatron's
    schedules.py warm-up), each 1/v of the stage's layers; on the first stage that is
    ``p (1 + (p - 1) / (p v))``, the penalty of Megatron's theoretical_memory_usage.py."""
    p = par.pp
    if p == 1:
        return 1.0
    if par.schedule == "gpipe":
        return float(n_micro)
    if par.schedule == "interleaved" and par.v > 1:
        v = par.v
        chunks = 2 * (p - stage - 1) + (v - 1) * p + 1
        return min(float(n_micro), chunks / v)
    return float(min(p - stage, n_micro))
