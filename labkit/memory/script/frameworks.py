"""What the libraries a training script uses need in order to run on the fake GPU.

Each adapter changes only what would otherwise fail or differ on CPU fake tensors, and each says what
it did in the run's notes:

* ``DataLoader``: worker processes would receive fake tensors they cannot pickle, and the pin-memory
  thread runs outside the fake modes (they are per thread): batches are loaded in the main process and
  not pinned (pinned memory is host memory; the GPU's figures do not change).
* ``torch.compile``: the program runs eagerly; a compiled graph usually holds fewer activations, so the
  figures are the eager program's (said in the notes).
* ``torch.save`` / ``torch.load`` and safetensors' ``save_file`` / ``save`` / ``safe_open`` / ``load_file`` (what
  ``save_pretrained`` and ``from_pretrained`` of transformers and peft use): placeholders with shapes and dtypes and
  no values, which the fake GPU loads back (:mod:`.checkpoints`; said in the notes).
* ``Tensor.numpy()`` of a tensor whose values the fake GPU does not have (predictions copied to the host for a
  metric, as Hugging Face ``Trainer``'s ``compute_metrics`` receives them): zeros of its shape and dtype, a
  placeholder like a float ``.item()``'s 0.0 (said in the notes); small tensors with known values are real.
* Lightning, accelerate and Hugging Face ``Trainer`` read the GPU through ``torch.cuda`` (answered in
  :mod:`.cuda_api`) and move tensors with ``.to(device)`` (:mod:`.tensor_placement`): nothing of theirs is patched.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch
import torch.nn as nn
import torch.utils.data as tud
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

from labkit.memory.script.checkpoints import fake_checkpoints


@contextlib.contextmanager
def _patched(obj: Any, attr: str, value: Any) -> Iterator[None]:
    original = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, original)


def _data_loader(gpu: Any) -> Any:
    original = tud.DataLoader.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0):
            gpu.note(f"DataLoader(num_workers={kwargs['num_workers']}) loads in the main process on the fake GPU "
                     "(its workers would get fake tensors); the GPU's figures do not depend on it")
            kwargs["num_workers"] = 0
            kwargs.pop("prefetch_factor", None)
            kwargs["persistent_workers"] = False
        if kwargs.get("pin_memory"):
            gpu.note("DataLoader(pin_memory=True): pinned memory is host memory; batches are not pinned on the fake "
                     "GPU and the GPU's figures do not change")
            kwargs["pin_memory"] = False
        original(self, *args, **kwargs)

    return _patched(tud.DataLoader, "__init__", init)


def _compile(gpu: Any) -> Any:
    def compile(model: Any = None, **kwargs: Any) -> Any:
        gpu.note("torch.compile: run eagerly on the fake GPU; a compiled graph usually saves fewer activations, so "
                 "the figures are the eager program's (an upper bound for the compiled one's activations)")
        if model is None:
            return lambda fn: fn
        return model

    return _patched(torch, "compile", compile)


@contextlib.contextmanager
def _optimizers_follow_parameters() -> Iterator[None]:
    """``model.to(device)`` after the optimizer was made (``accelerator.prepare(model, opt)`` does it):
    ``Module._apply`` keeps each ``Parameter`` object and swaps its data, so the optimizer's references stay
    valid; on fake parameters the conversion makes new ``Parameter`` objects instead
    (:func:`labkit.memory.trace.fake.fake_runtime.fake_module_conversion`), so every live optimizer's parameter
    groups and state are pointed at the new ones."""
    optimizers: weakref.WeakSet = weakref.WeakSet()
    init, apply = torch.optim.Optimizer.__init__, nn.Module._apply

    def opt_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        optimizers.add(self)

    def module_apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
        mods = list(self.modules()) if recurse else [self]
        before = [(m, key, p) for m in mods for key, p in m._parameters.items() if p is not None]
        out = apply(self, fn, recurse)
        moved = {id(p): m._parameters[key] for m, key, p in before if m._parameters.get(key) is not p}
        if moved:
            for opt in list(optimizers):
                for group in opt.param_groups:
                    group["params"] = [moved.get(id(p), p) for p in group["params"]]
                for old_id, new in moved.items():
                    for p in list(opt.state.keys()):
                        if id(p) == old_id:
                            opt.state[new] = opt.state.pop(p)
        return out

    torch.optim.Optimizer.__init__ = opt_init                   # type: ignore[method-assign]
    nn.Module._apply = module_apply                             # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.optim.Optimizer.__init__ = init                   # type: ignore[method-assign]
        nn.Module._apply = apply                                # type: ignore[method-assign]


def _numpy(gpu: Any) -> Any:
    original = torch.Tensor.numpy

    def numpy(self: torch.Tensor, *, force: bool = False) -> Any:
        if not is_fake(self):
            return original(self, force=force)
        gpu.note("Tensor.numpy() of values the fake GPU does not have: zeros of its shape and dtype (placeholders, "
                 "like a float .item()'s 0.0; host memory, not the GPU's)")
        with unset_fake_temporarily():
            return original(torch.zeros(self.shape, dtype=self.dtype), force=force)

    return _patched(torch.Tensor, "numpy", numpy)


@contextlib.contextmanager
def framework_adapters(gpu: Any) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for cm in (_data_loader(gpu), _compile(gpu), fake_checkpoints(gpu), _optimizers_follow_parameters(),
                   _numpy(gpu)):
            stack.enter_context(cm)
        yield
