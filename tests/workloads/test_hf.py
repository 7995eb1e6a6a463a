import pytest
import torch

from labkit.core.errors import LabkitError
from labkit.workloads.harness import StepPolicy, TrainStep, find_layers
from labkit.workloads.hf import HF_GPT2_SIZES, HFGPT2Spec, hf_gpt2_factory, hf_lm_batch

TINY = HFGPT2Spec(n_layer=3, n_embd=32, n_head=2, n_positions=32, vocab_size=100)


def test_spec_counts_match_transformers():
    model = hf_gpt2_factory(TINY)()
    assert sum(p.numel() for p in model.parameters()) == TINY.num_params
    assert model.config._attn_implementation == "sdpa" and model.config.use_cache is False
    assert HFGPT2Spec.named("gpt2").num_params == 124_439_808      # GPT-2 small, tied head
    assert set(HF_GPT2_SIZES) == {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}
    with pytest.raises(LabkitError, match="unknown GPT-2 size"):
        HFGPT2Spec.named("gpt5")


@pytest.mark.parametrize("ck", ["full", "every-2", "selective"])
def test_hf_checkpointing_same_gradients(ck):
    def grads(mode):
        torch.manual_seed(0)
        model = hf_gpt2_factory(TINY)()
        batch = hf_lm_batch(TINY.vocab_size, 2, 16, seed=2)
        step = TrainStep(model, batch, policy=StepPolicy(recompute=mode, optimizer="sgd"), device_type="cpu")
        out = step.call(step.model, batch)
        out.loss.backward()
        return sorted(round(float(p.grad.norm()), 5) for p in step.model.parameters() if p.grad is not None)

    assert grads(ck) == grads("none")


def test_hf_layers_found_and_step_runs():
    model = hf_gpt2_factory(TINY)()
    assert find_layers(model) is model.transformer.h
    batch = hf_lm_batch(TINY.vocab_size, 2, 16)
    step = TrainStep(model, batch, policy=StepPolicy(precision="amp-bf16"), device_type="cpu")
    step.run()
    assert len(step.optimizer.state) == len(list(model.parameters()))
