"""Each axis of the model moves the bytes the way its mechanism says."""

from __future__ import annotations

import pytest

from labkit.core.errors import LabkitError
from labkit.memory.estimate import ModelSpec, ParallelSpec, TrainSpec, estimate, precision_bytes
from labkit.memory.estimate.presets import get_preset

M = ModelSpec(layers=24, hidden=2048, heads=16, vocab=50304, seq=2048, name="m")


def acts(par=ParallelSpec(), **kw):
    e = estimate(M, par, TrainSpec(**{"micro_batch": 2, "precision": "bf16-mixed", **kw}))
    return e.by_stage[0].phase_breakdown["backward"]


def test_keep_logits_adds_one_logits_copy():
    a = acts()["logits"]
    b = acts(keep_logits=True)["logits"]
    assert b - a == 2 * 2048 * 50304 * 2  # b s V in the activation dtype (bf16)


def test_vocab_parallel_splits_the_logits():
    full = acts(ParallelSpec(tp=4, vocab_parallel=False))["logits"]
    split = acts(ParallelSpec(tp=4, vocab_parallel=True))["logits"]
    assert split * 4 == pytest.approx(full, rel=1e-6)


def test_context_parallel_splits_the_sequence():
    one = acts()["activations"]
    two = acts(ParallelSpec(cp=2))["activations"]
    assert two == pytest.approx(one / 2, rel=0.02)


def test_dropout_adds_masks():
    assert acts(dropout=0.1)["activations"] > acts()["activations"]


def test_optimizers():
    mixed = {"precision": "bf16-mixed"}   # an fp32 master copy (4 B/param) beside the states
    assert precision_bytes(TrainSpec(optimizer="adamw", **mixed)).optimizer == 12
    assert precision_bytes(TrainSpec(optimizer="sgd", **mixed)).optimizer == 8
    assert precision_bytes(TrainSpec(optimizer="adam8bit", **mixed)).optimizer == pytest.approx(4 + 2 + 8 / 256)
    assert precision_bytes(TrainSpec(optimizer="adamw")).optimizer == 8     # fp32: the weights are the master copy
    e_adam = estimate(M, ParallelSpec(), TrainSpec(optimizer="adamw"))
    e_8bit = estimate(M, ParallelSpec(), TrainSpec(optimizer="adam8bit"))
    assert e_8bit.model_states["optimizer_state"] < e_adam.model_states["optimizer_state"] * 0.6
    assert isinstance(e_8bit.model_states["optimizer_state"], int)


def test_fp32_grad_accumulation_adds_two_bytes_per_param():
    a = estimate(M, ParallelSpec(), TrainSpec(precision="bf16-mixed")).model_states
    b = estimate(M, ParallelSpec(), TrainSpec(precision="bf16-mixed", fp32_grad_accum=True)).model_states
    assert b["gradients"] == 2 * a["gradients"]


def test_gradient_accumulation_keeps_grads_through_backward():
    one = estimate(M, ParallelSpec(), TrainSpec(micro_batch=2, global_batch=2))
    four = estimate(M, ParallelSpec(), TrainSpec(micro_batch=2, global_batch=8))
    assert four.micro_batches == 4
    assert four.by_stage[0].phase_breakdown["backward"]["gradients"] == four.model_states["gradients"]
    assert four.peak_allocated > one.peak_allocated


def test_foreach_adamw_temporary_and_fused():
    big = get_preset("llama3-8b")
    t = TrainSpec(micro_batch=1, recompute="full", precision="bf16")
    foreach = estimate(big, ParallelSpec(), t)
    fused = estimate(big, ParallelSpec(), TrainSpec(micro_batch=1, recompute="full", precision="bf16", optimizer_impl="fused"))
    assert foreach.by_stage[0].phases["optimizer"] - fused.by_stage[0].phases["optimizer"] == pytest.approx(
        2 * foreach.by_stage[0].params_local, rel=1e-6)  # one bf16 sqrt(v) list


def test_gqa_and_gated_mlp_presets():
    llama = get_preset("llama3-8b")
    assert llama.kv == 8 and llama.gated_mlp and llama.ffn_size == 14336
    e = estimate(llama, ParallelSpec(tp=8), TrainSpec(micro_batch=1))
    assert e.layer_activations["kept"] > 0


def test_validation_messages_name_the_input():
    with pytest.raises(LabkitError, match="--zero"):
        estimate(M, ParallelSpec(zero=4), TrainSpec())
    with pytest.raises(LabkitError, match="--vpp"):
        estimate(M, ParallelSpec(pp=1, vpp=2, schedule="interleaved"), TrainSpec())
    with pytest.raises(LabkitError, match="kv_heads"):
        ModelSpec(layers=2, hidden=64, heads=4, kv_heads=3, vocab=10)
    with pytest.raises(LabkitError, match="shard size"):
        estimate(M, ParallelSpec(dp=8, zero=3, shard_size=3), TrainSpec())
