import json

import pytest
import torch

from labkit.core.errors import LabkitError
from labkit.memory.trace.phases import phase_snapshots, profiler_memory_timeline


def test_phase_snapshots_on_cpu_use_the_tracker():
    m = torch.nn.Linear(128, 128)
    x = torch.randn(32, 128)
    snaps = phase_snapshots()
    assert snaps.use_tracker and snaps.device == "cpu"
    snaps.track_existing(list(m.parameters()) + [x])
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        with snaps.phase("forward"):
            loss = m(x).square().mean()
        with snaps.phase("backward"):
            loss.backward()
        with snaps.phase("optimizer"):
            opt.step()
            opt.zero_grad()
    names = [s.name for s in snaps.snapshots]
    assert names == ["forward", "backward", "optimizer"] * 2
    params = sum(p.numel() * 4 for p in m.parameters())
    fwd = snaps.snapshots[0]
    # the forward's output (32x128 float32) is live at the end of the forward
    assert fwd.end_allocated - fwd.start_allocated >= 32 * 128 * 4
    # after the first step the momentum buffers exist: a parameter's worth more than before it
    # (plus the 4-byte loss of step 1, still referenced by `loss`)
    assert snaps.snapshots[3].start_allocated - snaps.snapshots[0].start_allocated == params + 4
    assert snaps.peaks["backward"] >= snaps.snapshots[1].start_allocated + params
    assert "forward" in snaps.table()
    with pytest.raises(LabkitError, match="no CUDA GPU"):
        if not torch.cuda.is_available():
            phase_snapshots("cuda")
        else:
            raise LabkitError("no CUDA GPU (skipped meaning on a GPU machine)")


def test_profiler_memory_timeline_export(tmp_path):
    m = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64)

    def step():
        m(x).sum().backward()

    p = profiler_memory_timeline(step, tmp_path / "timeline.json", device="cpu")
    times, sizes = json.loads(p.read_text())
    assert len(times) == len(sizes) > 0
    assert max(sum(s) for s in sizes) > 0
    from labkit.memory.trace.phases import read_profiler_timeline

    tl = read_profiler_timeline(p)
    assert tl.times_us[0] == 0 and len(tl.times_us) == len(times)
    # microseconds, as torch writes them: the span read is the file's own (it was once divided by 1000 here and
    # again by the figure, two steps drawn 8 us apart)
    assert tl.times_us[-1] == times[-1] - times[0]
    from labkit.viz.trace import profiler_timeline

    fig = profiler_timeline(tl.times_us, tl.by_category, title="t", source="measured here")
    drawn = fig.renderers[0].data_source.data["t"]
    assert drawn[-1] == (times[-1] - times[0]) / 1000 and fig.xaxis[0].axis_label == "time, ms"
    assert max(tl.by_category["parameters"]) >= 64 * 65 * 4      # the Linear's weight and bias
    assert max(tl.by_category["gradients"]) > 0
    assert tl.peak_bytes >= max(tl.by_category["parameters"])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(LabkitError, match="not a torch.profiler memory timeline"):
        read_profiler_timeline(bad)


def test_measure_cli_json(run_cli):
    r = run_cli("measure", "--model", "tiny", "--device", "fake-cuda", "--precision", "amp-bf16",
                "--checkpointing", "full", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["device"] == "fake-cuda" and doc["policy"]["recompute"] == "full"
    assert doc["peak_bytes"] == max(p["peak_bytes"] for p in doc["by_phase"])
    assert [p["phase"] for p in doc["by_phase"]] == ["forward", "loss", "backward", "optimizer", "zero_grad"]
    assert doc["by_category"]["parameters"] > 0


def test_measure_cli_table_and_errors(run_cli, capsys):
    r = run_cli("measure", "--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "16", "--vocab", "64",
                "--batch", "2", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "peak" in r.stdout and "measured on this CPU" in r.stdout and "backward" in r.stdout
    # the refusals through the CLI's entry point in this process (no interpreter start-up each)
    from labkit.cli import main

    capsys.readouterr()
    assert main(["measure", "--model", "tiny", "--checkpointing", "every-0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # the old flag's deprecation line, then the error
    assert len(lines) == 2 and "--checkpointing is deprecated" in lines[0] and "every-0" in lines[1], lines
    assert main(["measure", "--hidden", "30", "--heads", "4"]) == 2
    err = capsys.readouterr().err
    assert "divisible" in err and len(err.strip().splitlines()) == 1, err


def test_measure_replays_reserved_from_a_snapshots_segments(tmp_path, capsys):
    import json
    import pickle

    from labkit.cli import main

    mib = 1 << 20
    snap = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 1024 * mib, "allocated_size": 512 * mib,
                          "active_size": 512 * mib, "stream": 0, "segment_type": "large",
                          "blocks": [{"size": 512 * mib, "state": "active_allocated"},
                                     {"size": 512 * mib, "state": "inactive"}]}],
            "device_traces": [[]]}
    path = tmp_path / "held.pickle"
    path.write_bytes(pickle.dumps(snap))
    args = ["measure", "--layers", "1", "--hidden", "64", "--heads", "2", "--seq", "32", "--vocab", "128",
            "--micro-batch", "2", "--json"]
    capsys.readouterr()
    assert main(args) == 0
    bare = json.loads(capsys.readouterr().out)
    assert main(args + ["--allocator-state", str(path)]) == 0
    held = json.loads(capsys.readouterr().out)
    # the held 1 GiB stays reserved and the step's large blocks fit in its free half: only a small-pool segment
    # is added (the workspaces are taken to be in the snapshot's process already)
    assert bare["reserved_bytes"] == 66 * mib and held["reserved_bytes"] == 1024 * mib + 2 * mib
    assert held["peak_bytes"] >= bare["peak_bytes"] + 512 * mib - 64 * mib
    assert main(args[:-1] + ["--allocator-state", str(path)]) == 0
    assert f"from the segments of {path}" in capsys.readouterr().out
    assert main(args + ["--allocator-state", str(tmp_path / "none.pickle")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.pickle" in err[0], err


def test_gpu_recording_script_dry_runs_on_cpu(tmp_path, bench_script, capsys):
    """benchmarks/gpu/record_measure.py --smoke: tiny cases on the CPU, the same files as on a GPU."""
    from labkit.core.provenance import load_measurement

    bench_script("record_measure").main(["--out", str(tmp_path), "--smoke"])
    out = capsys.readouterr().out
    assert "no CUDA GPU" in out or "device cuda" in out
    peaks = load_measurement(tmp_path / "reference_peaks.json", kind="measure_peaks")
    cases = peaks["data"]["cases"]
    assert {c["model"] for c in cases} == {"labkit-gpt", "hf-gpt2"}
    for c in cases:
        assert c["fake_inputs"]["precision"] == c["precision"] and c["peak_allocated"] > 0
    sweep = load_measurement(tmp_path / "sweep_checkpointing.json", kind="measure_sweep")
    assert [p["recompute"] for p in sweep["data"]["points"]][:3] == ["none", "selective", "full"]
    # a new recording states the optimizer implementation and loads back as it ran
    from labkit.core.vocab import OptimizerSpec
    from labkit.memory.trace.recorded import load_recorded_peaks

    assert {c.optimizer for c in load_recorded_peaks(tmp_path / "reference_peaks.json")} == {OptimizerSpec("adamw", "fused")}
    assert (tmp_path / "tracer_overhead.json").exists()
    snaps = load_measurement(tmp_path / "api_phase_snapshots.json", kind="measure_api_snapshots")["data"]
    assert [s["name"] for s in snaps["snapshots"]] == ["forward", "backward", "optimizer"] * 2
    assert (tmp_path / "api_profiler_timeline.json").exists()


def _fake_cuda_stats(monkeypatch):
    """Make torch.cuda's statistics functions answer from a dict (the CUDA path runs on a CPU build);
    memory_summary stays torch's own formatter, fed by the patched memory_stats."""
    import collections

    import torch.cuda.memory as tcm

    state = {"cur": 1000, "peak": 1000}
    stats = collections.defaultdict(int)
    for k in ("num_ooms", "num_alloc_retries", "num_sync_all_streams", "num_device_alloc", "num_device_free"):
        stats[k] = 0

    def memory_stats(device=None):
        for n in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes", "inactive_split_bytes"):
            for pool in ("all", "large_pool", "small_pool"):
                stats[f"{n}.{pool}.current"] = state["cur"]
                stats[f"{n}.{pool}.peak"] = state["peak"]
        return stats

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["cur"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 2 * state["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: state.update(peak=state["cur"]))
    monkeypatch.setattr(tcm, "memory_stats", memory_stats)
    monkeypatch.setattr(torch.cuda, "memory_summary",
                        lambda device=None, abbreviated=False: tcm.memory_summary(device=0, abbreviated=abbreviated))
    return state


def test_summary_excerpt_of_torch_memory_summary(monkeypatch):
    from labkit.memory.trace.phases import summary_excerpt

    _fake_cuda_stats(monkeypatch)
    text = torch.cuda.memory_summary(0, abbreviated=True)
    ex = summary_excerpt(text)
    rows = ex.splitlines()
    assert rows[0].lstrip("| ").startswith("CUDA OOMs")
    assert any(r.lstrip("| ").startswith("Allocated memory") for r in rows)
    assert any(r.lstrip("| ").startswith("GPU reserved memory") for r in rows)
    assert not any("Oversize" in r for r in rows)
    assert len(summary_excerpt(text, 3).splitlines()) == 3


def test_phase_snapshots_cuda_path(monkeypatch):
    state = _fake_cuda_stats(monkeypatch)
    snaps = phase_snapshots("cuda")
    assert not snaps.use_tracker
    with snaps.phase("forward"):
        state["cur"] = 5000
        state["peak"] = 9000
    with snaps.phase("backward"):
        state["cur"] = 3000
    f, b = snaps.snapshots
    assert (f.start_allocated, f.peak_allocated, f.end_allocated, f.peak_reserved) == (1000, 9000, 5000, 18000)
    assert (b.start_allocated, b.peak_allocated, b.end_allocated) == (5000, 5000, 3000)
    assert f.source == "torch.cuda allocator stats" and "Allocated memory" in f.summary_excerpt
    assert snaps.peaks == {"forward": 9000, "backward": 5000}
