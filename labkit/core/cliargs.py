"""The command line's conventions, shared by every verb.

* :class:`Parser`: argparse's own errors (a bad type or choice, a missing or unknown flag) become
  one line on stderr and exit status 2, like every other user error.
* :class:`Deprecated`: an old flag name that still works, stores into the new flag's destination
  and says so in one line on stderr (after the run: an error is the only line its refusal prints).
* Argument types that check what they read: integers and finite floats in range, and the lab's
  vocabulary (:mod:`labkit.core.vocab`), old spellings mapped with one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from typing import Any, Callable

from labkit.core.errors import LabkitError
from labkit.core.vocab import MoeRouting, Recompute, canonical


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of blanks folded into single spaces."""
    return " ".join(str(text).split())


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``PROG: error: MESSAGE``) and exit 2; its
    sub-parsers are of the same class."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {one_line(message)}\n")
        sys.exit(2)


_pending: list[str] = []


def deprecation_note(old: str, new: str, prog: str = "labkit") -> None:
    """Queue the one line an old spelling prints on stderr; :func:`flush_notes` prints it once the
    verb has run (a refused call prints only its error line)."""
    line = f"{prog}: {old} is deprecated: use {new}"
    if line not in _pending:
        _pending.append(line)


def flush_notes(*, show: bool = True) -> None:
    """Print (or, with ``show=False``, drop) the queued deprecation lines."""
    if show:
        for line in _pending:
            sys.stderr.write(line + "\n")
    _pending.clear()


class Deprecated(argparse.Action):
    """An old flag kept as an alias: ``parser.add_argument("--batch-size", dest="micro_batch",
    action=Deprecated, new="--micro-batch", type=positive_int)``. ``convert(value)`` maps an old value
    to the new flag's (``--amp bfloat16`` to ``amp-bf16``)."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str,
                 convert: Callable[[Any], Any] | None = None, **kw: Any) -> None:
        kw.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kw)
        self.new = new
        self.convert = convert

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.convert is not None:
            try:
                values = self.convert(values)
            except LabkitError as exc:
                parser.error(f"argument {option_string}: {exc}")
        deprecation_note(option_string or self.option_strings[0], self.new, parser.prog)
        setattr(namespace, self.dest, values)


# ------------------------------------------------------------------ numbers

def _int(text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def int_at_least(lo: int) -> Callable[[str], int]:
    """An argument type: an integer >= ``lo``."""
    def parse(text: str) -> int:
        v = _int(text)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return v
    parse.__name__ = f"integer >= {lo}"
    return parse


def int_between(lo: int, hi: int) -> Callable[[str], int]:
    """An argument type: an integer from ``lo`` to ``hi`` (a count a user controls, bounded so that the work is)."""
    def parse(text: str) -> int:
        v = _int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo} to {hi}, got {text[:40]!r}")
        return v
    parse.__name__ = f"integer from {lo} to {hi}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def finite_float(*, gt: float | None = None, ge: float | None = None, lt: float | None = None,
                 le: float | None = None) -> Callable[[str], float]:
    """An argument type: a finite float within the given bounds (``gt``/``ge`` below, ``lt``/``le`` above)."""
    parts = [f"> {gt:g}" if gt is not None else "", f">= {ge:g}" if ge is not None else "",
             f"< {lt:g}" if lt is not None else "", f"<= {le:g}" if le is not None else ""]
    bounds = " and ".join(p for p in parts if p)

    def parse(text: str) -> float:
        try:
            v = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if ((gt is not None and not v > gt) or (ge is not None and not v >= ge)
                or (lt is not None and not v < lt) or (le is not None and not v <= le)):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}")
        return v
    parse.__name__ = f"number {bounds}".strip()
    return parse


# ------------------------------------------------------------------ the vocabulary

def vocab_value(kind: str, choices: tuple[str, ...] | None = None, *, flag: str | None = None
                ) -> Callable[[str], str]:
    """An argument type for a word of :mod:`labkit.core.vocab` (``precision``, ``optimizer``,
    ``optimizer_impl``, ...): its canonical spelling; an old spelling prints one deprecation line;
    ``choices`` narrows what this verb accepts."""
    def parse(text: str) -> str:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = canonical(kind, text)
            except LabkitError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        if caught:
            name = flag or "--" + kind.replace("_", "-")
            deprecation_note(f"{name} {text}", f"{name} {value}")
        if choices is not None and value not in choices:
            raise argparse.ArgumentTypeError(f"{value!r} does not apply here; choose one of {', '.join(choices)}")
        return value
    parse.__name__ = kind
    return parse


def recompute_value(text: str):
    """An argument type: a :class:`~labkit.core.vocab.Recompute` (none, selective, full, every-K)."""
    try:
        return Recompute.parse(text)
    except LabkitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def moe_routing_value(text: str):
    """An argument type: a :class:`~labkit.core.vocab.MoeRouting` (``balanced`` or shares ``0.4,0.3,0.2,0.1``)."""
    try:
        return MoeRouting.parse(text)
    except LabkitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def choices_metavar(choices: tuple[str, ...]) -> str:
    return "{" + ",".join(choices) + "}"
