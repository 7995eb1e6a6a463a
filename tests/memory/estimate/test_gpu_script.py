"""The 2-rank GPU recording script runs its TP and FSDP2 code paths on CPU (gloo, --smoke), and
writes provenance-stamped results the estimator tests can read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from labkit.core.provenance import load_measurement

REPO = Path(__file__).resolve().parents[3]


def test_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "pm"
    r = subprocess.run([sys.executable, "benchmarks/gpu/record_parallel_memory.py", "--out", str(out), "--smoke",
                        "--steps", "2", "--parallel", "tp-sp", "fsdp", "--precisions", "amp-bf16"],
                       cwd=REPO, capture_output=True, text=True, timeout=240, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = load_measurement(out / "summary.json", "parallel_memory_summary")["data"]
    assert summary["errors"] == [], summary["errors"]
    assert sorted(summary["files"]) == sorted(f"tiny__{p}__amp-bf16.json" for p in ("tp-sp", "fsdp"))
    for name in summary["files"]:
        doc = load_measurement(out / name, "parallel_memory")
        ranks = doc["data"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        for rk in ranks:
            assert len(rk["losses"]) == 2 and all(l == l and l > 0 for l in rk["losses"])
            assert set(rk["step_records"][0]) >= {"forward", "backward", "optimizer"}
        if "fsdp" in name:  # parameters are sharded over the 2 ranks
            assert ranks[0]["local_param_elements"] < ranks[0]["param_count"] * 0.6
        else:  # TP: the blocks' matmuls are split, embeddings replicated
            assert ranks[0]["local_param_elements"] < ranks[0]["param_count"]
            assert ranks[0]["losses"] == ranks[1]["losses"]  # same batch, same replicated loss
    json.dumps(summary)
