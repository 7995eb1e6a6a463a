"""The lab's one vocabulary for a training step, defined once.

Every chapter, CLI verb, widget and notebook uses these names; nothing else defines them.

precision
    ``fp32``        everything in float32.
    ``amp-bf16``    float32 weights, forward and loss under ``torch.autocast(dtype=torch.bfloat16)``.
    ``amp-fp16``    the same with float16 and a GradScaler.
    ``bf16``        the model cast to bfloat16 (``model.to(torch.bfloat16)``); optimizer state follows.
    ``bf16-mixed``  16-bit weights and gradients with an fp32 master copy in the optimizer
    ``fp16-mixed``  (Megatron / DeepSpeed style). The analytical model only: a plain PyTorch loop
                    has no such mode, so the tracer refuses them.
recompute (activation checkpointing)
    ``none``, ``full`` (every layer a checkpoint segment), ``every-K`` (a segment of K layers;
    ``every-1`` is ``full``), ``selective`` (only the attention core is recomputed).
optimizer and its implementation
    ``adamw``, ``adam``, ``sgd``, ``adam8bit`` (the model only); implementation ``foreach``
    (PyTorch's default on CUDA), ``fused`` or ``for-loop``.
phase
    ``forward``, ``loss``, ``backward``, ``optimizer``, ``zero_grad``.
MoE routing (``moe_routing=``, ``--moe-routing``)
    ``balanced`` (the default: every expert receives tokens x top-k / experts rows) or the share
    of the rows each expert receives, ``0.4,0.3,0.2,0.1`` (one non-negative number per expert,
    summing to 1). Fake tensors have no values, so fake mode assumes it where a model's shapes
    depend on the routing, and reports which.
memory category
    ``parameters``, ``gradients``, ``optimizer_state``, ``activations``, ``logits``,
    ``temporaries``, ``inputs``, ``workspace``, ``comm_buffers``, ``context``,
    ``allocator_overhead``. The tracer and the model each fill the ones they can see.

Old spellings keep working through :func:`canonical`, which says once (a ``DeprecationWarning``)
what the new name is; ``LEGACY`` lists them and a test pins it.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Literal, get_args

from labkit.core.errors import LabkitError

Precision = Literal["fp32", "amp-bf16", "amp-fp16", "bf16", "bf16-mixed", "fp16-mixed"]
RecomputeKind = Literal["none", "selective", "full", "every"]
OptimizerName = Literal["adamw", "adam", "sgd", "adam8bit"]
OptimizerImpl = Literal["foreach", "fused", "for-loop"]
Phase = Literal["forward", "loss", "backward", "optimizer", "zero_grad"]
Category = Literal["parameters", "gradients", "optimizer_state", "activations", "logits", "temporaries",
                   "inputs", "workspace", "comm_buffers", "context", "allocator_overhead"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
TRACEABLE_PRECISIONS: tuple[str, ...] = ("fp32", "amp-bf16", "amp-fp16", "bf16")
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
PHASES: tuple[str, ...] = get_args(Phase)
CATEGORIES: tuple[str, ...] = get_args(Category)

# kind -> {old spelling: new spelling}. Values that exist in users' scripts today.
LEGACY: dict[str, dict[str, str]] = {
    "precision": {"float32": "fp32", "bfloat16": "amp-bf16", "float16": "amp-fp16", "bf16-amp": "amp-bf16",
                  "fp16-amp": "amp-fp16"},
    "recompute": {"every-1": "full"},
    "optimizer": {"adamw-foreach": "adamw"},   # with implementation foreach (see OptimizerSpec.parse)
    "category": {"params": "parameters", "grads": "gradients", "optimizer": "optimizer_state",
                 "overhead": "allocator_overhead", "temporary": "temporaries", "input": "inputs",
                 "activation": "activations", "gradient": "gradients", "parameter": "parameters"},
}

_CHOICES = {"precision": PRECISIONS, "optimizer": OPTIMIZERS, "optimizer_impl": OPTIMIZER_IMPLS,
            "phase": PHASES, "category": CATEGORIES}


def canonical(kind: str, value: str, *, what: str | None = None) -> str:
    """The canonical spelling of ``value`` for ``kind`` (precision, optimizer, optimizer_impl, phase,
    category); an old spelling is mapped with a one-line deprecation warning, anything else is a
    :class:`LabkitError` naming ``what`` (default: the kind) and the choices."""
    label = what or kind.replace("_", " ")
    if not isinstance(value, str):
        raise LabkitError(f"{label} must be a string, got {type(value).__name__}")
    choices = _CHOICES[kind]
    if value in choices:
        return value
    new = LEGACY.get(kind, {}).get(value)
    if new is not None:
        warnings.warn(f"{label} {value!r} is deprecated: use {new!r}", DeprecationWarning, stacklevel=3)
        return new
    raise LabkitError(f"{label} {value!r} is not one of {', '.join(choices)}")


class CategoryBytes(dict):
    """Bytes by memory category (and ``total`` where there is one). An old category spelling
    (``params``, ``grads``, ``optimizer``, ``overhead``...) still reads its entry, with a
    ``DeprecationWarning`` naming the new key."""

    def __missing__(self, key: str) -> int:
        new = LEGACY["category"].get(key) if isinstance(key, str) else None
        if new is None or not dict.__contains__(self, new):
            raise KeyError(key)
        warnings.warn(f"memory category {key!r} is deprecated: use {new!r}", DeprecationWarning, stacklevel=2)
        return self[new]

    def get(self, key: str, default=None):  # type: ignore[override]
        try:
            return self[key]
        except KeyError:
            return default


@dataclass(frozen=True)
class Recompute:
    """An activation-recomputation policy: ``none``, ``selective``, ``full`` or ``every-K``."""

    kind: RecomputeKind = "none"
    every: int = 1                        # layers per checkpoint segment (``full`` is every 1)

    def __post_init__(self) -> None:
        if self.kind not in get_args(RecomputeKind):
            raise LabkitError(f"recompute kind {self.kind!r} is not one of none, selective, full, every")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise LabkitError(f"recompute every {self.every!r}: must be an integer >= 1")
        if self.kind in ("none", "selective") and self.every != 1:
            raise LabkitError(f"recompute {self.kind!r} takes no segment length (got every={self.every})")
        if self.kind == "every" and self.every == 1:
            object.__setattr__(self, "kind", "full")

    @classmethod
    def parse(cls, value: "str | Recompute", *, what: str = "recompute") -> "Recompute":
        if isinstance(value, Recompute):
            return value
        if not isinstance(value, str):
            raise LabkitError(f"{what} must be a string like none, selective, full or every-K, got {value!r}")
        if value in ("none", "selective", "full"):
            return cls(value)  # type: ignore[arg-type]
        if value.startswith("every-"):
            tail = value[len("every-"):]
            if tail.isdigit() and int(tail) >= 1:
                return cls("every", int(tail))
        raise LabkitError(f"{what} {value!r} is not one of none, selective, full, every-K (K >= 1)")

    @property
    def segment(self) -> int | None:
        """Layers per checkpoint segment, or None when layers are not checkpointed whole."""
        return self.every if self.kind in ("full", "every") else None

    def __str__(self) -> str:
        return f"every-{self.every}" if self.kind == "every" else self.kind


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer and its PyTorch implementation."""

    name: OptimizerName = "adamw"
    impl: OptimizerImpl = "foreach"

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise LabkitError(f"optimizer {self.name!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.impl not in OPTIMIZER_IMPLS:
            raise LabkitError(f"optimizer implementation {self.impl!r} is not one of {', '.join(OPTIMIZER_IMPLS)}")

    @classmethod
    def parse(cls, name: str, impl: str | None = None) -> "OptimizerSpec":
        """``name`` may be an old spelling (``adamw-foreach``); ``impl`` None takes the default."""
        if name == "adamw-foreach":
            canonical("optimizer", name)
            if impl not in (None, "foreach"):
                raise LabkitError(f"optimizer 'adamw-foreach' contradicts implementation {impl!r}")
            return cls("adamw", "foreach")
        return cls(canonical("optimizer", name), canonical("optimizer_impl", impl) if impl else "foreach")

    def __str__(self) -> str:
        return f"{self.name} ({self.impl})"


@dataclass(frozen=True)
class MoeRouting:
    """How a mixture-of-experts model's tokens are assumed to be routed: ``balanced`` (``shares``
    None: every expert the same number of rows) or the share of the rows (token-expert pairs) each
    expert receives, in expert order. :meth:`parse` reads ``balanced`` or ``0.4,0.3,0.2,0.1``."""

    shares: tuple[float, ...] | None = None

    SUM_TOLERANCE = 0.01     # shares are normalised; a sum further than this from 1 is refused

    def __post_init__(self) -> None:
        if self.shares is not None:
            label = "moe routing " + repr(",".join(str(x) for x in self.shares))
            object.__setattr__(self, "shares", _checked_shares(self.shares, label))

    @classmethod
    def parse(cls, value: "str | MoeRouting | None | tuple | list", *, what: str = "moe routing") -> "MoeRouting":
        """``balanced`` (or None), comma-separated shares, a sequence of shares, or a :class:`MoeRouting`."""
        if value is None or isinstance(value, MoeRouting):
            return value or cls()
        if isinstance(value, (tuple, list)):
            return cls(_checked_shares(tuple(value), f"{what} {list(value)!r}"))
        if not isinstance(value, str):
            raise LabkitError(f"{what} must be balanced or shares like 0.4,0.3,0.2,0.1, got {value!r}")
        text = value.strip()
        if text == "balanced":
            return cls()
        shares = []
        for i, part in enumerate(text.split(",")):
            try:
                shares.append(float(part))
            except ValueError:
                raise LabkitError(f"{what} {value!r}: share {i} ({part.strip()!r}) is not a number; give balanced "
                                  "or one share per expert, e.g. 0.4,0.3,0.2,0.1") from None
        return cls(_checked_shares(tuple(shares), f"{what} {value!r}"))

    @property
    def balanced(self) -> bool:
        return self.shares is None

    def text(self) -> str:
        return "balanced" if self.shares is None else ",".join(f"{x:.4g}" for x in self.shares)

    def __str__(self) -> str:
        return self.text()


def _checked_shares(shares: tuple, label: str) -> tuple[float, ...]:
    """``shares`` normalised to sum 1, or a :class:`LabkitError` starting with ``label``."""
    if not shares:
        raise LabkitError(f"{label}: give one share per expert (e.g. 0.4,0.3,0.2,0.1) or balanced")
    for i, x in enumerate(shares):
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise LabkitError(f"{label}: share {i} ({x!r}) is not a finite number")
        if x < 0:
            raise LabkitError(f"{label}: share {i} ({x:g}) is negative")
    total = math.fsum(shares)
    if abs(total - 1.0) > MoeRouting.SUM_TOLERANCE:
        raise LabkitError(f"{label}: the shares sum to {total:g}, not 1 (within {MoeRouting.SUM_TOLERANCE:g})")
    return tuple(float(x) / total for x in shares)
