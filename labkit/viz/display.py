"""Notebook display helpers: Bokeh with inline resources (no CDN), tables, source notes."""

from __future__ import annotations

import html
import sys
import threading
from contextlib import contextmanager
from typing import Iterable, Sequence

from bokeh.io import output_notebook, show as bokeh_show
from bokeh.resources import INLINE
from IPython.display import HTML, Markdown, display
from tqdm import tqdm

_ready = False


def setup() -> None:
    """Load BokehJS inline once per kernel, so plots render offline and in the HTML report."""
    global _ready

    output_notebook(resources=INLINE, hide_banner=True)
    _ready = True


def show(obj) -> None:
    """Show a Bokeh object in the notebook (inline resources)."""
    if not _ready:
        setup()
    bokeh_show(obj)


def line_width(k: int, n: int, thinnest: float = 1.5, step: float = 2.0) -> float:
    """The width of the ``k``-th of ``n`` lines drawn over each other: the first widest, each later one
    narrower, so a line that lies exactly on an earlier one still shows as a band of two colours."""
    return thinnest + step * (n - 1 - k)


def html_table(headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str | None = None):
    """An HTML table for the notebook (and the HTML report)."""
    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape('' if c is None else str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return HTML(f"<table class='labkit-table'>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def source_note(text: str):
    """An italic line saying where the numbers above come from."""
    return Markdown(f"*Source: {text}*")


WIDGET_TEXT = "[interactive explorer: open this notebook in JupyterLab (make lab) to use it; the static result is shown beside it]"


def show_widget(widget, text: str = WIDGET_TEXT) -> None:
    """Display an ipywidgets widget whose plain-text fallback (what a report without a kernel shows) is
    ``text``, not the widget's repr (``VBox(children=(HBox(...``)."""
    data = dict(widget._repr_mimebundle_() or {})
    data["text/plain"] = text
    display(data, raw=True)


def bar(desc: str, total: int | None, **kw):
    """A tqdm progress bar as a plain text line on stdout (also in a notebook: a widget there would be a
    frozen "0 %" in saved notebooks and reports, which keep the last text line of the bar instead; on
    stderr it would read as an error, a pink box in JupyterLab and the report)."""
    kw.setdefault("mininterval", 0.5)
    return tqdm(total=total, desc=desc, file=sys.stdout, **kw)


def progress(items, desc: str):
    """Iterate over ``items`` with a progress bar (one tick per item), for cells longer than a few seconds.
    Hand the generator to the work itself, not a list made of it first: the bar ticks when the next item is
    asked for, after each item's work; a list made first shows 100% before any work starts."""
    items = list(items)
    b = bar(desc, len(items))
    try:
        for x in items:
            yield x
            b.update(1)
    finally:
        b.close()


@contextmanager
def busy(desc: str, tick_s: float = 1.0):
    """A progress line for one long call that has no steps to count (a process group's run): the
    elapsed time, refreshed every ``tick_s`` seconds until the block ends."""
    b = bar(desc, None, bar_format="{desc}: {elapsed} elapsed")
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(tick_s):
            b.refresh()

    t = threading.Thread(target=tick, daemon=True, name="labkit-busy")
    t.start()
    try:
        yield b
    finally:
        stop.set()
        t.join()
        b.close()
