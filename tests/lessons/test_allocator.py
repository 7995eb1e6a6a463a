"""Notebook 03's sections: every branch, against the data/ recordings and an empty folder (every
recording missing), plus a written imbalance recording (it needs 2 GPUs, so data/ has none)."""

from __future__ import annotations

import json

import pytest

from labkit.allocator import recorded
from labkit.core.errors import LabkitError
from labkit.core.provenance import write_measurement
from labkit.lessons import allocator as lesson


def test_parse_configs():
    assert lesson.parse_configs("default; expandable_segments:True ;") == ["", "expandable_segments:True"]
    with pytest.raises(LabkitError, match="configs"):
        lesson.parse_configs(" ; ")


def test_every_missing_recording_is_a_stated_gap(tmp_path):
    for fn in (lesson.caching, lesson.fidelity, lesson.empty_cache_recorded, lesson.oom_cases, lesson.other_process):
        sec = fn(tmp_path)
        assert any("Not recorded here" in n and "record_allocator.py" in n for n in sec.notes), fn.__name__
        assert not sec.rows or fn is lesson.oom_cases and not sec.rows
    imb = lesson.imbalance(tmp_path)
    assert imb.source.startswith("sample") and imb.value is not None and imb.claims[0].value == "imbalance"
    # no recorded trace: the what-if replays a synthetic stream, labelled as such
    w = lesson.whatif(configs="default;expandable_segments:True", smoke=True, traces_dir=tmp_path)
    assert w.trace_source.startswith("sample") and any("Not recorded here" in n for n in w.notes)


def test_caching_reads_the_recorded_runs():
    runs = [r for r in recorded.recorded_runs() if r.workload == "varlen_train" and r.cap_bytes is None]
    sec = lesson.caching()
    default = next(r for r in runs if r.config == "default")
    assert sec.value("alloc.varlen.reserved_peak_default") == default.stats["reserved_bytes.all.peak"]
    assert sec.value("alloc.varlen.reserved_peak_best") == min(r.stats["reserved_bytes.all.peak"] for r in runs)
    assert len(sec.rows) == len(runs) and sec.figures


def test_whatif_on_the_recorded_trace_and_segment_map():
    w = lesson.whatif(configs="default;expandable_segments:True;max_split_size_mb:128")
    assert w.trace_source.startswith("trace recorded") and len(w.results) == 3
    sec = w.section()
    best = min(w.results, key=lambda r: r.reserved_peak_bytes)
    assert sec.value("alloc.whatif.best_config") == (best.config or "default")
    assert sec.value("alloc.whatif.reserved_saving_vs_first") == pytest.approx(
        1 - best.reserved_peak_bytes / w.results[0].reserved_peak_bytes, abs=1e-4)
    assert 0 < sec.value("alloc.whatif.reserved_saving_vs_first") < 1
    seg = lesson.segment_map(w)
    assert len(seg.figures) == 2 and seg.claims[1].value == "0 B"  # expandable segments strand nothing


def test_users_incomplete_snapshot_falls_back_with_a_note(tmp_path):
    from labkit.allocator.sim import synthetic

    snap = synthetic.to_snapshot(synthetic.fragmentation_pattern())
    snap["device_traces"][0] = snap["device_traces"][0][5:]  # the history's start is lost
    import pickle

    p = tmp_path / "mine.pickle"
    p.write_bytes(pickle.dumps(snap))
    tr, src, notes = lesson.pick_trace(str(p))
    assert "incomplete" in notes[0] and "before the history starts" in notes[0]
    assert src.startswith("trace recorded") and tr.complete  # the lab's trace stands in, and says so
    p.write_bytes(pickle.dumps(synthetic.to_snapshot(synthetic.fragmentation_pattern())))
    tr, src, notes = lesson.pick_trace(str(p))
    assert src == f"your snapshot {p}" and not notes


def test_fidelity_reports_the_worst_pair():
    rows = recorded.fidelity()
    sec = lesson.fidelity()
    assert sec.value("alloc.fidelity.max_rel_error") == pytest.approx(max(r.max_rel_error for r in rows), abs=1e-5)
    assert len(sec.rows) == len(rows)


def test_empty_cache_sections():
    er = recorded.experiment("empty_cache")["data"]["rows"]
    sec = lesson.empty_cache_recorded()
    assert sec.value("alloc.empty_cache.released") == er[0]["reserved_bytes"] - er[1]["reserved_bytes"] > 0
    rule = lesson.empty_cache_rule()
    assert rule.claims[0].value == "1.00 GiB" and rule.claims[1].value == "0 B"


def test_oom_cases_diagnosed():
    sec = lesson.oom_cases()
    kinds = {r[0]: r[2] for r in sec.rows}
    assert kinds["too_large"] == "too_large" and kinds["fragmentation"] == "fragmentation"
    assert kinds["leak"] == "growth" and kinds["fragmentation_expandable"] == "-"  # that run did not OOM
    assert lesson.other_process().claims[2].value == "cache_held"


def test_fragmentation_check_default_ooms_expandable_fits():
    sec = lesson.fragmentation_check(6.0)
    assert sec.value("alloc.fragmentation.ooms_default") >= 1 and sec.value("alloc.fragmentation.ooms_expandable") == 0


def test_imbalance_from_a_written_recording(tmp_path):
    data = {"ranks": lesson.SAMPLE_RANKS, "nvml": lesson.SAMPLE_NVML}
    write_measurement(tmp_path / "exp__imbalance.json", "allocator.experiment", data, command="test")
    sec = lesson.imbalance(tmp_path)
    assert sec.source.startswith("recorded") and not sec.notes and sec.rows[0][0] == "imbalance"
    json.dumps(sec.rows, default=str)


def test_captured_oom_shows_the_recorded_watch_capture_with_its_verdict():
    from labkit.lessons import allocator as lesson

    sec = lesson.captured_oom("fragmentation")
    text = sec.html()
    assert "fragmentation" in text.lower() and "expandable_segments" in text
    sec.record()
