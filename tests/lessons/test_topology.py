"""Notebook 01's sections: sample and live topologies, recorded, missing and live link measurements."""

import pytest

from labkit import topology as T
from labkit.core.errors import LabkitError
from labkit.core.units import GiB, MiB
from labkit.lessons import topology as lesson
from labkit.topology.measure import CopyResult, LinkMeasurements, Point


@pytest.fixture
def dgx1():
    return lesson.load("dgx1_v100_hybrid_cube_mesh_4nic")


@pytest.fixture
def sizes():
    return lesson.sizes(64, 1024)


def test_auto_without_a_driver_falls_back_to_the_sample_and_says_why(monkeypatch):
    def no_nvml(**_):
        raise LabkitError("NVML not found")

    monkeypatch.setattr(T, "load_live", no_nvml)
    view = lesson.load("auto", "dgx1_v100_hybrid_cube_mesh_4nic")
    assert not view.live and "NVML not found" in view.notes[0]
    assert view.section().claims[1].value == 8 and view.notes[0] in view.section().notes


def test_link_matrix_ratio_is_fastest_over_slowest_pair(dgx1):
    sec = lesson.link_matrix(dgx1)
    bws = [dgx1.topo.link(i, j).bandwidth_Bps for i in range(8) for j in range(8) if i != j]
    assert sec.value("topology.nominal_fast_slow_ratio") == pytest.approx(max(bws) / min(bws), rel=1e-2)
    assert [r[0] for r in sec.rows] == ["NV2", "NV1", "SYS"]
    assert sum(r[2] for r in sec.rows) == 8 * 7 // 2          # every pair counted once
    assert sec.figures


def test_one_gpu_has_no_pairs_to_compare():
    topo, _ = T.recorded_topology()
    view = lesson.TopologyView(topo, False, "recorded")
    sec = lesson.link_matrix(view)
    assert "One GPU" in sec.notes[0]
    with pytest.raises(KeyError):
        sec.value("topology.nominal_fast_slow_ratio")


def test_rings_time_is_the_model_for_all_gpus(dgx1, sizes):
    sec = lesson.rings(dgx1, sizes)
    t = T.collective_time(dgx1.topo, list(range(8)), "all_reduce", 1024 * MiB).time_s
    assert sec.value("topology.allreduce_all_gpus_ms") == pytest.approx(t * 1e3, rel=1e-3)
    assert [r[0] for r in sec.rows] == ["[0, 1]", "[0, 1, 2, 3]", str(list(range(8)))]
    # on a DGX-1 the slowest pair of all 8 is SYS, but a ring over NVLink exists
    assert sec.rows[-1][1] == "SYS" and sec.rows[-1][2].startswith("NV")


def test_recorded_links_split_the_lessons(dgx1):
    links = lesson.measured_links(dgx1, measure=True)   # no CUDA here: reads the recording
    assert links.measurements is not None and links.origin.startswith("recorded on")
    assert any(n.startswith("Not measuring here") for n in links.notes)
    host = lesson.pinned_vs_pageable(links)
    bw = {(r.what, r.memory): r.largest.bytes_per_s for r in links.measurements.host if r.gpu == 0}
    ratio = bw[("host->device", "pinned")] / bw[("host->device", "pageable")]
    assert host.value("topology.h2d_pinned_over_pageable") == pytest.approx(ratio, abs=0.01)
    assert ratio > 2                                           # the lesson: pinned is several times faster
    bars = host.figures[0]
    assert not any("device copy" in f[0] for f in bars.y_range.factors)   # the HBM bar is not on this chart
    gpu = lesson.gpu_copies(links)
    assert gpu.claims and "2 or more GPUs" in gpu.notes[-1]
    assert len(links.section().rows) == len(links.comparisons())


def test_missing_recording_is_a_stated_gap(dgx1, tmp_path):
    links = lesson.measured_links(dgx1, recorded_dir=tmp_path)
    assert links.measurements is None
    assert "record_topology.py" in links.notes[-1]
    assert lesson.pinned_vs_pageable(links).notes and not lesson.pinned_vs_pageable(links).figures
    assert lesson.gpu_copies(links).notes


def test_live_measurement_path(monkeypatch, dgx1):
    import labkit.topology.measure as M

    pts = lambda bps: [Point(GiB, GiB / bps, bps, [GiB / bps])]  # noqa: E731
    fake = LinkMeasurements(gpus=["Tesla V100-SXM2-16GB"],
                            host=[CopyResult("host->device", 0, "pinned", pts(12e9)),
                                  CopyResult("host->device", 0, "pageable", pts(4e9))])
    monkeypatch.setattr(M, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(M, "measure_links", lambda smoke=False: fake)
    live = lesson.TopologyView(dgx1.topo, True, "measured here (live NVML)")
    links = lesson.measured_links(live, smoke=True)
    assert links.origin == "measured here" and links.measurements is fake
    sec = lesson.pinned_vs_pageable(links)
    assert sec.value("topology.h2d_pinned_over_pageable") == 3.0
    assert sec.claims[0].source == "measured here"
    assert sec.claims[0].direction == "higher"   # measured here: the nightly report can flag it
    sec.record()                                 # (record refuses a result measured here without a direction)


def test_placement_and_a_layout_too_large(dgx1, sizes):
    placed = lesson.place(dgx1, 2, 2, 2, sizes)
    sec = placed.section()
    assert sec.value("topology.placed_tp_allreduce_ms") == pytest.approx(
        placed.placement.comparison.placed.tp_allreduce_s * 1e3, rel=1e-3)
    assert not any("does not fit" in n for n in sec.notes)
    assert len(lesson.affinity(placed).rows) == 8
    big = lesson.place(dgx1, 8, 2, 2, sizes)
    assert (big.placement.tp, big.placement.pp, big.placement.dp) == (8, 1, 1)
    assert any("32 does not fit 8 GPUs" in n for n in big.section().notes)


def test_placement_explorer_is_a_widget(dgx1):
    sec = lesson.placement_explorer(dgx1, 2, 2, 2)
    box = sec.widgets[0]
    assert "labkit-explorer" in box._dom_classes
    tp = box.children[0].children[0]
    assert list(tp.options) == [1, 2, 4, 8] and tp.value == 2
    tp.value = 8   # 8 x 2 x 2 does not fit: redraws with dp and pp lowered (outside a kernel: must not fail)


def test_classic_mistake_is_slower_over_node_links(sizes):
    sec = lesson.classic_mistake(sizes)
    a100 = T.load_sample(lesson.CLASSIC_SAMPLE)
    obv = T.place(a100, 4, 1, 2, sizes=sizes).comparison.placed.tp_allreduce_s
    aw = T.place(a100, 2, 2, 2, sizes=sizes).comparison.placed.tp_allreduce_s
    assert sec.value("topology.classic_mistake_tp_allreduce_slowdown") == pytest.approx(obv / aw, abs=0.01)
    assert obv / aw > 5 and "NODE vs NV12" in sec.claims[0].text
    assert len(sec.figures) == 2


def test_pcie_sample_claims():
    sec = lesson.pcie_sample()
    t = T.load_p2p_table(lesson.PCIE_SAMPLE)
    assert sec.value("topology.sample_rtx6000ada_p2p_on_GBps") == pytest.approx(t.uni_Bps["p2p_on"][0][1] / 1e9, abs=0.01)
    off, on = sec.claims[1].value, sec.claims[2].value
    assert off > 5 * on                                         # staging through the host costs latency
