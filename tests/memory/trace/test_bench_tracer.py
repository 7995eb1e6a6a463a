"""benchmarks/bench_tracer.py's 7B Llama benchmark (issue 11's speed target) runs, at a short sequence here."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_7b_benchmark_runs_with_the_recompute_it_is_given():
    r = subprocess.run([sys.executable, "benchmarks/bench_tracer.py", "--model", "llama-7b", "--repeats", "1",
                        "--seq", "256", "--recompute", "every-4"], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "batch 1 x 256, bf16, recompute every-4" in r.stdout and "6.74B parameters" in r.stdout
    assert "median" in r.stdout and ": PASS" in r.stdout
