"""``labkit advise`` and ``labkit estimate --plan`` print one step time and one per-GPU peak for one
job (issue 26): both call ``labkit.memory.estimate.planner.headline`` on the same best layout, with the
same traced step where the model is traced (a Hugging Face config) and the estimator and FLOPs model
where it is not (a preset)."""

from __future__ import annotations

import json

import pytest

from labkit.advise import Job, MachineSource, ModelSource, advise
from labkit.cli import main


def _plan(capsys, *argv) -> dict:
    rc = main(["estimate", "--plan", *argv, "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> str:
    cfg = tmp_path_factory.mktemp("cfg") / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
                               "n_positions": 128}))
    return str(cfg)


def _agree(adv, doc) -> dict:
    head = doc["headline"]
    best = doc["ranked"][0]
    assert (best["tp"], best["pp"], best["dp"], best["micro_batch"], best["recompute"]) == (
        adv.layout["tp"], adv.layout["pp"], adv.layout["dp"], adv.layout["micro_batch"], adv.layout["recompute"])
    assert abs(head["step_s"] / adv.step_time_s - 1) < 0.10
    assert head["peak_bytes"] == adv.peak_bytes
    return head


@pytest.mark.parametrize("gpus,global_batch", [(1, 4), (8, 16)])
def test_traced_job_one_answer(capsys, tiny_gpt2, gpus, global_batch):
    """A traced model, on one GPU and data-parallel over 8: the step priced op by op, the traced peak."""
    adv = advise(ModelSource(hf_config=tiny_gpt2), Job(seq=128, global_batch=global_batch),
                 MachineSource(gpus=gpus, gpu_memory_bytes=80 * 2**30))
    doc = _plan(capsys, "--hf-config", tiny_gpt2, "--seq", "128", "--global-batch", str(global_batch),
                "--gpus", str(gpus), "--gpu-memory", "80GiB")
    head = _agree(adv, doc)
    assert "op by op" in head["step_source"]
    if gpus == 1:
        assert "labkit.memory.trace" in head["peak_source"] and head["peak_bytes"] != head["estimator_peak_bytes"]
    # the op-by-op price, not the FLOPs model's: a tiny model's step is bound by kernel launches and the host
    assert head["step_s"] > 2 * head["flops_step_s"]
    # the runners-up stay on the model they were ranked by, beside the best's figure on it
    assert adv.ranking_step_time_s == pytest.approx(head["flops_step_s"])
    assert all(r["step_time_s"] >= adv.ranking_step_time_s for r in adv.runners_up)


def test_untraced_7b_over_8_gpus_one_answer(capsys):
    """Llama-2-7B (a preset: not traced) on 8 GPUs of 141 GB: the estimator's peak, the FLOPs model's step."""
    adv = advise(ModelSource(preset="llama2-7b"), Job(seq=4096, global_batch=64),
                 MachineSource(gpus=8, gpu_memory_bytes=141 * 10**9), trace=False)
    doc = _plan(capsys, "--model", "llama2-7b", "--seq", "4096", "--global-batch", "64", "--gpus", "8",
                "--gpu-memory", "141GB")
    head = _agree(adv, doc)
    assert head["step_s"] == head["flops_step_s"] and "not traced" in head["step_source"]
    assert "measured error" in head["peak_source"]


def test_traced_step_scaled_to_the_layout():
    """Forward and backward once per micro-batch and split over tp x pp; the optimizer once, sharded by ZeRO."""
    from labkit.memory.estimate import ParallelSpec, TrainSpec
    from labkit.memory.estimate.planner import TracedStep, h200_cluster, step_time
    from labkit.memory.estimate.presets import get_preset

    m = get_preset("llama2-7b")
    traced = TracedStep(1, "none", 1, step_s=1.0, source="test", optimizer_s=0.2)
    train = TrainSpec(micro_batch=1, seq=4096)
    t = step_time(m, ParallelSpec(dp=8, zero=3), train, h200_cluster(8), 4, traced=traced)
    assert t.compute_s == pytest.approx(0.8 * 4 + 0.2 / 8)
    t = step_time(m, ParallelSpec(tp=2, dp=4), train, h200_cluster(8), 4, traced=traced)
    assert t.compute_s == pytest.approx((0.8 * 4 + 0.2) / 2)
    assert step_time(m, ParallelSpec(), train, h200_cluster(1), 1, traced=traced).total_s == pytest.approx(1.0)
