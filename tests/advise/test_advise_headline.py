"""advise headlines the traced per-GPU peak wherever it traced the model, the estimator beside it
with its measured error (issue 26)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from labkit.advise.advice import ESTIMATOR_ERROR, advise
from labkit.memory.estimate.planner import traced_headline
from labkit.advise.request import Job, MachineSource, ModelSource


def _layout(tp=1, pp=1, dp=1, micro_batches=1):
    return SimpleNamespace(tp=tp, pp=pp, dp=dp, micro_batches=micro_batches)


def test_traced_headline_by_layout():
    assert traced_headline(100, 100, 130, _layout())[0] == 130            # one GPU: the trace itself
    assert traced_headline(80, 100, 130, _layout(dp=4))[0] == 110         # DP/ZeRO: + what the estimator missed
    assert traced_headline(60, 100, 130, _layout(tp=2, dp=2))[0] == 60    # TP/PP: the estimator (not traced per rank)


def test_single_gpu_hf_config_headlines_the_trace(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
                               "n_positions": 128}))
    a = advise(ModelSource(hf_config=str(cfg)), Job(seq=128, global_batch=2, micro_batch=2, recompute="none"),
               MachineSource(gpus=1, gpu_memory_bytes=80 * 2**30))
    assert a.fits and (a.layout["tp"], a.layout["pp"], a.layout["dp"]) == (1, 1, 1)
    ev = {e.what: e for e in a.evidence}
    traced = ev["fake-mode peak of one unsharded step (tp=pp=dp=1)"].value
    assert ev["per-GPU peak allocated (most loaded GPU)"].value == traced
    assert "labkit.memory.trace" in ev["per-GPU peak allocated (most loaded GPU)"].source
    assert "measured error" in ev["estimator's per-GPU peak for this layout"].unit


def test_untraced_preset_says_the_estimators_error():
    a = advise(ModelSource(preset="llama2-7b"), Job(seq=4096, global_batch=64),
               MachineSource(gpus=8, gpu_memory_bytes=141 * 10**9), trace=False)
    assert any(ESTIMATOR_ERROR in n for n in a.notes)
