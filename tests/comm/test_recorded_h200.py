"""The recording from the GPU machine (data/measurements/comm/) holds what the chapter claims.

Recorded by benchmarks/gpu/record_comm.py on an H200 (see each file's provenance): these tests check
the recorded numbers against the chapter's models and against each other, with no GPU here.
"""

from __future__ import annotations

import pytest

from labkit.comm import simulate
from labkit.comm.recorded import comm_dir, recorded
from labkit.comm.timeline import reduce_trace
from labkit.workloads import get_workload


def test_provenance_names_the_gpu_and_stack():
    for name in ("buckets", "ddp_timeline", "buffer_reuse", "pinned_pageable"):
        prov = recorded(name)["provenance"]
        assert "H200" in prov["gpu_name"] and prov["gpu_count"] >= 1
        assert prov["torch"] and prov["cuda"] and prov["driver"]
        assert "record_comm.py" in prov["command"]


def test_simulator_predicts_ddp_bucket_counts_on_the_gpu():
    s = recorded("buckets")["data"]
    cfg = get_workload(s["workload"]).config
    assert s["param_bytes"] == 4 * cfg.num_params
    events = simulate.gpt_grad_schedule(cfg, s["batch_size"], 0.01)
    for r in s["rows"]:
        if r["bucket_cap_mb"] is not None:
            assert r["num_buckets"] == len(simulate.buckets(events, int(r["bucket_cap_mb"] * 2**20))), r


def test_gradient_as_bucket_view_saves_one_gradient_copy_somewhere():
    s = recorded("buckets")["data"]
    mem = {(r["bucket_cap_mb"], r["gradient_as_bucket_view"]): r["peak_allocated_bytes"]
           for r in s["rows"] if r["bucket_cap_mb"] is not None}
    saved = [mem[(mb, False)] - mem[(mb, True)] for mb, g in mem if not g and (mb, True) in mem]
    assert max(saved) == pytest.approx(s["param_bytes"], rel=0.1)  # one fp32 gradient copy
    assert min(saved) > -0.02 * s["param_bytes"]  # never costs memory beyond noise


def test_timeline_json_is_the_reduction_of_the_stored_trace():
    doc = recorded("ddp_timeline")["data"]
    stored = doc["timeline"]
    again = reduce_trace(comm_dir() / doc["trace_file"])
    assert again.source == "cuda"
    assert again.backward_compute_us == pytest.approx(stored["backward_compute_us"])
    assert again.span_us == pytest.approx(stored["span_us"])
    assert again.n_comm_ops == stored["n_comm_ops"]
    assert 0 < stored["backward_compute_us"] <= stored["span_us"]


def test_pinned_memory_copies_faster_and_overlaps():
    rows = {r["host_memory"]: r for r in recorded("pinned_pageable")["data"]["rows"]}
    pinned, pageable = rows["pinned"], rows["pageable"]
    assert pinned["copy_GBps"] > 3 * pageable["copy_GBps"]
    assert pinned["host_call_ms"] < 1.0 < pageable["host_call_ms"]  # pageable holds the host
    assert pinned["overlap_fraction"] > pageable["overlap_fraction"]


def test_buffer_reuse_rows():
    b = recorded("buffer_reuse")["data"]
    assert [r["mode"] for r in b["rows"]] == ["persistent", "in_loop", "in_loop_empty_cache"]
    rows = {r["mode"]: r for r in b["rows"]}
    # the persistent buffer takes fewer allocator requests per step than allocating inside the loop
    assert rows["persistent"]["allocator_requests_per_step"] < rows["in_loop"]["allocator_requests_per_step"]
