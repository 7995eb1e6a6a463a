"""Trace reduction: interval arithmetic and exposed communication from Chrome traces."""

from __future__ import annotations

import gzip
import json

import pytest

from labkit.comm import timeline
from labkit.core.errors import LabkitError


def test_merge_total_intersect():
    assert timeline.merge([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert timeline.total([(0, 2), (1, 3)]) == 3
    assert timeline.intersect([(0, 10)], [(2, 3), (5, 12)]) == 6
    assert timeline.intersect([(0, 1)], [(1, 2)]) == 0


def test_overlap_summary_exposed():
    # compute 0..10; comm 8..14 (2 hidden, 4 exposed) and 15..16 (exposed)
    tl = timeline.overlap_summary([(0, 4), (4, 10)], [(8, 14), (15, 16)], ["a", "b"])
    assert tl.span_us == 16 and tl.backward_compute_us == 10 and tl.comm_us == 7
    assert tl.overlapped_us == 2 and tl.exposed_comm_us == 5
    assert tl.exposed_fraction == pytest.approx(5 / 16)
    assert tl.hidden_fraction == pytest.approx(2 / 7)
    assert tl.compute == [(0, 10)] and tl.comm_names == ["a", "b"]


def _ev(name, cat, ts, dur, corr=None, tid=1):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def _cuda_trace():
    return {"traceEvents": [
        _ev("labkit::forward", "user_annotation", 0, 100),
        _ev("labkit::backward", "user_annotation", 100, 100),
        _ev("cudaLaunchKernel", "cuda_runtime", 10, 1, corr=1),   # forward kernel: not backward compute
        _ev("gemm_fwd", "kernel", 20, 50, corr=1),
        _ev("cudaLaunchKernel", "cuda_runtime", 110, 1, corr=2, tid=2),  # autograd thread
        _ev("gemm_bwd", "kernel", 120, 60, corr=2),
        _ev("cuLaunchKernelEx", "cuda_driver", 150, 1, corr=3, tid=2),
        _ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 150, 50, corr=3),  # 30 hidden, 20 exposed
        _ev("cudaLaunchKernel", "cuda_runtime", 205, 1, corr=4),  # optimizer, after backward
        _ev("adam", "kernel", 230, 10, corr=4),
    ]}


def test_reduce_cuda_trace():
    tl = timeline.reduce_trace(_cuda_trace())
    assert tl.source == "cuda"
    assert (tl.backward_compute_us, tl.comm_us, tl.overlapped_us, tl.exposed_comm_us) == (60, 50, 30, 20)
    assert tl.span_us == 80 and tl.n_comm_ops == 1
    assert tl.comm == [(30, 80)]


def test_reduce_trace_file_gz(tmp_path):
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(_cuda_trace(), f)
    assert timeline.reduce_trace(p).exposed_comm_us == 20


def test_reduce_trace_errors(tmp_path):
    with pytest.raises(LabkitError, match="no 'labkit::backward' range"):
        timeline.reduce_trace({"traceEvents": [_ev("gemm", "kernel", 0, 1)]})
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(LabkitError, match="not a readable Chrome trace"):
        timeline.reduce_trace(bad)
    with pytest.raises(LabkitError, match="no such trace"):
        timeline.reduce_trace(tmp_path / "missing.json")
