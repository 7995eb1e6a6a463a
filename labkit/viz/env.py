"""Figures and the units explorer of the 'this server' notebook."""

from __future__ import annotations

import ipywidgets as W
from bokeh.models import ColumnDataSource, HoverTool, Title
from bokeh.plotting import figure
from IPython.display import display

from labkit.core.machine import MachineInfo
from labkit.core.units import GB, GiB
from labkit.viz.display import html_table, show


def _units(binary: bool) -> tuple[str, int]:
    return ("GiB", GiB) if binary else ("GB", GB)


def gpu_memory_figure(m: MachineInfo, origin: str, *, binary: bool = True):
    """Stacked bar per GPU: memory in use vs free (NVML's view), in GiB or GB. The source is a
    subtitle line, so the title is never cut."""
    unit, f = _units(binary)
    names = [f"GPU{g.index}" for g in m.gpus] or ["(no GPU)"]
    total = [g.memory_total_bytes / f for g in m.gpus] or [0.0]
    free = [(g.memory_free_bytes if g.memory_free_bytes is not None else g.memory_total_bytes) / f for g in m.gpus] or [0.0]
    used = [t - fr for t, fr in zip(total, free)]
    src = ColumnDataSource(dict(gpu=names, used=used, free=free, total=total,
                                name=[g.name for g in m.gpus] or [""]))
    p = figure(x_range=names, height=320, width=max(440, 90 * len(names)), toolbar_location=None)
    p.add_layout(Title(text=origin, text_font_style="italic", text_font_size="9pt"), "above")
    p.add_layout(Title(text=f"Memory per GPU, {unit} ({'2^30' if binary else '10^9'} bytes)", text_font_size="12pt"),
                 "above")
    p.vbar_stack(["used", "free"], x="gpu", width=0.6, source=src, color=["#d95f02", "#1b9e77"],
                 legend_label=["in use", "free"])
    p.add_tools(HoverTool(tooltips=[("GPU", "@gpu @name"), (f"total ({unit})", "@total{0.00}"),
                                    (f"in use ({unit})", "@used{0.00}"), (f"free ({unit})", "@free{0.00}")]))
    p.y_range.start = 0
    p.yaxis.axis_label = unit
    p.add_layout(p.legend[0], "right")   # beside the bars, never over them
    return p


def memory_rows(m: MachineInfo, binary: bool) -> list[tuple[str, str, str, str]]:
    """(GPU, name, total, free) per GPU in GiB or GB."""
    unit, f = _units(binary)
    return [(f"GPU{g.index}", g.name, f"{g.memory_total_bytes / f:.2f} {unit}",
             "-" if g.memory_free_bytes is None else f"{g.memory_free_bytes / f:.2f} {unit}") for g in m.gpus]


def units_explorer(m: MachineInfo, origin: str):
    """A GiB / GB toggle that redraws the per-GPU figure and table in the chosen units."""
    toggle = W.ToggleButtons(options=[("GiB (2^30)", True), ("GB (10^9)", False)], value=True, description="Units:")
    out = W.Output()

    def redraw(_change=None):
        out.clear_output(wait=True)
        with out:
            show(gpu_memory_figure(m, origin, binary=toggle.value))
            display(html_table(["GPU", "name", "total", "free"], memory_rows(m, toggle.value)))

    toggle.observe(redraw, names="value")
    redraw()
    box = W.VBox([toggle, out])
    box.add_class("labkit-explorer")
    return box
