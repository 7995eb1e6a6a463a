"""Figures for the 'this server' notebook."""

from __future__ import annotations

from labkit.core.machine import MachineInfo
from labkit.core.units import GB, GiB


def gpu_memory_figure(m: MachineInfo, origin: str, *, binary: bool = True):
    """Stacked bar per GPU: memory in use vs free (NVML's view), in GiB or GB."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    unit, f = ("GiB", GiB) if binary else ("GB", GB)
    names = [f"GPU{g.index}" for g in m.gpus] or ["(no GPU)"]
    total = [g.memory_total_bytes / f for g in m.gpus] or [0.0]
    free = [(g.memory_free_bytes if g.memory_free_bytes is not None else g.memory_total_bytes) / f for g in m.gpus] or [0.0]
    used = [t - fr for t, fr in zip(total, free)]
    src = ColumnDataSource(dict(gpu=names, used=used, free=free, total=total,
                                name=[g.name for g in m.gpus] or [""]))
    p = figure(x_range=names, height=300, width=max(360, 90 * len(names)),
               title=f"GPU memory per device ({unit}); {origin}", toolbar_location=None)
    p.vbar_stack(["used", "free"], x="gpu", width=0.6, source=src, color=["#d95f02", "#1b9e77"],
                 legend_label=["in use", "free"])
    p.add_tools(HoverTool(tooltips=[("GPU", "@gpu @name"), (f"total ({unit})", "@total{0.00}"),
                                    (f"in use ({unit})", "@used{0.00}"), (f"free ({unit})", "@free{0.00}")]))
    p.y_range.start = 0
    p.yaxis.axis_label = unit
    p.legend.location = "top_right"
    p.legend.orientation = "horizontal"
    return p
