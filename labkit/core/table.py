"""Plain-text tables for the CLI's human output (``--json`` prints the dataclass instead)."""

from __future__ import annotations

from typing import Iterable, Sequence


def render(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    rows = [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)
