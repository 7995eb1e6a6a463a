"""What the analytical model is asked about: the model's dimensions, the parallel layout and the
training recipe, as three plain dataclasses, plus the checks that reject impossible combinations.

Axes follow the usual names: ``tp`` tensor, ``pp`` pipeline (``vpp`` virtual stages per rank for
the interleaved schedule), ``dp`` data, ``cp`` context parallel sizes; ``zero`` the ZeRO stage
(0: plain DDP, 1: optimizer states sharded, 2: + gradients, 3: + parameters, i.e. FSDP full shard).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from labkit.core.errors import LabkitError

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "bf16-mixed", "fp16-mixed", "bf16")
OPTIMIZERS = ("adamw", "sgd", "adam8bit")
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
FRAMEWORKS = ("pytorch", "megatron")


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

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "vocab", "seq"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise LabkitError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
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
    """The training recipe of one step."""

    micro_batch: int = 1
    global_batch: int | None = None      # None: micro_batch x dp (one micro-batch per step)
    seq: int | None = None               # None: the model's seq
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"      # PyTorch AdamW: foreach (default on CUDA), fused, for-loop
    recompute: str = "none"              # none | selective (attention core) | full
    recompute_every: int = 1             # with full: checkpoint every k-th layer (1: all layers)
    flash: bool = True                   # flash / memory-efficient attention (no s^2 scores kept)
    dropout: float = 0.0
    fp32_grad_accum: bool = False        # Megatron's fp32 main grads (18 B/param with Adam)
    keep_logits: bool = False            # the training loop holds the logits through backward
    framework: str = "pytorch"           # pytorch: nn.Module + SDPA + DTensor; megatron: the paper's layout


def validate(model: ModelSpec, par: ParallelSpec, train: TrainSpec) -> None:
    """Raise LabkitError naming the input and what is wrong, for impossible combinations."""
    for f in ("tp", "pp", "dp", "cp"):
        v = getattr(par, f)
        if not isinstance(v, int) or v < 1:
            raise LabkitError(f"--{f} must be a positive integer, got {v!r}")
    if par.zero not in (0, 1, 2, 3):
        raise LabkitError(f"--zero must be 0, 1, 2 or 3, got {par.zero!r}")
    if par.schedule not in SCHEDULES:
        raise LabkitError(f"schedule {par.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if train.precision not in PRECISIONS:
        raise LabkitError(f"--precision {train.precision!r} is not one of {', '.join(PRECISIONS)}")
    if train.optimizer not in OPTIMIZERS:
        raise LabkitError(f"--optimizer {train.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    if train.optimizer_impl not in OPTIMIZER_IMPLS:
        raise LabkitError(f"optimizer implementation {train.optimizer_impl!r} is not one of {', '.join(OPTIMIZER_IMPLS)}")
    if train.recompute not in RECOMPUTE:
        raise LabkitError(f"--recompute {train.recompute!r} is not one of {', '.join(RECOMPUTE)}")
    if train.framework not in FRAMEWORKS:
        raise LabkitError(f"framework {train.framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if train.recompute_every < 1:
        raise LabkitError(f"--recompute-every must be >= 1, got {train.recompute_every}")
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
    if par.zero == 0 and par.shard_size is not None:
        raise LabkitError("a sharding group (hybrid shard) needs --zero >= 1")


def micro_batches(par: ParallelSpec, train: TrainSpec) -> int:
    """Micro-batches per step on each data-parallel rank (gradient accumulation or pipeline fill)."""
    gb = train.global_batch or train.micro_batch * par.dp
    return gb // (train.micro_batch * par.dp)


def with_changes(obj, **changes):
    """dataclasses.replace, re-running the checks."""
    return replace(obj, **changes)
