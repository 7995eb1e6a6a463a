"""Bokeh figures of the training-step tracer (``labkit.memory.trace``; notebooks 04 and 07). No computation
here: the inputs are ``labkit.memory`` reports (or their recorded JSON rows) and already-computed numbers.

Every figure takes a ``source`` string (``measured here``, ``recorded on <GPU>, <date>``, ``model``)
and shows it in its title.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from bokeh.layouts import row
from bokeh.models import ColumnDataSource, HoverTool, Legend, Title
from bokeh.plotting import figure

GIB = float(1 << 30)
CATEGORY_COLORS = {
    "parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c", "activations": "#d62728",
    "temporaries": "#9467bd", "inputs": "#8c564b", "workspace": "#7f7f7f",
}


def _get(obj: Any, key: str) -> Any:
    return obj[key] if isinstance(obj, Mapping) else getattr(obj, key)


def _unit(max_bytes: float) -> tuple[float, str]:
    """GiB for GPU-sized numbers, MiB below 1 GiB (a tiny CPU model's 3 MiB is not 0.003 GiB)."""
    return (GIB, "GiB (2^30 bytes)") if max_bytes >= GIB else (float(1 << 20), "MiB (2^20 bytes)")


def _source_line(fig, source: str):
    """The source under the plot (a footnote), so the title stays short enough not to be clipped."""
    fig.add_layout(Title(text=f"source: {source}", text_font_size="8pt", text_font_style="italic",
                         text_color="#555555"), "below")
    return fig


def phase_timeline(phases: Sequence[Any], *, title: str, source: str, width: int = 760, height: int = 330):
    """Per-phase memory as a timeline: for each phase (in order) a bar from its start to its peak,
    the categories live at the peak stacked inside it, and the bytes at its end as a line.
    ``phases``: ``PhaseStats`` objects or dicts (step, phase, start_bytes, peak_bytes, end_bytes,
    peak_by_category)."""
    labels = [f"{_get(p, 'step')}:{_get(p, 'phase')}" for p in phases]
    cats = [c for c in CATEGORY_COLORS if any((_get(p, "peak_by_category") or {}).get(c, 0) for p in phases)]
    scale, unit = _unit(max((_get(p, "peak_bytes") for p in phases), default=0))
    short = unit.split()[0]
    data: dict[str, list] = {"x": labels}
    for c in cats:
        data[c] = [(_get(p, "peak_by_category") or {}).get(c, 0) / scale for p in phases]
    data["peak"] = [_get(p, "peak_bytes") / scale for p in phases]
    data["start"] = [_get(p, "start_bytes") / scale for p in phases]
    data["end"] = [_get(p, "end_bytes") / scale for p in phases]
    src = ColumnDataSource(data)
    fig = figure(x_range=labels, width=width, height=height, title=title,
                 y_axis_label=unit, toolbar_location="right")
    _source_line(fig, source)
    renderers = fig.vbar_stack(cats, x="x", width=0.7, source=src, color=[CATEGORY_COLORS[c] for c in cats],
                               fill_alpha=0.75) if cats else []
    line = fig.line("x", "end", source=src, color="black", line_width=2)
    fig.scatter("x", "peak", source=src, size=8, color="black", marker="triangle")
    legend = Legend(items=[(c.replace("_", " "), [r]) for c, r in zip(cats, renderers)] + [("bytes at phase end", [line])],
                    location="center")
    fig.add_layout(legend, "right")
    fig.add_tools(HoverTool(tooltips=[("phase", "@x"), ("start", f"@start{{0.000}} {short}"),
                                      ("peak", f"@peak{{0.000}} {short}"), ("end", f"@end{{0.000}} {short}")]))
    fig.xaxis.major_label_orientation = 0.9
    return fig


def sweep_bars(labels: Sequence[str], peak_bytes: Sequence[float], step_times_s: Sequence[float | None], *,
               title: str, source: str, baseline: int = 0, width: int = 760, height: int = 300):
    """Peak memory (bars, GiB) and step time overhead vs the first point (line, %) per policy."""
    base_t = step_times_s[baseline]
    over = [None if (t is None or not base_t) else 100.0 * (t - base_t) / base_t for t in step_times_s]
    scale, unit = _unit(max(peak_bytes, default=0))
    src = ColumnDataSource({"x": list(labels), "gib": [b / scale for b in peak_bytes],
                            "ms": [None if t is None else t * 1e3 for t in step_times_s], "over": over})
    timed = any(t is not None for t in step_times_s)
    f1 = figure(x_range=list(labels), width=width // 2 if timed else width, height=height, title=f"{title}: peak",
                y_axis_label=f"peak allocated, {unit}")
    f1.vbar(x="x", top="gib", width=0.7, source=src, color="#1f77b4")
    f1.add_tools(HoverTool(tooltips=[("policy", "@x"), ("peak", f"@gib{{0.00}} {unit.split()[0]}")]))
    f1.xaxis.major_label_orientation = 0.9
    _source_line(f1, source)
    if not timed:  # fake mode has no step time: no empty second plot
        return row(f1)
    f2 = figure(x_range=list(labels), width=width // 2, height=height, title=f"step time vs {labels[baseline]}",
                y_axis_label="extra step time, %")
    f2.vbar(x="x", top="over", width=0.7, source=src, color="#d62728")
    f2.add_tools(HoverTool(tooltips=[("policy", "@x"), ("step", "@ms{0.0} ms"), ("overhead", "@over{0.0}%")]))
    f2.xaxis.major_label_orientation = 0.9
    _source_line(f2, source)
    return row(f1, f2)


def category_bars(labels: Sequence[str], by_category: Sequence[Mapping[str, int]], *, title: str, source: str,
                  width: int = 760, height: int = 320):
    """Stacked bytes per category (at each case's peak) for several cases, e.g. precision policies."""
    cats = [c for c in CATEGORY_COLORS if any(b.get(c, 0) for b in by_category)]
    scale, unit = _unit(max((sum(b.values()) for b in by_category), default=0))
    data: dict[str, list] = {"x": list(labels)}
    for c in cats:
        data[c] = [b.get(c, 0) / scale for b in by_category]
    fig = figure(x_range=list(labels), width=width, height=height, title=title,
                 y_axis_label=f"{unit} at the peak")
    _source_line(fig, source)
    rs = fig.vbar_stack(cats, x="x", width=0.7, source=ColumnDataSource(data),
                        color=[CATEGORY_COLORS[c] for c in cats], fill_alpha=0.8)
    fig.add_layout(Legend(items=[(c.replace("_", " "), [r]) for c, r in zip(cats, rs)]), "right")
    return fig


def prediction_scatter(names: Iterable[str], recorded: Sequence[int], predicted: Sequence[int], *, title: str,
                       source: str, band_pct: float = 5.0, width: int = 520, height: int = 480):
    """Predicted vs recorded peak per case, with the identity line and a +-band_pct band."""
    names = list(names)
    r = [x / GIB for x in recorded]
    p = [x / GIB for x in predicted]
    err = [100.0 * (b - a) / a for a, b in zip(r, p)]
    hi = max(r + p) * 1.08 if r else 1.0
    fig = figure(width=width, height=height, title=title, x_axis_label="recorded peak, GiB (2^30)",
                 y_axis_label="fake-mode prediction, GiB (2^30)", x_range=(0, hi), y_range=(0, hi))
    _source_line(fig, source)
    fig.line([0, hi], [0, hi], color="black")
    fig.varea(x=[0, hi], y1=[0, hi * (1 - band_pct / 100)], y2=[0, hi * (1 + band_pct / 100)], fill_alpha=0.15,
              color="green", legend_label=f"within {band_pct:g}%")
    fig.scatter("r", "p", size=8, source=ColumnDataSource({"r": r, "p": p, "name": names, "err": err}))
    fig.add_tools(HoverTool(tooltips=[("case", "@name"), ("recorded", "@r{0.000} GiB"), ("predicted", "@p{0.000} GiB"),
                                      ("error", "@err{+0.0}%")]))
    fig.legend.location = "top_left"
    return fig


def profiler_timeline(times_us: Sequence[float], by_category: Mapping[str, Sequence[int]], *, title: str, source: str,
                      width: int = 760, height: int = 300):
    """Stacked bytes per category over time, from ``torch.profiler``'s memory timeline."""
    colors = {"parameters": "#1f77b4", "optimizer_state": "#2ca02c", "inputs": "#8c564b", "temporaries": "#9467bd",
              "activations": "#d62728", "gradients": "#ff7f0e", "autograd_detail": "#17becf", "unknown": "#7f7f7f"}
    cats = [c for c in colors if any(by_category.get(c, []))]
    fig = figure(width=width, height=height, title=title, x_axis_label="time, ms",
                 y_axis_label="MiB (2^20 bytes)")
    _source_line(fig, source)
    data = {"t": [t / 1000.0 for t in times_us]}
    for c in cats:
        data[c] = [v / 2**20 for v in by_category[c]]
    fig.varea_stack(cats, x="t", source=data, color=[colors[c] for c in cats],
                    legend_label=[c.replace("_", " ") for c in cats])
    fig.add_layout(fig.legend[0], "right")  # beside the plot, clear of the areas
    return fig


def predicted_vs_recorded(points: Sequence[tuple[str, int, int]], *, title: str, source: str,
                          width: int = 560, height: int = 360):
    """Each script's predicted peak against its recorded one (bytes), with the line where they agree.
    ``points``: (name, recorded bytes, predicted bytes)."""
    top = max([max(r, p) for _, r, p in points] or [GIB])
    div, unit = _unit(top)
    src = ColumnDataSource({"name": [n for n, _, _ in points], "recorded": [r / div for _, r, _ in points],
                            "predicted": [p / div for _, _, p in points]})
    fig = figure(title=title, width=width, height=height, x_axis_label=f"recorded peak, {unit}",
                 y_axis_label=f"predicted peak, {unit}", x_range=(0, top / div * 1.1), y_range=(0, top / div * 1.1))
    fig.line([0, top / div * 1.1], [0, top / div * 1.1], color="#999999", line_dash="dashed",
             legend_label="prediction = recording")
    fig.scatter("recorded", "predicted", source=src, size=9, color="#1f77b4", legend_label="a script")
    fig.add_tools(HoverTool(tooltips=[("script", "@name"), ("recorded", "@recorded{0.00}"),
                                      ("predicted", "@predicted{0.00}")]))
    fig.legend.location = "top_left"
    return _source_line(fig, source)
