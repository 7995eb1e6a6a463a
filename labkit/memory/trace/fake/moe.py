"""MoE routing in fake mode: what fake tensors cannot know (which expert each token goes to),
answered from a stated assumption instead of refused.

A mixture-of-experts layer routes each of its T tokens to k of E experts. How many of the T x k rows
(token-expert pairs) each expert receives depends on the router's values; fake tensors have none.
Where a model's memory does not depend on it, fake mode says so; where it does, it assumes a routing
(:class:`labkit.core.vocab.MoeRouting`: ``balanced`` by default, or the user's shares) and reports it.

How Hugging Face ``transformers`` runs the experts (``integrations/moe.py``; the implementation is
``config._experts_implementation``, ``grouped_mm`` by default in ``get_correct_experts_implementation``):

* ``grouped_mm``: the rows sorted by expert, one ``torch._grouped_mm`` over all T x k rows with the
  per-expert offsets from ``histc``: every tensor has T x k rows whatever the routing.
* ``batched_mm``: each row's expert weights gathered by id (``gate_up_proj[expert_ids]``), one ``bmm``:
  T x k rows again.
* ``eager`` (the model's own forward, e.g. ``MixtralExperts.forward``): ``nonzero`` on the
  one-hot expert mask lists the experts hit; a Python loop over them reads each id (an integer
  ``.item()``), ``torch.where`` on the expert's slice of the mask finds its rows, and the expert's
  matmuls run on those rows only: the transient memory of one iteration (and of its backward) grows
  with the expert's share; what backward keeps sums to T x k rows.

:class:`RoutingOracle` answers the data-dependent ops of such dispatch code from the assumed routing:

* ``aten.topk`` over the last dimension of a (tokens, experts) tensor is a routing decision: it opens
  a dispatch (T, k, E) that lasts while the module that called the router runs (the parent of the
  module running ``topk``); its indices are the routing ids.
* ``nonzero`` on a 1-D tensor of E entries (or E + 1: Hugging Face's expert-parallel sentinel class,
  never hit): the experts that receive rows, in ascending order; the ids are known values.
* ``nonzero`` on a tensor of T x k (or T) entries, one expert's slice of the mask: that expert's rows;
  experts are taken in the order of the list of experts hit (the loop over it), else 0, 1, ...
* ``bincount`` / ``histc`` over the routing ids (the ``topk`` indices, flattened, cast or sorted), and
  the token-dimension ``sum`` of a (tokens, experts) mask scattered from them: the rows per expert, as
  known values; ``cumsum`` and casts of known values, and comparisons of one with a
  number, are known values too.
* ``.item()`` / ``.tolist()`` of a known value (an expert id, a count, an offset) reads it;
  ``repeat_interleave`` by known counts has their sum as its length.

Any other data-dependent op is still refused by name (:func:`labkit.memory.trace.fake.fake_runtime.fake_run`).
"""

from __future__ import annotations

import math
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from labkit.core.errors import LabkitError
from labkit.core.vocab import MoeRouting

aten = torch.ops.aten


def expert_rows(routing: MoeRouting, tokens: int, top_k: int, experts: int, *,
                where: str = "the model") -> tuple[list[int], list[str]]:
    """Rows (token-expert pairs) each of ``experts`` receives when ``tokens`` tokens pick ``top_k``
    each, under ``routing``; and notes on what the arithmetic had to decide.

    Balanced: ``tokens * top_k // experts`` each, the remainder one more for the first experts.
    Shares: largest-remainder rounding of ``share * tokens * top_k``; an expert takes a token at most
    once, so a share above ``1 / top_k`` is capped at ``tokens`` rows and the rest is spread over the
    other experts by their shares (evenly where their shares are all zero)."""
    total = tokens * top_k
    if routing.balanced:
        q, r = divmod(total, experts)
        return [q + (1 if e < r else 0) for e in range(experts)], []
    shares = routing.shares or ()
    if len(shares) != experts:
        raise LabkitError(f"moe routing {routing.text()!r}: {len(shares)} shares given but {where} routes to "
                          f"{experts} experts; give {experts} shares (or balanced)")
    rows = [0] * experts
    free = list(range(experts))
    left = total
    notes = []
    while True:
        weight = math.fsum(shares[e] for e in free)
        ideal = {e: (left * shares[e] / weight if weight > 0 else left / len(free)) for e in free}
        over = [e for e in free if ideal[e] > tokens]
        if not over:
            break
        for e in over:
            rows[e] = tokens
            free.remove(e)
            left -= tokens
            notes.append(f"expert {e}'s share {shares[e]:.3g} is more than top-{top_k} routing allows (a token goes "
                         f"to an expert at most once): capped at {tokens} rows, the rest spread over the others")
        if weight == 0 or not free:
            break
    if free and all(shares[e] == 0 for e in free) and left:
        notes.append(f"the {left} rows left go evenly to experts whose share is 0")
    floors = {e: math.floor(ideal[e]) for e in free}
    for e in free:
        rows[e] = floors[e]
    extra = left - sum(floors.values())
    for e in sorted(free, key=lambda e: (-(ideal[e] - floors[e]), e))[:extra]:
        rows[e] += 1
    return rows, notes


def rows_text(rows: list[int]) -> str:
    """``32 each``, ``21 each, 22 for experts 0-1`` or ``51, 38, 26, 13``."""
    lo, hi = min(rows), max(rows)
    if lo == hi:
        return f"{lo} each"
    if hi == lo + 1 and rows == sorted(rows, reverse=True):
        n = rows.count(hi)
        return f"{lo} each, {hi} for expert{'s 0-' + str(n - 1) if n > 1 else ' 0'}"
    return ", ".join(str(r) for r in rows)


@dataclass
class Dispatch:
    """One routing decision (a ``topk`` over the experts) and what was answered from it."""

    tokens: int
    top_k: int
    experts: int
    scope: int | None                     # id of the module whose forward the dispatch lasts for
    where: str
    rows: list[int] | None = None
    notes: list[str] = field(default_factory=list)
    hit: list[int] | None = None
    cursor: int = 0
    answers: int = 0

    def expert_rows(self, routing: MoeRouting) -> list[int]:
        if self.rows is None:
            self.rows, self.notes = expert_rows(routing, self.tokens, self.top_k, self.experts, where=self.where)
        return self.rows


class _StorageMap:
    """A value per live tensor storage (weakly held: a freed storage drops out)."""

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref, Any]] = {}

    @staticmethod
    def _storage(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return None
        try:
            return t.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return None

    def get(self, t: Any) -> Any:
        st = self._storage(t)
        hit = self._d.get(id(st)) if st is not None else None
        return hit[1] if hit is not None and hit[0]() is st else None

    def put(self, t: Any, value: Any) -> None:
        st = self._storage(t)
        if st is None:
            return
        key = id(st)
        try:
            ref = weakref.ref(st, lambda _r, key=key: self._d.pop(key, None))
        except TypeError:
            return
        self._d[key] = (ref, value)


def _elements(t: torch.Tensor, values: list) -> list | None:
    """The elements of ``t`` in logical order, read from its storage's known ``values``."""
    idx = [t.storage_offset()]
    for size, stride in zip(t.shape, t.stride()):
        idx = [i + j * stride for i in idx for j in range(size)]
    if any(i >= len(values) for i in idx):
        return None
    return [values[i] for i in idx]


_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
            "ge": operator.ge}


class RoutingOracle:
    """Answers MoE dispatch's data-dependent ops from the assumed routing (see the module docstring).

    ``modules``: the running modules (:class:`~labkit.memory.trace.fake.fake_runtime.ModuleStack`);
    ``assume(text)``: how an assumption is reported."""

    def __init__(self, routing: MoeRouting, modules: Any, assume: Callable[[str], None]) -> None:
        self.routing = routing
        self.modules = modules
        self._assume = assume
        self.dispatch: Dispatch | None = None
        self.ids = _StorageMap()       # storages holding routing ids (True)
        self.values = _StorageMap()    # storages whose values fake mode knows (a list, by storage element)
        self.masks = _StorageMap()     # (tokens, experts) one-hot routing masks made by scatter: the experts' dim
        self.used: dict[str, int] = {}          # assumption text -> dispatches that used it
        self.not_needed: dict[str, int] = {}    # routing-independent implementations seen -> calls

    # -- reporting ------------------------------------------------------------------------------
    def label(self) -> str:
        if self.routing.balanced:
            return "balanced (the default; moe_routing= or --moe-routing give each expert's share)"
        return f"as given ({self.routing.text()})"

    def describe(self) -> dict[str, Any]:
        return {"assumed": self.routing.text(), "default": self.routing.balanced,
                "used_by": dict(self.used), "not_needed_by": dict(self.not_needed)}

    def independent(self, what: str, *, experts: int | None, rows: int | None) -> None:
        """An implementation whose memory does not depend on the routing, seen running ``rows`` rows
        (None: not known here, e.g. in backward); the user's shares must still match ``experts``."""
        d = self._live()
        if d is not None:
            rows = d.tokens * d.top_k
        if experts is not None and not self.routing.balanced:
            expert_rows(self.routing, max(rows or 1, 1), 1, experts, where=self.modules.where())
        if rows is None:
            return
        text = (f"MoE routing {self.label()}: not needed by {what} in {self.modules.where()}: it runs all {rows} "
                "token x top-k rows at once, so its memory does not depend on how tokens are routed")
        self.not_needed[text] = self.not_needed.get(text, 0) + 1
        self._assume(text)

    def _used(self, d: Dispatch, how: str) -> None:
        d.answers += 1
        if d.answers > 1:
            return
        rows = d.expert_rows(self.routing)
        text = (f"MoE routing {self.label()}: {how} in {self.modules.where()} takes its shapes from it: {d.tokens} tokens x "
                f"top-{d.top_k} = {d.tokens * d.top_k} rows over {d.experts} experts, {rows_text(rows)}")
        if d.notes:
            text += " (" + "; ".join(d.notes) + ")"
        self.used[text] = self.used.get(text, 0) + 1
        self._assume(text)

    # -- the dispatch -----------------------------------------------------------------------------
    def _live(self) -> Dispatch | None:
        d = self.dispatch
        if d is None or (d.scope is not None and d.scope not in self.modules.ids):
            return None
        return d

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """After an op: a routing decision, or routing ids and known values carried through it."""
        if func is aten.topk.default:
            x, k = args[0], args[1]
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            if x.dim() >= 2 and dim % x.dim() == x.dim() - 1 and 0 < k <= x.size(-1):
                ids = self.modules.ids
                scope = ids[-2] if len(ids) >= 2 else (ids[-1] if ids else None)
                self.dispatch = Dispatch(x.numel() // x.size(-1), int(k), x.size(-1), scope, self.modules.where())
                self.ids.put(out[1], True)
            return
        if not args or not isinstance(args[0], torch.Tensor):
            return
        name = func.__name__.split(".")[0]
        src = args[0]
        if func is aten.scatter.value and len(args) > 3 and args[3] == 1 and self.ids.get(args[2]):
            d = self._live()        # zeros(tokens, experts).scatter(1, topk indices, 1): the routing mask
            dim = args[1] % src.dim()
            if d is not None and src.dim() == 2 and src.size(dim) == d.experts and src.size(1 - dim) == d.tokens:
                self.masks.put(out, dim)
            return
        if name == "sum" and self.masks.get(src) is not None and len(args) > 1:
            d = self._live()
            dims = [x % src.dim() for x in args[1]] if isinstance(args[1], (list, tuple)) else []
            if d is not None and dims == [1 - self.masks.get(src)] and out.is_contiguous():
                self.values.put(out, _cast_values(d.expert_rows(self.routing), out.dtype))   # rows per expert
            return
        if name in ("_to_copy", "clone", "sort", "cumsum") or name in _COMPARE:
            first = out[0] if isinstance(out, (tuple, list)) else out
            if name != "cumsum" and name not in _COMPARE and self.ids.get(src):
                self.ids.put(first, True)
            if name in ("_to_copy", "clone") and self.masks.get(src) is not None and src.is_contiguous():
                self.masks.put(first, self.masks.get(src))
            known = self.values.get(src)
            if known is None or (name in ("cumsum", "sort") and src.dim() != 1):
                return
            vals = _elements(src, known)
            if vals is None:
                return
            if name == "cumsum":
                acc, run = [], 0
                for v in vals:
                    run += v
                    acc.append(run)
                vals = acc
            elif name == "sort":
                vals = sorted(vals)
            elif name in _COMPARE:
                other = args[1] if len(args) > 1 else None
                if isinstance(other, torch.Tensor):
                    return
                vals = [_COMPARE[name](v, other) for v in vals]
            if isinstance(first, torch.Tensor) and first.is_contiguous():
                self.values.put(first, _cast_values(vals, first.dtype))
        elif func is aten.index.Tensor and src.dim() >= 3:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(self.ids.get(i) for i in indices if isinstance(i, torch.Tensor)):
                self.independent("the per-row gather of expert weights (batched_mm)", experts=src.size(0),
                                 rows=None)
        elif func is aten.histc.default and self.ids.get(src):
            d = self._live()
            bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
            if d is not None and bins == d.experts:     # its shape is fixed: only its values become known
                self.values.put(out, [float(r) for r in d.expert_rows(self.routing)])

    def replace(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The output of a data-dependent op of MoE dispatch, or ``NotImplemented``."""
        if func is aten.nonzero.default:
            return self._nonzero(args[0])
        if func is aten.bincount.default:
            return self._bincount(args[0], args[1] if len(args) > 1 else kwargs.get("weights"),
                                  args[2] if len(args) > 2 else kwargs.get("minlength", 0))
        if func is aten.repeat_interleave.Tensor:
            known = self.values.get(args[0])
            vals = _elements(args[0], known) if known is not None else None
            if vals is None:
                return NotImplemented
            return torch.empty((int(sum(vals)),), dtype=torch.long)
        return NotImplemented

    def _nonzero(self, x: torch.Tensor) -> Any:
        d = self._live()
        if d is None:
            return NotImplemented
        rows = d.expert_rows(self.routing)
        n = x.numel()
        if x.dim() == 1 and d.hit is None and n in (d.experts, d.experts + 1):
            d.hit = [e for e, r in enumerate(rows) if r > 0]
            d.cursor = 0
            self._used(d, "the loop over the experts hit (nonzero)")
            out = torch.empty((len(d.hit), 1), dtype=torch.long)
            self.values.put(out, list(d.hit))
            return out
        if n in (d.tokens * d.top_k, d.tokens):
            order = d.hit if d.hit is not None else list(range(d.experts))
            if not order:
                return NotImplemented
            e = order[d.cursor % len(order)]
            d.cursor += 1
            self._used(d, "each expert's rows (nonzero / torch.where on its slice of the routing mask)")
            return torch.empty((rows[e], x.dim()), dtype=torch.long)
        return NotImplemented

    def _bincount(self, x: torch.Tensor, weights: Any, minlength: int) -> Any:
        d = self._live()
        if d is None or not self.ids.get(x):
            return NotImplemented
        rows = d.expert_rows(self.routing)
        last = max((e for e, r in enumerate(rows) if r > 0), default=-1)
        length = max(int(minlength or 0), last + 1)
        self._used(d, "the per-expert counts (bincount)")
        if weights is not None:
            return torch.empty((length,), dtype=weights.dtype if weights.is_floating_point() else torch.double)
        out = torch.empty((length,), dtype=torch.long)
        self.values.put(out, (rows + [0] * length)[:length])
        return out

    def scalar(self, x: torch.Tensor) -> Any:
        """The value of a one-element tensor whose value fake mode knows, else None."""
        known = self.values.get(x)
        if known is None or x.numel() != 1:
            return None
        vals = _elements(x, known)
        if not vals:
            return None
        d = self._live()
        if d is not None:
            self._used(d, "reading expert ids and counts (.item() / .tolist())")
        v = vals[0]
        return bool(v) if x.dtype == torch.bool else (float(v) if x.is_floating_point() else int(v))


def _cast_values(vals: list, dtype: torch.dtype) -> list:
    if dtype == torch.bool:
        return [bool(v) for v in vals]
    if dtype.is_floating_point:
        return [float(v) for v in vals]
    return [int(v) for v in vals]
