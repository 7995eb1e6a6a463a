"""The simulator against the real allocator: traces and memory_stats() recorded on an H200
(benchmarks/gpu/record_allocator.py, one fresh process per PYTORCH_ALLOC_CONF)."""

import pytest

from labkit.allocator import compile_trace, read_snapshot, replay, replay_with_sim
from labkit.allocator import recorded
from labkit.core.paths import DATA_DIR

RUNS = recorded.recorded_runs()
WORKLOADS = sorted({r.workload for r in RUNS})


def test_recordings_are_present_with_provenance():
    assert len(WORKLOADS) >= 2 and len(RUNS) >= 12
    for r in RUNS:
        assert r.provenance["gpu_name"] and "H200" in r.device_name
        assert r.stats["num_ooms"] == 0 and r.oom_message is None
        if r.cap_bytes is None:
            assert r.stats["num_alloc_retries"] == 0


def test_data_stays_small():
    total = sum(p.stat().st_size for p in (DATA_DIR / "traces").glob("*")) + \
        sum(p.stat().st_size for p in recorded.MEAS_DIR.glob("*"))
    assert total < 4 * 1024 * 1024


@pytest.fixture(scope="module")
def fidelity_rows():
    return recorded.fidelity()


def test_every_configuration_ran_the_same_requests(fidelity_rows):
    assert fidelity_rows and all(r.same_requests for r in fidelity_rows)


def test_default_trace_replayed_under_default_is_exact(fidelity_rows):
    rows = [r for r in fidelity_rows if r.config == "default"]
    assert len(rows) == len(WORKLOADS)
    for r in rows:
        assert r.simulated == r.real, r.workload


def test_default_trace_replayed_under_other_configurations_within_1_percent(fidelity_rows):
    others = [r for r in fidelity_rows if r.config != "default"]
    configs = {r.config for r in others}
    assert {"expandable", "max_split_128", "roundup_4", "expandable+roundup_4", "max_split_128+roundup_4"} <= configs
    for r in others:
        assert r.max_rel_error <= 0.01, (r.workload, r.config, r.real, r.simulated)
        assert r.extra["allocated_peak_sim"] == r.extra["allocated_peak_real"], (r.workload, r.config)


def test_memory_cap_decisions_match(fidelity_rows):
    """Under set_per_process_memory_fraction the real allocator garbage-collects, releases oversize blocks,
    flushes its cache and retries; the simulator makes the same decisions, as many times."""
    capped = [r for r in fidelity_rows if r.cap_bytes]
    assert {"cap", "cap+gc_0.6", "cap+expandable", "cap+max_split_128"} <= {r.config for r in capped}
    assert any(r.extra["num_alloc_retries_real"] > 0 for r in capped)
    assert any(r.extra["num_device_free_real"] > 10 for r in capped)
    for r in capped:
        assert r.simulated == r.real, (r.workload, r.config)
        for k in ("num_alloc_retries", "num_device_free", "num_ooms"):
            assert r.extra[f"{k}_sim"] == r.extra[f"{k}_real"], (r.workload, r.config, k)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_expandable_recording_replayed_under_every_configuration(workload):
    """The request stream does not depend on the recording configuration: the expandable-segments trace,
    replayed under each configuration, gives that configuration's real statistics too."""
    tr = compile_trace(read_snapshot(recorded.trace_path(workload, "expandable")))
    assert tr.complete and tr.recorded_conf == "expandable_segments:True"
    for run in (r for r in RUNS if r.workload == workload):
        res = replay(tr, run.alloc_conf, cap_bytes=run.cap_bytes, device_total_bytes=run.device_total_bytes)
        assert res.reserved_peak_bytes == run.stats["reserved_bytes.all.peak"], run.config
        assert res.segments_peak == run.stats["segment.all.peak"], run.config
        assert res.num_device_alloc == run.stats["num_device_alloc"], run.config


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("config, conf", [("default", ""), ("expandable", "expandable_segments:True")])
def test_replay_reproduces_every_address_and_the_final_segments(workload, config, conf):
    snap = read_snapshot(recorded.trace_path(workload, config))
    tr = compile_trace(snap)
    total = next(r.device_total_bytes for r in RUNS if r.workload == workload)
    sim = replay_with_sim(tr, conf, device_total_bytes=total)
    assert sim.addresses == tr.recorded_addresses
    real = sorted((s["address"], s["total_size"], s["allocated_size"]) for s in snap.segments)
    mine = sorted((s["address"], s["total_size"], s["allocated_size"]) for s in sim.segments())
    assert real == mine


def test_full_memory_stats_match_for_default(fidelity_rows):
    """Beyond the three headline numbers: every tracked counter of memory_stats() for the default run."""
    for wl in WORKLOADS:
        run = next(r for r in RUNS if r.workload == wl and r.config == "default")
        res = replay(recorded.trace_path(wl), "", device_total_bytes=run.device_total_bytes)
        skip = {"num_sync_all_streams"}
        for k, v in res.stats.items():
            if k in run.stats and k not in skip:
                assert v == run.stats[k], (wl, k, v, run.stats[k])


def test_cli_replay_of_a_recorded_trace_gives_the_real_numbers(capsys):
    import json

    from labkit.cli import main

    run = next(r for r in RUNS if r.workload == "train_then_eval" and r.config == "expandable")
    assert main(["alloc", "replay", str(recorded.trace_path("train_then_eval")), "--conf", run.alloc_conf, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reserved_peak_bytes"] == run.stats["reserved_bytes.all.peak"]
    assert doc["num_device_alloc"] == run.stats["num_device_alloc"] and doc["segments_peak"] == 0
