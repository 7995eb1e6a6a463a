"""benchmarks/gpu/record_target.py (the target's facts as a GPU shows them) runs on the CPU in its smoke mode
and names every fact of targets/h200.json; without a GPU and without --smoke it refuses in one line."""

import os
import subprocess
import sys
from pathlib import Path

from labkit.core.provenance import load_measurement
from labkit.memory.trace.fake.targets import H200

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}


def test_record_target_smoke_runs_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, "benchmarks/gpu/record_target.py", "--out", str(tmp_path), "--smoke"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    data = load_measurement(tmp_path / "target.json", kind="target")["data"]
    assert data["smoke"] and set(data["seen"]) == set(H200) and data["facts_check"] == {}


def test_record_target_without_a_gpu_says_so(tmp_path):
    r = subprocess.run([sys.executable, "benchmarks/gpu/record_target.py", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "no CUDA GPU" in r.stderr
    assert not (tmp_path / "target.json").exists()
