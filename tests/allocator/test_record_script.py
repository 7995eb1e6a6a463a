"""The GPU recording script runs its workloads on the CPU (smoke) and skips CUDA-only parts with a reason."""

import importlib.util
from pathlib import Path

from labkit.allocator.experiments import RECORDED_CONFIGS, train_then_eval, varlen_train
from labkit.allocator.config import parse_alloc_conf

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("record_allocator", ROOT / "benchmarks/gpu/record_allocator.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recorded_configs_parse():
    for conf in RECORDED_CONFIGS.values():
        parse_alloc_conf(conf)


def test_workloads_run_on_cpu_smoke():
    import torch

    r = varlen_train(torch.device("cpu"), steps=3, smoke=True)
    assert len(r.steps) == 3 and len({s.tokens for s in r.steps}) >= 1
    r2 = train_then_eval(torch.device("cpu"), train_steps=2, eval_batches=1, smoke=True)
    assert [s.phase for s in r2.steps] == ["train", "train", "eval"]


def test_children_skip_cuda_parts_with_a_reason(tmp_path, capsys):
    mod = _load()
    assert mod.main(["--out", str(tmp_path), "--smoke", "--child", "oom", "--case", "too_large"]) == 0
    assert mod.main(["--out", str(tmp_path), "--smoke", "--child", "empty_cache"]) == 0
    out = capsys.readouterr().out
    assert "skipped, needs CUDA" in out
