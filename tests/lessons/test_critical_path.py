"""Notebook 05's sections: every branch, against the data/ recordings, a fixture made by
``benchmarks/gpu/record_comm.py --smoke``, and an empty folder (every recording missing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.comm import recorded as rec
from labkit.comm.dp import ParallelRun
from labkit.core.errors import LabkitError
from labkit.core.provenance import write_measurement
from labkit.lessons import critical_path as lesson

RECORDED = ("collectives", "launch_overhead", "buckets", "ddp_timeline", "pinned_pageable", "dp_vs_ddp")


@pytest.fixture(scope="module")
def smoke_dir(record_comm_smoke) -> Path:
    """The recording script's --smoke output (2 gloo ranks; the CUDA-only parts are absent), run once
    for the session and shared with tests/comm/test_record_script.py (tests/conftest.py)."""
    out, r = record_comm_smoke
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def clean_dir(smoke_dir, tmp_path_factory) -> Path:
    """The smoke recording with the all-reduce times replaced by a clean line (alpha 10 us, 1 GB/s):
    CPU timings at these sizes may not grow with size, and the fit's branch must not depend on luck."""
    import shutil

    out = tmp_path_factory.mktemp("comm-clean")
    for f in smoke_dir.iterdir():
        shutil.copy(f, out / f.name)
    doc = json.loads((out / "comm_collectives.json").read_text())
    for r in doc["data"]["bench"]["rows"]:
        if r["op"] == "all_reduce":
            r["time_us"] = 10.0 + r["bytes"] / 1e3
    (out / "comm_collectives.json").write_text(json.dumps(doc))
    return out


def _raw(folder: Path, name: str) -> dict:
    return json.loads((folder / f"comm_{name}.json").read_text())["data"]


@pytest.fixture(scope="module")
def live(smoke_dir) -> lesson.LiveRun:
    """A LiveRun filled from the smoke recording: recorded and live data are the same dataclasses."""
    m = lesson.Machine("ci", 0, "", 2, "x", "gloo", 2, [])
    return lesson.LiveRun(m, rec.load("collectives", smoke_dir).data["bench"], rec.load("buckets", smoke_dir).data,
                          rec.load("ddp_timeline", smoke_dir).data["timeline"], rec.load("async_overlap", smoke_dir).data,
                          rec.load("buffer_reuse", smoke_dir).data, 0.05)


def test_every_missing_recording_is_a_stated_gap(tmp_path):
    for fn in (lesson.bus_bandwidth_recorded, lesson.alpha_beta_recorded, lesson.launch_overhead,
               lesson.bucket_sweep_recorded, lesson.overlap_recorded, lesson.simulator_check, lesson.pinned_pageable,
               lesson.dp_vs_ddp):
        sec = fn(tmp_path)
        assert any("Not recorded yet" in n and lesson.RECORD_COMMAND in n for n in sec.notes), fn.__name__
    # in place of the collectives recording: the topology model's curve, labelled as a model
    sec = lesson.bus_bandwidth_recorded(tmp_path)
    assert sec.figures and all(c.source.startswith("model") for c in sec.claims)
    # the simulator still runs, on an assumed backward time that it states
    sim = lesson.bucket_simulator(folder=tmp_path, interactive=False)
    assert "assumed" in sim.claims[-1].source and sim.value("comm.model.best_bucket_mb_multinode") in lesson.SIM_GRID_MB


def test_recorded_sections_read_the_smoke_fixture(smoke_dir, clean_dir):
    rows = _raw(smoke_dir, "collectives")["bench"]["rows"]
    ar = [r for r in rows if r["op"] == "all_reduce"]
    sec = lesson.bus_bandwidth_recorded(smoke_dir)
    assert sec.value("comm.recorded.allreduce_busbw_peak_GBps") == pytest.approx(max(r["busbw_GBps"] for r in ar), rel=1e-3)
    assert sec.source.startswith("recorded on") and not any("Not recorded" in n for n in sec.notes)

    ab = lesson.alpha_beta_recorded(smoke_dir)
    assert len(ab.rows) + sum(n.startswith("No fit for") for n in ab.notes) == len({r["op"] for r in rows})
    assert ab.figures and ab.claims[0].unit == "x"  # measured over the model, whatever the fits

    gaps = _raw(smoke_dir, "launch_overhead")["rows"]
    lo = lesson.launch_overhead(smoke_dir)
    assert lo.value("comm.recorded.launch_gap_fraction_max") == pytest.approx(max(g["gap_fraction"] for g in gaps), abs=1e-4)

    sweep = _raw(smoke_dir, "buckets")["rows"]
    fastest = min((r for r in sweep if r["bucket_cap_mb"] is not None), key=lambda r: r["step_ms_median"])
    bs = lesson.bucket_sweep_recorded(smoke_dir)
    assert bs.value("comm.recorded.best_step_ms") == round(fastest["step_ms_median"], 3)
    pick = next(c for c in bs.claims if "bucket cap" in c.text.lower())  # fastest, or the caps that tie with it
    assert f"{fastest['bucket_cap_mb']:g}" in str(pick.value) and pick.name is None   # a choice, not a key result
    assert len(bs.rows) == len(sweep) and any("noisy" in n for n in bs.notes)  # gloo

    tl = _raw(smoke_dir, "ddp_timeline")["timeline"]
    ov = lesson.overlap_recorded(smoke_dir)
    assert ov.value("comm.recorded.exposed_comm_fraction") == pytest.approx(tl["exposed_fraction"], abs=1e-4)

    chk = lesson.simulator_check(clean_dir)
    assert not chk.notes[:-1] and len(chk.rows) == sum(r["bucket_cap_mb"] is not None for r in sweep)
    assert chk.claims[0].unit == f"of {len(chk.rows)}"

    sim = lesson.bucket_simulator(folder=smoke_dir, interactive=True)
    assert sim.claims[-1].value == pytest.approx(tl["backward_compute_us"] / 1e3, abs=0.01)
    assert sim.widgets and "labkit-explorer" in sim.widgets[0]._dom_classes


def test_live_sections_and_recorded_beside_them(smoke_dir, live):
    here = lesson.bus_bandwidth_here(live)
    assert here.value("comm.here.allreduce_busbw_peak_GBps") > 0 and here.source.startswith("measured here")
    assert lesson.bucket_sweep_here(live).value("comm.here.best_step_ms") == round(live.sweep.best().step_ms_median, 3)
    assert lesson.overlap_here(live).value("comm.here.exposed_comm_fraction") == round(live.timeline.exposed_fraction, 4)
    # recorded beside live: one row each
    assert len(lesson.async_overlap(live, smoke_dir).rows) == 2
    assert len(lesson.async_overlap(live, Path("/nonexistent")).rows) == 1
    br = lesson.buffer_reuse(live, smoke_dir)
    assert len(br.rows) == len(live.buffers.rows) + len(_raw(smoke_dir, "buffer_reuse")["rows"])
    fit = lesson.alpha_beta_here(live)
    assert fit.rows or fit.notes  # a fit, or the stated reason there is none


def test_dp_vs_ddp_from_a_written_recording(tmp_path):
    runs = [ParallelRun("DataParallel", 2, "tiny", 4, 30.0, 29.0, 31.0, 5, [3 << 30, 2 << 30], [4 << 30, 3 << 30]),
            ParallelRun("DistributedDataParallel", 2, "tiny", 4, 20.0, 19.0, 21.0, 5, [2 << 30, 2 << 30], [3 << 30] * 2)]
    write_measurement(tmp_path / "comm_dp_vs_ddp.json", "comm.dp_vs_ddp", {"runs": runs}, command="test")
    sec = lesson.dp_vs_ddp(tmp_path)
    assert sec.value("comm.recorded.dp_over_ddp_step_ratio") == 1.5 and len(sec.rows) == 2 and sec.figures


def test_pinned_pageable_from_data():
    sec = lesson.pinned_pageable()
    assert sec.value("comm.recorded.pinned_copy_GBps") > sec.value("comm.recorded.pageable_copy_GBps")


def test_machine_picks_gloo_without_gpus_and_refuses_unknown_backends():
    import torch

    m = lesson.this_machine("auto", 2)
    assert m.backend == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")
    assert m.source.startswith("measured here")
    with pytest.raises(LabkitError, match="backend"):
        lesson.this_machine("mpi")


def test_smoke_plan_is_small():
    p = lesson.live_plan(True, "gloo", "1,2")
    assert max(p["sizes"]) <= 1 << 20 and p["steps"] <= 2
    assert lesson.live_plan(False, "gloo", "1,2")["bucket_sizes_mb"] == [1.0, 2.0]


def test_the_one_gpu_recording_claims_no_overlap():
    """data/'s profiled step ran on one GPU: no all-reduce, so no hidden or exposed fraction is claimed."""
    sec = lesson.overlap_recorded()
    assert any("No all-reduce" in n for n in sec.notes) and any("one GPU" in n for n in sec.notes)
    with pytest.raises(KeyError):
        sec.value("comm.recorded.exposed_comm_fraction")
    sim = lesson.bucket_simulator(interactive=False)
    assert sim.claims[-1].source.startswith("recorded on") and "profiled step" in sim.claims[-1].text


def test_recordings_load_into_the_live_dataclasses_and_round_trip(smoke_dir):
    """comm.recorded.load gives the same dataclasses a live run returns; serialising them gives the file back."""
    from labkit.comm.bench import BenchResult
    from labkit.comm.ddp import BucketSweep
    from labkit.comm.levers import AsyncOverlap, BufferReuse
    from labkit.comm.timeline import Timeline
    from labkit.core.serialize import to_jsonable

    got = {n: rec.load(n, smoke_dir) for n in rec.available(smoke_dir)}
    assert isinstance(got["collectives"].data["bench"], BenchResult)
    assert isinstance(got["buckets"].data, BucketSweep) and isinstance(got["ddp_timeline"].data["timeline"], Timeline)
    assert isinstance(got["async_overlap"].data, AsyncOverlap) and isinstance(got["buffer_reuse"].data, BufferReuse)
    for name, r in got.items():
        raw = _raw(smoke_dir, name)
        assert json.loads(json.dumps(to_jsonable(r.data))) == raw, name
    assert rec.load("dp_vs_ddp", smoke_dir) is None  # CUDA-only: absent, not an error


def test_a_collective_whose_time_does_not_grow_gets_a_note_not_an_error(clean_dir, tmp_path):
    """Noisy timings (time falling with size) leave that collective unfitted, with the reason stated."""
    doc = json.loads((clean_dir / "comm_collectives.json").read_text())
    rows = [r for r in doc["data"]["bench"]["rows"] if r["op"] == "broadcast"]
    for r, t in zip(sorted(rows, key=lambda r: r["bytes"]), (300.0, 200.0, 100.0, 50.0, 25.0, 12.0, 6.0, 3.0)):
        r["time_us"] = t
    (tmp_path / "comm_collectives.json").write_text(json.dumps(doc))
    sec = lesson.alpha_beta_recorded(tmp_path)
    assert any("No fit for broadcast" in n for n in sec.notes)
    assert "broadcast" not in [r[0] for r in sec.rows] and "all_reduce" in [r[0] for r in sec.rows]
    assert sec.value("comm.recorded.allreduce_alpha_us") == pytest.approx(10.0, abs=0.01)
