"""Parameters and model states: how many parameters each GPU holds, and the bytes of weights,
gradients and optimizer states after ZeRO sharding.

Bytes per parameter (``K`` in the ZeRO paper is the optimizer's share):

=============  ======  =====  ===============================  =====================
precision      weight  grad   optimizer (AdamW)                total
=============  ======  =====  ===============================  =====================
fp32           4       4      8 (m, v)                         16
amp-bf16/fp16  4       4      8 (m, v); autocast adds 16-bit   16
                              weight copies while a micro-batch is in flight
bf16-mixed     2       2 (4)  12 (fp32 master, m, v)           16 (18 with fp32 grads)
bf16           2       2      4 (m, v in bf16)                 8
=============  ======  =====  ===============================  =====================

SGD with momentum keeps one state, 8-bit Adam two 1-byte states plus one fp32 scale per 256-element
block and state (bitsandbytes' block-wise quantisation). ZeRO shards over the ``shard_group``: stage 1
the optimizer (with the master copy), stage 2 also the gradients, stage 3 also the weights. Under
``framework="pytorch"`` stage 3 is FSDP2: its sharded parameter stays in the original fp32 and is
the master copy, gradients are reduced back to fp32 shards: 4 + 4 + 8 bytes per parameter over N.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.errors import LabkitError
from labkit.memory.estimate.spec import ModelSpec, ParallelSpec, TrainSpec

# (weight, grad, master, state) bytes per parameter; act and residual-stream bytes per element.
_PRECISION = {
    "fp32": dict(weight=4, grad=4, master=0, state=4, act=4, resid=4, autocast=0),
    "amp-bf16": dict(weight=4, grad=4, master=0, state=4, act=2, resid=4, autocast=2),
    "amp-fp16": dict(weight=4, grad=4, master=0, state=4, act=2, resid=4, autocast=2),
    "bf16-mixed": dict(weight=2, grad=2, master=4, state=4, act=2, resid=2, autocast=0),
    "fp16-mixed": dict(weight=2, grad=2, master=4, state=4, act=2, resid=2, autocast=0),
    "bf16": dict(weight=2, grad=2, master=0, state=2, act=2, resid=2, autocast=0),
}
ADAM8BIT_BLOCK = 256


@dataclass(frozen=True)
class Bytes:
    """Bytes per parameter and per activation element of a precision + optimizer choice."""

    weight: int
    grad: int
    master: int
    states: float          # optimizer states without the master copy
    act: int               # activations (16-bit under autocast and mixed precision)
    resid: int             # the residual stream (fp32 under autocast: the embeddings are fp32)
    autocast: int          # bytes of the 16-bit weight copies autocast makes (0: none)
    compute_weight: int    # weights as the matmuls read them (what ZeRO-3 gathers)

    @property
    def optimizer(self) -> float:
        """K of the ZeRO paper: master copy + optimizer states."""
        return self.master + self.states

    @property
    def per_param(self) -> float:
        return self.weight + self.grad + self.optimizer


def precision_bytes(train: TrainSpec) -> Bytes:
    # a LoRA base is bfloat16 throughout, under autocast too (no weight copies: its weights are 16-bit already);
    # what autocast changes at the adapters is in activations.lora_layer_terms
    p = _PRECISION["bf16" if train.lora is not None else train.precision]
    grad = 4 if train.fp32_grad_accum else p["grad"]
    state = p["state"]
    if train.optimizer in ("adamw", "adam"):
        states = 2.0 * state
    elif train.optimizer == "sgd":
        states = 1.0 * state
    else:  # adam8bit: two 1-byte states and an fp32 absmax per block and state
        states = 2.0 + 2 * 4 / ADAM8BIT_BLOCK
    compute = p["autocast"] or p["weight"]
    return Bytes(weight=p["weight"], grad=grad, master=p["master"], states=states, act=p["act"],
                 resid=p["resid"], autocast=p["autocast"], compute_weight=compute)


# ------------------------------------------------------------------ parameter counts

@dataclass(frozen=True)
class ParamCounts:
    """Parameters of one pipeline stage on one tensor-parallel rank."""

    layer: int             # one transformer layer (this rank's TP shard)
    layer_matmul: int      # of which in matmul weights (what autocast copies)
    embedding: int         # word (+ position) embeddings on this stage (0 if not stage 0)
    head: int              # final norm + LM head on this stage (0 if not the last stage)
    head_matmul: int       # LM-head weight used by a matmul on this stage
    layers: int            # transformer layers on this stage

    @property
    def total(self) -> int:
        return self.layer * self.layers + self.embedding + self.head


def layer_params(m: ModelSpec, tp: int = 1) -> tuple[int, int]:
    """(params, matmul params) of one transformer layer on one TP rank."""
    h, d, f = m.hidden, m.d_head, m.ffn_size
    q = m.heads * d // tp
    kv = max(m.kv // tp, 1) * d
    b = 1 if m.bias else 0
    attn_w = h * q + 2 * h * kv + q * h
    attn_b = b * (q + 2 * kv + h)                    # column biases are split, the row bias is not
    n_mlp = 3 if m.gated_mlp else 2
    mlp_w = n_mlp * h * f // tp
    mlp_b = b * ((n_mlp - 1) * f // tp + h)
    if m.hf is not None and m.hf.experts:
        # the router, E experts' gate_up and down weights, a shared expert with its sigmoid gate (Qwen2-MoE)
        e = m.hf
        shared = 3 * h * e.shared_ffn + h if e.shared_ffn else 0
        mlp_w = (h * e.experts + e.experts * 3 * h * e.expert_ffn + shared) // tp
        mlp_b = 0
    if m.hf is not None and m.hf.rel_span and not m.hf.share_att_key:
        # DeBERTa-v2's pos_key_proj (c2p) and pos_query_proj (p2c), biased (DisentangledSelfAttention.__init__)
        attn_w += m.hf.pos_att * h * q
        attn_b += m.hf.pos_att * q
    norm = (2 if m.norm == "layernorm" else 1) * h
    matmul = attn_w + mlp_w
    return matmul + attn_b + mlp_b + 2 * norm, matmul


def lora_params(m: ModelSpec, train: TrainSpec) -> int:
    """Adapter parameters of one layer: ``r (in + out)`` per adapted projection, q, k, v, o in that order."""
    L = train.lora
    if L is None:
        return 0
    q, kv = m.heads * m.d_head, m.kv * m.d_head
    shapes = [(m.hidden, q), (m.hidden, kv), (m.hidden, kv), (q, m.hidden)][:L.targets]
    return sum(L.rank * (i + o) for i, o in shapes)


def lora_states(m: ModelSpec, pc: "ParamCounts", train: TrainSpec, by: Bytes) -> ModelStates:
    """The frozen 16-bit base and the adapters: gradients and the optimizer's states for the adapters only (peft
    sets ``requires_grad=False`` on every base parameter; the optimizer is given the trainable ones)."""
    n_a = lora_params(m, train) * pc.layers
    ab = train.lora.adapter_bytes
    states = {"adamw": 2, "adam": 2, "sgd": 1}.get(train.optimizer)
    if states is None:

        raise LabkitError(f"LoRA: the estimator models AdamW or SGD over the adapters, not {train.optimizer}")
    return ModelStates(params=int(pc.total * by.weight + n_a * ab), grads=int(n_a * ab),
                       optimizer=int(n_a * ab * states))


def total_params(m: ModelSpec) -> int:
    """All parameters of the model (tied embeddings counted once)."""
    layer, _ = layer_params(m, 1)
    if m.hf is not None and (m.hf.patch or m.hf.decoder_layers or m.hf.model_type == "deberta-v2"):
        return m.layers * layer + stage_params(m, ParallelSpec(), 0).embedding + stage_params(m, ParallelSpec(), 0).head
    emb = m.vocab * m.hidden + (m.seq * m.hidden if m.learned_pos_emb else 0)
    norm = (2 if m.norm == "layernorm" else 1) * m.hidden
    head = 0 if m.tied_embeddings else m.vocab * m.hidden
    return m.layers * layer + emb + norm + head


def stage_params(m: ModelSpec, par: ParallelSpec, stage: int) -> ParamCounts:
    tv = par.tp if par.vocab_parallel else 1
    layer, layer_mm = layer_params(m, par.tp)
    first, last = stage == 0, stage == par.pp - 1
    word = m.vocab * m.hidden // tv
    emb = (word + (m.seq * m.hidden if m.learned_pos_emb else 0)) if first else 0
    norm = (2 if m.norm == "layernorm" else 1) * m.hidden
    head = 0
    head_mm = 0
    if m.hf is not None and m.hf.decoder_layers:
        # BART (pp=1): the shared word embedding (tied to the LM head), each stack's position table and embedding
        # LayerNorm, and the decoder layers' cross-attention (q, k, v, o with biases, its LayerNorm). T5
        # (modeling_t5.py): the shared embedding, each stack's relative-position bias table (buckets x heads, in its
        # first layer's self-attention) and final T5LayerNorm, the cross-attention (q, k, v, o of d_kv x heads, no
        # biases, its T5LayerNorm); the LM head is the shared embedding unless tie_word_embeddings is false
        h, inner = m.hidden, m.heads * m.d_head
        norm = (2 if m.norm == "layernorm" else 1) * h
        cross = m.hf.decoder_layers * (4 * h * inner + (3 * inner + h if m.bias else 0) + norm)
        if m.hf.rel_bias:
            emb = m.vocab * h + 2 * m.hf.rel_bias * m.heads + 2 * norm + cross
        else:
            emb = m.vocab * h + 2 * m.hf.positions * h + 2 * norm + cross
        return ParamCounts(layer=layer, layer_matmul=layer_mm, embedding=emb,
                           head=0 if m.tied_embeddings else m.vocab * h, head_matmul=m.vocab * h, layers=m.layers)
    if m.hf is not None and m.hf.patch:
        # ViT: the patch convolution (weight and bias) and the [CLS] token, the position table; the classifier
        p = m.hf.patch
        emb = (m.hf.channels * p * p * m.hidden + 2 * m.hidden + m.seq * m.hidden) if first else 0
        if last:
            head, head_mm = norm + m.vocab * m.hidden + m.vocab, m.vocab * m.hidden
        return ParamCounts(layer=layer, layer_matmul=layer_mm, embedding=emb, head=head, head_matmul=head_mm,
                           layers=m.layers // par.pp)
    if first and m.hf is not None and m.hf.model_type == "deberta-v2":
        # DeBERTa-v2: the encoder's relative embeddings (rel_span x hidden, with relative attention) and the
        # embeddings' LayerNorm
        emb += m.hf.rel_span * m.hidden + norm
    if last:
        head = norm
        head_mm = word
        if m.hf is not None and m.hf.model_type == "deberta-v2":
            # its masked-LM head (BertLMPredictionHead's layout): the transform's dense (weight and bias) and the
            # decoder's bias of vocab entries, besides the transform's LayerNorm (``norm``)
            head += m.hidden * m.hidden + m.hidden + m.vocab
        if not m.tied_embeddings or not first:
            # untied head, or (Megatron) the tied word embedding copied to the last stage
            head += word
    return ParamCounts(layer=layer, layer_matmul=layer_mm, embedding=emb, head=head, head_matmul=head_mm,
                       layers=m.layers // par.pp)


# ------------------------------------------------------------------ model states

@dataclass(frozen=True)
class ModelStates:
    """Persistent bytes of weights, gradients and optimizer states on one GPU (after sharding)."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def model_states(n_params: float, par: ParallelSpec, train: TrainSpec, b: Bytes | None = None) -> ModelStates:
    """Weights, gradients and optimizer states of ``n_params`` parameters under ZeRO ``par.zero``
    over ``par.shard_group`` ranks (the ZeRO paper's formulas, with FSDP2's layout for stage 3
    under the PyTorch framework with mixed precision)."""
    b = b or precision_bytes(train)
    n = par.shard_group if par.zero else 1
    w, g, opt = float(b.weight), float(b.grad), b.optimizer
    if par.zero == 3 and train.framework == "pytorch" and b.master:
        # FSDP2 mixed precision: the fp32 shard is both the parameter and the master copy,
        # gradients are reduced into fp32 shards (reduce_dtype or the original dtype).
        w, g, opt = float(b.master), 4.0, b.states
    params = w * n_params / (n if par.zero >= 3 else 1)
    grads = g * n_params / (n if par.zero >= 2 else 1)
    optimizer = opt * n_params / (n if par.zero >= 1 else 1)
    return ModelStates(params=int(round(params)), grads=int(round(grads)), optimizer=int(round(optimizer)))
