"""benchmarks/gpu/record_ckpt_nodes.py (the per-node memory trace of a checkpointed math-SDPA step) runs
on the CPU in its smoke mode and hooks every autograd node of the step."""

import os
import subprocess
import sys
from pathlib import Path

from labkit.core.provenance import load_measurement

REPO = Path(__file__).resolve().parents[3]


def test_ckpt_node_trace_smoke_runs_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, "benchmarks/gpu/record_ckpt_nodes.py", "--out", str(tmp_path), "--smoke"],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr
    cases = load_measurement(tmp_path / "ckpt_nodes.json", kind="ckpt_nodes")["data"]["cases"]
    assert [c["case"]["checkpoint_impl"] for c in cases] == ["hf", "torch"]
    for c in cases:
        names = [n["node"] for n in c["nodes"]["nodes"]]
        # every node ran under both hooks (one row each), the attention's softmax among them
        assert names[0] == "NllLossBackward0" and "SafeSoftmaxBackward0" in names
        assert all(n["before"] is not None for n in c["nodes"]["nodes"])
