"""The training-step harness: one step of forward, loss, backward, optimizer step and zero_grad
under a policy (precision, optimizer and its implementation, recompute), for any ``nn.Module``.
The policy speaks the lab's vocabulary (:mod:`labkit.core.vocab`).

The harness does not measure anything itself: it calls ``on_phase(name)`` (a context-manager
factory) around each phase, so the memory tracer (``labkit.memory``) or a timer can wrap it.

Precision policies
    ``fp32``      everything in float32.
    ``amp-bf16``  float32 weights, forward and loss under bf16 autocast.
    ``amp-fp16``  float32 weights, forward and loss under fp16 autocast, loss scaled by a GradScaler.
    ``bf16``      the model's floating-point parameters cast to bfloat16 (optimizer state follows).
    (``bf16-mixed`` and ``fp16-mixed`` are the analytical model's: a plain PyTorch loop has no such mode.)

Optimizers: ``adamw``, ``adam``, ``sgd`` (momentum 0.9), each as ``foreach`` (PyTorch's default on
CUDA), ``fused`` or ``for-loop``.

Recompute policies (activation checkpointing with ``torch.utils.checkpoint``, non-reentrant)
    ``none``       keep every activation.
    ``full``       every layer is a checkpoint segment: only layer inputs are kept.
    ``every-K``    a checkpoint boundary every K layers: each run of K consecutive layers is
                   recomputed as one segment (``every-1`` is ``full``; K near sqrt(L) gives the
                   O(sqrt L) memory of segment checkpointing).
    ``selective``  only the attention core is recomputed (``CausalSelfAttention.core`` in the
                   reference GPT; the attention module of other models).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from labkit.core.errors import LabkitError
from labkit.core.vocab import TRACEABLE_PRECISIONS, OptimizerSpec, Recompute, canonical
from labkit.workloads.gpt import CausalSelfAttention

# The two loops users write: ``plain`` (``loss = model(**batch).loss``: the output object, with the
# logits, is freed before backward) and ``keep-output`` (``out = model(**batch); loss = out.loss``:
# the output stays alive through backward and the optimizer step, and is freed when the step ends).
LOOPS = ("plain", "keep-output")


@dataclass(frozen=True)
class StepPolicy:
    """How one training step runs."""

    precision: str = "fp32"
    """Numeric precision (:data:`labkit.core.vocab.TRACEABLE_PRECISIONS`: fp32, amp-bf16, amp-fp16, bf16)."""
    optimizer: OptimizerSpec = OptimizerSpec()
    """An :class:`OptimizerSpec` or a name (the implementation then is PyTorch's default, ``foreach``)."""
    recompute: Recompute = Recompute()
    """Activation checkpointing: a :class:`Recompute` or its spelling (``none|selective|full|every-K``)."""
    lr: float = 1e-4
    """The optimizer's learning rate."""
    checkpointing: str | None = None
    """The old name of ``recompute`` (deprecated)."""
    loop: str = "plain"
    """How the user's loop holds the model's output: ``plain`` (``loss = model(**batch).loss``: the output
    object, logits included, is freed before backward) or ``keep-output`` (it stays alive through backward and
    the optimizer step), the two loops users write (:data:`LOOPS`)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        prec = canonical("precision", self.precision)
        if prec not in TRACEABLE_PRECISIONS:
            raise LabkitError(f"precision {prec!r} is the analytical model's only (a PyTorch loop has no such mode); "
                              f"a training step runs {', '.join(TRACEABLE_PRECISIONS)}")
        set_(self, "precision", prec)
        opt = self.optimizer if isinstance(self.optimizer, OptimizerSpec) else OptimizerSpec.parse(self.optimizer)
        if opt.name not in STEP_OPTIMIZERS:
            raise LabkitError(f"optimizer {opt.name!r} is the analytical model's only; a training step runs "
                              f"{', '.join(STEP_OPTIMIZERS)}")
        set_(self, "optimizer", opt)
        rc = Recompute.parse(self.recompute)
        if self.checkpointing is not None:
            warnings.warn("StepPolicy(checkpointing=...) is deprecated: use recompute=...", DeprecationWarning,
                          stacklevel=3)
            old = Recompute.parse(self.checkpointing, what="checkpointing")
            if rc != Recompute() and rc != old:
                raise LabkitError(f"checkpointing={self.checkpointing!r} contradicts recompute={str(rc)!r}")
            rc = old
            set_(self, "checkpointing", None)
        set_(self, "recompute", rc)
        if self.loop not in LOOPS:
            raise LabkitError(f"loop {self.loop!r} is not one of {', '.join(LOOPS)}")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.precision)


STEP_OPTIMIZERS = ("adamw", "adam", "sgd")     # what make_optimizer builds (adam8bit is the model's only)


# ---------------------------------------------------------------------------------------------
# Recompute (activation checkpointing)


def find_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of repeated layers: the longest ``nn.ModuleList`` whose items share a class."""
    best: nn.ModuleList | None = None
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            if len({type(m) for m in mod}) == 1 and (best is None or len(mod) > len(best)):
                best = mod
    if best is None:
        raise LabkitError(f"{type(model).__name__}: no nn.ModuleList of repeated layers to checkpoint")
    return best


class _Segment(nn.Module):
    """Runs ``layers`` one after another inside one checkpoint (non-reentrant).

    The autocast context (``autocast``) is re-entered inside the checkpointed function so that the
    recomputation in backward runs under the same precision policy as the forward.
    """

    def __init__(self, layers: list[nn.Module], autocast: Callable[[], ContextManager]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self._autocast = autocast
        self.tuple_len = 0          # the layers' outputs: a tuple of this length (BLOOM, Falcon), 0 a tensor

    def _run(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with self._autocast():
            for layer in self.layers:
                out = layer(hidden, *args, **kwargs)
                hidden = out[0] if isinstance(out, tuple) else out
            self.tuple_len = len(out) if isinstance(out, tuple) else 0
            return out

    def forward(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._run(hidden, *args, **kwargs)
        return checkpoint(self._run, hidden, *args, use_reentrant=False, **kwargs)


class _PassThrough(nn.Module):
    """Stands in for a layer that a preceding :class:`_Segment` already ran: returns its input as the layer
    would have returned its output (the hidden state, or a tuple starting with it: a model that takes
    ``block(...)[0]`` must get the hidden state back, not its first row)."""

    def __init__(self, segment: _Segment) -> None:
        super().__init__()
        self._segment = [segment]         # a list: not a submodule (the segment's parameters are its own)

    def forward(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        n = self._segment[0].tuple_len
        return (hidden,) + (None,) * (n - 1) if n else hidden


class _CheckpointedCall(nn.Module):
    """Wraps one submodule (selective recomputation of the attention of a foreign model)."""

    def __init__(self, inner: nn.Module, autocast: Callable[[], ContextManager]) -> None:
        super().__init__()
        self.inner = inner
        self._autocast = autocast

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        with self._autocast():
            return self.inner(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._run(*args, **kwargs)
        return checkpoint(self._run, *args, use_reentrant=False, **kwargs)


def apply_recompute(model: nn.Module, recompute: Recompute | str,
                    autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> nn.Module:
    """Rewrite ``model`` in place for a recompute policy; returns it.

    Segments of K layers replace the model's layer list entries (the first layer of each segment
    runs the whole segment, the others pass their input through), so the model's own forward loop
    is unchanged. Layers must take the hidden state as first argument and return it (or a tuple
    starting with it).
    """
    rc = Recompute.parse(recompute)
    k = rc.segment
    if rc.kind == "none":
        return model
    if rc.kind == "selective":
        n = 0
        for mod in model.modules():
            if isinstance(mod, CausalSelfAttention):
                mod.core = _make_checkpointed_core(mod.core, autocast)
                n += 1
        if n == 0:
            layers = find_layers(model)
            for layer in layers:
                name = next((nm for nm in ("attn", "self_attn", "attention", "self_attention")
                             if isinstance(getattr(layer, nm, None), nn.Module)), None)
                if name is None:
                    raise LabkitError(f"{type(layer).__name__}: no attention submodule (attn, self_attn, "
                                      "attention) for selective checkpointing")
                setattr(layer, name, _CheckpointedCall(getattr(layer, name), autocast))
        return model
    layers = find_layers(model)
    originals = list(layers)
    assert k is not None
    for start in range(0, len(originals), k):
        layers[start] = seg = _Segment(originals[start:start + k], autocast)
        for j in range(start + 1, min(start + k, len(originals))):
            layers[j] = _PassThrough(seg)
    return model


def apply_checkpointing(model: nn.Module, mode: str,
                        autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> nn.Module:
    """Deprecated name of :func:`apply_recompute`."""
    warnings.warn("apply_checkpointing is deprecated: use apply_recompute", DeprecationWarning, stacklevel=2)
    return apply_recompute(model, mode, autocast)


def _make_checkpointed_core(core: Callable, autocast: Callable[[], ContextManager]) -> Callable:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with autocast():
            return core(q, k, v)

    def checkpointed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return run(q, k, v)
        return checkpoint(run, q, k, v, use_reentrant=False)

    return checkpointed


# ---------------------------------------------------------------------------------------------
# Optimizer, loss, batch


IMPL_KWARGS = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}


def make_optimizer(params: list[torch.nn.Parameter], policy: StepPolicy, *, fused: bool | None = None
                   ) -> torch.optim.Optimizer:
    """The policy's optimizer (AdamW, Adam, or SGD with momentum 0.9) in its implementation.

    ``fused`` overrides the implementation (True: fused; False: not fused, i.e. foreach where the
    policy says fused); None follows the policy."""
    spec = policy.optimizer
    impl = spec.impl
    if fused is True:
        impl = "fused"
    elif fused is False and impl == "fused":
        impl = "foreach"
    kw = IMPL_KWARGS[impl]
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=policy.lr, momentum=0.9, **kw)
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=policy.lr, **kw)
    return torch.optim.AdamW(params, lr=policy.lr, **kw)


def default_loss(output: Any, batch: Any) -> torch.Tensor:
    """``output.loss`` (the Hugging Face convention), else the second item of a ``(logits, loss)`` pair."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)) and len(output) == 2 and isinstance(output[1], torch.Tensor):
        loss = output[1]
    if loss is None:
        raise LabkitError("the model's output has no .loss: pass loss_fn(output, batch)")
    return loss


def gpt_loss(output: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the reference GPT's logits (in float32, as the model itself does)."""
    logits = output[0] if isinstance(output, (tuple, list)) else output
    return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), batch["targets"].view(-1))


def gpt_batch(config: Any, batch_size: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A CPU batch for the reference GPT: ``{"idx": ..., "targets": ...}`` of random token ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch_size, config.seq_len + 1), generator=g)
    return {"idx": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


def gpt_call(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    """Forward of the reference GPT on the token ids only (the loss is computed by :func:`gpt_loss`)."""
    return model(batch["idx"])


def move_batch(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: move_batch(v, fn) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_batch(v, fn) for v in batch)
    return batch


def call_model(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def cast_floating(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast floating-point parameters and buffers to ``dtype`` in place, keeping tied parameters tied.

    Unlike ``model.to(dtype)`` this replaces Parameter objects instead of swapping their contents,
    which also works on fake tensors.
    """
    done: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_floating_point() or p.dtype == dtype:
                continue
            new = done.get(id(p))
            if new is None:
                with torch.no_grad():
                    new = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                done[id(p)] = new
            mod._parameters[name] = new
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                mod._buffers[name] = b.to(dtype)
    return model


# ---------------------------------------------------------------------------------------------
# The step


@contextlib.contextmanager
def _null_phase(name: str) -> Iterator[None]:
    yield


class TrainStep:
    """One training step of ``model`` on ``batch`` (already on the target device) under ``policy``.

    ``autocast`` is a zero-argument context-manager factory; by default ``torch.autocast`` on
    ``device_type`` for the AMP policies (the fake-GPU mode passes its own emulation of CUDA autocast).
    ``loss_fn(output, batch)`` defaults to :func:`default_loss`; ``call(model, batch)`` runs the
    forward (default: ``model(**batch)`` for a dict). For the reference GPT use :func:`gpt_call`
    and :func:`gpt_loss` so the cross-entropy is its own phase. The model is rewritten in place
    for the recompute policy (and cast to bf16 for ``bf16``).
    """

    def __init__(self, model: nn.Module, batch: Any, *, policy: StepPolicy, device_type: str = "cuda",
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 autocast: Callable[[], ContextManager] | None = None,
                 fused: bool | None = None, grad_scaler: Any = None,
                 call: Callable[[nn.Module, Any], Any] | None = None) -> None:
        self.loop = policy.loop
        self.policy = policy
        self.call = call or call_model
        self.batch = batch
        self.loss_fn = loss_fn or default_loss
        dt = policy.autocast_dtype
        if autocast is None:
            autocast = (lambda: torch.autocast(device_type, dtype=dt)) if dt is not None else contextlib.nullcontext
        self.autocast = autocast
        if policy.precision == "bf16":
            cast_floating(model, torch.bfloat16)
        self.model = apply_recompute(model, policy.recompute, autocast)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise LabkitError(f"{type(model).__name__} has no trainable parameters")
        self.optimizer = make_optimizer(params, policy, fused=fused)
        self.scaler = grad_scaler
        if policy.precision == "amp-fp16" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(device_type)
        self.steps_done = 0

    def run(self, on_phase: Callable[[str], ContextManager] = _null_phase) -> float | None:
        """One step; returns the loss value when it can be read (not on fake tensors)."""
        with self.autocast():
            with on_phase("forward"):
                out = self.call(self.model, self.batch)
            with on_phase("loss"):
                loss = self.loss_fn(out, self.batch)
                if self.loop == "plain":
                    del out
                    out = None
        with on_phase("backward"):
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        with on_phase("optimizer"):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        with on_phase("zero_grad"):
            self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        del loss, out
        return None
