"""HTML for the report: each executed notebook (offline: no CDN), and the run's index page."""

from __future__ import annotations

from pathlib import Path

import jinja2
import nbformat

from labkit.core.units import fmt_bytes
from labkit.report.compare import DEFAULT_TOLERANCE, regressions
from labkit.report.history import identity_key, machine_identity

# nbconvert (5 s to import: python -X importtime, 2-core machine) and bokeh (2.6 s) where a page is rendered.

TEMPLATES = Path(__file__).parent / "templates"


BOKEH_LOAD = "application/vnd.bokehjs_load.v0+json"


def bokeh_js_name() -> str:
    """The file name of the run folder's one copy of BokehJS (versioned: a page and its script agree)."""
    import bokeh

    return f"bokeh-{bokeh.__version__}.min.js"


def write_bokeh_js(folder: Path) -> str:
    """Write BokehJS (every component that ``output_notebook(INLINE)`` loads) once into ``folder``; its
    pages load it with ``<script src>``, so they still render offline and the folder holds it once."""
    from bokeh.resources import INLINE

    name = bokeh_js_name()
    path = Path(folder) / name
    if not path.exists():
        tmp = path.with_name(name + ".tmp")
        tmp.write_text("\n;\n".join(INLINE.js_raw), encoding="utf-8")
        tmp.replace(path)
    return name


def slim_notebook(ipynb: Path) -> int:
    """Replace the BokehJS payload that ``output_notebook(INLINE)`` put in an executed notebook (about 4 MB,
    twice) by a one-line note; its figures' own outputs are kept. Returns how many outputs were slimmed."""
    nb = nbformat.read(str(ipynb), as_version=4)
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if BOKEH_LOAD in out.get("data", {}):
                out["data"] = {"text/html": "<span class='labkit-bokehjs'></span>",
                               "text/plain": f"[BokehJS: the report's HTML pages load {bokeh_js_name()} beside them]"}
                n += 1
    if n:
        nbformat.write(nb, str(ipynb))
    return n


def notebook_html(ipynb: Path, out: Path) -> Path:
    """Render an executed notebook to HTML that renders offline: BokehJS from the one copy beside it
    (:func:`write_bokeh_js`), the figures' own data inline. The notebook is slimmed first
    (:func:`slim_notebook`)."""
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    slim_notebook(ipynb)
    js = write_bokeh_js(out.parent)
    nb = nbformat.read(str(ipynb), as_version=4)
    nb.metadata.pop("widgets", None)  # widget state needs a CDN-loaded manager; the template notes widgets instead
    exporter = HTMLExporter(template_name="lab", extra_template_paths=[str(TEMPLATES)])
    exporter.template_file = "offline.html.j2"
    # one stream output per cell, with carriage returns applied: a progress bar shows its last line only
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(enabled=True), enabled=True)
    body, _ = exporter.from_notebook_node(nb, resources={"labkit_bokeh_js": js})
    out.write_text(body, encoding="utf-8")
    return out


def _fmt(v, unit: str = "") -> str:
    if unit in ("bytes", "B") and isinstance(v, (int, float)):
        return fmt_bytes(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _with_unit(v, unit: str) -> str:
    if v is None:
        return "—"
    return _fmt(v, unit) + ("" if unit in ("bytes", "B", "") else f" {unit}")


def _short_source(src: str) -> str:
    """'recorded on 1 x H200, 2026-11-29 (driver ...); command: ...' -> the part before the details."""
    for cut in (" (driver", "; command"):
        src = src.split(cut, 1)[0]
    return src


def _sparkline(points: list[tuple[str, float]], regressed: bool):
    """A small Bokeh line of a result over the comparable runs (the last point is this run)."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    src = ColumnDataSource({"i": list(range(len(points))), "v": [v for _, v in points],
                            "run": [r for r, _ in points]})
    fig = figure(width=220, height=56, toolbar_location=None, tools="", min_border=2,
                 x_axis_type=None, y_axis_type=None)
    fig.outline_line_color = None
    fig.grid.visible = False
    colour = "#b00020" if regressed else "#3465a4"
    fig.line("i", "v", source=src, line_width=1.5, color=colour)
    fig.scatter("i", "v", source=src, size=4, color=colour)
    fig.add_tools(HoverTool(tooltips=[("run", "@run"), ("value", "@v{0.[000]}")]))
    return fig


def _watch_text(r: dict) -> str:
    """Which way is better and the tolerance, or that the result is information only."""
    if r.get("direction") not in ("higher", "lower"):
        return "information (a change is shown, not judged)"
    tol = r.get("tolerance")
    return f"{r['direction']} is better, tolerance {DEFAULT_TOLERANCE if tol is None else tol:.0%}"


def _change_text(c) -> str:
    if c is None:
        return ""
    if c.status == "not comparable":
        return "not comparable"
    if c.status == "new":
        return "new"
    delta = f"{c.rel_change * 100:+.1f}% " if c.rel_change is not None else ""
    return (delta + ("" if c.status == "same" else c.status)).strip()


def index_html(summary: dict, comparison: dict, history_note: str = "") -> str:
    """The run's index page, from ``templates/run_index.html.j2``: per notebook its status and key
    results, each with the last comparable run's value, the change judged by the result's
    direction, and a trend over the comparable runs (Bokeh, from the run folder's one BokehJS file:
    renders offline; the caller writes it there, :func:`write_bokeh_js`)."""
    from bokeh.embed import components

    env = summary.get("environment") or {}
    state, status = summary.get("state"), summary.get("status")
    head = "incomplete" if state != "finished" else status
    figures: dict[str, object] = {}
    notebooks = []
    for nb in summary.get("notebooks", []):
        rows = []
        for rname, r in (nb.get("results") or {}).items():
            c = comparison.get(nb["name"], {}).get(rname)
            key = f"t{len(figures)}"
            trend = ""
            if c is not None and len(c.trend) >= 2:
                figures[key] = _sparkline(c.trend, c.status == "regressed")
                trend = key
            unit = r.get("unit", "")
            src = r.get("source", "")
            rows.append({"name": rname, "label": r.get("label") or "", "watch": _watch_text(r),
                         "value": _with_unit(r.get("value"), unit),
                         "previous": _with_unit(c.previous, unit) if c is not None and c.previous_run else "—",
                         "change": _change_text(c), "reason": (c.reason if c is not None else "") or
                         (f"against {c.previous_run}, tolerance {c.tolerance:.0%}" if c is not None and c.previous_run else ""),
                         "css": (c.status.replace(" ", "-") if c is not None else ""), "trend": trend,
                         "source": src, "short_source": _short_source(src)})
        er = nb.get("error")
        notebooks.append({
            "name": nb["name"], "status": nb["status"],
            "css": nb["status"] if nb["status"] in ("passed", "failed") else "incomplete",
            "duration": f"{nb['duration_s']:.1f} s" if nb.get("duration_s") is not None else "",
            "links": [{"href": nb[k], "label": k} for k in ("html", "ipynb") if nb.get(k)],
            "params": ", ".join(f"{k}={v!r}" for k, v in (nb.get("parameters") or {}).items()),
            "error": (f"cell {er.get('cell')}: {er.get('ename')}: {str(er.get('evalue'))[:2000]}" if er else ""),
            "results": rows})
    script, divs = components(figures) if figures else ("", {})
    for nb in notebooks:
        for r in nb["results"]:
            r["trend"] = divs.get(r["trend"], "") if r["trend"] else ""
    compared = any(c.previous_run and c.status != "not comparable" for res in comparison.values() for c in res.values())
    tmpl = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.ChainableUndefined).get_template("run_index.html.j2")
    return tmpl.render(run=summary, env=env, head=head, head_class=head or "", notebooks=notebooks,
                       machine_key=identity_key(machine_identity(env)), history_note=history_note,
                       regressions=regressions(comparison), compared=compared,
                       bokeh_js=(f'<script src="{bokeh_js_name()}"></script>' if figures else ""),
                       bokeh_script=script)
