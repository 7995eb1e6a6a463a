"""What labkit.allocator.watch caught on the H200 (benchmarks/gpu/record_watch.py, data/measurements/allocator/
watch__*): the committed captures are laid out as rank folders again and diagnosed here; the verdict must be the
case's, checked by the simulator on the captured snapshot, and agree with what the GPU did under the fix."""

import pytest

from labkit.allocator import capture, parse_oom_message, recorded
from labkit.allocator.recorded import overhead_summary
from labkit.core.provenance import load_measurement

MEAS = recorded.MEAS_DIR


def packed(case):
    doc = load_measurement(MEAS / f"watch__{case}.json", "allocator.watch_capture")
    assert doc["provenance"]["gpu_name"] == "NVIDIA H200"
    return doc["data"]


def rediagnose(case, tmp_path):
    d = packed(case)
    snap = MEAS / f"watch__{case}.pickle.gz"
    folder = capture.unpack(d["capture"], tmp_path / "rank0", snap if snap.exists() else None)
    return d, capture.read_capture(folder), capture.diagnose_capture(folder)


@pytest.mark.parametrize("case, kind", [("fragmentation", "fragmentation"), ("too_large", "too_large"),
                                        ("leak", "growth")])
def test_each_recorded_oom_gets_its_verdict_here(case, kind, tmp_path):
    d, cap, diag = rediagnose(case, tmp_path)
    assert d["run"]["oom"] and d["run"]["num_ooms"] >= 1
    # complete as written on the GPU (the committed copy keeps the snapshot only where it was saved)
    assert d["capture"]["complete"] and cap.manifest["oom"] and cap.oom_message.startswith("CUDA out of memory")
    assert {capture.SNAPSHOT, capture.STATS_AT_OOM, capture.MESSAGE, capture.VERDICT_JSON} <= set(d["capture"]["files"])
    f = diag.findings[0]
    assert f.kind == kind, diag.kinds
    snap = MEAS / f"watch__{case}.pickle.gz"
    if snap.exists():
        assert f.verified is True, f.simulator_check
        assert snap.stat().st_size < 16 * 2**20
    assert d["verified"] is True  # the simulator's check as watch ran it on the GPU


def test_the_fragmentation_verdict_holds_on_the_gpu(tmp_path):
    d, cap, diag = rediagnose("fragmentation", tmp_path)
    m = parse_oom_message(cap.oom_message)
    # the fake-OOM arithmetic: allocated + request fit under the cap, the room for a segment did not
    assert m.allocated_bytes + m.request_bytes <= m.allowed_bytes
    assert m.allowed_bytes - m.allocated_bytes - m.reserved_unallocated_bytes < m.request_bytes
    assert "expandable_segments:True" in diag.findings[0].fix
    # the watched verdict on the GPU, and the same loop unwatched under expandable segments: no OOM for real
    assert d["verdict"] == "fragmentation" and d["verified"] is True
    t = d["expandable_truth"]
    assert t["alloc_conf"] == "expandable_segments:True" and t["oom"] is False and t["cap_bytes"] == d["run"]["cap_bytes"]


def test_the_leak_is_seen_in_the_per_step_series(tmp_path):
    d, cap, diag = rediagnose("leak", tmp_path)
    a = [r["allocated_bytes.all.current"] for r in cap.steps]
    assert len(a) >= 8 and all(y > x for x, y in zip(a, a[1:]))
    assert "across the samples" in diag.findings[0].evidence[0]


def test_two_ranks_on_one_gpu_under_torchrun_write_their_own_folders():
    doc = load_measurement(MEAS / "watch__torchrun.json", "allocator.watch_torchrun")
    d = doc["data"]
    assert d["returncode"] == 1  # rank 0's OOM fails the job, as torchrun reports it
    ranks = {r["folder"]: r for r in d["ranks"]}
    assert sorted(ranks) == ["rank0", "rank1"] and len(set(d["pids"])) == 2
    r0, r1 = ranks["rank0"], ranks["rank1"]
    assert r0["manifest"]["rank"] == 0 and r1["manifest"]["rank"] == 1
    assert r0["state"] == "complete" and r0["manifest"]["oom"] and r0["verdict"]["findings"][0]["kind"] == "fragmentation"
    # rank 1 trained, met rank 0 at a barrier and finished (no OOM by design): complete, statistics only
    assert r1["state"] == "complete" and not r1["manifest"]["oom"] and r1["manifest"]["steps"] >= 1
    assert sorted(r1["files"]) == [capture.MANIFEST, capture.STATS]
    assert any("captures in" in ln for ln in d["watch_lines"])  # the folder printed at the end


def test_watch_overhead_is_under_three_percent_with_the_defaults():
    o = overhead_summary()
    assert o is not None and o["baseline_step_ms"] > 0
    assert o["modes"]["trace"]["change_pct"] < 3.0
    for mode in ("trace", "stats", "stacks"):
        assert mode in o["modes"]


def test_alloc_doctor_reads_a_capture_folder(tmp_path, capsys):
    from labkit.cli import main

    d = packed("fragmentation")
    folder = capture.unpack(d["capture"], tmp_path / "rank0", MEAS / "watch__fragmentation.pickle.gz")
    assert main(["alloc", "doctor", "--capture", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "[fragmentation]" in out and "the fix is confirmed by the simulator" in out
    assert main(["alloc", "doctor", "--capture", str(tmp_path / "nothing")]) == 2
    assert "no such capture folder" in capsys.readouterr().err
