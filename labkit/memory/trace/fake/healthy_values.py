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

Checks a working run passes. Any other boolean is answered from the statement that reads it (:func:`guard_answer`):
the test of an ``assert`` holds, and the test of an ``if`` whose one branch only raises takes the other branch. A run
whose memory is asked about is one that runs: on the GPU a check that fails stops it there. So
``torch.distributions`` validating its arguments (``if not torch._is_all_true(valid): raise ValueError``, on by
default), ``assert (labels >= 0).all()`` and ``torch._assert`` pass, as they do for the values of a working program.
A ``while`` loop whose test cannot be answered goes on once, then ends (:func:`loop_answer`).
"""

from __future__ import annotations

import ast
import linecache
import math
import operator
import os
import sys
from functools import lru_cache
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

_NEVER = frozenset({"isnan", "isinf", "isposinf", "isneginf"})
_AND = frozenset({"mul", "bitwise_and", "logical_and"})
_OR = frozenset({"bitwise_or", "logical_or"})
_NOT = frozenset({"bitwise_not", "logical_not"})
_SAME = frozenset({"all", "any", "_is_all_true", "_is_any_true", "_to_copy", "clone", "alias", "view", "reshape",
                   "squeeze", "unsqueeze", "expand", "detach", "lift_fresh"})


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


# Where a boolean read passes on its way from the statement that reads it to fake mode: labkit.memory (fake mode and
# script mode; not labkit's own models and loops, which are programs like a user's), and torch's dispatch machinery
# (``__torch_function__``/``__torch_dispatch__`` handling, fake tensors, the decompositions they run)
_TORCH = os.path.dirname(torch.__file__)
_PASSED = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
           *(os.path.join(_TORCH, p) for p in ("_compile.py", "_dynamo" + os.sep, "_subclasses" + os.sep, "_ops.py",
                                               "overrides.py", "_prims" + os.sep, "_prims_common" + os.sep,
                                               "_refs" + os.sep, "_decomp" + os.sep,
                                               os.path.join("utils", "_python_dispatch.py"),
                                               os.path.join("utils", "_stats.py"),
                                               os.path.join("utils", "_device.py"))))


def guard_answer() -> tuple[bool, str] | None:
    """The answer a boolean read gets in a run that works, from the statement that reads it, with what that
    statement is and where (``"the assert at train.py:12"``); None where the statement does not decide it.

    The statement is found on the Python stack (the first frame outside labkit and torch's dispatch machinery) and
    parsed. Its test decides the answer when it is an ``assert`` (the test holds) or an ``if`` one of whose branches
    holds nothing but calls and a ``raise`` (the test takes the other branch), and the read's place in the test is
    known: the test itself, under any number of ``not``, or every operand of an ``and`` that must hold (of an ``or``
    that must not) needing the same answer. ``if a and b: raise`` leaves it open which operand fails: None."""
    f = _reading_frame()
    if f is None:
        return None
    stmt = _statement_at(f.f_code.co_filename, f.f_lineno)
    if isinstance(stmt, ast.Assert):
        want, what = True, "the assert"
    elif isinstance(stmt, ast.If) and _only_raises(stmt.body):
        want, what = False, "the check that raises"
    elif isinstance(stmt, ast.If) and _only_raises(stmt.orelse):
        want, what = True, "the check that raises"
    else:
        return None
    answers = _reads_need(stmt.test, want)
    if answers is None or len(answers) != 1:
        return None
    return answers.pop(), f"{what} at {_short(f.f_code.co_filename)}:{f.f_lineno}"


def loop_answer(entries: dict) -> tuple[bool, str] | None:
    """The answer a boolean read gets when it is the whole test of a ``while`` loop (under any number of ``not``),
    with what and where; None for any other read. Fake tensors cannot say how many times such a loop runs (a
    decoding loop ``while not done.all():`` ends when every sequence has met its end token), and answering False
    every time would run ``while not ...`` for ever. Such tests alternate: the first goes on (one more pass of the
    body is counted), the next ends the loop, and so on each time the loop is entered (``entries`` counts the
    tests per loop, kept by the caller)."""
    f = _reading_frame()
    if f is None:
        return None
    stmt = _statement_at(f.f_code.co_filename, f.f_lineno)
    if not isinstance(stmt, ast.While):
        return None
    test = stmt.test
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.BoolOp):                  # several reads in one test: which one ends it is open
        return None
    key = (f.f_code.co_filename, stmt.lineno)
    n = entries.get(key, 0)
    entries[key] = n + 1
    (answer,) = _reads_need(stmt.test, n % 2 == 0)
    return answer, f"the while loop at {_short(f.f_code.co_filename)}:{stmt.lineno}"


def _reading_frame() -> Any:
    """The Python frame whose statement made the read in progress: the first outside fake mode's machinery
    (:data:`_PASSED`); None where there is none or its code was made at run time (exec, torch.fx: no source to read)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_PASSED):
        f = f.f_back
    return None if f is None or f.f_code.co_filename.startswith("<") else f


def _only_raises(body: list) -> bool:
    return bool(body) and isinstance(body[-1], ast.Raise) and all(
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) for s in body[:-1])


def _reads_need(e: ast.expr, want: bool) -> set[bool] | None:
    """The answers the reads in test ``e`` need for ``e`` to come out ``want``; None where it is open."""
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        return _reads_need(e.operand, not want)
    if isinstance(e, ast.BoolOp):
        if isinstance(e.op, ast.And) != want:          # an `and` that fails, an `or` that holds: which operand?
            return None
        parts = [_reads_need(v, want) for v in e.values]
        return None if any(p is None for p in parts) else set().union(*parts)
    return {want}


def _statement_at(filename: str, line: int) -> ast.stmt | None:
    """The innermost ``assert``, ``if`` or ``while`` whose test spans ``line`` of ``filename``'s source
    (linecache's, which holds notebook cells too), else None."""
    return _statements(filename, "".join(linecache.getlines(filename))).get(line)


@lru_cache(maxsize=256)
def _statements(filename: str, source: str) -> dict[int, ast.stmt]:
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return {}
    spans = [(n.test.end_lineno - n.test.lineno, n) for n in ast.walk(tree)
             if isinstance(n, (ast.Assert, ast.If, ast.While))]
    out: dict[int, ast.stmt] = {}
    for _, n in sorted(spans, key=lambda s: -s[0]):      # the innermost (shortest) test of a line wins
        for line in range(n.test.lineno, n.test.end_lineno + 1):
            out[line] = n
    return out


def _short(filename: str) -> str:
    """A file's name as a user reads it: torch's from its package, another one's base name."""
    if filename.startswith(_TORCH + os.sep):
        return "torch/" + os.path.relpath(filename, _TORCH).replace(os.sep, "/")
    return os.path.basename(filename)
