"""Figures for notebook 06: the advised layout beside its runners-up, and the explorer."""

from __future__ import annotations

import ipywidgets as W
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure
from IPython.display import display

from labkit.viz.display import html_table, show


def layouts_figure(adv, title: str = "Step time of the layouts that fit (model)"):
    """Horizontal bars: predicted step time of the advised layout and its runners-up."""
    if not adv.fits:
        return None
    lay = adv.layout
    best = (f"tp={lay['tp']} pp={lay['pp']} dp={lay['dp']} ZeRO-{lay['zero']} mb={lay['micro_batch']} "
            f"recompute={lay['recompute']}")
    labels = [best] + [r["label"] for r in adv.runners_up]
    # the layouts as ranked: each by the FLOPs model (advise's headline step time may be the op-by-op one)
    ms = [(getattr(adv, "ranking_step_time_s", None) or adv.step_time_s) * 1e3] + [r["step_time_s"] * 1e3
                                                                                for r in adv.runners_up]
    colours = ["#1b9e77"] + ["#7570b3"] * len(adv.runners_up)
    src = ColumnDataSource({"layout": labels, "ms": ms, "colour": colours})
    p = figure(y_range=list(reversed(labels)), height=90 + 40 * len(labels), width=760, title=title,
               toolbar_location=None, tools="")
    p.hbar(y="layout", right="ms", height=0.6, source=src, color="colour")
    p.add_tools(HoverTool(tooltips=[("layout", "@layout"), ("step (ms)", "@ms{0.0}")]))
    p.x_range.start = 0
    p.xaxis.axis_label = "predicted step time (ms)"
    return p


def explorer(advise_for, gpu_choices, initial):
    """A dropdown of GPU counts; each choice re-plans the job and redraws the figure and table."""
    pick = W.Dropdown(options=list(gpu_choices), value=initial, description="GPUs:")
    out = W.Output()

    def redraw(_change=None):
        out.clear_output(wait=True)
        adv = advise_for(pick.value)
        with out:
            fig = layouts_figure(adv, title=f"Layouts on {pick.value} GPU(s) (model)")
            if fig is not None:
                show(fig)
            rows = [["fits", "yes" if adv.fits else "no"], ["layout", adv.layout],
                    ["step time (ms)", f"{adv.step_time_s * 1e3:.1f}" if adv.step_time_s else "-"],
                    ["launch", adv.command or "-"]]
            display(html_table(["", "advice"], rows))

    pick.observe(redraw, names="value")
    redraw()
    box = W.VBox([pick, out])
    box.add_class("labkit-explorer")
    return box
