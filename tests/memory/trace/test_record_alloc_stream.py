"""benchmarks/gpu/record_alloc_stream.py on the CPU: the smoke mode writes its files (saying there was no allocator
to record), held-out cases are refused, and a snapshot is compacted into integer rows with interned frames."""

import gzip
import json

from labkit.core.provenance import load_measurement


def test_smoke_mode_writes_one_file_per_run_and_a_summary(tmp_path, bench_script):
    mod = bench_script("record_alloc_stream")
    assert mod.main(["--out", str(tmp_path), "--smoke", "--cases", "gpt2-b8-bf16", "--cold", ""]) == 0
    runs = load_measurement(tmp_path / "summary.json")["data"]["runs"]
    assert [r["run"] for r in runs] == ["gpt2-b8-bf16@tiny__warm"] and "error" not in runs[0]
    doc = json.loads(gzip.decompress((tmp_path / runs[0]["file"]).read_bytes()))
    assert doc["trace"] == [] and "no CUDA" in doc["why"]
    assert [m[0] for m in doc["marks"]] == ["init", "step1", "step2", "end"]


def test_held_out_cases_are_refused(tmp_path, capsys, bench_script):
    mod = bench_script("record_alloc_stream")
    assert mod.main(["--out", str(tmp_path), "--smoke", "--cases", "llama-gqa-b4-bf16", "--cold", ""]) == 2
    assert "held-out" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_a_snapshot_is_compacted_with_interned_frames(bench_script):
    mod = bench_script("record_alloc_stream")
    fr = [{"filename": "/x/transformers/models/gpt2/modeling_gpt2.py", "line": 10, "name": "forward"}]
    snap = {"segments": [{"device": 0, "address": 4096, "total_size": 2097152, "stream": 0, "segment_type": "small",
                          "blocks": [{"size": 512, "state": "active_allocated", "requested_size": 100},
                                     {"size": 2096640, "state": "inactive"}]}],
            "device_traces": [[{"action": "segment_alloc", "addr": 4096, "size": 2097152, "stream": 0, "time_us": 5},
                               {"action": "alloc", "addr": 4096, "size": 100, "stream": 0, "time_us": 6, "frames": fr},
                               {"action": "free_requested", "addr": 4096, "size": 100, "stream": 0, "time_us": 7,
                                "frames": fr}]]}
    doc = mod.compact_snapshot(snap)
    assert [r[0] for r in doc["trace"]] == [doc["actions"].index(a) for a in ("segment_alloc", "alloc", "free_requested")]
    assert doc["trace"][1][5] == doc["trace"][2][5] and doc["frames"][doc["trace"][1][5]] == "gpt2/modeling_gpt2.py:10:forward"
    assert doc["segments"][0]["blocks"] == [[512, "active_allocated", 100], [2096640, "inactive", 0]]
