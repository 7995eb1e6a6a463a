"""The traced step, offered from above: ``labkit.advise`` traces one unsharded step of a Hugging Face
model in fake mode and prices it op by op (:mod:`labkit.advise.roofline`); the planner's verb
``labkit estimate --plan`` lives in the memory chapter, which may not import advise (imports point down
the layers), yet must headline the same figures as ``labkit advise``. So advise offers its function
here when it is imported (``labkit.cli`` imports every verb before it runs one), and the plan asks for it.

The function: ``trace(hf_config, *, layers, hidden, seq, micro_batch, precision, optimizer, recompute)
-> labkit.memory.estimate.planner.TracedStep``.
"""

from __future__ import annotations

from typing import Callable

_TRACER: Callable | None = None


def offer(fn: Callable) -> None:
    """Offer the step tracer (advise does, once, when it is imported)."""
    global _TRACER
    _TRACER = fn


def tracer() -> Callable | None:
    """The offered step tracer, or None when nothing above has offered one."""
    return _TRACER
