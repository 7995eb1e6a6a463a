"""benchmarks/gpu/record_watch.py on the CPU: its children run at smoke sizes (watch is a no-op without CUDA and the
results say so), and its packing turns a capture folder into the committed files."""

import json
from types import SimpleNamespace

from labkit.allocator import capture, diagnose, read_snapshot, recorded
from labkit.core.provenance import load_measurement
from labkit.core.serialize import dumps


def test_children_run_at_smoke_sizes_on_the_cpu(tmp_path, capsys, bench_script):
    mod = bench_script("record_watch")
    base = ["--out", str(tmp_path / "out"), "--work", str(tmp_path), "--smoke"]
    for case in ("fragmentation", "leak"):
        assert mod.main(base + ["--child", "case", "--case", case]) == 0
        r = json.loads((tmp_path / f"{case}.result.json").read_text())
        assert r["cuda"] is False and r["oom"] is False and r["capture_folder"] is None
    assert mod.main(base + ["--child", "overhead"]) == 0
    r = json.loads((tmp_path / "overhead_0.result.json").read_text())
    assert [b["mode"] for b in r["blocks"]] == ["none", "trace", "stats", "stacks"]
    summ = mod._overhead_summary([r])
    assert summ["none"]["overhead_pct"] == 0 and len(summ["trace"]["paired_change_pct"]) == 1
    assert "no CUDA GPU here" in capsys.readouterr().err
    # what the parent makes of a case without CUDA: recorded as such, with provenance
    d = mod._pack_case(None, tmp_path, tmp_path, "leak", json.loads((tmp_path / "leak.result.json").read_text()), False)
    assert d["capture"] is None and "no CUDA" in d["why"]


def test_a_capture_is_packed_with_its_reduced_snapshot(tmp_path, bench_script):
    mod = bench_script("record_watch")
    d = recorded.oom_case("fragmentation")["data"]
    doc = {"manifest": {"state": "complete", "rank": 0, "oom": True, "settings": {"history": True}},
           "steps": [], "stats_at_oom": d["stats"], "oom_message": d["oom_message"]}
    folder = capture.unpack(doc, tmp_path / "cap" / "rank0", recorded.oom_snapshot_path("fragmentation"))
    v = capture.diagnose_capture(folder)
    (folder / capture.VERDICT_JSON).write_text(dumps(v))
    out = tmp_path / "out"
    out.mkdir()
    packed = mod._pack_case(SimpleNamespace(), out, tmp_path, "fragmentation",
                            {"capture_folder": str(folder), "cuda": True}, True)
    assert packed["verdict"] == "fragmentation" and packed["verified"] is True
    assert packed["snapshot_file"] == "watch__fragmentation.pickle.gz"
    snap = read_snapshot(out / "watch__fragmentation.pickle.gz")
    assert diagnose(stats=d, snapshot=snap).findings[0].verified is True
    mod._write(out, "watch__fragmentation.json", "allocator.watch_capture", packed)
    assert load_measurement(out / "watch__fragmentation.json")["data"]["capture"]["complete"]
