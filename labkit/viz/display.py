"""Notebook display helpers: Bokeh with inline resources (no CDN), tables, source notes."""

from __future__ import annotations

import html
from typing import Iterable, Sequence

_ready = False


def setup() -> None:
    """Load BokehJS inline once per kernel, so plots render offline and in the HTML report."""
    global _ready
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(resources=INLINE, hide_banner=True)
    _ready = True


def show(obj) -> None:
    """Show a Bokeh object in the notebook (inline resources)."""
    from bokeh.io import show as bokeh_show

    if not _ready:
        setup()
    bokeh_show(obj)


def html_table(headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str | None = None):
    """An HTML table for the notebook (and the HTML report)."""
    from IPython.display import HTML

    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape('' if c is None else str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return HTML(f"<table class='labkit-table'>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def source_note(text: str):
    """An italic line saying where the numbers above come from."""
    from IPython.display import Markdown

    return Markdown(f"*Source: {text}*")


WIDGET_TEXT = "[interactive explorer: open this notebook in JupyterLab (make lab) to use it; the static result is shown beside it]"


def show_widget(widget, text: str = WIDGET_TEXT) -> None:
    """Display an ipywidgets widget whose plain-text fallback (what a report without a kernel shows) is
    ``text``, not the widget's repr (``VBox(children=(HBox(...``)."""
    from IPython.display import display

    data = dict(widget._repr_mimebundle_() or {})
    data["text/plain"] = text
    display(data, raw=True)
