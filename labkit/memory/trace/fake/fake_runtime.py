"""What fake mode changes around a user's code so that it runs as it would on the GPU.

* :class:`CudaFunctionRules`: a ``TorchFunctionMode`` making the GPU's choices at the Python level
  (``F.scaled_dot_product_attention``: the kernel chosen by :mod:`labkit.memory.trace.fake.sdpa`;
  ``F.dropout``: ``at::dropout`` takes the fused ``native_dropout`` on CUDA, which saves a boolean
  mask, where the CPU multiplies by a noise tensor of the input's dtype; ``F.rms_norm``: one fused kernel on
  CUDA, :mod:`labkit.memory.trace.fake.rms_norm`; ``nn.LSTMCell``/``nn.GRUCell``: two matmuls and a fused cell,
  :mod:`labkit.memory.trace.fake.rnn_cells`).
* :func:`checkpoint_autocast`: ``torch.utils.checkpoint`` (reentrant or not) recomputes under the
  autocast state of the forward; torch records only its own autocast, so each checkpointed function
  is bound to the emulated CUDA autocast that was active when it was checkpointed, and to
  :class:`CudaFunctionRules` (function modes are not active inside autograd's backward, where the
  recomputation runs: without it the recomputed attention would take the CPU's kernel).
* :func:`fake_module_conversion`: ``Module._apply`` (``.to(dtype)``, ``.half()``, ``.bfloat16()``) on
  fake parameters builds new parameters (tied ones once) instead of swapping tensor contents: the
  fake tensor converter keeps weak references to fake tensors, and ``torch.utils.swap_tensors``
  refuses tensors with weak references.
* :func:`composite_body`: a Python-level composite of ``torch.nn.functional`` (``multi_head_attention_forward``,
  what ``nn.MultiheadAttention`` runs in training) reaches a function mode as ONE call, and the mode
  is popped while it handles it, so the ops inside (the projections, SDPA) would bypass both fake
  mode's autocast and its kernel rules. On the GPU those ops are cast and dispatched one by one;
  fake mode runs the composite's body with the modes active instead.
* :func:`recorded_init`: ``nn.init.trunc_normal_`` as the target's torch runs it. Up to 2.11 it samples in place
  (the inverse CDF); from 2.12 (``targets/torch_gates.json``) by rejection, with masks of the weight's size. A model
  built on the device (``torch.device("cuda")``, as the recordings build theirs) takes those masks from the caching
  allocator, and the segments they leave move every later placement: ModernBERT amp-bf16, built by torch 2.13's
  masks, missed one of the H200's four 3148 MiB segments (reserved -12.5%; as 2.11 samples, 0.0%).
* :func:`no_hub_kernels`: transformers' Hub kernels off (from 5.25 a CUDA model downloads some when it runs).
* :class:`ModuleStack`: which module is running (named in refusals and assumptions).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import types
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensor, UnsupportedOperatorException,
)
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from labkit.core.errors import LabkitError
from labkit.memory.trace.fake.cudnn_rnn import ASSUMPTION, pack_padded, pad_packed, run_cudnn_rnn
from labkit.memory.trace.fake.rms_norm import run_rms_norm
from labkit.memory.trace.fake.rnn_cells import run_fused_cell
from labkit.memory.trace.fake.sdpa import parse_version, run_sdpa, select_backend
from labkit.memory.trace.fake.targets import TORCH_GATES


class ModuleStack:
    """The chain of modules whose forward is running (global module hooks, while :meth:`active`)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.ids: list[int] = []          # id() of each running module, innermost last

    def where(self) -> str:
        return f"module {self.stack[-1]}" if self.stack else "code outside any module"

    def innermost(self) -> str | None:
        return self.stack[-1] if self.stack else None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        def pre(mod: nn.Module, args: Any) -> None:
            self.stack.append(type(mod).__name__)
            self.ids.append(id(mod))

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            if self.stack:
                self.stack.pop()
                self.ids.pop()

        h1 = register_module_forward_pre_hook(pre)
        h2 = register_module_forward_hook(post)   # not on exceptions: a refusal names the failing module
        try:
            yield
        finally:
            h1.remove()
            h2.remove()


# Python-level composites whose body must run under the function modes (torch.nn.functional): their
# first statement dispatches the whole call to the modes (``has_torch_function`` / ``handle_torch_function``)
COMPOSITES = ("multi_head_attention_forward",)
_BODIES: dict[Any, Callable] = {}


def composite_body(func: Any) -> Callable | None:
    """For a composite named in :data:`COMPOSITES`, the same function with its torch-function dispatch
    check answered "no" (a copy of it whose ``has_torch_function`` returns False), so that calling it
    inside a mode runs its body op by op; None for any other function."""
    if getattr(func, "__name__", "") not in COMPOSITES or getattr(func, "__module__", "") != "torch.nn.functional":
        return None
    body = _BODIES.get(func)
    if body is None:
        glb = dict(func.__globals__)
        glb["has_torch_function"] = lambda *a, **k: False
        body = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
        _BODIES[func] = body
    return body


def run_composite(mode: TorchFunctionMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run a composite's body with ``mode`` pushed again (it is popped while it handles a call), so the
    ops inside reach it and the modes beneath it, in their order; ``NotImplemented`` if ``func`` is not one."""
    body = composite_body(func)
    if body is None:
        return NotImplemented
    with mode:
        return body(*args, **kwargs)


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                                  "enable_gqa": False}


# torch._VF's recurrent layers (nn.LSTM, nn.GRU, nn.RNN call them), which a CUDA GPU runs as one cuDNN call
# (cudnn_rnn.py)
_CUDNN_RNN = {torch._VF.lstm: "lstm", torch._VF.gru: "gru", torch._VF.rnn_tanh: "rnn_tanh",
              torch._VF.rnn_relu: "rnn_relu"}


# the recurrent cells a CUDA build runs as two matmuls and one fused kernel (rnn_cells.py)
_FUSED_CELLS = {torch._VF.lstm_cell: "lstm", torch._VF.gru_cell: "gru"}
# F.rms_norm (what nn.RMSNorm calls) and torch.rms_norm, which a CUDA build runs as one fused kernel (rms_norm.py)
_RMS_NORM = (torch.nn.functional.rms_norm, torch.rms_norm)


class CudaFunctionRules(TorchFunctionMode):
    """Python-level GPU choices for one fake run (see the module docstring)."""

    def __init__(self, emulator: Any) -> None:
        super().__init__()
        self.emulator = emulator

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = run_composite(self, func, args, kwargs)
        if out is not NotImplemented:
            return out
        if func is torch.nn.functional.scaled_dot_product_attention:
            p = dict(_SDPA_DEFAULTS)
            p.update(zip(_SDPA_PARAMS, args))
            p.update(kwargs)
            q, k, v = p["query"], p["key"], p["value"]
            choice = select_backend(q, k, v, p["attn_mask"], float(p["dropout_p"]), bool(p["is_causal"]),
                                    bool(p["enable_gqa"]), target=self.emulator.target.sdpa)
            self.emulator.note_sdpa(choice)
            return run_sdpa(choice, q, k, v, p["attn_mask"], float(p["dropout_p"]), bool(p["is_causal"]),
                            p["scale"], bool(p["enable_gqa"]))
        if func in _FUSED_CELLS:     # nn.LSTMCell, nn.GRUCell (rnn_cells.py)
            out = run_fused_cell(_FUSED_CELLS[func], args, kwargs)
            if out is not NotImplemented:
                return out
        if func in _RMS_NORM:        # the fused CUDA kernel (rms_norm.py)
            out = run_rms_norm(args, kwargs, self.emulator.target.torch_version)
            if out is not NotImplemented:
                return out
        if func is torch._VF._pack_padded_sequence:       # packed sequences' sizes (cudnn_rnn.py)

            return pack_padded(args, kwargs, self.emulator.assume)
        if func is torch._VF._pad_packed_sequence:
            out = pad_packed(args, kwargs)
            if out is not NotImplemented:
                return out
        if func in _CUDNN_RNN and self.emulator._tracker is not None:
            em = self.emulator
            dtype = em.policy.autocast_dtype if em.autocast_state.depth > 0 else None
            out = run_cudnn_rnn(_CUDNN_RNN[func], args, kwargs, em._tracker, dtype, em.target, em.assume)
            if out is not NotImplemented:
                em.assume(ASSUMPTION)
                return out
        if func is torch.nn.functional.dropout:
            p = dict(zip(("input", "p", "training", "inplace"), args))
            p.update(kwargs)
            x, prob = p["input"], float(p.get("p", 0.5))
            if p.get("training", True) and not p.get("inplace", False) and 0.0 < prob < 1.0 and x.numel():
                # CUDA's fused dropout keeps a boolean mask (1 byte per element) for backward; the CPU's
                # unfused path would keep a noise tensor in the input's dtype (see at::dropout)
                return torch.ops.aten.native_dropout(x, prob, True)[0]
        return func(*args, **kwargs)


def _mode_active(cls: type) -> bool:
    return any(isinstance(m, cls) for m in _get_current_function_mode_stack())


def _active_autocast(cls: type) -> Any:
    """The innermost active mode of ``cls`` (the emulator's autocast class), or None."""
    for m in reversed(_get_current_function_mode_stack()):
        if isinstance(m, cls):
            return m
    return None


@contextlib.contextmanager
def checkpoint_autocast(emulator: Any) -> Iterator[None]:
    """Bind every function ``torch.utils.checkpoint`` receives to the emulated autocast active at
    that moment, so that its recomputation in backward casts as the forward did."""
    def bind(fn: Callable) -> Callable:
        mode = _active_autocast(emulator.autocast_class)
        region = emulator.autocast_factory(mode.dtype) if mode is not None else None
        rules = emulator.target.emulate_kernels

        def run(*a: Any, **k: Any) -> Any:
            # torch function modes are not active inside autograd's backward, where the recomputation
            # runs: enter the GPU rules (below) and the autocast (above them) again
            with contextlib.ExitStack() as stack:
                if rules and not _mode_active(CudaFunctionRules):
                    stack.enter_context(CudaFunctionRules(emulator))
                if region is not None:
                    stack.enter_context(region())
                return fn(*a, **k)

        return run

    original_gen = cp._checkpoint_without_reentrant_generator
    original_fn = cp.CheckpointFunction

    def generator(fn: Callable, *a: Any, **k: Any) -> Any:
        return original_gen(bind(fn), *a, **k)

    class Reentrant:
        @staticmethod
        def apply(function: Callable, preserve: bool, *args: Any) -> Any:
            return original_fn.apply(bind(function), preserve, *args)

    cp._checkpoint_without_reentrant_generator = generator
    cp.CheckpointFunction = Reentrant
    try:
        yield
    finally:
        cp._checkpoint_without_reentrant_generator = original_gen
        cp.CheckpointFunction = original_fn


def _fake_deepcopy(t: Any, memo: dict) -> Any:
    """``copy.deepcopy`` of a fake tensor: a clone in the same fake mode (see :func:`fake_deepcopy`)."""
    if id(t) in memo:
        return memo[id(t)]
    with torch.no_grad():
        new = t.clone(memory_format=torch.preserve_format)
    new.requires_grad_(t.requires_grad)
    if t.grad is not None:                   # as Tensor.__deepcopy__: the gradient is copied too
        new.grad = _fake_deepcopy(t.grad, memo)
    for key, value in t.__dict__.items():    # _is_param and the user's attributes; not the fake tensor's own
        if key not in new.__dict__:          # fields (its fake_mode above all: a deep copy of it is a new mode)
            new.__dict__[key] = copy.deepcopy(value, memo)
    memo[id(t)] = new
    return new


@contextlib.contextmanager
def fake_deepcopy() -> Iterator[None]:
    """``copy.deepcopy`` of a fake tensor makes a clone in the same fake mode.

    ``Tensor.__deepcopy__`` (torch/_tensor.py) clones a wrapper subclass only when its ``data_ptr()`` is 0;
    otherwise its storage is deep-copied and its ``__dict__`` with it, ``fake_mode`` included: the copy belongs
    to a new fake mode ("Mixing fake modes NYI" at its first use). A fake tensor's pointer is not 0 where fake
    storages have addresses (:mod:`labkit.memory.trace.fake.addresses`, the script runtime's) or where it is a
    view at an offset, so the clone must not depend on it. A parameter made in fake mode is a ``FakeTensor``
    flagged ``_is_param`` (``Parameter.__new__`` for a custom tensor type, torch/nn/parameter.py), so
    ``Parameter.__deepcopy__`` does not apply either. PyTorch's own modules copy themselves this way: ``nn.TransformerEncoder`` and
    ``nn.TransformerDecoder`` clone their layer ``num_layers`` times with ``copy.deepcopy`` (``_get_clones``,
    torch/nn/modules/transformer.py). The method is set on the ``FakeTensor`` class for the fake run (no cost
    per op) and removed after."""
    had = FakeTensor.__dict__.get("__deepcopy__")
    FakeTensor.__deepcopy__ = _fake_deepcopy  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had is None:
            del FakeTensor.__deepcopy__
        else:
            FakeTensor.__deepcopy__ = had  # type: ignore[method-assign]


@contextlib.contextmanager
def fake_module_conversion() -> Iterator[None]:
    """``Module._apply`` on fake parameters: new ``Parameter`` objects, tied parameters kept tied."""
    original = nn.Module._apply

    def _apply(self: nn.Module, fn: Callable, recurse: bool = True) -> nn.Module:
        mods = list(self.modules()) if recurse else [self]
        if not any(isinstance(p, FakeTensor) for m in mods for p in m._parameters.values() if p is not None):
            return original(self, fn, recurse)
        done: dict[int, Any] = {}
        for m in mods:
            for key, p in list(m._parameters.items()):
                if p is None:
                    continue
                new = done.get(id(p))
                if new is None:
                    with torch.no_grad():
                        applied = fn(p)
                    new = p if applied is p else nn.Parameter(applied, requires_grad=p.requires_grad)
                    if p.grad is not None and new is not p:
                        new.grad = fn(p.grad)
                    done[id(p)] = new
                m._parameters[key] = new
            for key, b in list(m._buffers.items()):
                if b is not None:
                    nb = done.get(id(b))
                    if nb is None:
                        nb = done[id(b)] = fn(b)
                    m._buffers[key] = nb
        return self

    nn.Module._apply = _apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._apply = original  # type: ignore[method-assign]


def _trunc_normal_in_place(tensor: torch.Tensor, mean: float, std: float, a: float, b: float,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """A normal(mean, std) truncated to [a, b], sampled in place through the inverse of the normal CDF: the ops torch
    up to 2.11 runs for ``nn.init.trunc_normal_`` (none allocates)."""
    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    with torch.no_grad():
        tensor.uniform_(2 * cdf((a - mean) / std) - 1, 2 * cdf((b - mean) / std) - 1, generator=generator)
        tensor.erfinv_().mul_(std * math.sqrt(2.0)).add_(mean).clamp_(min=a, max=b)
    return tensor


@contextlib.contextmanager
def recorded_init(target_torch: str) -> Iterator[None]:
    """``nn.init.trunc_normal_`` as torch ``target_torch`` runs it where the installed torch samples otherwise
    (:data:`TORCH_GATES` ``trunc_normal_rejection``: in place up to 2.11, by rejection from 2.12)."""
    gate = parse_version(TORCH_GATES["trunc_normal_rejection"]["torch"])
    installed = parse_version(torch.__version__)
    if not (parse_version(target_torch) < gate <= installed):
        yield
        return
    original = nn.init._no_grad_trunc_normal_
    nn.init._no_grad_trunc_normal_ = _trunc_normal_in_place          # type: ignore[assignment]
    try:
        yield
    finally:
        nn.init._no_grad_trunc_normal_ = original                     # type: ignore[assignment]


@contextlib.contextmanager
def no_hub_kernels() -> Iterator[None]:
    """Transformers' Hub kernels off (``USE_HUB_KERNELS=NO``, read at each call by transformers/integrations/
    hub_kernels.py ``_kernels_enabled``): from transformers 5.25, which installs the ``kernels`` package, a model on
    a CUDA device fetches kernels such as ``kernels-community/rotary`` from the Hub when it first runs, and without
    a network that raises. Fake mode predicts PyTorch's own ops, as the H200 recordings ran them (transformers 5.17
    loaded no Hub kernel); a downloaded kernel's allocations are not modelled."""
    old = os.environ.get("USE_HUB_KERNELS")
    os.environ["USE_HUB_KERNELS"] = "NO"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("USE_HUB_KERNELS", None)
        else:
            os.environ["USE_HUB_KERNELS"] = old


def refusal(op: str, where: str, why: str) -> str:
    return (f"fake-cuda cannot run {op} in {where}: {why}; "
            "measure it with --device cpu (or cuda), or use the analytical estimator")


# what names a module of a mixture of experts, whose dispatch's masks are the routing's (labkit.memory.trace.fake.moe)
MOE_NAMES = ("Expert", "Moe", "MoE")


class FakeRefusal(LabkitError):
    """What fake tensors cannot run (:func:`refusal`'s line), with its parts: ``op``, ``module`` (the innermost
    module running, or None outside any) and ``why``; ``measure_step`` turns it into its one-line refusal
    (``refusals.FakeModeUnsupported``)."""

    def __init__(self, op: str, module: str | None, why: str) -> None:
        self.op, self.module, self.why = op, module, why
        super().__init__(refusal(op, f"module {module}" if module else "code outside any module", why))


@contextlib.contextmanager
def fake_run(emulator: Any) -> Iterator[None]:
    """Everything above, for the duration of one fake ``measure_step``; what fake tensors still cannot
    run becomes one :class:`~labkit.core.errors.LabkitError` naming the op and the module."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(emulator.modules.active())
        stack.enter_context(fake_module_conversion())
        stack.enter_context(fake_deepcopy())
        stack.enter_context(checkpoint_autocast(emulator))
        stack.enter_context(recorded_init(emulator.target.torch_version))
        stack.enter_context(no_hub_kernels())
        if emulator.target.emulate_kernels:
            stack.enter_context(CudaFunctionRules(emulator))
        try:
            yield
        except DynamicOutputShapeException as e:
            where = emulator.modules.where()
            why = "its output shape depends on tensor values"
            if any(k in where for k in MOE_NAMES):
                why += (" (an expert dispatch that fake mode's routing rules, labkit.memory.trace.fake.moe, do not "
                        "cover; Hugging Face's experts_implementation='grouped_mm' runs every token's top-k rows at "
                        "once, whose memory does not depend on the routing)")
            raise FakeRefusal(str(e.func), emulator.modules.innermost(), why) from None
        except DataDependentOutputException as e:
            raise FakeRefusal(str(e.func), emulator.modules.innermost(), "its result depends on tensor values") from None
        except UnsupportedOperatorException as e:
            raise FakeRefusal(str(e.func), emulator.modules.innermost(),
                              "the op has no fake-tensor implementation") from None
