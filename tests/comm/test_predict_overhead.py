"""Topology predictions beside measurements; the benchmark's launch-gap arithmetic."""

from __future__ import annotations

import pytest

from labkit.comm.bench import BenchResult, row_from_time
from labkit.comm.overhead import comm_intervals, gaps_from_intervals
from labkit.comm.predict import DEFAULT_H200_STANDIN, attach_predictions, predict_rows
from labkit.topology import collective_time, load_topology


def _res(backend="nccl", world=2, nodes=1):
    rows = [row_from_time(op, s, world, 1e-4) for op in ("all_reduce", "all_gather") for s in (4096, 1 << 30)]
    return BenchResult(backend=backend, world=world, nodes=nodes, device="x", dtype="float32", rows=rows)


def test_predictions_come_from_the_topology_model():
    topo = load_topology(DEFAULT_H200_STANDIN)
    res = _res()
    assert attach_predictions(res, topo)
    for r in res.rows:
        assert r.predicted_us == pytest.approx(collective_time(topo, [0, 1], r.op, r.bytes).time_s * 1e6)
    big = [r for r in res.rows if r.bytes == 1 << 30 and r.op == "all_reduce"][0]
    small = [r for r in res.rows if r.bytes == 4096 and r.op == "all_reduce"][0]
    assert big.predicted_us > 100 * small.predicted_us
    assert predict_rows([r.__dict__ for r in res.rows], topo) == [r.predicted_us for r in res.rows]


@pytest.mark.parametrize("kw,why", [(dict(backend="gloo"), "CPU processes"), (dict(nodes=2), "spans 2 nodes"),
                                    (dict(world=16), "topology has 8 GPUs")])
def test_no_prediction_says_why(kw, why):
    res = _res(**kw)
    assert not attach_predictions(res, load_topology(DEFAULT_H200_STANDIN))
    assert all(r.predicted_us is None for r in res.rows)
    assert any(why in n for n in res.notes)


def test_gaps_from_intervals():
    assert gaps_from_intervals([]) == (0.0, 0.0, 0.0)
    span, busy, gap = gaps_from_intervals([(0, 10), (12, 20), (20, 30)])
    assert (span, busy, gap) == (30, 28, 2)


def test_comm_intervals_prefer_nccl_kernels():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 5, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 3},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 0, "dur": 1},
    ]}
    assert comm_intervals(trace) == [(5.0, 8.0)]
    trace["traceEvents"] = trace["traceEvents"][1:]
    assert comm_intervals(trace) == [(0.0, 1.0)]
