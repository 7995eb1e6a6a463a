"""Figures for the critical-path notebook: bus bandwidth over sizes, the DDP bucket sweep, the overlap
timeline, simulated exposed communication, and lever bars. No computation of their own: the numbers
come from ``labkit.comm`` (measurements, recordings, the simulator). Every title names its source."""

from __future__ import annotations

from typing import Iterable, Sequence

import ipywidgets as widgets
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Label, Span
from bokeh.plotting import figure
from IPython.display import display

from labkit.viz.display import line_width

# jupyter_bokeh (3.3 s to import: python -X importtime, 2-core machine) where a widget is shown.

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]


def _row(r) -> dict:
    return r if isinstance(r, dict) else r.__dict__


def _size_label(b: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b:g} B"


def busbw_figure(series: dict[str, Iterable], *, title: str, nominal_GBps: float | None = None,
                 nominal_label: str = "nominal link rate", published: dict[str, float] | None = None,
                 width: int = 760, height: int = 380):
    """Bus bandwidth (GB/s, 1e9 B/s) against message size (log-log), one line per series label."""
    p = figure(x_axis_type="log", y_axis_type="log", width=width, height=height, title=title,
               x_axis_label="bytes (as nccl-tests counts them)", y_axis_label="busbw, GB/s (1e9 B/s)")
    for k, (label, rows) in enumerate(series.items()):
        rs = [_row(r) for r in rows]
        src = ColumnDataSource(dict(x=[r["bytes"] for r in rs], y=[max(r["busbw_GBps"], 1e-6) for r in rs],
                                    t=[r["time_us"] for r in rs], size=[_size_label(r["bytes"]) for r in rs]))
        c = PALETTE[k % len(PALETTE)]
        p.line("x", "y", source=src, color=c, legend_label=label, line_width=line_width(k, len(series)))
        p.scatter("x", "y", source=src, color=c, size=5, legend_label=label)
    if nominal_GBps:
        p.add_layout(Span(location=nominal_GBps, dimension="width", line_dash="dashed", line_color="black"))
        right = max((_row(r)["bytes"] for rows in series.values() for r in rows), default=1)
        p.add_layout(Label(x=right, y=nominal_GBps, text=f"{nominal_label}: {nominal_GBps:g} GB/s", text_align="right",
                           text_font_size="9pt", y_offset=-16))  # under the line at the right: clear of the legend
    for k, (name, v) in enumerate((published or {}).items()):
        p.add_layout(Span(location=v, dimension="width", line_dash="dotted", line_color="grey"))
        p.add_layout(Label(x=5, y=v, x_units="screen", text=f"published: {name} {v:g} GB/s", text_font_size="8pt",
                           text_color="grey", y_offset=3))
    p.add_tools(HoverTool(tooltips=[("size", "@size"), ("busbw GB/s", "@y{0.000}"), ("time us", "@t{0.0}")]))
    p.legend.location = "top_left"
    p.legend.click_policy = "hide"
    return p


def time_vs_model_figure(rows: Iterable, predicted_us: Sequence[float] | None, *, title: str,
                         fit_us: Sequence[float] | None = None, width: int = 760, height: int = 340):
    """Measured collective time against the topology model's prediction (and an alpha-beta fit)."""
    rs = [_row(r) for r in rows]
    x = [r["bytes"] for r in rs]
    p = figure(x_axis_type="log", y_axis_type="log", width=width, height=height, title=title,
               x_axis_label="bytes", y_axis_label="time per collective, us")
    p.scatter(x, [r["time_us"] for r in rs], size=6, color=PALETTE[0], legend_label="measured (median)")
    p.segment(x, [r["time_us_min"] for r in rs], x, [r["time_us_max"] for r in rs], color=PALETTE[0], alpha=0.5)
    if predicted_us:
        p.line(x, list(predicted_us), color=PALETTE[1], line_dash="dashed", line_width=2,
               legend_label="topology model (alpha-beta ring, nominal rate)")
    if fit_us:
        p.line(x, list(fit_us), color=PALETTE[2], line_width=2, legend_label="alpha-beta fit of the measurement")
    p.legend.location = "top_left"
    return p


def bucket_sweep_figure(rows: Iterable, *, title: str, width: int = 760, height: int = 360):
    """Median step time (p10-p90 whiskers) against bucket_cap_mb, gradient_as_bucket_view off and on;
    the no_sync (no all-reduce) step as a dashed line."""
    rs = [_row(r) for r in rows]
    p = figure(x_axis_type="log", width=width, height=height, title=title,
               x_axis_label="bucket_cap_mb (MiB)", y_axis_label="step time, ms (median, p10-p90)")
    for k, gav in enumerate((False, True)):
        pts = sorted((r for r in rs if r["bucket_cap_mb"] is not None and bool(r["gradient_as_bucket_view"]) == gav),
                     key=lambda r: r["bucket_cap_mb"])
        if not pts:
            continue
        src = ColumnDataSource(dict(x=[r["bucket_cap_mb"] for r in pts], y=[r["step_ms_median"] for r in pts],
                                    lo=[r["step_ms_p10"] for r in pts], hi=[r["step_ms_p90"] for r in pts],
                                    nb=[r["num_buckets"] for r in pts],
                                    mem=[(r.get("peak_allocated_bytes") or 0) / 2**30 for r in pts]))
        c = PALETTE[k]
        lab = f"gradient_as_bucket_view={'on' if gav else 'off'}"
        p.line("x", "y", source=src, color=c, line_width=line_width(k, 2), legend_label=lab)  # off and on may coincide
        p.scatter("x", "y", source=src, color=c, size=6, legend_label=lab)
        p.segment("x", "lo", "x", "hi", source=src, color=c, alpha=0.6)
    base = [r for r in rs if r["bucket_cap_mb"] is None]
    if base:
        p.add_layout(Span(location=base[0]["step_ms_median"], dimension="width", line_dash="dashed", line_color="grey"))
    p.add_tools(HoverTool(tooltips=[("bucket MiB", "@x"), ("buckets", "@nb"), ("step ms", "@y{0.00}"),
                                    ("p10-p90", "@lo{0.00}-@hi{0.00}"), ("peak allocated GiB", "@mem{0.00}")]))
    p.add_layout(p.legend[0], "right")  # beside the plot, clear of the lines
    return p


def timeline_figure(tl, *, title: str, width: int = 900, height: int = 220):
    """Two lanes: backward compute (merged intervals) and one bar per all-reduce, in ms from backward start."""
    t = _row(tl)
    lanes = ["all-reduce", "backward compute"]
    p = figure(y_range=lanes, width=width, height=height, title=title, x_axis_label="ms since backward began",
               toolbar_location="above")
    comp = t["compute"]
    p.hbar(y=["backward compute"] * len(comp), left=[s / 1e3 for s, _ in comp], right=[e / 1e3 for _, e in comp],
           height=0.6, color=PALETTE[2])
    comm = t["comm"]
    src = ColumnDataSource(dict(y=["all-reduce"] * len(comm), l=[s / 1e3 for s, _ in comm], r=[e / 1e3 for _, e in comm],
                                d=[(e - s) / 1e3 for s, e in comm], n=list(range(len(comm))),
                                name=[str(x)[:60] for x in t.get("comm_names", [""] * len(comm))]))
    bars = p.hbar(y="y", left="l", right="r", height=0.6, color=PALETTE[1], alpha=0.7, source=src)
    p.add_tools(HoverTool(renderers=[bars], tooltips=[("op", "@n: @name"), ("ms", "@d{0.000}")]))
    return p


def simulator_figure(series: dict[str, Iterable], *, title: str, measured: dict[str, Iterable] | None = None,
                     width: int = 760, height: int = 360):
    """Exposed communication (ms) against bucket size: simulated lines, measured points where they exist."""
    p = figure(x_axis_type="log", width=width, height=height, title=title, x_axis_label="bucket_cap_mb (MiB)",
               y_axis_label="exposed communication, ms")
    for k, (label, pts) in enumerate(series.items()):
        ps = [_row(x) for x in pts]
        c = PALETTE[k % len(PALETTE)]
        p.line([x["bucket_cap_mb"] for x in ps], [x["exposed_ms"] for x in ps], color=c,
               line_width=line_width(k, len(series)), legend_label=label)
        p.scatter([x["bucket_cap_mb"] for x in ps], [x["exposed_ms"] for x in ps], color=c, size=4, legend_label=label)
    for k, (label, pts) in enumerate((measured or {}).items()):
        ps = [_row(x) for x in pts]
        p.scatter([x["bucket_cap_mb"] for x in ps], [x["exposed_ms"] for x in ps], marker="diamond", size=10,
                  color=PALETTE[(k + 4) % len(PALETTE)], legend_label=label)
    p.legend.click_policy = "hide"
    p.add_layout(p.legend[0], "right")  # beside the plot: the curves start high on the left
    return p


def bars_figure(labels: Sequence[str], values: Sequence[float], *, title: str, y_label: str,
                colors: Sequence[str] | None = None, width: int = 560, height: int = 300):
    """Plain bars (one value per label)."""
    src = ColumnDataSource(dict(x=list(labels), y=list(values),
                                c=list(colors) if colors else [PALETTE[i % len(PALETTE)] for i in range(len(labels))]))
    p = figure(x_range=list(labels), width=width, height=height, title=title, y_axis_label=y_label,
               toolbar_location=None)
    p.vbar(x="x", top="y", width=0.6, color="c", source=src)
    p.add_tools(HoverTool(tooltips=[("", "@x"), (y_label, "@y{0.000}")]))
    p.xaxis.major_label_orientation = 0.3
    return p


def per_gpu_memory_figure(runs: Iterable, *, title: str, width: int = 560, height: int = 320):
    """Peak allocated GiB per GPU, one group per run (DataParallel vs DDP)."""
    rs = [_row(r) for r in runs]
    xs, ys, cs = [], [], []
    for k, r in enumerate(rs):
        for i, b in enumerate(r["peak_allocated_bytes"]):
            xs.append((r["mode"], f"GPU{i}"))
            ys.append(b / 2**30)
            cs.append(PALETTE[k % len(PALETTE)])
    p = figure(x_range=FactorRange(*xs), width=width, height=height, title=title,
               y_axis_label="peak allocated, GiB (2^30 B)", toolbar_location=None)
    p.vbar(x="x", top="y", width=0.7, color="c", source=ColumnDataSource(dict(x=xs, y=ys, c=cs)))
    return p


def simulator_explorer(sweep_fn, *, nodes: int, inter_bw_GBps: float, inter_latency_us: float):
    """Sliders for the node count, inter-node bandwidth and latency; each change redraws the figure from
    ``sweep_fn(nodes, inter_bw_GBps, inter_latency_us)`` (the simulator's points: no computation here)."""
    from jupyter_bokeh import BokehModel

    nodes_w = widgets.IntSlider(value=nodes, min=1, max=64, description="nodes")
    bw_w = widgets.FloatLogSlider(value=inter_bw_GBps, base=10, min=0, max=3, description="inter GB/s")
    lat_w = widgets.FloatLogSlider(value=inter_latency_us, base=10, min=0, max=3, description="latency us")
    out = widgets.Output()

    def redraw(*_) -> None:
        fig = simulator_figure({"model": sweep_fn(nodes_w.value, bw_w.value, lat_w.value)},
                               title=f"{nodes_w.value} nodes, {bw_w.value:.3g} GB/s, {lat_w.value:.3g} us (model)")
        with out:
            out.clear_output(wait=True)
            display(BokehModel(fig))

    for w in (nodes_w, bw_w, lat_w):
        w.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([widgets.HBox([nodes_w, bw_w, lat_w]), out])
    box.add_class("labkit-explorer")
    return box
