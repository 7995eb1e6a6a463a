"""One notebook section as one value: ``Section``, which displays itself.

A notebook cell calls one labkit function that returns a :class:`Section` (or a subclass that
fills it from a chapter's typed result). Displaying it shows, in order: the claims, each beside
the number that shows it and where that number comes from; the table; the figure; then any notes
(a stated gap, such as a recording that is not there). Displaying it also records its key results
in the report (``labkit.report.record``), once per kernel.

    sec = Section("Pinned vs pageable copies", source="measured here")
    sec.claim("Pinned host memory copies faster", 6.1, "x", name="h2d_pinned_speedup")
    sec.table(["size", "pageable GB/s", "pinned GB/s"], rows)
    sec.figure(fig)
    sec            # the last expression of the cell: it displays itself

Nothing here computes a result of its own: the chapter does, the section only shows and records.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from IPython.display import HTML, display

from labkit.core.table import render
from labkit.core.units import fmt_bytes
from labkit.report import record
from labkit.viz.display import show, show_widget


FIXED_SOURCES = ("recorded", "sample")  # sources whose numbers do not change from one run to the next
LONG_TABLE_ROWS = 20  # a longer table shows its failures first and the whole table collapsed


@dataclass
class Claim:
    """A sentence and the number that shows it."""

    text: str
    value: float | int | str
    unit: str = ""
    source: str = ""
    name: str | None = None              # key result name in the report, or None (not recorded)
    tolerance: float | None = None
    direction: str | None = None         # "higher", "lower" or None (informational), for the report
    digits: int | None = None            # decimals to show (default: 3 significant digits)

    def value_text(self) -> str:
        v = self.value
        if self.unit in ("bytes", "B") and isinstance(v, (int, float)) and not isinstance(v, bool):
            return fmt_bytes(v)
        if self.digits is not None and isinstance(v, (int, float)):
            v = f"{v:,.{self.digits}f}"
        elif isinstance(v, float):
            v = f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return f"{v} {self.unit}".strip()


@dataclass
class Section:
    """What one notebook section shows: claims, a table, a figure and notes."""

    title: str
    source: str = ""                      # default source for claims that name none
    claims: list[Claim] = field(default_factory=list)
    headers: list[str] | None = None
    rows: list[list[Any]] = field(default_factory=list)
    caption: str | None = None
    figures: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    widgets: list[Any] = field(default_factory=list)   # ipywidgets explorers, shown after the figures
    failed: list[bool] = field(default_factory=list)   # per table row: a failure, shown first (empty: none marked)
    _recorded: bool = field(default=False, repr=False)

    # -- building ---------------------------------------------------------------------------
    def claim(self, text: str, value, unit: str = "", *, source: str | None = None, name: str | None = None,
              tolerance: float | None = None, direction: str | None = None, digits: int | None = None) -> "Section":
        self.claims.append(Claim(text, value, unit, source or self.source, name, tolerance, direction, digits))
        return self

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None, *,
              failed: Iterable[bool] | None = None) -> "Section":
        """The section's table. ``failed``: per row, whether it is a failure (a refusal, a miss); those rows
        come first. A table longer than :data:`LONG_TABLE_ROWS` shows its failures and a count, and the
        whole table in a collapsed part one click away."""
        self.headers = list(headers)
        rows = [list(r) for r in rows]
        flags = [bool(f) for f in failed] if failed is not None else [False] * len(rows)
        if len(flags) != len(rows):
            raise ValueError(f"table: {len(flags)} failure flags for {len(rows)} rows")
        order = sorted(range(len(rows)), key=lambda i: not flags[i])  # stable: failures first, else as given
        self.rows = [rows[i] for i in order]
        self.failed = [flags[i] for i in order] if failed is not None else []
        self.caption = caption
        return self

    def figure(self, fig) -> "Section":
        if fig is not None:
            self.figures.append(fig)
        return self

    def widget(self, w) -> "Section":
        """An interactive explorer (ipywidgets), shown after the figures; in a report without a kernel
        a one-line note stands in for it (:func:`labkit.viz.display.show_widget`)."""
        if w is not None:
            self.widgets.append(w)
        return self

    def note(self, text: str) -> "Section":
        self.notes.append(text)
        return self

    # -- reading ----------------------------------------------------------------------------
    def value(self, name: str):
        """The value of the claim recorded as ``name`` (KeyError if none)."""
        for c in self.claims:
            if c.name == name:
                return c.value
        raise KeyError(name)

    # -- recording and display --------------------------------------------------------------
    def record(self) -> None:
        """Put the named claims into the report (once). A claim from a recording or a sample with no
        direction is shown but not recorded: it cannot move from one run to the next, so the nightly
        report would only repeat it (one with a direction is a figure computed against a recording,
        such as a model's error, and is recorded)."""
        if self._recorded:
            return

        for c in self.claims:
            if c.name is None or not c.source or (c.direction is None and c.source.startswith(FIXED_SOURCES)):
                continue
            record(c.name, c.value, c.unit, source=c.source, tolerance=c.tolerance, direction=c.direction,
                   label=c.text)
        self._recorded = True

    def html(self) -> str:
        parts = [f"<h4 class='labkit-section'>{html.escape(self.title)}</h4>"]
        if self.claims:
            items = "".join(
                f"<li>{html.escape(c.text)}: <b>{html.escape(c.value_text())}</b>"
                + (f" <i>({html.escape(c.source)})</i>" if c.source and c.source != self.source else "") + "</li>"
                for c in self.claims)
            parts.append(f"<ul class='labkit-claims'>{items}</ul>")
            if any(c.source == self.source for c in self.claims) and self.source:  # the shared source, once
                parts.append(f"<p class='labkit-source'><i>Source: {html.escape(self.source)}</i></p>")
        if self.headers:
            parts.append(self._table_html())
        for n in self.notes:
            parts.append(f"<p class='labkit-note'><i>{html.escape(n)}</i></p>")
        return "\n".join(parts)

    def _table_html(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in self.headers)

        def table(rows, caption) -> str:
            body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape('' if c is None else str(c))}</td>"
                                            for c in r) + "</tr>" for r in rows)
            cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
            return f"<table class='labkit-table'>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

        if len(self.rows) <= LONG_TABLE_ROWS:
            return table(self.rows, self.caption)
        bad = [r for r, f in zip(self.rows, self.failed) if f]
        n = len(self.rows)
        if self.failed:
            lead = (f"{len(bad)} of {n} rows fail (shown first, and below)" if bad else f"None of the {n} rows fails.")
        else:
            lead = f"{n} rows."
        out = [f"<p class='labkit-table-summary'><b>{html.escape(lead)}</b></p>"]
        if bad:
            out.append(table(bad, "The rows that fail"))
        out.append(f"<details class='labkit-full-table'><summary>All {n} rows"
                   f"{' (failures first)' if bad else ''}: click to open</summary>{table(self.rows, self.caption)}</details>")
        return "\n".join(out)

    def _ipython_display_(self) -> None:
        self.record()
        display(HTML(self.html()))
        for fig in self.figures:
            show(fig)
        for w in self.widgets:
            show_widget(w)

    def __str__(self) -> str:  # plain text, e.g. in a terminal
        lines = [self.title]
        lines += [f"  - {c.text}: {c.value_text()}" + (f" ({c.source})" if c.source and c.source != self.source else "")
                  for c in self.claims]
        if self.source and any(c.source == self.source for c in self.claims):
            lines.append(f"  source: {self.source}")
        if self.headers:
            lines.append(render(self.headers, self.rows))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class ShowsSection:
    """A mixin for a chapter's typed result that displays itself through one :class:`Section`.

    The subclass (usually a dataclass holding the chapter's result) defines ``section()``; displaying
    the value shows that Section and records its named claims once, like a Section itself.
    """

    def section(self) -> Section:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def cached_section(self) -> Section:
        """The Section, built once (so displaying twice records once)."""
        sec = self.__dict__.get("_labkit_section")
        if sec is None:
            sec = self.section()
            object.__setattr__(self, "_labkit_section", sec)
        return sec

    def _ipython_display_(self) -> None:
        self.cached_section()._ipython_display_()

    def record(self) -> None:
        self.cached_section().record()

    def __str__(self) -> str:
        return str(self.cached_section())
