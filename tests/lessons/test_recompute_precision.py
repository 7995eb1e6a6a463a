"""Notebook 04's sections, each on the data/ recordings, a CPU run, or fake mode (the smoke sizes)."""

from __future__ import annotations

import pytest

from labkit.core.errors import LabkitError
from labkit.lessons import recompute_precision as lesson
from labkit.memory import load_recorded_peaks
from labkit.memory.trace.recorded import load_recorded, measure_dir


@pytest.fixture(scope="module")
def cpu() -> lesson.Machine:
    return lesson.Machine("ci", 0, "", "x", "cpu", "cpu", "recorded on 1 x NVIDIA H200, 2026-11-29", 28)


def test_machine_falls_back_to_the_cpu_and_says_so():
    import torch

    m = lesson.this_machine("cuda")
    assert m.live == ("cuda" if torch.cuda.is_available() else "cpu")
    assert m.recorded_cases == len(load_recorded_peaks()) and m.recorded_source.startswith("recorded on")
    if m.live == "cpu":
        assert any("no GPU" in n for n in m.section().notes)
    with pytest.raises(LabkitError, match="device"):
        lesson.this_machine("tpu")


def test_recorded_step_and_sweeps_read_their_files():
    doc = load_recorded("case_gpt2-124m-amp-bf16-none.json", "measure_step")
    sec = lesson.step_phases_recorded("gpt2-124m")
    assert sec.value("gpt2-124m-amp-bf16-none_peak_allocated_gib") == round(doc["data"]["peak_allocated"] / 2**30, 3)
    assert "backward" in sec.claims[0].text
    assert any("Not recorded here" in n for n in lesson.step_phases_recorded("no-such-workload").notes)

    pts = load_recorded("sweep_checkpointing.json", "measure_sweep")["data"]["points"]
    none = next(p for p in pts if p["checkpointing"] == "none")
    full = next(p for p in pts if p["checkpointing"] == "full")
    ck = lesson.recompute_sweep_recorded()
    assert ck.value("full_checkpointing_peak_saving_pct") == pytest.approx(
        100 * (1 - full["peak_allocated"] / none["peak_allocated"]), abs=0.01)
    assert ck.value("full_checkpointing_step_overhead_pct") > 0 and len(ck.rows) == len(pts)

    pr = lesson.precision_recorded()
    assert 0 < pr.value("amp_bf16_peak_saving_pct") < 50
    # amp keeps the fp32 parameters; pure bf16 halves them
    assert pr.claims[0].value == pytest.approx(2 * pr.claims[3].value, rel=0.01)


def test_live_sections_on_the_cpu(cpu):
    here = lesson.step_phases_here(cpu, smoke=True)
    assert here.source == "measured here" and here.claims[0].value > 0 and here.figures
    sw = lesson.recompute_sweep_here(cpu, smoke=True)
    labels = [r[0] for r in sw.rows]
    assert labels == ["none", "selective", "full", "every-2", "every-3"]
    peaks = {r[0]: r[1] for r in sw.rows}
    assert peaks["full"] != peaks["none"] and any("noisy" in n for n in sw.notes)
    pr = lesson.precision_here(cpu, smoke=True)
    assert [r[0] for r in pr.rows] == ["fp32", "amp-bf16", "bf16"]
    assert pr.claims[1].value * 2 == pytest.approx(pr.claims[0].value, rel=0.01)  # bf16 halves the parameters


def test_segment_sweep_in_fake_mode():
    sec = lesson.segment_sweep(smoke=True)
    assert sec.value("deep_best_segment_k") in (1, 2, 4)
    assert sec.claims[1].value < sec.claims[0].value  # recomputing every layer keeps less than no recompute


def test_fake_mode_against_recorded_and_heldout():
    sec = lesson.fake_vs_recorded(smoke=True, subset=("gpt-small-ref-fp32-none", "gpt-small-ref-amp-bf16-full"))
    assert sec.value("fake_vs_h200_cases") == 2 == len(sec.rows)
    assert sec.value("fake_vs_h200_worst_abs_error_pct") < 5 and sec.notes
    held = lesson.heldout(smoke=True)
    assert len(held.rows) == 1 and held.value("fake_vs_h200_heldout_worst_abs_error_pct") < 5
    assert any("Not recorded here" in n for n in lesson.heldout(path=measure_dir() / "nothing.json").notes)


def test_estimator_own_loop_overhead_and_profiler(cpu):
    est = lesson.estimator_vs_recorded("gpt2-124m")
    assert len(est.rows) == 4 and est.claims[0].value < 10
    loop = lesson.own_loop(cpu)
    assert [r[0] for r in loop.rows] == ["forward", "backward", "optimizer"] * 2
    assert loop.claims[0].value > 0
    assert lesson.tracer_overhead().claims[0].value > 0
    prof = lesson.profiler_timeline(cpu)
    assert prof.claims[0].value > 0 and prof.figures


def test_supported_models_and_plain_loop_validation_in_smoke():
    from labkit.lessons import recompute_precision as lesson

    sup = lesson.supported_models(smoke=True)
    assert sup.value("fake_corpus_predicted") <= lesson.SMOKE_SUPPORT and sup.rows
    assert any("Smoke profile" in n for n in sup.notes)
    val = lesson.plain_loop_validation(smoke=True)
    assert len(val.rows) == lesson.SMOKE_VALIDATION
    assert 0 <= val.value("fake_plain_reference_within") <= lesson.SMOKE_VALIDATION // 2
    assert 0 <= val.value("fake_plain_held_out_within") <= lesson.SMOKE_VALIDATION // 2
    assert "each case in its own new process" in val.title
    inproc = lesson.plain_loop_validation(smoke=True, process="in-process")
    assert "one after another in one process" in inproc.title
    assert 0 <= inproc.value("fake_plain_in_process_reference_within") <= lesson.SMOKE_VALIDATION // 2
    sup.record()  # what the report records: each named claim states a source the report accepts
    val.record()
    inproc.record()
    two = lesson.one_loop_two_processes()
    assert len(two.rows) == 8 and "llama-gqa-b8-ckpt3-amp-bf16" in [r[0] for r in two.rows]
    changes = [abs(float(r[-1].rstrip("%"))) for r in two.rows]
    assert changes == sorted(changes, reverse=True) and changes[-1] > 5
    two.record()


def test_the_kv_cache_section_pairs_each_use_cache_false_recording_with_its_default():
    from labkit.memory.trace.corpus_check import cache_pairs, load_plain

    records = load_plain()
    pairs = cache_pairs(records)
    assert {(on.name, off.name) for on, off in pairs} == {
        ("llama-gqa-b8-ckpt2-amp-bf16", "llama-gqa-b8-ckpt2-nocache-amp-bf16"),
        ("mistral-b4-ckpt2-amp-bf16", "mistral-b4-ckpt2-nocache-amp-bf16"),
        ("gpt2-medium-b8-ckpt2-amp-bf16", "gpt2-medium-b8-ckpt2-nocache-amp-bf16")}
    for on, off in pairs:       # the same step but for the cache
        assert on.case.overrides.get("use_cache", True) and off.case.overrides["use_cache"] is False
        assert (on.case.micro_batch, on.case.seq, on.case.recompute) == (off.case.micro_batch, off.case.seq,
                                                                         off.case.recompute)
        assert off.peak_allocated < on.peak_allocated
    sec = lesson.kv_cache_under_checkpointing()
    (claim,) = sec.claims
    best = max((on.peak_allocated - off.peak_allocated) / on.peak_allocated for on, off in pairs)
    assert claim.value == round(100 * best) and "use_cache=False" in claim.text
    assert len(sec.rows) == 3 and sec.headers[2] == "use_cache=False"
    assert cache_pairs([r for r in records if "nocache" not in r.name]) == []
