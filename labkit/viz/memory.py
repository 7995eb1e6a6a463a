"""Bokeh figures and the ipywidgets explorer of the parallel-memory chapter (notebook 02).

The figures take numbers already computed by ``labkit.memory`` (estimates, recorded peaks) and a
``source`` string that goes in the title (``model``, ``recorded on <GPU>, <date>``). The explorer
calls ``labkit.memory.estimate()`` on each widget change and updates the plot's data source.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import ipywidgets as W
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Legend, Range1d, Span, Title
from bokeh.plotting import figure

from labkit.core.errors import LabkitError
from labkit.core.units import fmt_bytes
from labkit.core.vocab import PRECISIONS
# CATEGORIES: the model's memory categories (labkit.core.vocab)
from labkit.memory.estimate import CATEGORIES, ModelSpec, ParallelSpec, TrainSpec, estimate
from labkit.memory.estimate.presets import get_preset, preset_names

# jupyter_bokeh (3.3 s to import: python -X importtime, 2-core machine) where a widget is shown.

GIB = float(1 << 30)
COLORS = {
    "parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c", "activations": "#d62728",
    "logits": "#e377c2", "comm_buffers": "#9467bd", "context": "#7f7f7f", "allocator_overhead": "#bcbd22",
}
LABELS = {"comm_buffers": "comm buffers", "optimizer_state": "optimizer states", "allocator_overhead": "allocator overhead",
          "context": "CUDA context, workspaces"}


def _data(labels: Sequence[str], breakdowns: Sequence[Mapping[str, int]]) -> dict[str, list]:
    data: dict[str, list] = {"x": list(labels)}
    for c in CATEGORIES:
        data[c] = [b.get(c, 0) / GIB for b in breakdowns]
    data["total"] = [sum(b.get(c, 0) for c in CATEGORIES) / GIB for b in breakdowns]
    return data


def _y_end(totals_gib: Sequence[float], capacity_bytes: int | None) -> float:
    """The y axis' top: the tallest bar or the capacity line, whichever is higher, plus headroom."""
    top = max([*totals_gib, (capacity_bytes or 0) / GIB, 1e-3])
    return top * 1.08


def stacked_bars(labels: Sequence[str], breakdowns: Sequence[Mapping[str, int]], *, title: str, source: str,
                 capacity_bytes: int | None = None, width: int = 760, height: int = 340):
    """One stacked bar per GPU (or pipeline stage): bytes by category, in GiB (2^30 bytes);
    a dashed line at the GPU's capacity when given (the axis always reaches it)."""
    data = _data(labels, breakdowns)
    src = ColumnDataSource(data)
    fig = figure(x_range=list(labels), width=width, height=height, y_axis_label="GiB (2^30 bytes)",
                 toolbar_location="right", y_range=Range1d(0, _y_end(data["total"], capacity_bytes)))
    fig.add_layout(Title(text=source, text_font_style="italic", text_font_size="9pt"), "above")
    fig.add_layout(Title(text=title, text_font_size="12pt"), "above")
    rs = fig.vbar_stack(list(CATEGORIES), x="x", width=0.7, source=src, color=[COLORS[c] for c in CATEGORIES],
                        fill_alpha=0.8)
    fig.add_layout(Legend(items=[(LABELS.get(c, c), [r]) for c, r in zip(CATEGORIES, rs)], location="center"), "right")
    if capacity_bytes:
        fig.add_layout(Span(location=capacity_bytes / GIB, dimension="width", line_dash="dashed", line_color="black"))
    fig.add_tools(HoverTool(tooltips=[("", "@x"), ("total", "@total{0.00} GiB"), ("activations", "@activations{0.00} GiB"),
                                      ("parameters", "@parameters{0.00} GiB"),
                                      ("optimizer states", "@optimizer_state{0.00} GiB")]))
    fig.xaxis.major_label_orientation = 0.6 if len(labels) > 6 else 0
    fig._labkit_source = src  # the explorer updates this
    fig._labkit_capacity = capacity_bytes
    return fig


def stage_bars(est: Any, *, title: str, source: str = "model", capacity_bytes: int | None = None, **kw):
    """Stacked bars for every pipeline stage of an ``Estimate``."""
    labels = [f"stage {s.stage} ({s.peak_phase})" for s in est.by_stage]
    return stacked_bars(labels, [s.per_gpu_bytes for s in est.by_stage], title=title, source=source,
                        capacity_bytes=capacity_bytes, **kw)


def model_vs_measured(labels: Sequence[str], model_bytes: Sequence[int], measured_bytes: Sequence[int], *,
                      title: str, source: str, width: int = 760, height: int | None = None):
    """Paired horizontal bars: the model's peak beside the measured one (GiB), the relative error in the
    hover. Horizontal, so that long case names read across and never overlap."""
    ys, vals, errs, kinds = [], [], [], []
    for lab, m, r in zip(labels, model_bytes, measured_bytes):
        for kind, v in (("model", m), ("measured", r)):
            ys.append((lab, kind))
            vals.append(v / GIB)
            errs.append(f"{(m - r) / r * 100:+.1f}%" if r else "")
            kinds.append(kind)
    colour = {"model": "#d62728", "measured": "#1f77b4"}
    src = ColumnDataSource({"y": ys, "v": vals, "err": errs, "kind": kinds, "c": [colour[k] for k in kinds]})
    fig = figure(y_range=FactorRange(*reversed(ys)), width=width, height=height or 80 + 16 * len(ys),
                 x_axis_label="peak allocated, GiB (2^30 bytes)", toolbar_location="right")
    fig.add_layout(Title(text=source, text_font_style="italic", text_font_size="9pt"), "above")
    fig.add_layout(Title(text=title, text_font_size="12pt"), "above")
    fig.hbar(y="y", right="v", height=0.8, source=src, fill_color="c", line_color=None)
    fig.add_tools(HoverTool(tooltips=[("", "@y"), ("peak", "@v{0.000} GiB"), ("model vs measured", "@err")]))
    fig.x_range.start = 0
    fig.ygrid.grid_line_color = None
    fig.yaxis.group_label_orientation = "horizontal"
    return fig


def explorer(initial: Mapping[str, Any] | None = None, *, capacity_bytes: int | None = None):
    """An ipywidgets explorer: model preset or custom dimensions, tp/pp/dp/ZeRO, SP, precision,
    recompute, micro-batch; redraws a stacked bar per pipeline stage (model). Returns the widget box
    (needs jupyter_bokeh in a live kernel)."""
    from jupyter_bokeh import BokehModel

    init = {"preset": "llama3-8b", "tp": 2, "pp": 2, "dp": 2, "zero": 1, "sp": True, "precision": "bf16-mixed",
            "recompute": "selective", "micro_batch": 1, "global_batch": 16, **(initial or {})}
    w = {
        "preset": W.Dropdown(options=["custom"] + preset_names(), value=init["preset"], description="model"),
        "layers": W.IntText(value=32, description="layers"), "hidden": W.IntText(value=4096, description="hidden"),
        "heads": W.IntText(value=32, description="heads"), "seq": W.IntText(value=init.get("seq", 4096), description="seq"),
        "vocab": W.IntText(value=32000, description="vocab"),
        "tp": W.Dropdown(options=[1, 2, 4, 8], value=init["tp"], description="tp"),
        "pp": W.Dropdown(options=[1, 2, 4, 8], value=init["pp"], description="pp"),
        "dp": W.Dropdown(options=[1, 2, 4, 8, 16, 64], value=init["dp"], description="dp"),
        "zero": W.Dropdown(options=[0, 1, 2, 3], value=init["zero"], description="ZeRO"),
        "sp": W.Checkbox(value=init["sp"], description="sequence parallel"),
        "precision": W.Dropdown(options=list(PRECISIONS), value=init["precision"], description="precision"),
        "recompute": W.Dropdown(options=["none", "selective", "full", "every-2", "every-4"], value=init["recompute"],
                                description="recompute"),
        "micro_batch": W.Dropdown(options=[1, 2, 4, 8, 16], value=init["micro_batch"], description="micro-batch"),
    }
    msg = W.HTML()
    dims = ("layers", "hidden", "heads", "seq", "vocab")
    model_dims = ("layers", "hidden", "heads", "vocab")   # what a preset fills (seq is the training run's)
    filling = [False]  # True while a preset's dimensions are written into the boxes (one redraw, not five)

    def fill_from_preset(_change=None):
        if w["preset"].value == "custom":
            return
        p = get_preset(w["preset"].value)
        filling[0] = True
        for d in model_dims:
            w[d].value = getattr(p, d)
        filling[0] = False

    def compute():
        values = {d: w[d].value for d in dims}
        if w["preset"].value == "custom":
            m = ModelSpec(**values)
        else:  # the boxes edit the preset's dimensions; the rest (gated MLP, KV heads, norms) stays the preset's

            m = dataclasses.replace(get_preset(w["preset"].value), **values)
        par = ParallelSpec(tp=w["tp"].value, pp=w["pp"].value, dp=w["dp"].value, zero=w["zero"].value,
                           sp=w["sp"].value and w["tp"].value > 1)
        gb = max(init["global_batch"], w["micro_batch"].value * w["dp"].value * w["pp"].value)
        gb -= gb % (w["micro_batch"].value * w["dp"].value)
        tr = TrainSpec(micro_batch=w["micro_batch"].value, global_batch=gb, precision=w["precision"].value,
                       recompute=w["recompute"].value)
        return estimate(m, par, tr)

    fill_from_preset()
    est = compute()
    fig = stage_bars(est, title="per-GPU memory by pipeline stage", capacity_bytes=capacity_bytes)
    src = fig._labkit_source
    model = BokehModel(fig)

    def redraw(_change=None):
        if filling[0]:
            return
        try:
            e = compute()
        except LabkitError as exc:
            msg.value = f"<b>invalid:</b> {exc}"
            return
        labels = [f"stage {s.stage} ({s.peak_phase})" for s in e.by_stage]
        fig.x_range.factors = labels
        src.data = data = _data(labels, [s.per_gpu_bytes for s in e.by_stage])
        fig.y_range.end = _y_end(data["total"], capacity_bytes)
        msg.value = (f"most loaded GPU: {fmt_bytes(e.total)} (stage {e.most_loaded_stage}, peak in {e.peak_phase}); "
                     f"{e.micro_batches} micro-batches per step; source: model")

    w["preset"].observe(fill_from_preset, names="value")
    for x in w.values():
        x.observe(redraw, names="value")
    redraw()
    left = W.VBox([w["preset"], w["layers"], w["hidden"], w["heads"], w["seq"], w["vocab"]])
    right = W.VBox([w["tp"], w["pp"], w["dp"], w["zero"], w["sp"], w["precision"], w["recompute"], w["micro_batch"]])
    box = W.VBox([W.HBox([left, right]), msg, model])
    box.add_class("labkit-explorer")
    box._labkit_figure = fig  # what the widgets redraw (tests read it)
    return box
