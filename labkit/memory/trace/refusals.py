"""Fake mode's refusals: a step or script fake tensors cannot run becomes one line naming the failing op, the
module (or the user's file:line) and what to run instead."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import traceback
from typing import Any, Iterator

import torch
import torch.nn as nn

from labkit.core.errors import LabkitError
from labkit.memory.trace.fake.fake_runtime import FakeRefusal
from labkit.memory.trace.storage import StorageTracker


class FakeModeUnsupported(LabkitError):
    """Fake mode could not run the step: one line naming the op, the module and the phase, the
    cause's first line, and what to use instead. ``op``, ``module``, ``phase`` and ``cause`` hold them."""

    def __init__(self, op: str | None, module: str | None, phase: str, cause: BaseException, *,
                 own: bool = False) -> None:
        self.op, self.module, self.phase, self.own = op, module, phase, own
        first = (str(cause).strip().splitlines() or [""])[0]
        self.cause = f"{type(cause).__name__}: {first[:240]}"
        what = f"op {op}" if op else "this step"
        where = f" in module {module}" if module else ""
        if own:
            super().__init__(f"the step itself fails{where} during {phase} ({self.cause}): the program's own code "
                             "raised it before fake mode had guessed any value, so it fails the same on any device; "
                             "fix the model or its configuration")
            return
        super().__init__(f"fake mode cannot run {what}{where} during {phase} ({self.cause}); run the step on a "
                         "device instead (--device cpu, or cuda on a GPU) or size it with the analytical "
                         "estimator (labkit estimate)")


# Python's own errors: raised by a program's code (a list index, a configuration check), not by fake tensors
_PROGRAM_ERRORS = (ValueError, IndexError, KeyError, TypeError, AttributeError, AssertionError)
_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCH_NN_MODULES = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep
_LABKIT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def programs_own(exc: BaseException, tracker: StorageTracker) -> bool:
    """Whether ``exc`` is the program's own failure: one of Python's errors (:data:`_PROGRAM_ERRORS`) raised in the
    program's code or in torch.nn's Python modules it called (not under a dispatcher, a fake tensor or labkit), before
    fake mode answered any value it cannot know (a boolean or float read, MoE routing: an answer could steer the
    program into the error). Such a step fails on every device, so ``--device cpu`` would only fail again."""
    if not isinstance(exc, _PROGRAM_ERRORS) or exc.__traceback__ is None:
        return False
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):     # innermost first
        origin = os.path.abspath(frame.f_code.co_filename)
        if origin.startswith(_TORCH_NN_MODULES):
            continue                        # torch.nn's Python API (a ModuleList's index): the program's call
        if origin.startswith((_TORCH_DIR, _LABKIT_DIR)) or frame.f_code.co_filename.startswith("<"):
            return False                    # raised under a dispatcher, a fake tensor or labkit
        break
    emulator = tracker.emulator
    routing = getattr(emulator, "routing", None)
    return (emulator is not None and not getattr(emulator, "assumptions", None)
            and not getattr(routing, "used", None))


class _Why(Exception):
    """The reason fake tensors give for refusing an op, as the refusal's cause."""


_Why.__name__ = "fake tensors"


def _module_names(model: Any) -> dict[int, str]:
    if not isinstance(model, nn.Module):
        return {}
    return {id(m): (f"{name} ({type(m).__name__})" if name else type(m).__name__) for name, m in model.named_modules()}


@contextlib.contextmanager
def refusals(device: str, tracker: StorageTracker, built: list[nn.Module], model: Any) -> Iterator[None]:
    """In fake mode, turn a failure inside the step into :class:`FakeModeUnsupported` (a
    :class:`LabkitError` stays as it is; on a real device nothing is caught)."""
    quiet = logging.getLogger("torch._subclasses.fake_tensor")   # logs a traceback before raising
    level = quiet.level
    if device == "fake-cuda":
        quiet.setLevel(logging.CRITICAL)
    try:
        yield
    except FakeRefusal as exc:       # fake_run's refusal of an op: the same one line as any other
        raise FakeModeUnsupported(exc.op, exc.module, tracker.phases[-1], _Why(exc.why)) from None
    except LabkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - fake mode's limits become one clear refusal
        if device != "fake-cuda":
            raise
        op, module = locate(exc, _module_names(built[-1] if built else model))
        raise FakeModeUnsupported(op, module, tracker.phases[-1], exc, own=programs_own(exc, tracker)) from exc
    finally:
        quiet.setLevel(level)


def locate(exc: BaseException, names: dict[int, str]) -> tuple[str | None, str | None]:
    """The failing ATen op and the innermost module running when ``exc`` was raised: the op from
    the exception (``.func`` of fake-tensor errors) or the innermost ``__torch_dispatch__`` frame;
    the module from the innermost frame of a module's ``forward`` (or ``_apply``), else of any
    module method (its construction), else a module a ``torch.utils.checkpoint`` frame recomputes."""
    func = getattr(exc, "func", None)
    module = fallback = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        loc = frame.f_locals
        self = loc.get("self")
        if isinstance(self, nn.Module):
            name = names.get(id(self), type(self).__name__)
            if frame.f_code.co_name in ("forward", "_apply", "_call_impl"):
                module = name
            else:
                fallback = name
        elif frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            found = _recomputed_module(list(loc.values()), names)
            fallback = found or fallback
        if frame.f_code.co_name == "__torch_dispatch__" and not hasattr(exc, "func"):
            func = loc.get("func", func)
    return (str(func) if func is not None else None), module or fallback


def _recomputed_module(objs: list[Any], names: dict[int, str], depth: int = 4) -> str | None:
    """The module behind a checkpointed function: through bound methods, partials, closures and
    torch.utils.checkpoint's own frame objects, a few levels deep."""
    for obj in objs:
        if isinstance(obj, nn.Module):
            return names.get(id(obj), type(obj).__name__)
        if depth == 0:
            continue
        inner: list[Any] = []
        if hasattr(obj, "__self__") and callable(obj):
            inner.append(obj.__self__)
        if isinstance(obj, functools.partial):
            inner += [obj.func, *obj.args]
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):
                inner.append(cell.cell_contents)
        if type(obj).__module__ == "torch.utils.checkpoint" and hasattr(obj, "__dict__"):
            inner += list(vars(obj).values())
        found = _recomputed_module(inner, names, depth - 1) if inner else None
        if found:
            return found
    return None
