"""The GPU recording script dry-runs on CPU (gloo ranks, CUDA parts skipped with a reason)."""

from __future__ import annotations

from labkit.comm.timeline import load_trace
from labkit.core.provenance import load_measurement


def test_record_comm_smoke(record_comm_smoke):
    tmp_path, r = record_comm_smoke  # one run, read by tests/lessons/test_critical_path.py too (tests/conftest.py)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "FAILED" not in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
    assert "SKIP pinned vs pageable: needs a CUDA GPU" in r.stdout
    assert "SKIP DataParallel vs DDP: needs 2 CUDA GPUs" in r.stdout
    kinds = {"comm_collectives.json": "comm.collectives", "comm_launch_overhead.json": "comm.launch_overhead",
             "comm_buckets.json": "comm.buckets", "comm_ddp_timeline.json": "comm.timeline",
             "comm_async_overlap.json": "comm.async_overlap", "comm_buffer_reuse.json": "comm.buffer_reuse"}
    for name, kind in kinds.items():
        doc = load_measurement(tmp_path / name, kind)
        assert doc["provenance"]["backend"] == "gloo" and doc["provenance"]["world"] == 2
    rows = load_measurement(tmp_path / "comm_collectives.json")["data"]["bench"]["rows"]
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    tl = load_measurement(tmp_path / "comm_ddp_timeline.json")["data"]
    assert load_trace(tmp_path / tl["trace_file"])["traceEvents"]
    assert tl["timeline"]["n_comm_ops"] >= 1
