"""Figures and widgets for the topology notebook: link heatmap, graph view, measured vs nominal
bandwidth, P2P matrices, placement view and explorer. No computation of their own: the numbers come
from ``labkit.topology`` (model, placement, measurements)."""

from __future__ import annotations

import math

import ipywidgets as w
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, LabelSet, Title
from bokeh.plotting import figure
from bokeh.transform import linear_cmap
from IPython.display import display

from labkit.core.errors import LabkitError
from labkit.topology import place
from labkit.topology.links import LEGEND
from labkit.viz.display import html_table, show

# One colour per link kind, closest (NVLink) to farthest (SYS).
KIND_COLOURS = {"X": "#f0f0f0", "NVLINK": "#1a9850", "PIX": "#91cf60", "PXB": "#d9ef8b", "PHB": "#fee08b",
                "NODE": "#fc8d59", "SYS": "#d73027"}
GROUP_COLOURS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]


def link_heatmap(topo, origin: str, *, size: int = 46):
    """GPU x GPU matrix: each cell shows the nvidia-smi label, coloured by kind, hover gives the
    nominal per-direction bandwidth."""
    names = [f"GPU{i}" for i in range(topo.n)]
    xs, ys, labels, kinds, colours, bw, meaning = [], [], [], [], [], [], []

    for i in range(topo.n):
        for j in range(topo.n):
            lk = topo.link(i, j)
            xs.append(names[j])
            ys.append(names[i])
            labels.append(lk.label)
            kinds.append(lk.kind)
            colours.append(KIND_COLOURS[lk.kind])
            bw.append("-" if math.isinf(lk.bandwidth_Bps) else f"{lk.bandwidth_Bps / 1e9:.1f}")
            meaning.append(LEGEND[lk.kind])
    src = ColumnDataSource(dict(x=xs, y=ys, label=labels, kind=kinds, colour=colours, bw=bw, meaning=meaning))
    p = figure(x_range=names, y_range=list(reversed(names)), width=120 + size * topo.n, height=90 + size * topo.n,
               title=f"Links ({origin})", toolbar_location=None, x_axis_location="above")
    p.rect("x", "y", 1, 1, source=src, fill_color="colour", line_color="white")
    p.text("x", "y", text="label", source=src, text_align="center", text_baseline="middle", text_font_size="10pt")
    p.add_tools(HoverTool(tooltips=[("pair", "@y -> @x"), ("link", "@label (@meaning)"),
                                    ("nominal GB/s per direction (model)", "@bw")]))
    p.grid.visible = False
    p.axis.major_tick_line_color = None
    return p


def _positions(topo):
    """GPUs on a circle, grouped by NUMA node (node 0 on the left, node 1 on the right)."""
    order = sorted(range(topo.n), key=lambda i: (topo.gpus[i].numa if topo.gpus[i].numa is not None else 0, i))
    pos = {}
    for k, i in enumerate(order):
        a = math.pi / 2 + 2 * math.pi * k / max(topo.n, 1)
        pos[i] = (math.cos(a), math.sin(a))
    return pos


def link_graph(topo, origin: str, *, highlight_groups: list[list[int]] | None = None, title: str | None = None):
    """GPUs as nodes, links as edges (colour = kind, width ~ nominal bandwidth); optional groups
    (e.g. TP groups of a placement) colour the nodes."""
    pos = _positions(topo)
    p = figure(width=540, height=420, title=title or f"Link graph ({origin})", toolbar_location=None,
               x_range=(-1.35, 1.35), y_range=(-1.35, 1.35), match_aspect=True)
    top = max((topo.link(i, j).bandwidth_Bps for i in range(topo.n) for j in range(topo.n) if i != j), default=1.0)
    for kind in ("SYS", "NODE", "PHB", "PXB", "PIX", "NVLINK"):
        xs, ys, widths, labels = [], [], [], []
        for i in range(topo.n):
            for j in range(i + 1, topo.n):
                lk = topo.link(i, j)
                if lk.kind != kind:
                    continue
                xs.append([pos[i][0], pos[j][0]])
                ys.append([pos[i][1], pos[j][1]])
                widths.append(1 + 7 * lk.bandwidth_Bps / top)
                labels.append(f"GPU{i}-GPU{j} {lk.label}: {lk.bandwidth_Bps / 1e9:.1f} GB/s nominal")
        if xs:
            src = ColumnDataSource(dict(xs=xs, ys=ys, w=widths, label=labels))
            r = p.multi_line("xs", "ys", line_width="w", source=src, color=KIND_COLOURS[kind],
                             alpha=0.35 if kind in ("SYS", "NODE") else 0.85, legend_label=kind)
            p.add_tools(HoverTool(renderers=[r], tooltips=[("link", "@label")]))
    group_of = {}
    for gi, grp in enumerate(highlight_groups or []):
        for g in grp:
            group_of[g] = gi
    nodes = ColumnDataSource(dict(
        x=[pos[i][0] for i in range(topo.n)], y=[pos[i][1] for i in range(topo.n)],
        name=[f"GPU{i}" for i in range(topo.n)],
        numa=["?" if g.numa is None else str(g.numa) for g in topo.gpus],
        colour=[GROUP_COLOURS[group_of[i] % len(GROUP_COLOURS)] if i in group_of else "#4d4d4d" for i in range(topo.n)]))
    r = p.scatter("x", "y", size=30, source=nodes, fill_color="colour", line_color="black")
    p.add_tools(HoverTool(renderers=[r], tooltips=[("GPU", "@name"), ("NUMA node", "@numa")]))
    p.add_layout(LabelSet(x="x", y="y", text="name", source=nodes, text_align="center", text_baseline="middle",
                          text_color="white", text_font_size="8pt"))
    p.axis.visible = False
    p.grid.visible = False
    if p.legend:
        p.legend.label_text_font_size = "8pt"
        p.add_layout(p.legend[0], "right")   # beside the graph, never over a GPU
    return p


def bandwidth_bars(rows: list[tuple[str, float | None, float | None]], title: str, source: str | None = None):
    """Measured beside nominal: rows of (what, nominal bytes/s or None, measured bytes/s or None), GB/s.
    Horizontal bars, so that the labels read across and never overlap; the source is a subtitle line."""
    factors, values, colours, kinds = [], [], [], []
    for what, nominal, measured in rows:
        for kind, v, c in (("nominal", nominal, "#bdbdbd"), ("measured", measured, "#2c7fb8")):
            if v is not None:
                factors.append((what, kind))
                values.append(v / 1e9)
                colours.append(c)
                kinds.append(kind)
    src = ColumnDataSource(dict(y=factors, v=values, c=colours, k=kinds))
    p = figure(y_range=FactorRange(*reversed(factors)), width=760, height=70 + 26 * len(factors),
               toolbar_location=None)
    if source:
        p.add_layout(Title(text=source, text_font_style="italic", text_font_size="9pt"), "above")
    p.add_layout(Title(text=title, text_font_size="12pt"), "above")
    p.hbar(y="y", right="v", height=0.8, source=src, fill_color="c", line_color=None)
    p.add_tools(HoverTool(tooltips=[("", "@y"), ("GB/s (decimal)", "@v{0.0}")]))
    p.x_range.start = 0
    p.xaxis.axis_label = "GB/s per direction (1 GB = 1e9 B)"
    p.ygrid.grid_line_color = None
    p.yaxis.group_label_orientation = "horizontal"
    return p


def p2p_heatmap(table, key: str, mode: str, origin: str):
    """One of a P2P table's matrices (``key`` 'uni_Bps' | 'bi_Bps' | 'latency_s'; ``mode`` 'p2p_on' | 'p2p_off')."""
    m = getattr(table, key).get(mode)
    names = [f"GPU{i}" for i in range(table.n)]
    scale, unit = (1e6, "us") if key == "latency_s" else (1e-9, "GB/s")
    xs, ys, vals, text = [], [], [], []
    for i in range(table.n):
        for j in range(table.n):
            v = None if m is None else m[i][j]
            xs.append(names[j])
            ys.append(names[i])
            vals.append(float("nan") if v is None else v * scale)
            text.append("-" if v is None else f"{v * scale:.1f}")
    src = ColumnDataSource(dict(x=xs, y=ys, v=vals, t=text))
    finite = [v for v in vals if v == v] or [0.0, 1.0]
    title = {"uni_Bps": "unidirectional", "bi_Bps": "bidirectional", "latency_s": "latency"}[key]
    p = figure(x_range=names, y_range=list(reversed(names)), width=max(320, 140 + 80 * table.n), height=130 + 60 * table.n,
               toolbar_location=None, x_axis_location="above")

    p.add_layout(Title(text=origin, text_font_style="italic", text_font_size="9pt"), "above")
    p.add_layout(Title(text=f"{title} ({unit}), {mode.replace('_', ' ')}", text_font_size="12pt"), "above")
    p.rect("x", "y", 1, 1, source=src, line_color="white",
           fill_color=linear_cmap("v", "Blues8" if key != "latency_s" else "Oranges8", max(finite), min(finite) if min(finite) < max(finite) else 0))
    p.text("x", "y", text="t", source=src, text_align="center", text_baseline="middle", text_font_size="10pt")
    p.add_tools(HoverTool(tooltips=[("pair", "@y -> @x"), (unit, "@t")]))
    p.grid.visible = False
    return p


def placement_rows(placement) -> list[tuple[str, object, object]]:
    """Naive beside placed, for an HTML table."""
    c = placement.comparison
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    return [("CUDA_VISIBLE_DEVICES", ",".join(map(str, c.naive.gpu_of_rank)), placement.cuda_visible_devices),
            ("TP groups (GPUs)", c.naive.tp_groups, c.placed.tp_groups),
            ("PP groups (GPUs)", c.naive.pp_groups, c.placed.pp_groups),
            ("DP groups (GPUs)", c.naive.dp_groups, c.placed.dp_groups),
            ("weakest TP link", c.naive.weakest_tp_link or "-", c.placed.weakest_tp_link or "-"),
            (f"TP all-reduce of {placement.sizes.tp_bytes / 2**20:.0f} MiB, ms (model)", ms(c.naive.tp_allreduce_s), ms(c.placed.tp_allreduce_s)),
            (f"PP send of {placement.sizes.pp_bytes / 2**20:.0f} MiB, ms (model)", ms(c.naive.pp_send_s), ms(c.placed.pp_send_s)),
            (f"DP all-reduce of {placement.sizes.dp_bytes / 2**30:.2f} GiB, ms (model)", ms(c.naive.dp_allreduce_s), ms(c.placed.dp_allreduce_s))]


def placement_explorer(topo, origin: str, *, tp: int = 2, pp: int = 1, dp: int = 1):
    """ipywidgets: choose tp/pp/dp (divisors of the GPU count), see the placement (graph with TP groups
    coloured, naive vs placed). A layout larger than the machine is shown with dp, then pp, lowered
    until it fits, and says so."""
    sizes = [d for d in range(1, topo.n + 1) if topo.n % d == 0]
    pick = lambda v: v if v in sizes else max(d for d in sizes if d <= max(1, v))  # noqa: E731
    boxes = [w.Dropdown(options=sizes, value=pick(v), description=name, layout=w.Layout(width="160px"))
             for name, v in (("tp", tp), ("pp", pp), ("dp", dp))]
    out = w.Output()

    def update(_=None):
        out.clear_output(wait=True)
        t, p_, d = (b.value for b in boxes)
        with out:
            asked = t * p_ * d
            while t * p_ * d > topo.n:
                if d > 1:
                    d = 1
                else:
                    p_ = 1
            if asked != t * p_ * d:
                print(f"tp x pp x dp = {asked} does not fit {topo.n} GPUs: showing tp={t}, pp={p_}, dp={d}")
            try:
                pl = place(topo, t, p_, d)
            except LabkitError as exc:
                print(exc)
                return
            print(pl.verdict)
            for s in pl.suggestions:
                print("suggestion:", s)
            show(link_graph(topo, origin, highlight_groups=pl.tp_groups,
                            title=f"TP groups of tp={t} pp={p_} dp={d} (colours)"))
            display(html_table(["", "naive 0,1,2,...", "placed"], placement_rows(pl), caption=pl.comparison.summary))

    for b in boxes:
        b.observe(update, names="value")
    update()
    box = w.VBox([w.HBox(boxes), out])
    box.add_class("labkit-explorer")
    return box
