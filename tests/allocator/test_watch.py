"""labkit.allocator.watch on a CPU: a fake torch.cuda surface (monkeypatched) drives the real watch code with the
snapshots, messages and statistics of the OOMs recorded on the H200 (data/measurements/allocator/oom__*)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labkit.allocator import capture, recorded, watch, watcher
from labkit.allocator.snapshot import _load_bytes
from labkit.cli import main

GiB = 1024**3
MiB = 1024**2
ROOT = Path(__file__).resolve().parents[2]


def recorded_case(name):
    d = recorded.oom_case(name)["data"]
    snap = _load_bytes(recorded.oom_snapshot_path(name).read_bytes(), name)
    return d, snap


class FakeCuda:
    """The parts of torch.cuda that watch touches, with a recorded snapshot and statistics behind them."""

    def __init__(self, monkeypatch, snapshot=None, stats=None, available=True):
        self.history_calls = []
        self.observer = None
        self.snapshot = snapshot
        self.stats = dict(stats or {"allocated_bytes.all.current": 0, "reserved_bytes.all.current": 0})
        self.series = None  # optional list of allocated values, one per memory_stats() call
        m = monkeypatch
        m.setattr(torch.cuda, "is_available", lambda: available)
        m.setattr(torch.cuda, "is_initialized", lambda: True)
        m.setattr(torch.cuda, "current_device", lambda: 0)
        m.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake H200")
        m.setattr(torch.cuda, "memory_stats", self.memory_stats)
        m.setattr(torch.cuda, "_lazy_call", lambda fn, **kw: fn())
        m.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: self.history_calls.append(kw))
        m.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: self.snapshot)
        m.setattr(torch._C, "_cuda_attach_out_of_memory_observer", self.attach, raising=False)
        m.setattr(watcher, "_OBSERVER_ATTACHED", False)
        m.setattr(watcher, "_ACTIVE", [])
        m.delenv("LABKIT_WATCH_RUN_DIR", raising=False)
        m.delenv("TORCHELASTIC_RUN_ID", raising=False)
        m.delenv("RANK", raising=False)

    def attach(self, fn):
        self.observer = fn

    def memory_stats(self, device=None):
        st = dict(self.stats)
        if self.series:
            st["allocated_bytes.all.current"] = self.series.pop(0)
        return st

    def oom(self, message, request):
        """What the allocator does: the observer first, then the exception."""
        self.observer(0, request, 0, 0)
        raise torch.OutOfMemoryError(message)


def cpu_training(steps):
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(steps):
        p.sum().backward()
        opt.step()  # watch samples memory_stats() here, through the global optimizer hook
        opt.zero_grad()


def only_rank_folder(tmp_path):
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1
    folders = capture.rank_folders(runs[0])
    assert [f.name for f in folders] == ["rank0"]
    return folders[0]


def test_fragmentation_oom_is_captured_with_a_verdict_checked_by_the_simulator(monkeypatch, tmp_path):
    d, snap = recorded_case("fragmentation")
    fake = FakeCuda(monkeypatch, snapshot=snap, stats=d["stats"])
    with pytest.raises(torch.OutOfMemoryError):
        with watch(tmp_path, quiet=True):
            cpu_training(3)
            fake.oom(d["oom_message"], d["request_bytes"])
    folder = only_rank_folder(tmp_path)
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([capture.MANIFEST, capture.STATS, capture.STATS_AT_OOM, capture.SNAPSHOT, capture.MESSAGE,
                            capture.VERDICT_TXT, capture.VERDICT_JSON])
    c = capture.read_capture(folder)
    assert c.complete and c.state == "complete" and len(c.steps) == 3 and c.manifest["oom"]
    assert c.manifest["oom_info"]["request_bytes"] == d["request_bytes"]
    v = c.verdict["findings"][0]
    assert v["kind"] == "fragmentation" and v["verified"] is True and "expandable_segments:True" in v["fix"]
    assert "the fix is confirmed by the simulator" in (folder / capture.VERDICT_TXT).read_text()
    # recording: a bounded ring buffer without stack traces, switched off again at the end
    assert fake.history_calls[0] == {"enabled": "all", "context": None, "stacks": "python",
                                     "max_entries": watcher.DEFAULT_MAX_ENTRIES}
    assert fake.history_calls[-1] == {"enabled": None}
    # the optimizer hook is gone after the block
    cpu_training(2)
    assert len(capture.read_capture(folder).steps) == 3


def test_leak_is_named_from_the_per_step_series(monkeypatch, tmp_path):
    d, snap = recorded_case("leak")
    fake = FakeCuda(monkeypatch, snapshot=snap, stats=d["stats"])
    fake.series = list(d["allocated_after_step_bytes"])

    @watch(tmp_path, quiet=True)
    def train():
        for _ in d["allocated_after_step_bytes"]:
            w = watcher._ACTIVE[-1]
            w.step()  # no optimizer in this loop: the user marks the steps
        fake.oom(d["oom_message"], 198 * MiB)

    with pytest.raises(torch.OutOfMemoryError):
        train()
    c = capture.read_capture(only_rank_folder(tmp_path))
    assert [r["allocated_bytes.all.current"] for r in c.steps] == d["allocated_after_step_bytes"]
    assert c.verdict["findings"][0]["kind"] == "growth"


def test_too_large_is_captured(monkeypatch, tmp_path):
    d, snap = recorded_case("too_large")
    fake = FakeCuda(monkeypatch, snapshot=snap, stats=d["stats"])
    with pytest.raises(torch.OutOfMemoryError):
        with watch(tmp_path, quiet=True):
            fake.oom(d["oom_message"], d["request_bytes"])
    f = capture.read_capture(only_rank_folder(tmp_path)).verdict["findings"][0]
    assert f["kind"] == "too_large" and f["verified"] is True


def test_without_a_gpu_watch_is_a_no_op_with_one_line(monkeypatch, tmp_path, capsys):
    FakeCuda(monkeypatch, available=False)
    with watch(tmp_path) as w:
        w.step()
        cpu_training(1)
    assert capsys.readouterr().err.strip() == "labkit watch: no CUDA GPU here: nothing is recorded (watch is a no-op)"
    assert not w.active and list(tmp_path.iterdir()) == []


def test_ranks_get_their_own_folders(monkeypatch, tmp_path):
    FakeCuda(monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job/7")
    folders = []
    for rank in (0, 1, 0):
        monkeypatch.setenv("RANK", str(rank))
        with watch(tmp_path, quiet=True) as w:
            w.step()
        folders.append(w.folder)
    assert [f.name for f in folders] == ["rank0", "rank1", "rank0.1"]
    assert len({f.parent for f in folders}) == 1 and folders[0].parent.name == "torchrun-job_7"
    for f in folders:
        c = capture.read_capture(f)
        assert c.complete and len(c.steps) == 1 and c.manifest["pid"] == os.getpid()
    assert [f.name for f in capture.rank_folders(folders[0].parent)] == ["rank0", "rank0.1", "rank1"]


def test_a_full_disk_keeps_what_was_written_and_marks_the_capture_incomplete(monkeypatch, tmp_path):
    d, snap = recorded_case("fragmentation")
    fake = FakeCuda(monkeypatch, snapshot=snap, stats=d["stats"])
    real_atomic = capture.CaptureWriter._atomic

    def full(self, name, data):
        if name == capture.SNAPSHOT:  # the big file is the one that does not fit
            self._fail(f"writing {name}", OSError(28, "No space left on device"))
            return False
        return real_atomic(self, name, data)

    monkeypatch.setattr(capture.CaptureWriter, "_atomic", full)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):  # the user's error still propagates
        with watch(tmp_path, quiet=True):
            cpu_training(2)
            fake.oom(d["oom_message"], d["request_bytes"])
    c = capture.read_capture(only_rank_folder(tmp_path))
    assert not c.complete and "No space left on device" in c.reason
    assert len(c.steps) == 2 and c.oom_message.startswith("CUDA out of memory")
    # the verdict comes from what was written: the message and the statistics (no snapshot to replay)
    assert c.verdict["findings"][0]["kind"] == "fragmentation" and c.verdict["findings"][0]["verified"] is None


def test_a_killed_run_reads_as_incomplete_with_the_steps_so_far(tmp_path):
    code = ("import os, signal, sys; from pathlib import Path; from labkit.allocator import capture\n"
            "w = capture.CaptureWriter(capture.make_rank_folder(Path(sys.argv[1]), 0), {'rank': 0, 'settings': {}})\n"
            "for i in range(3): w.append_step({'step': i, 'allocated_bytes.all.current': i})\n"
            "w._stats.write('{\"step\": 3, \"alloc'); w._stats.flush()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGKILL
    c = capture.read_capture(tmp_path / "rank0")
    assert not c.complete and "stopped before watch finished" in c.reason
    assert [s["step"] for s in c.steps] == [0, 1, 2] and any("cut short" in n for n in c.notes)
    assert main(["watch", "--show", str(tmp_path)]) == 0


def test_script_form_hooks_after_import_torch(monkeypatch, tmp_path):
    """install_from_env is what the sitecustomize calls after `import torch` in the user's unedited script."""
    d, snap = recorded_case("fragmentation")
    fake = FakeCuda(monkeypatch, snapshot=snap, stats=d["stats"])
    monkeypatch.setenv("LABKIT_WATCH_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("LABKIT_WATCH_OPTS", json.dumps({"quiet": True}))
    hooks = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: hooks.append(a))
    monkeypatch.setattr("atexit.register", lambda fn: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    w = watcher.install_from_env()
    assert w.active
    cpu_training(4)
    try:
        fake.oom(d["oom_message"], d["request_bytes"])
    except torch.OutOfMemoryError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)  # the script ended with this exception
    assert hooks and hooks[0][0] is torch.OutOfMemoryError  # the previous hook still prints it
    c = capture.read_capture(tmp_path / "run" / "rank0")
    assert c.complete and len(c.steps) == 4 and c.verdict["findings"][0]["kind"] == "fragmentation"


def test_sitecustomize_hooks_a_real_interpreter_and_chains_the_users_own(tmp_path):
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import sys; print('user sitecustomize ran', file=sys.stderr)\n")
    from labkit.allocator.watch_cli import boot_dir

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(boot_dir()), str(ROOT), str(user)]),
           "LABKIT_WATCH_RUN_DIR": str(tmp_path / "run"), "LABKIT_WATCH_OPTS": json.dumps({"verbose": True})}
    r = subprocess.run([sys.executable, "-c", "import torch; print('trained')"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "trained"
    assert "user sitecustomize ran" in r.stderr and "labkit watch: hooked into pid" in r.stderr
    assert not (tmp_path / "run").exists()  # CUDA never initialised (no GPU, or a launcher): nothing written


def test_cli_without_a_gpu_runs_the_command_and_says_so(tmp_path, capfd):
    if torch.cuda.is_available():
        pytest.fail("this test expects the CPU-only CI machine")
    rc = main(["watch", "--out", str(tmp_path), "--", sys.executable, "-c", "import sys; sys.exit(3)"])
    assert rc == 3
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["labkit watch: no CUDA GPU here: running the command without watching (watch is a no-op)"]
    assert main(["watch"]) == 2
    assert "give the command to run after --" in capfd.readouterr().err
    assert main(["watch", "--out", "", "--", "true"]) == 2
    assert "--out is empty" in capfd.readouterr().err


def test_watch_refuses_bad_settings():
    from labkit.core.errors import LabkitError

    with pytest.raises(LabkitError, match="detail must be one of"):
        watch(detail="everything")
    with pytest.raises(LabkitError, match="max_entries"):
        watch(max_entries=10)


def test_reduced_snapshot_keeps_what_the_doctor_needs():
    d, snap = recorded_case("fragmentation")
    small = watcher.reduce_snapshot(snap)
    from labkit.allocator import diagnose

    f = diagnose(stats=d, snapshot=small).findings[0]
    assert f.kind == "fragmentation" and f.verified is True
