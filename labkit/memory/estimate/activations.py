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

from labkit.core.errors import LabkitError
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
    if train.lora is not None:
        return lora_layer_terms(m, par, train, by)
    x = dims(m, par, train)
    sb = x.s * x.b
    act, res = by.act, by.resid
    pt = train.framework == "pytorch"
    drop = hidden_dropout(m, train) > 0
    gathered = pt and par.sp  # DTensor SP saves the all-gathered linear inputs
    kv_local = max(x.kv // x.t, 1) * x.d if x.kv < x.t else x.kv * x.d / x.t
    q_local = x.a * x.d / x.t
    math = attention_path(m, train) == "math"
    terms: list[tuple[str, float, bool]] = [
        ("norm 1 input (residual stream)", sb * x.h * res / x.t_sp, False),
        ("QKV input", sb * x.h * act / (1 if gathered else x.t_sp), False),
    ]
    hf = m.hf if (m.hf is not None and pt) else None
    # SDPA's math path computes in float32 for 16-bit inputs (aten/src/ATen/native/transformers/attention.cpp,
    # _scaled_dot_product_attention_math: "Keep query, key, value in high precision", ``query_.to(at::kFloat)`` for
    # half and bfloat16 unless allowFP16BF16ReductionMathSDP; T5's self-attention under autocast and in bf16)
    mb = 4 if (math and hf is not None and hf.attn_impl == "sdpa") else act
    if math and hf is not None:
        # PyTorch's math path (attention.cpp, _scaled_dot_product_attention_math) scales q and k by
        # sqrt(scale) and repeats GQA's k and v to every query head before the matmuls, which save
        # them; BLOOM's eager attention (no GQA) keeps a query, key and value per head likewise
        terms.append(("Q, K, V as the math path saves them (scaled, repeated to every head)",
                      3 * sb * q_local * mb, False))
    else:
        terms += [("Q, K", sb * (q_local + kv_local) * act, False), ("V", sb * kv_local * act, False)]
    if not math:
        if pt:
            # SDPA keeps its output too, but that is the projection's input: the flash and
            # efficient kernels write it in (b, s, a, d) layout, so the transpose back is free.
            terms.append(("attention log-sum-exp (fp32)", sb * (x.a / x.t) * 4, True))
    else:
        scores = (x.a / x.t) * x.s * x.s * x.b
        deberta = hf is not None and hf.model_type == "deberta-v2"
        if deberta:
            terms += disentangled_terms(m, x, by)
            # its plain softmax: a float32 op under autocast (the output kept), whose dropout's output the context
            # bmm casts back to 16 bits for itself
            terms.append(("softmax output", scores * (4 if by.autocast else act), True))
        else:
            terms.append(("softmax output", scores * mb, True))
        if hf is not None and hf.attn_impl == "eager" and act != 4 and not deberta:
            # transformers' eager attention takes the softmax in float32 and casts it back
            # (modeling_bloom.py: F.softmax(..., dtype=torch.float32).to(input_dtype)): both are kept
            terms.append(("softmax output (float32)", scores * 4, True))
        attn_drop = drop if m.hf is None else m.hf.attn_dropout > 0
        if attn_drop:
            terms.append(("attention dropout mask", scores * 1, True))
            terms.append(("attention dropout output", scores * mb, True))
    terms.append(("projection input", sb * q_local * act, False))
    if m.hf is not None and pt:
        terms += mask_terms(m, x, train, act)
        terms += hf_layer_terms(m, x, by)
    if drop:
        terms.append(("attention residual dropout mask", sb * x.h / x.t_sp, False))
    if not (m.hf is not None and pt and m.hf.parallel_residual):
        # GPT-NeoX's parallel residual (modeling_gpt_neox.py, GPTNeoXLayer.forward, use_parallel_residual): its
        # second norm reads the layer's input, already counted as the first norm's
        terms.append(("norm 2 input (residual stream)", sb * x.h * res / x.t_sp, False))
    terms.append(("MLP input", sb * x.h * act / (1 if gathered else x.t_sp), False))
    if m.hf is not None and pt and m.hf.experts:
        terms += moe_terms(m, x, by)
    elif m.gated_mlp:
        n_f = 4 if pt else 3
        terms.append(("MLP gate/up and activation outputs", n_f * sb * x.f / x.t * act, False))
    else:
        terms.append(("MLP up output, activation output", 2 * sb * x.f / x.t * act, False))
    if hf is not None and hf.mlp_dropout and hidden_dropout(m, train) > 0:
        # T5 drops out the MLP's hidden activation before wo (modeling_t5.py, T5DenseActDense.forward and
        # T5DenseGatedActDense.forward): the dropout's mask is kept, and wo keeps the dropout's output (under
        # autocast its 16-bit cast of the float32 copy T5 makes to match wo's weight) instead of the activation's
        # (ReLU's output, then no longer the down projection's input) or the gate's product (the same size)
        terms.append(("MLP hidden dropout: mask, and ReLU's output beside wo's input" if hf.act == "relu"
                      and not m.gated_mlp else "MLP hidden dropout mask",
                      sb * x.f / x.t * (1 + (act if hf.act == "relu" and not m.gated_mlp else 0)), False))
    if drop:
        terms.append(("MLP residual dropout mask", sb * x.h / x.t_sp, False))
    if pt:
        stats = 8 if m.norm == "layernorm" else 4  # mean and rstd (fp32) per token
        terms.append(("norm statistics", 2 * sb * stats / x.t_sp, False))
    return terms


def lora_layer_terms(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes) -> list[tuple[str, float, bool]]:
    """What a Llama-like transformers layer saves for backward with LoRA adapters on its attention projections and
    a frozen bfloat16 base (what the fake-mode trace of ``tinyllama-b4-lora-bf16`` keeps per layer, to the byte).

    Autograd saves an operand only for a gradient it must compute: a frozen linear (``x @ W.T``, W not requiring
    grad) keeps its weight but not its input, and ``weight * x`` with a frozen weight keeps the weight alone
    (torch/csrc/autograd/FunctionsManual and derivatives.yaml: ``mm``'s ``self`` is saved only for ``mat2``'s
    gradient). So:

    * RMSNorm (modeling_llama.py, LlamaRMSNorm.forward) keeps its float32 copy of the input (``pow`` and the
      ``rsqrt`` product read it) and the rsqrt, but not its 16-bit input or output;
    * attention: the rotated queries, the keys and values (the KV cache's tensors where the cache is on, counted
      with the cache), the fused kernel's output and log-sum-exp;
    * LoRA (peft tuners/lora/layer.py, ``Linear.forward``: ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``,
      then ``lora_B(lora_A(dropout(x))) * scaling``): each adapter's ``lora_A`` keeps its input: with float32
      adapters every adapted projection casts the input for itself (one float32 copy each); with bfloat16 adapters
      q, k and v share the norm's output and o reads the attention's output (already kept); under autocast, float32
      adapters' ``lora_A`` keeps autocast's bfloat16 cast of peft's float32 copy, its own per adapter. ``lora_B``
      keeps ``lora_A``'s rank-r output. With dropout, ``lora_A`` keeps the dropout's output instead and dropout its
      1-byte mask, per adapter;
    * the MLP: the gate's and up projection's outputs and the activation's (``act_fn(gate) * up`` keeps all three);
      the frozen down projection keeps nothing."""
    L = train.lora
    x = dims(m, par, train)
    sb = x.s * x.b
    act = by.act
    # autocast casts lora_A's input only where peft made it float32 (float32 adapters): a bfloat16 tensor passes as is
    autocast = train.precision == "amp-bf16" and L.adapter_bytes != act
    terms: list[tuple[str, float, bool]] = [
        ("RMSNorm float32 input copies (2 norms)", 2 * sb * x.h * 4, False),
        ("norm statistics", 2 * sb * 4, False),
        ("Q (rotary output)", sb * x.a * x.d * act, False),
    ]
    terms += mask_terms(m, x, train, act)
    if not (m.hf.use_cache and train.framework == "pytorch"):
        terms.append(("K (rotary output), V", 2 * sb * x.kv * x.d * act, False))
    terms.append(("attention output and log-sum-exp", sb * x.a * x.d * act + x.b * x.a * x.s * 4, False))
    in_sizes = [x.h, x.h, x.h, x.a * x.d][:L.targets]
    if L.dropout > 0:
        per = act if (L.adapter_bytes == act or autocast) else L.adapter_bytes
        terms.append(("LoRA: each adapter's dropout output and mask", sum(in_sizes) * sb * (per + 1), False))
    elif autocast or L.adapter_bytes != act:
        per = act if autocast else L.adapter_bytes
        terms.append(("LoRA: each adapter's own cast of its input", sum(in_sizes) * sb * per, False))
    else:
        terms.append(("LoRA: q, k, v's shared input (the norm's output)", sb * x.h * act, False))
    out_bytes = act if autocast else L.adapter_bytes
    terms.append(("LoRA: lora_A's outputs (lora_B's inputs)", L.targets * sb * L.rank * out_bytes, False))
    n_f = 3 if m.gated_mlp else 1
    terms.append(("MLP gate/up and activation outputs (frozen: the down projection keeps nothing)",
                  n_f * sb * x.f * act, False))
    return terms


def moe_terms(m: ModelSpec, x: "Dims", by: Bytes) -> list[tuple[str, float, bool]]:
    """A mixture-of-experts MLP as transformers runs it by default (integrations/moe.py, grouped_mm_experts_forward):
    each token's k (token, expert) rows sorted by expert, gathered (``hidden_states[perm // k]``), one grouped GEMM
    to gate and up, ``act(gate) * up``, one grouped GEMM down, times the routing weight. Every tensor has T x k
    rows whatever the routing, so the memory needs no routing assumption (labkit.memory.trace.fake.moe says the
    same for the trace). Kept: the gathered rows, the gate/up output, the activation's and the product's, the
    expert outputs (the routing weights' multiplication); the router's float32 softmax (T x E). Qwen2-MoE adds a
    shared expert (a gated MLP on every token: four tensors of its width) scaled by a sigmoid gate, which keeps the
    shared expert's output."""
    e = m.hf
    sb = x.s * x.b
    rows = sb * e.top_k
    act = by.act
    out = [("MoE: gathered rows, gate/up, activation and product, expert outputs",
            rows * (2 * x.h + 4 * e.expert_ffn) * act / x.t, False),
           ("MoE: the router's float32 softmax", sb * e.experts * 4, False)]
    if e.shared_ffn:
        out.append(("MoE: the shared expert's gated MLP and its output", (4 * sb * e.shared_ffn + sb * x.h) * act / x.t,
                    False))
    return out


def disentangled_terms(m: ModelSpec, x: "Dims", by: Bytes) -> list[tuple[str, float, bool]]:
    """DeBERTa-v2's disentangled attention (He et al. 2020, arXiv:2006.03654; modeling_deberta_v2.py,
    DisentangledSelfAttention.forward and disentangled_attention_bias), beyond the query, the scaled key
    (``key_layer.transpose(-1, -2) / scale``: a new tensor the content bmm keeps) and the value, counted as the math
    path's: the key itself, which p2c's bmm keeps; the position keys and queries
    (``pos_key_proj`` / ``pos_query_proj`` of the relative embeddings, ``.repeat`` to every sequence of the batch:
    b x heads x rel_span x d each); c2p's and p2c's (b x heads, s, rel_span) score blocks, which ``torch.gather``
    keeps; the gathers' (s, s) int64 indices; the mask ``masked_fill`` keeps (b, 1, s, s booleans); the relative
    embeddings' dropout mask and the position projections' input (under autocast, one 16-bit cast each). Without
    relative attention (``relative_attention`` false: rel_span 0) only the mask."""
    e = m.hf
    sb = x.s * x.b
    act = by.act
    q_local = x.a * x.d / x.t
    n = e.pos_att
    out = [("DeBERTa: the key p2c's bmm reads (the scaled one counted as the math path's)", sb * q_local * act, False)
           ] if n > 1 else []
    if n and e.rel_span:
        out += [("DeBERTa: position keys/queries repeated over the batch", n * x.b * e.rel_span * q_local * act, False),
                ("DeBERTa: c2p/p2c score blocks kept by gather", n * x.b * (x.a / x.t) * x.s * e.rel_span * act, True),
                ("DeBERTa: gather indices (int64)", n * x.s * x.s * 8, False),
                ("DeBERTa: relative embeddings' dropout mask and the projections' input",
                 e.rel_span * x.h * (1 + (n * act if by.autocast else act)), False)]
    out.append(("DeBERTa: masked_fill's mask", x.b * x.s * x.s, False))
    return out


def cross_attention_bytes(m: ModelSpec, x: "Dims", by: Bytes) -> float:
    """What a BART decoder layer's cross-attention block keeps (modeling_bart.py, BartDecoderLayer.forward:
    ``encoder_attn``, its dropout, residual add and ``encoder_attn_layer_norm``): the query, key and value
    projections' outputs (keys and values from the encoder's output), the fused kernel's output and log-sum-exp,
    the residual sum (the LayerNorm's input), the LayerNorm's output and statistics, the dropout's mask. Under
    autocast the query reads a 16-bit copy of the float32 LayerNorm output, and the key and value projections
    each cast the float32 encoder output for themselves (autocast caches only weights). T5's block
    (modeling_t5.py, T5LayerCrossAttention: pre-norm, then ``EncDecAttention``, dropout, residual add) keeps the
    same, its T5LayerNorm keeping a float32 normalised copy and one statistic per token (see hf_layer_terms'
    RMSNorm); its attention has no relative bias (a zeros bias that does not require grad: the fused kernel runs)."""
    sb = x.s * x.b
    act, res = by.act, by.resid
    inner = x.a * x.d
    stats = sb * 8 if m.norm == "layernorm" else sb * 4 + sb * x.h * 4
    stats += sb * x.h * res if t5_norm_input(m, by) else 0
    kept = 4 * sb * inner * act + x.b * x.a * x.s * 4 + sb * x.h * res + sb * x.h * act + sb * x.h + stats
    if by.autocast:
        kept += 2 * sb * x.h * act
    return kept


def encoder_decoder_extras(m: ModelSpec, x: "Dims", by: Bytes) -> tuple[float, float]:
    """(embedding side, head side) of a T5 model beyond one stack's embedding and head (modeling_t5.py, T5Stack.forward
    and T5ForConditionalGeneration.forward). Each stack keeps its token ids, its input dropout's mask and its
    relative-position buckets ((s, s) int64, the bias embedding's backward: ``compute_bias``, once per stack; the
    other layers reuse the bias it returns). The encoder ends in T5LayerNorm (its input, float32 normalised copy and
    statistic) and a dropout (its mask); its output is the cross-attention keys' and values' input, one tensor kept
    for every decoder layer (under autocast each layer's projections keep their own casts instead, counted in
    cross_attention_bytes). The decoder's end adds the same norm's float32 copy and statistic and the dropout's mask
    to the generic head (the norm's input, the LM head's input: the output scaled by d_model**-0.5 where the head is
    tied, ``scale_decoder_outputs``, a new tensor either way). Each decoder self-attention keeps the boolean causal mask
    ``create_position_bias_mask`` (integrations/sdpa_attention.py) selects the bias with (``torch.where``)."""
    sb = x.s * x.b
    stack_in = sb * 8 + sb * x.h + x.s * x.s * 8
    norm_end = sb * x.h * by.resid + sb * x.h * 4 + sb * 4 + sb * x.h
    kept_input = sb * x.h * by.resid if t5_norm_input(m, by) else 0
    emb = (2 * stack_in + norm_end + kept_input + (0 if by.autocast else sb * x.h * by.act)
           + m.hf.decoder_layers * x.s * x.s)
    head = sb * x.h * 4 + sb * 4 + sb * x.h + kept_input
    return emb, head


def mask_terms(m: ModelSpec, x: "Dims", train: TrainSpec, act: int) -> list[tuple[str, float, bool]]:
    """A padded batch (``attention_mask`` with zeros) of a transformers model: SDPA is given the mask, a (b, 1, s, s)
    tensor in the activation dtype kept per layer, and no longer runs grouped-query attention in the kernel
    (integrations/sdpa_attention.py, ``use_gqa_in_sdpa``: CUDA needs ``attention_mask is None``), so ``repeat_kv``
    copies keys and values to every query head and the kernel keeps those copies (the fake-mode trace of
    tinyllama-b4-lora-padded-bf16)."""
    if not train.padded or m.hf is None or train.framework != "pytorch":
        return []
    out = [("attention mask given to SDPA", x.b * x.s * x.s * act, False)]
    if x.kv < x.a:
        out.append(("K, V repeated to every query head (a mask: no GQA in the kernel)",
                    2 * x.s * x.b * (x.a / x.t) * x.d * act, False))
    return out


def hidden_dropout(m: ModelSpec, train: TrainSpec) -> float:
    """The residual dropout probability: the recipe's, or a transformers config's (GPT-2's resid_pdrop
    0.1, OPT's dropout 0.1: ``model.train()`` switches them on)."""
    if m.hf is not None and train.framework == "pytorch":
        return max(train.dropout, m.hf.hidden_dropout)
    return train.dropout


def attention_path(m: ModelSpec, train: TrainSpec) -> str:
    """``fused`` (flash, cuDNN or memory-efficient SDPA: no s x s tensor kept) or ``math`` (the
    (b, heads, s, s) probabilities kept for backward).

    ``train.flash=False`` asks for the math path. A transformers model takes it where its attention
    is eager (BLOOM), and, on the H200's PyTorch 2.11, for float32 grouped-query attention: transformers
    calls SDPA with ``enable_gqa=True`` (integrations/sdpa_attention.py, use_gqa_in_sdpa), flash and
    cuDNN take no float32, and the memory-efficient kernel supports GQA only from PR pytorch#191085
    (torch 2.13), so ``select_sdp_backend`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp)
    falls back to math: the same rule as the tracer's :mod:`labkit.memory.trace.fake.sdpa`."""
    if not train.flash:
        return "math"
    if m.hf is None or train.framework != "pytorch":
        return "fused"
    if m.hf.attn_impl == "eager":
        return "math"
    # T5's learned relative-position bias is SDPA's mask and requires grad: the mem-efficient kernel and cuDNN refuse
    # such a mask (sdp_utils.cpp; the H200 ran the math path: labkit.memory.trace.fake.sdpa)
    if m.hf.rel_bias:
        return "math"
    # Falcon calls SDPA itself with keys and values expanded to every head (modeling_falcon.py)
    if train.precision == "fp32" and m.kv < m.heads and m.hf.model_type != "falcon":
        return "math"
    return "fused"


def t5_norm_input(m: ModelSpec, by: Bytes) -> bool:
    """Whether each T5LayerNorm keeps its input besides the generic RMSNorm's tensors: T5LayerNorm.forward
    (modeling_t5.py) computes the variance on ``hidden_states.to(torch.float32)`` but multiplies ``hidden_states``
    itself by the rsqrt, where LlamaRMSNorm multiplies the float32 copy. With a float32 residual stream (fp32,
    autocast) the copy is the input (``.to`` returns it), so nothing more; with a 16-bit one (bf16) the product keeps
    the 16-bit input beside the copy (the fake-mode trace of mt5-small-b16-bf16: -1.6% without it)."""
    return m.hf is not None and m.hf.norm_keeps_input and by.resid != 4


def hf_layer_terms(m: ModelSpec, x: "Dims", by: Bytes) -> list[tuple[str, float, bool]]:
    """What a transformers decoder layer saves beyond the generic pre-norm block (per micro-batch):

    * RMSNorm (modeling_llama.py, LlamaRMSNorm.forward: ``hidden_states.to(torch.float32)``, then
      ``hidden_states * torch.rsqrt(variance + eps)``, then ``self.weight * hidden_states.to(input_dtype)``):
      the multiplications keep a float32 tensor of the input's size besides the input and the output
      (in 16-bit models the float32 copy of the input, in float32 ones the normalised input), two per
      layer; Qwen3 and Gemma-3 normalise queries and keys per head the same way (``q_norm``, ``k_norm``);
    * the activation: ``gelu_new`` (activations.py, NewGELUActivation: the tanh formula in Python)
      keeps three more tensors of the MLP's width than F.gelu; ReLU keeps only its output, which is also
      the down projection's input (one fewer than GELU's input and output)."""
    sb = x.s * x.b
    act = by.act
    out: list[tuple[str, float, bool]] = []
    if m.norm == "rmsnorm":
        out.append(("RMSNorm float32 intermediates (2 norms)", 2 * sb * x.h * 4 / x.t_sp, False))
        if t5_norm_input(m, by):
            out.append(("T5LayerNorm: its 16-bit input, which the rsqrt multiplies (2 norms)",
                        2 * sb * x.h * by.resid / x.t_sp, False))
        if m.hf.qk_norm:
            q_local = x.a * x.d / x.t
            kv_local = max(x.kv // x.t, 1) * x.d if x.kv < x.t else x.kv * x.d / x.t
            out.append(("query/key RMSNorm: float32 copy and output", sb * (q_local + kv_local) * (4 + act), False))
    casts = (m.hf.attn_in_linears - 1) + (m.hf.mlp_in_linears - 1)
    if by.autocast and casts:
        # under autocast the norms' outputs are float32 and every linear reading one casts it to 16 bits for
        # itself and saves that copy: autocast caches only casts of leaf tensors that require grad, the
        # weights (aten/src/ATen/autocast_mode.cpp, cached_cast: can_try_cache). The generic terms count one
        # copy per norm; q, k and v apart make two more, gate and up apart one more. Replicated under TP.
        out.append(("autocast: 16-bit copies of a norm's output, one per linear reading it", casts * sb * x.h * act,
                    False))
    if not m.gated_mlp or m.hf.act in ("gelu_new", "gelu_fast"):   # T5 v1.1 gates with gelu_new
        if m.hf.act in ("gelu_new", "gelu_fast"):
            # kept besides the input and the output: tanh's output, 0.5 * input and 1 + tanh. Under
            # autocast pow is a float32 op (CUDA autocast's op list, torch.amp docs): it casts the input to
            # float32 and keeps that copy instead of the 16-bit input, and tanh and 1 + tanh are float32
            if by.autocast:
                extra = (4 - act) + 2 * 4 + act
                if m.gated_mlp:
                    # the output is float32 then too (its last product reads 1 + tanh), and a gated MLP's product
                    # keeps it as it is, where a plain MLP's down projection keeps its 16-bit cast (the fake-mode
                    # trace of mt5-small-b16-amp-bf16: T5DenseGatedActDense's ``hidden_gelu * hidden_linear``)
                    extra += 4 - act
            else:
                extra = 3 * act
            out.append(("gelu_new: the tanh formula's intermediates", sb * x.f / x.t * extra, False))
        elif m.hf.act == "relu":
            out.append(("ReLU keeps only its output", -sb * x.f / x.t * act, False))
    return out


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
    if attention_path(m, train) == "math":
        # the math path's backward holds the gradients of the probabilities and of the scores at once
        backward_work = max(backward_work, 2 * (x.a / x.t) * x.s * x.s * x.b * by.act)
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
    kv_cache: int = 0      # a transformers model's KV cache while it is alive (see kv_cache_terms)
    cache_retained: int = 0  # with checkpointing: what the cache keeps alive at the end of backward
    tail: int = 0          # with checkpointing and the cache: the last segment's last layer at its backward, beyond
                           # cache_retained, its gradient work included (see kv_cache_terms)
    tail_layers: int = 0   # the layers whose gradients do not exist yet at that point (the last segment's)


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
        if m.hf is not None and m.hf.patch:
            # ViT: the images (float32, bfloat16 for a bfloat16 model), kept by the patch convolution (under autocast
            # its bfloat16 copy), instead of token ids
            pixels = x.b * m.hf.channels * (x.s - 1) * m.hf.patch ** 2
            emb = pixels * by.resid + (pixels * by.act if by.autocast else 0)
        if (train.dropout > 0 if m.hf is None or train.framework != "pytorch"
                else max(train.dropout, m.hf.embd_dropout) > 0):
            emb += sb * x.h / x.t_sp
    head = 0
    if stage == par.pp - 1:
        # final norm input and output, targets; PyTorch SP gathers the sequence before the final norm
        gathered = train.framework == "pytorch" and par.sp
        head = sb * x.h * by.resid / (1 if gathered else x.t_sp) + sb * x.h * by.act + sb * 8
        if m.hf is not None and train.framework == "pytorch" and m.hf.mlm_head:
            # BERT's masked-LM head (modeling_bert.py, BertPredictionHeadTransform): dense, activation, LayerNorm
            # before the decoder: the dense's output and the activation's besides the norm's input and output
            head += 2 * sb * x.h * by.act
    if m.hf is not None and m.hf.decoder_layers and train.framework == "pytorch":
        if k is not None:

            raise LabkitError(f"{m.name}: recomputation of an encoder-decoder is not modelled by the estimator; "
                              "use `labkit measure --hf-config` (the tracer)")
        layers += m.hf.decoder_layers * cross_attention_bytes(m, x, by)
        if m.hf.rel_bias:
            emb, extra = encoder_decoder_extras(m, x, by)
            head += extra
        else:
            # the decoder's embedding too: its ids, the position add (the embedding LayerNorm's input), dropout's mask
            emb = 2 * emb + 2 * sb * x.h * by.resid
    cache, retained, tail = kv_cache_terms(m, par, train, by, la, n)
    return StageActivations(layers=int(layers), embedding=int(emb), head=int(head), recompute_work=int(recompute_work),
                            backward_work=la.backward_work, kv_cache=int(cache), cache_retained=int(retained),
                            tail=int(tail), tail_layers=min(k, n) if tail else 0)


def kv_cache_terms(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes, la: LayerActivations,
                   n_layers: int) -> tuple[float, float, float]:
    """(bytes the KV cache adds while it lives, bytes kept at the end of backward, the tail) of a transformers
    causal LM whose config leaves ``use_cache`` on (the default): its training forward builds a
    ``DynamicCache`` (modeling_llama.py, LlamaModel.forward: ``if use_cache and past_key_values is None:
    past_key_values = DynamicCache(config=self.config)``) holding every layer's keys and values.

    * The cache's first ``update`` concatenates each layer's keys and values onto an empty tensor
      (cache_utils.py, DynamicLayer.update: ``torch.cat([self.keys, key_states], dim=-2)``): a copy of
      both per layer, the keys in the rotary embedding's output dtype (float32 under autocast: cos and
      sin take the float32 residual stream's dtype). The fake-mode trace, which matches the H200, keeps
      them through backward.
    * Under torch.utils.checkpoint (``recompute``) the cache is also an argument of every checkpointed
      segment; the recomputation appends each layer's keys and values again (``torch.cat``: the cache grows to twice
      the sequence), and the grown tensors' autograd history keeps the recomputed segment's saved
      tensors alive (every layer of the segment but the last, and the last one's norm and QKV input)
      until the cache is freed after backward. Hugging Face's own ``gradient_checkpointing_enable``
      switches the cache off in training.
    * The tail: backward recomputes the segments last to first, so the first segment (the last one recomputed)
      is where all of that is alive at once, and there its last layer's backward runs with every tensor the
      recomputation saved for it (the retained set counts only its norm and QKV input): while its MLP's backward
      runs, the whole layer and the MLP's gradient work; then, while its attention's backward runs, the attention's
      share and the attention's gradient work (the math path's two (b, heads, s, s) gradients). The larger of the
      two; the fake-mode trace of the checkpointed Llama steps peaks there (the recomputed layer's probabilities
      beside those the cache retains), with the segment's layers' gradients not yet made."""
    if m.hf is None or train.framework != "pytorch" or not m.hf.use_cache:
        return 0.0, 0.0, 0.0
    x = dims(m, par, train)
    sb = x.s * x.b
    kv_local = max(x.kv // x.t, 1) * x.d if x.kv < x.t else x.kv * x.d / x.t
    rope = not m.learned_pos_emb
    k_bytes = 4 if (by.autocast and rope) else by.act
    k = train.recompute.segment
    per_layer = sb * kv_local * (k_bytes + by.act)
    cache = n_layers * per_layer
    if k is None:
        return cache, 0.0, 0.0
    segments = -(-n_layers // k)
    pre_kv = sb * x.h * (by.resid + by.act + (4 if m.norm == "rmsnorm" else 0)) / x.t_sp
    # a recomputed layer's attention takes the grown cache's keys and values (twice the sequence). The math path
    # repeats them to every query head and keeps those copies besides what the forward kept. Without autocast a
    # fused kernel saves the grown cache's tensors themselves (counted in the cache) instead of the layer's own
    # keys and values, which the recomputation then frees (the fake-mode trace of llama-mha-b4-ckpt2-bf16 keeps
    # only the grown ones); under autocast a copy of the grown keys and values is kept beside them (the trace of
    # the amp-bf16 checkpointed Llama and GPT-2 steps: 2-3% lower without it)
    if attention_path(m, train) == "math":
        longer = 2 * sb * (x.a * x.d / x.t) * by.act
    elif by.autocast:
        longer = 2 * sb * kv_local * by.act
    else:
        longer = -2 * sb * kv_local * by.act
    retained = (n_layers - segments) * (la.full + longer) + segments * pre_kv + 2 * cache
    terms = layer_terms(m, par, train, by)
    mlp = sum(v for name, v, _ in terms if name.startswith(_MLP_TERMS))
    n_f = 2 if not m.gated_mlp else 3
    mlp_work = n_f * sb * x.f / x.t * by.act + 2 * sb * x.h * by.resid / x.t_sp
    attn_work = (2 * (x.a / x.t) * x.s * x.s * x.b * by.act if attention_path(m, train) == "math"
                 else 2 * sb * x.h * by.resid / x.t_sp)
    tail = la.full + longer - pre_kv + max(mlp_work, attn_work - mlp)
    return cache, retained, tail


# the terms of layer_terms that belong to the MLP's half of a layer (freed once its backward has run)
_MLP_TERMS = ("norm 2 input", "MLP", "gelu_new", "ReLU")


@dataclass(frozen=True)
class LogitsBytes:
    """Logits and loss buffers of one micro-batch on the last stage."""

    held: int              # kept from forward to backward
    forward_peak: int      # alive while the loss is computed in forward (includes ``held``)
    backward_peak: int     # alive while the loss's backward runs (includes ``held``)
    output: int = 0        # the logits themselves (the model's output, in the activation dtype)


def logits_bytes(m: ModelSpec, par: ParallelSpec, train: TrainSpec, by: Bytes) -> LogitsBytes:
    """PyTorch's ``F.cross_entropy(logits.float(), ...)``: log_softmax keeps its fp32 output; its
    backward allocates the gradient of nll_loss and of log_softmax (two more fp32 copies).
    Megatron's fused vocab-parallel cross-entropy keeps one fp32 copy and works in place."""
    x = dims(m, par, train)
    # a ViT classifies each image once ([CLS]): b x labels logits
    n = (x.b if m.hf is not None and m.hf.patch else x.s * x.b) * x.V / x.tv
    a = by.act
    kept = n * a if train.keep_logits else 0
    if train.framework == "megatron":
        held = n * 4 + kept
        fwd = n * a + n * 4
        bwd = n * 4 + n * a + kept
        return LogitsBytes(held=int(held), forward_peak=int(fwd), backward_peak=int(bwd), output=int(n * a))
    if m.hf is not None and m.hf.decoder_layers and not m.hf.rel_bias and by.autocast:
        # BART adds its float32 final_logits_bias buffer to the 16-bit logits (modeling_bart.py,
        # BartForConditionalGeneration.forward): type promotion makes the logits float32, and the loss runs on them
        held = n * 4 + kept
        return LogitsBytes(held=int(held), forward_peak=int(2 * n * 4), backward_peak=int(held + 2 * n * 4),
                           output=int(n * 4))
    if m.hf is not None and (m.hf.mlm_head or m.hf.decoder_layers):
        # BertForMaskedLM's (and BartForConditionalGeneration's) CrossEntropyLoss reads the logits as they are (no
        # .float(), unlike ForCausalLMLoss): log_softmax keeps its output in the logits' dtype. Under autocast only
        # nll_loss is a float32 op: it casts log_softmax's output to float32 and keeps that copy until its backward,
        # whose gradient is float32
        # (the fake-mode trace of bert-base-mlm-b32-amp-bf16, which matches the H200)
        held = n * a + (n * 4 if by.autocast else 0) + kept
        fwd = 2 * n * a + (n * 4 if by.autocast else 0)
        bwd = held + (n * 4 if by.autocast else 2 * n * a)
        return LogitsBytes(held=int(held), forward_peak=int(fwd), backward_peak=int(bwd), output=int(n * a))
    upcast = n * 4 if a != 4 else 0
    held = n * 4 + kept
    if m.hf is not None and m.hf.logit_softcap:
        # Gemma-2 caps the logits (modeling_gemma2.py: logits / cap, tanh, * cap): tanh keeps its output
        held += n * a
        upcast += 2 * n * a
    logits_alive = n * a  # the logits themselves while the loss is computed
    fwd = logits_alive + upcast + n * 4
    bwd = held + 2 * n * 4
    return LogitsBytes(held=int(held), forward_peak=int(fwd), backward_peak=int(bwd), output=int(logits_alive))


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
