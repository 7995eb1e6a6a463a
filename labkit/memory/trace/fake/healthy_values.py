"""The answer a NaN or infinity check gets in a healthy run, for a boolean read from fake tensors.

Fake tensors have no values, so a boolean a program reads from one (``bool(t)``, ``t.item()``) needs an answer.
Training scripts read booleans mostly to guard a step against overflow: ``if not torch.isfinite(loss):
continue``, ``if torch.isnan(loss).any(): raise``, ``if torch.isinf(grad_norm): skip``. The run whose memory
fake mode predicts is one whose values are finite (a step that overflows is not the one a user sizes), so such
a check answers as it does for finite values. Without this rule every such boolean read False: a script that
skips its step ``if not torch.isfinite(loss)`` ran no backward and no optimizer step on the fake GPU.

:class:`HealthyValues` follows each boolean through the ops these checks are made of, as the dispatcher sees
them (below autograd):

* ``torch.isfinite`` is not an op of its own: PyTorch's ``aten/src/ATen/native/TensorCompare.cpp``
  (``isfinite``) returns ``(self == self) * (self.abs() != infinity)`` for floating tensors, so the parts are
  ``eq.Tensor(x, x)`` (True: a finite value equals itself), ``ne.Scalar(x, +-inf or nan)`` (True),
  ``eq.Scalar(x, +-inf or nan)`` (False), and their product;
* ``isnan``, ``isinf``, ``isposinf``, ``isneginf``: False;
* ``mul``/``bitwise_and``/``logical_and`` (and), ``bitwise_or``/``logical_or`` (or), ``bitwise_not``/
  ``logical_not`` (not), ``all``/``any``, copies and views of a followed boolean: the same rule on its value.

Every element of a followed boolean has the same value, which is what ``all``/``any`` and a read return.
A boolean not made this way is not followed (:meth:`value` answers None).

Counts of a followed boolean are known too (``sum``, ``count_nonzero``: 0 where it is False, the elements reduced
where it is True), and so are comparisons of a count with a number: ``assert x.isnan().sum() == 0`` (I-BERT's
activation quantiser), ``if torch.isinf(grads).sum() > 0: skip``. :meth:`HealthyValues.count` answers an integer read.

Random draws have no healthy value: a boolean computed from one (``torch.rand([]) < p``, as Hugging Face's
LayerDrop decides whether a layer runs) goes either way from step to step on the GPU. :meth:`HealthyValues.random`
says whether a one-element tensor was drawn by a random factory or computed from such a tensor, so that the answer
fake mode gives it can say the run's peak is random there (larger draws, a diffusion model's noise, are not followed).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

_NEVER = frozenset({"isnan", "isinf", "isposinf", "isneginf"})
_AND = frozenset({"mul", "bitwise_and", "logical_and"})
_OR = frozenset({"bitwise_or", "logical_or"})
_NOT = frozenset({"bitwise_not", "logical_not"})
_SAME = frozenset({"all", "any", "_to_copy", "clone", "alias", "view", "reshape", "squeeze", "unsqueeze", "expand",
                   "detach", "lift_fresh"})


# ATen's random factories (aten/src/ATen/native/native_functions.yaml), not the in-place samplers that initialise
# weights (normal_, uniform_: every activation is computed from them)
_RANDOM = frozenset({"rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal",
                     "bernoulli", "multinomial"})


# how fake mode's report names its answer to a boolean read of a random draw (labkit.memory.trace.corpus_check finds
# such cases by it)
RANDOM_DRAW = "a test of a random draw"

_COUNT = frozenset({"sum", "count_nonzero"})
_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
            "ge": operator.ge}


def _non_finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)


class HealthyValues:
    """Boolean tensors whose value in a run with finite values is known (see the module docstring)."""

    def __init__(self) -> None:
        self._value: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._count: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._random: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def count(self, t: Any) -> int | None:
        """Each element of a count of a followed boolean (see the module docstring), else None."""
        return self._count.get(t) if isinstance(t, torch.Tensor) else None

    def value(self, t: Any) -> bool | None:
        return self._value.get(t) if isinstance(t, torch.Tensor) else None

    def random(self, t: Any) -> bool:
        """Whether ``t`` was computed from a random draw (see the module docstring)."""
        return isinstance(t, torch.Tensor) and t in self._random

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if not isinstance(out, torch.Tensor):
            return
        base = getattr(func, "__name__", str(func)).split(".")[0]
        if out.numel() == 1 and (base in _RANDOM or (self._random and any(self.random(a) for a in args))):
            self._random[out] = True        # one number drawn, or computed from one (noise tensors are not followed)
        if base in _COUNT and args and self.value(args[0]) is not None and not out.is_floating_point():
            reduced = args[0].numel() // max(out.numel(), 1)
            self._count[out] = reduced if self.value(args[0]) else 0
            return
        if out.dtype != torch.bool:
            return
        v = self._rule(base, args)
        if v is not None:
            self._value[out] = v

    def _rule(self, base: str, args: tuple) -> bool | None:
        x = args[0] if args else None
        n = self.count(x)
        if n is not None and base in _COMPARE and len(args) > 1 and isinstance(args[1], (int, float)) \
                and not isinstance(args[1], bool):
            return _COMPARE[base](n, args[1])
        if base == "isfinite":
            return True
        if base in _NEVER:
            return False
        if base in ("eq", "ne") and len(args) > 1:
            y = args[1]
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                if y is x:                                  # a finite value equals itself (NaN does not)
                    return base == "eq"
                if _non_finite(y):                          # a finite value is neither inf nor NaN
                    return base == "ne"
            return None
        known = [self.value(a) for a in args if isinstance(a, torch.Tensor)]
        if not known or any(k is None for k in known):
            return None
        if base in _AND:
            return all(known)
        if base in _OR:
            return any(known)
        if base in _NOT:
            return not known[0]
        if base in _SAME:
            return known[0]
        return None
