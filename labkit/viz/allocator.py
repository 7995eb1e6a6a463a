"""Figures for the allocator notebook: allocated vs reserved over time, the segment map, what-if bars,
and the simulator-vs-real fidelity chart. No computation here: the numbers come from
``labkit.allocator``. Every title names its source."""

from __future__ import annotations

from typing import Iterable, Sequence

from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem
from bokeh.plotting import figure

from labkit.viz.display import line_width

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]
GiB = 1024**3
MiB = 1024**2
STATE_COLORS = {"active_allocated": "#d62728", "active_pending_free": "#ff7f0e", "inactive": "#9ecae1"}
# red: allocated to a tensor; orange: freed, awaiting another stream; light blue: free (cached)
STATE_WORDS = {"active_allocated": "allocated to a tensor", "active_pending_free": "freed, awaiting another stream",
               "inactive": "free (cached)"}


def _get(r, k):
    return r[k] if isinstance(r, dict) else getattr(r, k)


def timeline_figure(series: dict[str, Sequence], *, title: str, x_label: str = "request index",
                    x_key: str = "index", width: int = 760, height: int = 340):
    """Allocated (dashed) and reserved (solid) GiB over time, one colour per series label.

    Each series is a sequence of samples with ``allocated_bytes``, ``reserved_bytes`` and ``x_key``.
    """
    p = figure(width=width, height=height, title=title, x_axis_label=x_label, y_axis_label="GiB (2^30 bytes)")

    items = []
    for k, (label, rows) in enumerate(series.items()):
        c = PALETTE[k % len(PALETTE)]
        xs = [_get(r, x_key) for r in rows]
        w = line_width(k, len(series))  # equal curves (allocated is the same under every setting) stay visible
        r1 = p.line(xs, [_get(r, "reserved_bytes") / GiB for r in rows], color=c, line_width=w)
        r2 = p.line(xs, [_get(r, "allocated_bytes") / GiB for r in rows], color=c, line_width=w, line_dash="dashed")
        items.append(LegendItem(label=label, renderers=[r1, r2]))
    p.add_tools(HoverTool(tooltips=[("x", "$x{0}"), ("GiB", "$y{0.00}")]))
    # beside the plot, one entry per series (solid: reserved, dashed: allocated), so no line is hidden
    p.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt",
                        title="solid: reserved, dashed: allocated", title_text_font_size="8pt"), "right")
    return p


def segment_map_figure(segments: Sequence[dict], *, title: str, width: int = 760, max_segments: int = 40,
                       normalize: bool = True):
    """One row per segment (largest first), blocks coloured by state: allocated, awaiting free, free.

    With ``normalize`` each row spans its own segment (x = share of the segment), so a 2 MiB segment is as
    readable as a 4 GiB one; the row label gives the segment's size.
    """
    every = sorted(segments, key=lambda s: -s["total_size"])
    segs, rest = every[:max_segments], every[max_segments:]
    labels = []
    rows = dict(y=[], left=[], right=[], color=[], state=[], size=[], seg=[])
    for i, s in enumerate(segs):
        total = s["total_size"] or 1
        kind = ("expandable " if s.get("is_expandable") else "") + s.get("segment_type", "")
        label = f"#{i} {_fmt(total)} {kind}".strip()
        labels.append(label)
        off = 0
        for b in s["blocks"]:
            scale = (100.0 / total) if normalize else 1.0 / MiB
            rows["y"].append(label)
            rows["left"].append(off * scale)
            rows["right"].append((off + b["size"]) * scale)
            rows["color"].append(STATE_COLORS.get(b.get("state", "inactive"), "#cccccc"))
            rows["state"].append(b.get("state", "?"))
            rows["size"].append(_fmt(b["size"]))
            rows["seg"].append(label)
            off += b["size"]
    height = max(180, 20 * len(segs) + 90)
    p = figure(width=width, height=height, title=title, y_range=list(reversed(labels)) or ["(none)"],
               x_axis_label="share of the segment, %" if normalize else "offset in segment, MiB (2^20 B)")
    src = ColumnDataSource(rows)
    p.hbar(y="y", left="left", right="right", height=0.8, source=src, fill_color="color", line_color="white",
           line_width=0.5)
    p.yaxis.major_label_text_font_size = "8pt"
    p.add_tools(HoverTool(tooltips=[("segment", "@seg"), ("block", "@size"), ("state", "@state")]))
    if rest:  # what the rows leave out, said on the figure itself
        from bokeh.models import Title

        p.add_layout(Title(text=f"the {len(segs)} largest of {len(every)} segments; the {len(rest)} smaller ones "
                                f"({_fmt(sum(s['total_size'] for s in rest))} in all) are not drawn",
                           text_font_size="9pt", text_font_style="italic"), "above")
    for state, colour in STATE_COLORS.items():  # the colours' legend (glyphs without data: swatches only)
        p.scatter(x=[], y=[], marker="square", size=10, color=colour, legend_label=STATE_WORDS[state])
    p.legend.label_text_font_size = "8pt"
    p.legend.background_fill_alpha = 0.8
    p.add_layout(p.legend[0], "right")
    return p


def _fmt(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def whatif_figure(rows: Iterable, *, title: str, width: int = 760, height: int = 320):
    """Reserved peak (bar) and allocated peak (tick) per configuration, GiB."""
    rs = list(rows)
    names = [_get(r, "config") for r in rs]
    src = ColumnDataSource(dict(config=names, reserved=[_get(r, "reserved_peak_bytes") / GiB for r in rs],
                                allocated=[_get(r, "allocated_peak_bytes") / GiB for r in rs],
                                ooms=[_get(r, "num_ooms") for r in rs]))
    p = figure(y_range=list(reversed(names)), width=width, height=max(height, 40 * len(names) + 60), title=title,
               x_axis_label="GiB (2^30 bytes) at the peak")
    p.hbar(y="config", right="reserved", height=0.6, source=src, color="#1f77b4", legend_label="reserved peak")
    p.scatter(x="allocated", y="config", source=src, marker="dash", size=22, line_width=3, color="#d62728",
              legend_label="allocated peak")
    p.add_tools(HoverTool(tooltips=[("config", "@config"), ("reserved GiB", "@reserved{0.00}"),
                                    ("allocated GiB", "@allocated{0.00}"), ("OOMs", "@ooms")]))
    return p


def fidelity_figure(rows: Iterable, *, title: str, width: int = 760, height: int = 360):
    """Simulated against real reserved peak (GiB), one point per (workload, configuration); the diagonal is exact."""
    rs = list(rows)
    real = [_get(r, "real")["reserved_bytes.all.peak"] / GiB for r in rs]
    sim = [_get(r, "simulated")["reserved_bytes.all.peak"] / GiB for r in rs]
    src = ColumnDataSource(dict(real=real, sim=sim, wl=[_get(r, "workload") for r in rs],
                                conf=[_get(r, "config") for r in rs],
                                err=[100 * _get(r, "rel_error")["reserved_bytes.all.peak"] for r in rs],
                                color=[PALETTE[hash(_get(r, "workload")) % len(PALETTE)] for r in rs]))
    hi = max(real + sim + [1.0]) * 1.05
    p = figure(width=width, height=height, title=title, x_axis_label="real reserved peak, GiB (2^30 B)",
               y_axis_label="simulated reserved peak, GiB", x_range=(0, hi), y_range=(0, hi))
    p.line([0, hi], [0, hi], color="grey", line_dash="dashed")
    p.scatter("real", "sim", source=src, size=9, color="color")
    p.add_tools(HoverTool(tooltips=[("workload", "@wl"), ("config", "@conf"), ("real", "@real{0.000}"),
                                    ("simulated", "@sim{0.000}"), ("error %", "@err{0.00}")]))
    return p
