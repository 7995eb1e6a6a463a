"""Figures build from every sample; measured-vs-nominal rows pair the right figures."""

import pytest

from labkit.topology import compare_p2p, generation_for, list_samples, load_p2p_table, load_sample, place
from labkit.topology.measured_vs_nominal import compare_links
from labkit.topology.links import pcie_bps
from labkit.topology.measure import CopyResult, LinkMeasurements, Point
from labkit.viz import topology as vt

TOPOS = [s.name for s in list_samples() if s.format != "p2pBandwidthLatencyTest output"]


@pytest.mark.parametrize("name", TOPOS)
def test_figures_for_every_sample(name):
    from bokeh.models import Plot

    t = load_sample(name)
    heat = vt.link_heatmap(t, f"sample: {name}")
    assert isinstance(heat, Plot) and len(heat.x_range.factors) == t.n
    graph = vt.link_graph(t, f"sample: {name}", highlight_groups=[[0]])
    assert isinstance(graph, Plot)
    p = place(t, 1, 1, min(2, t.n))
    rows = vt.placement_rows(p)
    assert rows[0][2] == p.cuda_visible_devices


def test_p2p_heatmaps_and_bars():
    t = load_p2p_table("p2pBandwidthLatencyTest_2x_rtx6000ada_pcie")
    for key in ("uni_Bps", "bi_Bps", "latency_s"):
        for mode in ("p2p_on", "p2p_off"):
            vt.p2p_heatmap(t, key, mode, "sample")
    rows = compare_p2p(t, gen=generation_for(t.gpus[0]))
    bars = vt.bandwidth_bars([(r.what, r.nominal_Bps, r.measured_Bps) for r in rows], "t")
    assert len(bars.y_range.factors) == 2 * len(rows)


def test_compare_uses_the_link_of_the_pair_and_the_largest_size():
    topo = load_sample("a100_pcie_8gpu_nv12_bridge_pairs_dual_socket")
    t = load_p2p_table("p2pBandwidthLatencyTest_2x_rtx6000ada_pcie")
    rows = {r.what: r for r in compare_p2p(t, topo)}
    assert rows["GPU0->GPU1 p2p on"].nominal_Bps == 300e9 and "NV12" in rows["GPU0->GPU1 p2p on"].note
    assert rows["GPU0<->GPU1 bidirectional p2p on"].nominal_Bps == 600e9
    pts = [Point(2**20, 1e-4, 2**20 / 1e-4, [1e-4]), Point(2**30, 0.05, 2**30 / 0.05, [0.05])]
    m = LinkMeasurements(gpus=["NVIDIA A100"], host=[CopyResult("host->device", 0, "pinned", pts)])
    (row,) = compare_links(m, topo)
    assert row.measured_Bps == pytest.approx(2**30 / 0.05) and row.nominal_Bps == pytest.approx(pcie_bps(4))
    assert row.ratio == pytest.approx(2**30 / 0.05 / pcie_bps(4)) and "1.00 GiB" in row.note
