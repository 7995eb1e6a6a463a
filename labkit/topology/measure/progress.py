"""Progress lines while a measurement runs (printed at once: a notebook cell shows them as they come)."""

from __future__ import annotations


def log(msg: str) -> None:
    print(msg, flush=True)
