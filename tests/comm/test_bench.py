"""Collective benchmark: nccl-tests' size and bandwidth conventions, and real gloo runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.comm import bench
from labkit.core.errors import LabkitError

REPO = Path(__file__).resolve().parents[2]


def test_size_ladder_doubles_inclusive():
    assert bench.size_ladder("4KiB", "64KiB") == [4096, 8192, 16384, 32768, 65536]
    assert bench.size_ladder(4096, 65536, 4) == [4096, 16384, 65536]
    with pytest.raises(LabkitError, match="empty"):
        bench.size_ladder("1MiB", "4KiB")
    with pytest.raises(LabkitError, match="cannot read"):
        bench.size_ladder("four", "1MiB")


def test_parse_ops():
    assert bench.parse_ops("all") == list(bench.OPS)
    assert bench.parse_ops("all_reduce,broadcast") == ["all_reduce", "broadcast"]
    with pytest.raises(LabkitError, match="allreduce"):
        bench.parse_ops("allreduce")


def test_element_count_follows_nccl_tests_total_size():
    # all_gather: bytes is the gathered total, each of 4 ranks contributes a quarter
    assert bench.element_count("all_gather", 4096, 4, 4) == (256, 4096)
    # reduce_scatter: the input is the total; it is rounded down to divide among ranks
    assert bench.element_count("reduce_scatter", 4100, 4, 4) == (1024, 4096)
    assert bench.element_count("all_reduce", 4100, 4, 4) == (1025, 4100)
    with pytest.raises(LabkitError, match="smaller than one element"):
        bench.element_count("all_gather", 8, 4, 4)


@pytest.mark.parametrize("op,n,factor", [("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
                                         ("reduce_scatter", 8, 0.875), ("broadcast", 8, 1.0)])
def test_row_bandwidths_use_nccl_tests_factors(op, n, factor):
    row = bench.row_from_time(op, 10**9, n, 0.01)  # 1 GB in 10 ms
    assert row.algbw_GBps == pytest.approx(100.0)
    assert row.busbw_GBps == pytest.approx(100.0 * factor)
    assert row.time_us == pytest.approx(10_000.0)


def test_spawned_ranks_really_communicate(gloo2):
    assert gloo2["sane"] is True  # all_reduce and all_gather returned the right values on every rank
    assert gloo2["ctx"].launched_by == "spawn" and gloo2["ctx"].world == 2


def test_gloo_bench_rows(gloo2):
    res = gloo2["bench"]
    assert (res.backend, res.world, res.nodes) == ("gloo", 2, 1)
    assert [(r.op, r.bytes) for r in res.rows] == [(op, s) for op in bench.OPS for s in (4096, 65536)]
    for r in res.rows:
        assert r.time_us_min <= r.time_us <= r.time_us_max
        assert r.algbw_GBps == pytest.approx(r.bytes / (r.time_us * 1e-6) / 1e9)


@pytest.mark.parametrize("argv,msg", [
    (["--op", "alltoall"], "unknown collective"),
    (["--backend", "nccl"], "needs CUDA GPUs"),
    (["--world", "0"], "argument --world: must be an integer >= 1"),
    (["--max-bytes", "2"], "empty"),
])
def test_cli_bench_errors_exit_2(argv, msg, capsys):
    assert main(["comm", "bench", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_cli_bench_json_runs_unchanged_under_torchrun():
    """``labkit comm bench --json`` under torchrun: rank 0 prints one JSON document with nccl-tests' rows."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun, "torchrun ships with torch"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    r = subprocess.run([torchrun, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", "127.0.0.1:0", "-m", "labkit", "comm", "bench", "--op", "all_reduce,all_gather",
                        "--max-bytes", "64KiB", "--repeats", "2", "--json"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)  # exactly one JSON document: only rank 0 prints
    assert doc["bench"]["world"] == 2
    rows = doc["bench"]["rows"]
    assert [(row["op"], row["bytes"]) for row in rows] == [(op, s) for op in ("all_reduce", "all_gather")
                                                           for s in (4096, 16384, 65536)]
    for row in rows:
        assert {"bytes", "time_us", "algbw_GBps", "busbw_GBps"} <= set(row)
        factor = 1.0 if row["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor)
    assert any("no topology prediction" in n for n in doc["bench"]["notes"])
    assert {f["op"] for f in doc["fits"]} <= {"all_reduce", "all_gather"}
