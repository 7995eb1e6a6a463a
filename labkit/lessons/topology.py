"""Notebook 01 (topology): the link matrix, rings, measured vs nominal links, placement, the classic mistake."""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit import topology as T
from labkit.core.errors import LabkitError
from labkit.core.provenance import describe
from labkit.core.units import MiB, fmt_bytes
from labkit.topology import Sizes, Topology
from labkit.topology.links import LEGEND
from labkit.viz import topology as vt
from labkit.viz.section import Section

CLASSIC_SAMPLE = "a100_pcie_8gpu_nv12_bridge_pairs_dual_socket"
PCIE_SAMPLE = "p2pBandwidthLatencyTest_2x_rtx6000ada_pcie"


@dataclass
class TopologyView:
    """The topology a notebook shows and where it comes from."""

    topo: Topology
    live: bool
    origin: str                    # 'measured here (live NVML)' or the sample/file source
    notes: list[str] = field(default_factory=list)

    def section(self) -> Section:
        sec = Section("The topology shown", source=self.origin)
        sec.claim("Topology", self.topo.describe())
        sec.claim("GPUs", self.topo.n, "GPUs")
        if self.topo.origin:
            sec.note(self.topo.origin)
        for n in self.notes:
            sec.note(n)
        for w in self.topo.warnings:
            sec.note(f"Warning: {w}")
        return sec

    def _ipython_display_(self) -> None:
        self.section()._ipython_display_()


def load(source: str = "auto", sample: str = "dgx1_v100_hybrid_cube_mesh_4nic") -> TopologyView:
    """``auto``: this machine's links through NVML when there is a driver, else the bundled ``sample``
    (the reason is a note); any other ``source`` is ``live``, a sample name or a file path."""
    notes: list[str] = []
    if source == "auto":
        try:
            topo = T.load_live()
        except LabkitError as exc:
            notes.append(f"No live topology here ({exc}); showing the sample {sample}.")
            topo = T.load_sample(sample)
    else:
        topo = T.load_topology(source)
    live = topo.source.startswith("live")
    return TopologyView(topo, live, "measured here (live NVML)" if live else topo.source, notes)


def sizes(tp_mib: int, dp_mib: int) -> Sizes:
    """The message sizes of the estimates: the TP all-reduce (also the PP send) and the DP all-reduce, in MiB."""
    return Sizes(tp_bytes=tp_mib * MiB, pp_bytes=tp_mib * MiB, dp_bytes=dp_mib * MiB)


def _pair_of(topo: Topology, label: str) -> tuple[int, int]:
    return next((i, j) for i in range(topo.n) for j in range(topo.n) if topo.matrix[i][j] == label)


def link_matrix(view: TopologyView) -> Section:
    """Every pair's nvidia-smi label, and what each label is worth on paper."""
    topo = view.topo
    labels = {lab for row in topo.matrix for lab in row if lab != "X"}
    links = sorted(((lab, topo.link(*_pair_of(topo, lab))) for lab in labels), key=lambda x: -x[1].bandwidth_Bps)
    sec = Section("Not every pair of GPUs is equal", source="model: nominal figures (labkit.topology.links)")
    sec.table(["link", "nominal GB/s per direction", "pairs", "meaning"],
              [(lab, f"{lk.bandwidth_Bps / 1e9:.1f}", sum(r.count(lab) for r in topo.matrix) // 2, LEGEND[lk.kind])
               for lab, lk in links], caption=f"{topo.generation.family}: {topo.generation.source}; on {view.origin}")
    if len(links) > 1:
        (fast_l, fast), (slow_l, slow) = links[0], links[-1]
        sec.claim(f"Fastest pair link ({fast_l}, {fast.bandwidth_Bps / 1e9:.1f} GB/s) over the slowest "
                  f"({slow_l}, {slow.bandwidth_Bps / 1e9:.1f} GB/s), on paper", round(fast.bandwidth_Bps / slow.bandwidth_Bps, 2),
                  "x", name="topology.nominal_fast_slow_ratio",
                  source="measured here (labels), model (bandwidth)" if view.live else "model")
    else:
        sec.note("Every pair has the same link: no pair is faster than another." if links else
                 "One GPU: there are no pairs to compare.")
    return sec.figure(vt.link_heatmap(topo, view.origin))


def link_graph(view: TopologyView) -> Section:
    """The same links as a graph (GPUs on a circle by NUMA node)."""
    nvlink_pairs = sum(1 for i in range(view.topo.n) for j in range(i + 1, view.topo.n)
                       if view.topo.link(i, j).kind == "NVLINK")
    sec = Section("The same links as a graph", source=view.origin)
    sec.claim("GPU pairs joined by NVLink", nvlink_pairs, f"of {view.topo.n * (view.topo.n - 1) // 2} pairs")
    return sec.figure(vt.link_graph(view.topo, view.origin))


def rings(view: TopologyView, sz: Sizes) -> Section:
    """Per group: the weakest pair, the best ring's slowest link and the all-reduce time it gives (model)."""
    topo = view.topo
    groups = [list(range(2)), list(range(4)), list(range(topo.n))] if topo.n >= 4 else [list(range(topo.n))]
    rows = []
    for g in groups:
        w, r = T.weakest_link(topo, g), T.ring_bottleneck(topo, g)
        e = T.collective_time(topo, g, "all_reduce", sz.dp_bytes)
        rows.append((str(g), w.label if w else "-", r.label if r else "-",
                     f"{e.bandwidth_Bps / 1e9:.1f}" if r else "-", f"{e.time_s * 1e3:.2f}"))
    whole = T.collective_time(topo, list(range(topo.n)), "all_reduce", sz.dp_bytes)
    sec = Section("A group is as fast as its best ring's slowest link",
                  source=f"model: alpha-beta ring over nominal bandwidth, on {view.origin}")
    sec.claim(f"All-reduce of {fmt_bytes(sz.dp_bytes)} over all {topo.n} GPUs", round(whole.time_s * 1e3, 3), "ms",
              name="topology.allreduce_all_gpus_ms", source="model")
    return sec.table(["GPUs", "weakest pair", "best ring's slowest link", "ring GB/s",
                      f"all-reduce {fmt_bytes(sz.dp_bytes)}, ms"], rows)


# -- measured links ------------------------------------------------------------------------------


@dataclass
class LinkView:
    """Link measurements (live or recorded) and the topology they were taken on."""

    measurements: object | None    # labkit.topology.measure.LinkMeasurements, or None: nothing to show
    origin: str
    topo: Topology | None
    notes: list[str] = field(default_factory=list)

    def comparisons(self):
        m = self.measurements
        if m is None:
            return []
        gen = None if self.topo else T.generation_for(m.gpus[0] if m.gpus else None)
        return T.compare_links(m, self.topo, gen=gen)

    def section(self) -> Section:
        sec = Section("Measured beside nominal: every link measured", source=_short(self.origin))
        for n in self.notes:
            sec.note(n)
        rows = self.comparisons()
        if rows:
            sec.claim("Measured on", ", ".join(self.measurements.gpus), source=self.origin)
            sec.table(["what", "nominal GB/s", "measured GB/s", "measured / nominal", "note"],
                      [(r.what, "-" if r.nominal_Bps is None else f"{r.nominal_Bps / 1e9:.1f}",
                        "-" if r.measured_Bps is None else f"{r.measured_Bps / 1e9:.1f}",
                        "-" if r.ratio is None else f"{r.ratio:.2f}", r.note) for r in rows],
                      caption=f"measured: {self.origin}; nominal: model")
        for s in (self.measurements.skipped if self.measurements else []):
            sec.note(f"Skipped {s.part}: {s.reason}")
        return sec

    def _ipython_display_(self) -> None:
        self.section()._ipython_display_()


def measured_links(view: TopologyView, *, measure: bool = True, smoke: bool = False, recorded_dir=None) -> LinkView:
    """Measure this machine's links when it has a CUDA GPU (and ``measure``), else read what
    ``benchmarks/gpu/record_topology.py`` recorded; a missing recording is a note, not an error."""
    from labkit.topology.measure import cuda_unavailable_reason, measure_links

    why = cuda_unavailable_reason()
    if why is None and measure and view.live:
        return LinkView(measure_links(smoke=smoke), "measured here", view.topo)
    notes = [f"Not measuring here: {why or 'measure=False or not a live topology'}."]
    rec = T.recorded_links(recorded_dir)
    if rec is None:
        notes.append("No recorded link measurements in data/measurements/topology/: run "
                     "benchmarks/gpu/record_topology.py on a GPU machine to fill this section.")
        return LinkView(None, "no measurement", None, notes)
    m, prov = rec
    rt = T.recorded_topology(recorded_dir)
    topo = rt[0] if rt else None
    if topo is not None:
        notes.append(f"Recorded machine: {topo.describe()}")
    return LinkView(m, describe(prov), topo, notes)


def _short(origin: str) -> str:
    return origin.split(" (driver", 1)[0].split("; command", 1)[0]


def pinned_vs_pageable(links: LinkView) -> Section:
    """Host<->device copies only: pinned against pageable, beside the PCIe link's nominal figure."""
    sec = Section("Pinned vs pageable host memory", source=_short(links.origin))
    m = links.measurements
    rows = [r for r in links.comparisons() if "->" in r.what and "NUMA" not in r.what and "GPU0 " in r.what
            and ("pinned" in r.what or "pageable" in r.what)]
    if m is None or not rows:
        return sec.note("No host<->device measurement to show (see the notes above).")
    bw = {(r.what, r.memory): r.largest.bytes_per_s for r in m.host if r.gpu == 0}
    pinned, pageable = bw.get(("host->device", "pinned")), bw.get(("host->device", "pageable"))
    if pinned and pageable:
        big = max(r.largest.size_bytes for r in m.host)
        sec.claim(f"Host-to-GPU0 copies of {fmt_bytes(big)}: pinned ({pinned / 1e9:.1f} GB/s) over pageable "
                  f"({pageable / 1e9:.1f} GB/s)", round(pinned / pageable, 2), "x",
                  name="topology.h2d_pinned_over_pageable", source=links.origin, digits=1,
                  direction=_here(links.origin), tolerance=0.2 if _here(links.origin) else None)
        nominal = rows[0].nominal_Bps
        if nominal:
            sec.claim("Pinned host-to-device copies reach, of the PCIe link's nominal figure",
                      round(pinned / nominal * 100), "%")
    return sec.figure(vt.bandwidth_bars([(r.what.replace("GPU0 ", ""), r.nominal_Bps, r.measured_Bps) for r in rows],
                                        "Host <-> GPU0: pinned vs pageable", _short(links.origin)))


def _here(origin: str) -> str | None:
    """A bandwidth measured on this machine is a figure to watch, higher is better; a recording's is fixed."""
    return "higher" if origin.startswith("measured here") else None


def gpu_copies(links: LinkView) -> Section:
    """Copies that stay on GPUs: inside one GPU's memory, and between GPUs (P2P on and off)."""
    sec = Section("Copies inside a GPU and between GPUs", source=_short(links.origin))
    m = links.measurements
    if m is None:
        return sec.note("No device measurement to show (see the notes above).")
    for r in m.device_copy:
        sec.claim(f"GPU{r.gpu} copies inside its own memory (bytes copied; the memory moves 2x that)",
                  round(r.largest.bytes_per_s / 1e9), "GB/s")
    if m.p2p is None:
        return sec.note("No GPU-to-GPU matrix in this measurement: it needs 2 or more GPUs.")
    on = m.p2p.uni_Bps.get("p2p_on")
    if on and m.p2p.n > 1 and on[0][1]:
        sec.claim("GPU0 -> GPU1 with peer access on", round(on[0][1] / 1e9, 1), "GB/s", name="topology.p2p_gpu0_gpu1_GBps",
                  source=links.origin, direction=_here(links.origin), tolerance=0.2 if _here(links.origin) else None)
    for mode in ("p2p_on", "p2p_off"):
        if mode in m.p2p.uni_Bps:
            sec.figure(vt.p2p_heatmap(m.p2p, "uni_Bps", mode, _short(links.origin)))
    return sec


def pcie_sample() -> Section:
    """A public p2pBandwidthLatencyTest of two PCIe Gen4 GPUs: what P2P off costs without NVLink."""
    ada = T.load_p2p_table(PCIE_SAMPLE)
    rows = T.compare_p2p(ada, gen=T.generation_for(ada.gpus[0]))
    src = f"sample: {PCIE_SAMPLE}"
    sec = Section("For contrast: two PCIe GPUs without NVLink", source=src)
    sec.claim(f"GPU0 -> GPU1 with P2P on (of {rows[0].nominal_Bps / 1e9:.1f} GB/s nominal)",
              round(ada.uni_Bps["p2p_on"][0][1] / 1e9, 2), "GB/s", name="topology.sample_rtx6000ada_p2p_on_GBps")
    sec.claim("Latency GPU0 -> GPU1 with P2P off", round(ada.latency_s["p2p_off"][0][1] * 1e6, 1), "us")
    sec.claim("Latency GPU0 -> GPU1 with P2P on", round(ada.latency_s["p2p_on"][0][1] * 1e6, 1), "us")
    sec.table(["what", "nominal GB/s", "measured GB/s", "measured / nominal", "note"],
              [(r.what, f"{r.nominal_Bps / 1e9:.1f}", f"{r.measured_Bps / 1e9:.1f}", f"{r.ratio:.2f}", r.note)
               for r in rows], caption=f"{src} ({ada.origin})")
    return sec.figure(vt.p2p_heatmap(ada, "latency_s", "p2p_off", "sample: 2x RTX 6000 Ada"))


# -- placement -------------------------------------------------------------------------------------


@dataclass
class PlacementView:
    """The placer's answer on the topology shown, and the layout that was asked for."""

    view: TopologyView
    placement: object              # labkit.topology.Placement
    asked: tuple[int, int, int]

    def section(self) -> Section:
        pl, view = self.placement, self.view
        sec = Section(f"Placing tp={pl.tp} x pp={pl.pp} x dp={pl.dp} ranks", source="model")
        if self.asked != (pl.tp, pl.pp, pl.dp):
            a = self.asked
            sec.note(f"tp x pp x dp = {a[0] * a[1] * a[2]} does not fit {view.topo.n} GPUs: "
                     f"placed tp={pl.tp}, pp=1, dp=1 instead.")
        sec.claim("Verdict", pl.verdict)
        sec.claim(f"Placed TP all-reduce of {fmt_bytes(pl.sizes.tp_bytes)}",
                  round(pl.comparison.placed.tp_allreduce_s * 1e3, 4), "ms", name="topology.placed_tp_allreduce_ms")
        sec.claim("CUDA_VISIBLE_DEVICES in rank order", pl.cuda_visible_devices)
        for s in pl.suggestions:
            sec.note(f"Suggestion: {s}")
        sec.table(["", "naive 0,1,2,...", "placed"], vt.placement_rows(pl),
                  caption=f"{pl.comparison.summary} ({pl.method}; times {pl.source}; topology {view.origin})")
        return sec.figure(vt.link_graph(view.topo, view.origin, highlight_groups=pl.tp_groups,
                                        title=f"TP groups of tp={pl.tp} pp={pl.pp} dp={pl.dp} (colours)"))

    def _ipython_display_(self) -> None:
        self.section()._ipython_display_()


def place(view: TopologyView, tp: int, pp: int, dp: int, sz: Sizes) -> PlacementView:
    """The placer's answer for tp x pp x dp on the topology shown; a layout larger than the machine
    falls back to tp only (said in a note)."""
    asked = (tp, pp, dp)
    if tp * pp * dp > view.topo.n:
        tp, pp, dp = min(tp, view.topo.n), 1, 1
    return PlacementView(view, T.place(view.topo, tp, pp, dp, sizes=sz), asked)


def affinity(pv: PlacementView) -> Section:
    """Each rank's GPU, NUMA node and CPU cores, and the command prefix that binds it."""
    sec = Section("Each rank's CPU cores", source="model (NUMA from the topology)")
    return sec.table(["rank", "GPU", "NUMA", "CPUs", "run with"],
                     [(a.rank, a.gpu, a.numa, a.cpus, a.advice) for a in pv.placement.affinity])


def placement_explorer(view: TopologyView, tp: int, pp: int, dp: int) -> Section:
    """Choices of tp/pp/dp that redraw the placement (interactive in JupyterLab)."""
    sec = Section("Try it: other sizes", source="model")
    n = view.topo.n
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    rows = []
    for t in divisors:  # the static result: every layout that fills the machine, what the explorer shows for each
        for p_ in [d for d in divisors if (n // t) % d == 0]:
            try:
                pl = T.place(view.topo, t, p_, n // (t * p_))
            except LabkitError as exc:  # the explorer prints the same refusal for this layout
                rows.append([f"tp={t} pp={p_} dp={n // (t * p_)}", "-", "-", "-", "-", str(exc)])
                continue
            c = pl.comparison
            rows.append([f"tp={t} pp={p_} dp={n // (t * p_)}", c.placed.tp_groups, c.placed.weakest_tp_link or "-",
                         f"{c.placed.tp_allreduce_s * 1e3:.3f}", f"{c.naive.tp_allreduce_s * 1e3:.3f}",
                         pl.cuda_visible_devices])
    sec.table(["layout", "TP groups (GPUs)", "weakest TP link", "TP all-reduce ms, placed", "naive 0,1,2,... ms",
               "CUDA_VISIBLE_DEVICES"], rows,
              caption=f"Static result: every tp x pp x dp that fills the {n} GPUs of {view.origin}, placed (model)")
    sec.note("Pick tp, pp or dp: the graph and the table below redraw for that layout (in JupyterLab).")
    return sec.widget(vt.placement_explorer(view.topo, view.origin, tp=tp, pp=pp, dp=dp))


def classic_mistake(sz: Sizes) -> Section:
    """Eight A100 PCIe cards with NVLink bridge pairs: tp=4 on 0-3 / 4-7 against tp=2 x pp=2 on the pairs."""
    a100 = T.load_sample(CLASSIC_SAMPLE)
    src = f"sample: {CLASSIC_SAMPLE}"
    obvious, aware = T.place(a100, 4, 1, 2, sizes=sz), T.place(a100, 2, 2, 2, sizes=sz)
    t_obv, t_aw = obvious.comparison.placed.tp_allreduce_s, aware.comparison.placed.tp_allreduce_s
    sec = Section("The classic mistake: 0-3 / 4-7 on NVLink bridge pairs", source=f"model on {src}")
    sec.claim(f"Each TP all-reduce is slower in the obvious split (weakest link {obvious.weakest_tp_link} vs "
              f"{aware.weakest_tp_link}); it runs several times per layer, every step", round(t_obv / t_aw, 2), "x",
              name="topology.classic_mistake_tp_allreduce_slowdown", digits=1)
    sec.table(["", "obvious: tp=4 on 0-3 / 4-7", "topology-aware: tp=2, pp=2, dp=2"],
              [("TP groups", obvious.tp_groups, aware.tp_groups),
               ("weakest TP link", obvious.weakest_tp_link, aware.weakest_tp_link),
               (f"TP all-reduce of {fmt_bytes(sz.tp_bytes)}, ms (model)", f"{t_obv * 1e3:.3f}", f"{t_aw * 1e3:.3f}"),
               ("CUDA_VISIBLE_DEVICES", obvious.cuda_visible_devices, aware.cuda_visible_devices),
               ("verdict", obvious.verdict, aware.verdict)],
              caption=f"model (alpha-beta over nominal bandwidth) on {src}")
    sec.figure(vt.link_graph(a100, src, highlight_groups=obvious.tp_groups, title="obvious: TP groups 0-3 and 4-7"))
    return sec.figure(vt.link_graph(a100, src, highlight_groups=aware.tp_groups,
                                    title="topology-aware: TP on the bridged pairs"))
