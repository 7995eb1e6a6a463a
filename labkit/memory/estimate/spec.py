"""What the analytical model is asked about: the model's dimensions, the parallel layout and the
training recipe, as three plain dataclasses, plus the checks that reject impossible combinations.

Axes follow the usual names: ``tp`` tensor, ``pp`` pipeline (``vpp`` virtual stages per rank for
the interleaved schedule), ``dp`` data, ``cp`` context parallel sizes; ``zero`` the ZeRO stage
(0: plain DDP, 1: optimizer states sharded, 2: + gradients, 3: + parameters, i.e. FSDP full shard).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

from labkit.core.errors import LabkitError
from labkit.core.spec import default
from labkit.core.vocab import OptimizerSpec, Recompute, canonical

SCHEDULES = ("1f1b", "gpipe", "interleaved")
# What the model supports: dimensions and batch sizes up to 2^24 (16,777,216) and parallel sizes up
# to 2^20 keep every byte count finite; one estimate per pipeline stage bounds pp.
MAX_DIM = 1 << 24
MAX_PARALLEL = 1 << 20
MAX_PP = 1024
FRAMEWORKS = ("pytorch", "megatron")


@dataclass(frozen=True)
class HfTraits:
    """What a Hugging Face ``transformers`` implementation of the model does beyond its dimensions,
    read from its ``config.json`` (:func:`labkit.memory.estimate.hf_config.spec_from_hf_config`).
    The estimator's rules for them (``activations.hf_layer_terms``) cite the modeling code."""

    model_type: str
    act: str = "silu"                    # hidden_act / activation_function (ACT2FN name)
    attn_impl: str = "sdpa"              # sdpa, or eager (the model's own softmax(QK^T)V, e.g. BLOOM's ALiBi)
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0          # residual dropout after attention and MLP
    embd_dropout: float = 0.0
    use_cache: bool = True               # the training forward builds a DynamicCache (transformers' default)
    logit_softcap: float | None = None   # Gemma-2: tanh soft-capping of the logits
    qk_norm: bool = False                # RMSNorm on queries and keys per head (Qwen3, Gemma-3)
    attn_in_linears: int = 1             # linears reading the attention's normed input (q, k, v apart: 3)
    mlp_in_linears: int = 1              # linears reading the MLP's normed input (gate and up apart: 2)
    parallel_residual: bool = False      # attention and MLP both read the layer's input (GPT-NeoX)
    mlm_head: bool = False               # an encoder's masked-LM head (BERT, RoBERTa): dense, activation, LayerNorm,
                                         # then the tied decoder; its loss reads the logits in their own dtype
    patch: int = 0                       # a ViT (modeling_vit.py): the patch side of its convolutional embedding (the
                                         # model's seq is then patches + 1, its vocab the classifier's labels); 0: text
    channels: int = 3                    # the image's channels (ViT)
    decoder_layers: int = 0              # an encoder-decoder (BART, T5): the last decoder_layers of the model's layers
                                         # also cross-attend to the encoder's output; 0: one stack
    positions: int = 0                   # BART: rows of each stack's learned position table
    experts: int = 0                     # a mixture-of-experts MLP (Mixtral, Qwen2-MoE): routed experts, 0: dense
    top_k: int = 0                       # experts per token
    expert_ffn: int = 0                  # one expert's intermediate size
    shared_ffn: int = 0                  # Qwen2-MoE's shared expert's intermediate size (0: none)
    rel_bias: int = 0                    # T5: buckets of the learned relative-position bias added to every
                                         # self-attention's scores (0: none); it requires grad, so SDPA runs its
                                         # math path (activations.attention_path)
    mlp_dropout: bool = False            # T5: a dropout on the MLP's hidden activation (T5DenseActDense.dropout)
    norm_keeps_input: bool = False       # T5LayerNorm multiplies its input itself (not its float32 copy) by the
                                         # rsqrt: with a 16-bit residual stream it keeps the input besides the copy
    rel_span: int = 0                    # DeBERTa-v2: rows of relative embeddings each attention reads (2 x
                                         # position_buckets); 0: no disentangled attention
    pos_att: int = 0                     # DeBERTa-v2: its position terms (c2p, p2c: 2)
    share_att_key: bool = False          # DeBERTa-v2: the position terms reuse the content projections


@dataclass(frozen=True)
class LoraSpec:
    """LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685) as peft
    applies it: a frozen 16-bit base, rank-``rank`` adapters ``lora_B(lora_A(x))`` on ``targets`` attention
    projections of every layer (q, k, v and o: 4), the optimizer over the adapters only. ``adapter_bytes``: 4 where
    peft keeps the adapters in float32 (``get_peft_model(..., autocast_adapter_dtype=True)``, its default, on a
    model already cast to bfloat16), 2 where they are bfloat16 (``autocast_adapter_dtype=False``, or the model cast
    after ``get_peft_model``)."""

    rank: int = 16
    targets: int = 4
    adapter_bytes: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise LabkitError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if self.targets not in (1, 2, 3, 4):
            raise LabkitError(f"LoRA targets: 1 to 4 attention projections (q, k, v, o), got {self.targets!r}")
        if self.adapter_bytes not in (2, 4):
            raise LabkitError(f"LoRA adapter bytes: 2 (bfloat16) or 4 (float32), got {self.adapter_bytes!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise LabkitError(f"LoRA dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (GPT/Llama style), dimensions only."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int = 2048
    kv_heads: int | None = None          # None: multi-head attention (kv_heads = heads)
    ffn: int | None = None               # None: 4*hidden (GELU MLP) or the Llama rule for gated MLPs
    gated_mlp: bool = False              # SwiGLU-style: gate, up and down projections
    head_dim: int | None = None          # None: hidden // heads
    tied_embeddings: bool = True
    norm: str = "layernorm"              # "layernorm" (weight and bias) or "rmsnorm" (weight only)
    bias: bool = True                    # biases in the linear layers
    learned_pos_emb: bool = True         # GPT-2 style position table (seq x hidden); False: RoPE
    name: str = "custom"
    hf: HfTraits | None = None           # a transformers implementation (None: the lab's/Megatron's layer)

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "vocab", "seq"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LabkitError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        for f in ("layers", "hidden", "heads", "vocab", "seq", "kv_heads", "ffn", "head_dim"):
            v = getattr(self, f)
            if v is not None and v > MAX_DIM:
                raise LabkitError(f"model {self.name}: {f} {v} is above the {MAX_DIM} the model supports")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise LabkitError(f"model {self.name}: heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        if self.head_dim is None and self.hidden % self.heads:
            raise LabkitError(f"model {self.name}: hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.ffn is not None and self.ffn < 1:
            raise LabkitError(f"model {self.name}: ffn must be positive, got {self.ffn}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise LabkitError(f"model {self.name}: norm {self.norm!r} is not 'layernorm' or 'rmsnorm'")

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        if self.ffn is not None:
            return self.ffn
        if self.gated_mlp:  # Llama: 2/3 of 4h, rounded up to a multiple of 256
            f = int(2 * 4 * self.hidden / 3)
            return 256 * ((f + 255) // 256)
        return 4 * self.hidden


@dataclass(frozen=True)
class ParallelSpec:
    """How the model is spread over GPUs."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    zero: int = 0                        # 0 DDP, 1 optimizer, 2 + grads, 3 + params (FSDP full shard)
    sp: bool = False                     # sequence parallelism (with tp > 1)
    vpp: int | None = None               # virtual stages per pipeline rank (interleaved schedule)
    schedule: str = "1f1b"
    vocab_parallel: bool = True          # embedding and LM head split over tp (Megatron); False: replicated
    shard_size: int | None = None        # ZeRO/FSDP sharding group (hybrid shard); None: the whole dp x cp group
    reshard_after_forward: bool = True   # ZeRO-3: FSDP frees gathered params after forward (False: keeps them)
    ddp_bucket_view: bool = False        # DDP gradient_as_bucket_view (grads are views into the buckets)
    bucket_bytes: int = 25 * 1024**2     # DDP bucket_cap_mb=25 (PyTorch default); ZeRO-1/2 reduce buckets
    pp_return_outputs: bool = True       # torch.distributed.pipelining step(return_outputs=True), its default: the
                                         # last stage keeps every micro-batch's output (torchtitan passes False)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def shard_group(self) -> int:
        """Ranks over which ZeRO shards model states (Megatron shards over dp x cp)."""
        return self.shard_size or self.dp * self.cp

    @property
    def v(self) -> int:
        return self.vpp or 1


@dataclass(frozen=True)
class TrainSpec:
    """The training recipe of one step, in the lab's vocabulary (:mod:`labkit.core.vocab`).

    ``recompute`` is a :class:`~labkit.core.vocab.Recompute` or its spelling (``none``, ``selective``,
    ``full``, ``every-K``); ``optimizer`` a name or an :class:`~labkit.core.vocab.OptimizerSpec`
    (which also sets ``optimizer_impl``). ``recompute_every`` is the old spelling of ``every-K``
    (deprecated: with ``recompute="full"`` it becomes ``every-K``).
    """

    micro_batch: int = 1
    global_batch: int | None = None      # None: micro_batch x dp (one micro-batch per step)
    seq: int | None = None               # None: the model's seq
    precision: str = default("precision")            # the one default of each: labkit.core.spec
    optimizer: str = default("optimizer")
    optimizer_impl: str = default("optimizer_impl")  # PyTorch AdamW: foreach (default on CUDA), fused, for-loop
    recompute: Recompute = default("recompute")      # none | selective (attention core) | full | every-K
    recompute_every: int | None = None   # deprecated alias: recompute="full", recompute_every=K is every-K
    flash: bool = True                   # flash / memory-efficient attention (no s^2 scores kept)
    dropout: float = 0.0
    fp32_grad_accum: bool = False        # Megatron's fp32 main grads (18 B/param with Adam)
    keep_logits: bool = False            # the training loop holds the logits through backward
    framework: str = "pytorch"           # pytorch: nn.Module + SDPA + DTensor; megatron: the paper's layout
    lora: LoraSpec | None = None         # LoRA adapters on a frozen 16-bit base (precision bf16 or amp-bf16)
    padded: bool = False                 # the batch has padding in its attention mask (SDPA is given the mask)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "precision", canonical("precision", self.precision, what="precision"))
        if isinstance(self.optimizer, OptimizerSpec):
            opt = self.optimizer
        else:
            opt = OptimizerSpec.parse(self.optimizer, self.optimizer_impl)
        set_(self, "optimizer", opt.name)
        set_(self, "optimizer_impl", opt.impl)
        rc = Recompute.parse(self.recompute)
        if self.recompute_every is not None:
            k = self.recompute_every
            warnings.warn("TrainSpec(recompute_every=K) is deprecated: use recompute='every-K'",
                          DeprecationWarning, stacklevel=3)
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise LabkitError(f"recompute_every must be an integer >= 1, got {k!r}")
            if rc.kind == "full":
                rc = Recompute("every", k)
            elif k != 1 and rc.kind != "every":
                raise LabkitError(f"recompute_every={k} needs recompute='full' (or say recompute='every-{k}')")
            elif k != 1 and rc.every != k:
                raise LabkitError(f"recompute={str(rc)!r} contradicts recompute_every={k}")
            set_(self, "recompute_every", None)
        set_(self, "recompute", rc)

    @property
    def optimizer_spec(self) -> OptimizerSpec:
        return OptimizerSpec(self.optimizer, self.optimizer_impl)  # type: ignore[arg-type]


def validate(model: ModelSpec, par: ParallelSpec, train: TrainSpec) -> None:
    """Raise LabkitError naming the input and what is wrong, for impossible combinations."""
    for f in ("tp", "pp", "dp", "cp"):
        v = getattr(par, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise LabkitError(f"--{f} must be a positive integer, got {v!r}")
        if v > (MAX_PP if f == "pp" else MAX_PARALLEL):
            raise LabkitError(f"--{f} {v} is above the {MAX_PP if f == 'pp' else MAX_PARALLEL} the model supports")
    for f in ("micro_batch", "global_batch", "seq"):
        v = getattr(train, f)
        if v is not None and isinstance(v, int) and v > MAX_DIM:
            raise LabkitError(f"--{f.replace('_', '-')} {v} is above the {MAX_DIM} the model supports")
    if par.zero not in (0, 1, 2, 3):
        raise LabkitError(f"--zero must be 0, 1, 2 or 3, got {par.zero!r}")
    if par.schedule not in SCHEDULES:
        raise LabkitError(f"schedule {par.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if train.framework not in FRAMEWORKS:
        raise LabkitError(f"framework {train.framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if not 0.0 <= train.dropout < 1.0:
        raise LabkitError(f"--dropout must be in [0, 1), got {train.dropout}")
    if model.heads % par.tp:
        raise LabkitError(f"--heads {model.heads} is not divisible by --tp {par.tp}")
    if model.kv % par.tp and par.tp % model.kv:
        raise LabkitError(f"--kv-heads {model.kv} and --tp {par.tp}: neither divides the other")
    if model.ffn_size % par.tp:
        raise LabkitError(f"--ffn {model.ffn_size} is not divisible by --tp {par.tp}")
    if par.sp and par.tp == 1:
        raise LabkitError("--sp needs --tp > 1 (sequence parallelism splits the tensor-parallel group's activations)")
    if par.vpp is not None and par.vpp < 1:
        raise LabkitError(f"--vpp must be >= 1, got {par.vpp}")
    if par.schedule == "interleaved" and (par.vpp or 1) < 2:
        raise LabkitError("the interleaved schedule needs --vpp >= 2 virtual stages per pipeline rank")
    if (par.vpp or 1) > 1 and par.pp == 1:
        raise LabkitError(f"--vpp {par.vpp} needs --pp > 1")
    if model.layers % (par.pp * par.v):
        raise LabkitError(f"--layers {model.layers} is not divisible by --pp {par.pp} x --vpp {par.v} "
                          f"= {par.pp * par.v} (every pipeline chunk needs the same number of layers)")
    seq = train.seq or model.seq
    if seq % par.cp:
        raise LabkitError(f"--seq {seq} is not divisible by --cp {par.cp}")
    if par.sp and (seq // par.cp) % par.tp:
        raise LabkitError(f"--seq {seq} (per context-parallel rank) is not divisible by --tp {par.tp} for --sp")
    if train.micro_batch < 1:
        raise LabkitError(f"--micro-batch must be >= 1, got {train.micro_batch}")
    gb = train.global_batch
    if gb is not None and (gb < 1 or gb % (train.micro_batch * par.dp)):
        raise LabkitError(f"--global-batch {gb} is not divisible by --micro-batch {train.micro_batch} x --dp {par.dp} "
                          f"= {train.micro_batch * par.dp}")
    if par.shard_size is not None and (par.shard_size < 1 or (par.dp * par.cp) % par.shard_size):
        raise LabkitError(f"shard size {par.shard_size} does not divide the data-parallel group dp x cp = {par.dp * par.cp}")
    if model.hf is not None and model.hf.decoder_layers and (par.pp > 1 or par.tp > 1):
        raise LabkitError(f"{model.name}: an encoder-decoder (BART, T5) is read as one stack on one pipeline stage without "
                          "tensor parallelism (tp=pp=1); trace other layouts with `labkit measure --script`")
    if train.lora is not None:
        if par.world > 1:
            raise LabkitError("LoRA: the estimator models it on one GPU (tp=pp=dp=cp=1); trace a sharded LoRA job with "
                              "`labkit measure --script`")
        if train.precision not in ("bf16", "amp-bf16") or train.framework != "pytorch":
            raise LabkitError(f"LoRA: a bfloat16 base (precision bf16 or amp-bf16, framework pytorch), got "
                              f"{train.precision} ({train.framework})")
        if model.hf is None or model.hf.attn_in_linears != 3 or model.norm != "rmsnorm":
            raise LabkitError(f"LoRA: the estimator models adapters on separate q, k, v, o projections of a "
                              f"Llama-like transformers model (RMSNorm); {model.name} is not one")
    if par.zero == 0 and par.shard_size is not None:
        raise LabkitError("a sharding group (hybrid shard) needs --zero >= 1")


def micro_batches(par: ParallelSpec, train: TrainSpec) -> int:
    """Micro-batches per step on each data-parallel rank (gradient accumulation or pipeline fill)."""
    gb = train.global_batch or train.micro_batch * par.dp
    return gb // (train.micro_batch * par.dp)


def with_changes(obj, **changes):
    """dataclasses.replace, re-running the checks."""
    return replace(obj, **changes)
