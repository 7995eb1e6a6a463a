"""DDP bucket sweep, profiled step and the simulator's buckets, on real gloo DDP training."""

from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.comm import ddp, simulate
from labkit.core.errors import LabkitError
from labkit.workloads import get_workload

SIZES = (0.05, 0.2)  # as in conftest.py's shared run


@pytest.fixture(scope="module")
def run(gloo2):
    return gloo2["sweep"], gloo2["observed_buckets"], gloo2["timeline"]


def test_sweep_rows(run):
    sweep = run[0]
    assert sweep.rows[0].bucket_cap_mb is None and sweep.rows[0].num_buckets is None  # the no_sync floor
    pts = [(r.bucket_cap_mb, r.gradient_as_bucket_view) for r in sweep.rows[1:]]
    assert pts == [(0.05, False), (0.2, False), (0.05, True), (0.2, True)]
    for r in sweep.rows:
        assert r.step_ms_min <= r.step_ms_p10 <= r.step_ms_median <= r.step_ms_p90 <= r.step_ms_max
        assert r.peak_allocated_bytes is None  # CPU ranks: no CUDA allocator
    for r in sweep.rows[1:]:
        assert r.exposed_ms == pytest.approx(r.step_ms_median - sweep.rows[0].step_ms_median)
    assert sweep.param_bytes == 4 * get_workload("tiny").config.num_params
    best = sweep.best()
    assert best.step_ms_median == min(r.step_ms_median for r in sweep.rows[1:])


def test_simulator_buckets_match_ddp(run):
    sweep, real = run[0], run[1]
    events = simulate.gpt_grad_schedule(get_workload("tiny").config, 2, 0.01)
    for mb in SIZES:
        predicted = [b for b, _ in simulate.buckets(events, int(mb * 2**20))]
        assert predicted == real[mb]  # same bucket boundaries, byte for byte
        assert [r.num_buckets for r in sweep.rows if r.bucket_cap_mb == mb] == [len(predicted)] * 2


def test_profiled_step_timeline(run):
    tl = run[2]
    assert tl.source == "cpu"
    assert tl.n_comm_ops == len(run[1][0.05])  # one gloo all-reduce per bucket
    assert all(n.startswith("gloo:") for n in tl.comm_names)
    assert 0 < tl.backward_compute_us <= tl.span_us
    assert tl.exposed_comm_us == pytest.approx(tl.comm_us - tl.overlapped_us)
    assert 0.0 <= tl.exposed_fraction <= 1.0


def test_parse_bucket_sizes():
    assert ddp.parse_bucket_sizes("1, 25,100") == [1.0, 25.0, 100.0]
    for bad in ("", "a", "0", "-1"):
        with pytest.raises(LabkitError):
            ddp.parse_bucket_sizes(bad)


def test_cli_buckets_json(capsys):
    rc = main(["comm", "buckets", "--world", "2", "--sizes", "0.2", "--steps", "1",
               "--gradient-as-bucket-view", "on", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["world"] == 2 and doc["workload"] == "tiny"
    assert [(r["bucket_cap_mb"], r["gradient_as_bucket_view"], r["num_buckets"]) for r in doc["rows"]] == \
        [(None, False, None), (0.2, True, 2)]


def test_cli_buckets_errors(capsys):
    assert main(["comm", "buckets", "--sizes", "1,x"]) == 2
    assert "cannot read 'x'" in capsys.readouterr().err
    assert main(["comm", "buckets", "--model", "gpt5"]) == 2
    assert "unknown workload" in capsys.readouterr().err
