"""Models engineers bring, in fake mode: each predicts (with its assumptions stated) or is refused by
one line naming the op and the module. Tiny configurations: seconds each."""

import pytest
import torch
import transformers

from labkit.core.errors import LabkitError
from labkit.core.vocab import OptimizerSpec
from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.fake.sdpa import parse_version
from labkit.memory.trace.step import FakeCuda, Probes, measure_step
from labkit.workloads import StepPolicy
from labkit.workloads.hf import hf_lm_batch

V = 256


def llama_cfg(**kw):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   use_cache=False, **kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def llama_checkpointed(reentrant):
    def build():
        m = transformers.LlamaForCausalLM(llama_cfg())
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return m
    return build


@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_gradient_checkpointing_under_amp_bf16_recomputes_in_bf16(reentrant):
    batch = hf_lm_batch(V, 2, 64)
    rep = measure_step(llama_checkpointed(reentrant), batch, StepPolicy(precision="amp-bf16"),
                       probes=Probes(op_log=True))
    full = measure_step(lambda: transformers.LlamaForCausalLM(llama_cfg()), batch, StepPolicy(precision="amp-bf16"))
    assert rep.peak_bytes < full.peak_bytes
    back = [r for r in rep.op_log if r.phase == "backward"]
    # the recomputed forward ran under the emulated CUDA autocast: its projections cast the weights
    # to bf16 again (a fresh cache) and no float32 activation matmul appears in backward
    assert any("_to_copy" in r.name and "float32[128, 64] -> bfloat16" in r.shapes for r in back)
    assert not [r for r in back if r.name.startswith("aten.mm") and "-> float32[128" in r.shapes]


def test_pure_bf16_factory_cast_keeps_tied_weights():
    def build():
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=V, use_cache=False)
        cfg._attn_implementation = "sdpa"
        return transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16)

    rep = measure_step(build, hf_lm_batch(V, 2, 32))
    n_tensors = sum(1 for _ in build().parameters()) + 1
    assert rep.num_params * 2 <= rep.by_category["parameters"] <= rep.num_params * 2 + n_tensors * 512
    # GPT-2's default attention dropout 0.1: cuDNN on torch 2.11 (recorded); flash once cuDNN checks 1/16
    assert list(rep.emulation["sdpa"]) == ["cudnn"]
    later = measure_step(build, hf_lm_batch(V, 2, 32), fake=FakeCuda(target=CudaTarget(torch_version="2.12")))
    assert list(later.emulation["sdpa"]) == ["flash (cudnn: dropout not a multiple of 1/16)"]


def test_lora_on_a_bf16_base():
    import peft

    def build():
        base = transformers.LlamaForCausalLM(llama_cfg()).to(torch.bfloat16)
        return peft.get_peft_model(base, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))

    rep = measure_step(build, hf_lm_batch(V, 2, 32))
    trainable = sum(p.numel() for p in build().parameters() if p.requires_grad)
    assert 0 < rep.by_category["optimizer_state"] <= 2 * trainable * 4 + 64 * 512   # AdamW on the adapters only


def test_vit_input_and_init_checks_are_answered_and_reported():
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                 image_size=32, patch_size=8, num_labels=10)
    cfg._attn_implementation = "sdpa"
    batch = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.zeros(2, dtype=torch.long)}
    rep = measure_step(lambda: transformers.ViTForImageClassification(cfg), batch)
    assert rep.peak_bytes > 0
    # the recordings' torch (2.11) samples trunc_normal_ in place: no value is read while the model is built
    assert not any("boolean .item()" in a for a in rep.emulation["assumptions"])
    # from 2.12 trunc_normal_ samples by rejection (fake_runtime.recorded_init): its `while mask.any()` is a boolean
    # read fake mode answers False, and reports
    if parse_version(torch.__version__) >= (2, 12):
        rep = measure_step(lambda: transformers.ViTForImageClassification(cfg), batch,
                           fake=FakeCuda(target=CudaTarget(torch_version=torch.__version__.split("+")[0])))
        assert any("boolean .item()" in a and "False" in a for a in rep.emulation["assumptions"])


def test_mixtral_grouped_expert_matmul_in_float32_and_amp():
    cfg = transformers.MixtralConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, use_cache=False)
    cfg._attn_implementation = "sdpa"
    batch = hf_lm_batch(V, 2, 32)
    fp32 = measure_step(lambda: transformers.MixtralForCausalLM(cfg), batch)
    amp = measure_step(lambda: transformers.MixtralForCausalLM(cfg), batch, StepPolicy(precision="amp-bf16"))
    bf16 = measure_step(lambda: transformers.MixtralForCausalLM(cfg), batch, StepPolicy(precision="bf16"))
    assert fp32.peak_bytes > bf16.peak_bytes > 0 and amp.peak_bytes > 0
    assert any(a.startswith("MoE routing") for a in amp.emulation["assumptions"])


def test_mixtral_eager_experts_run_under_the_stated_routing():
    """The eager per-expert loop (nonzero on the expert mask, an integer read per expert id) used to be
    refused; it runs under the assumed routing, which the report states."""
    cfg = transformers.MixtralConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, use_cache=False)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = "eager"
    rep = measure_step(lambda: transformers.MixtralForCausalLM(cfg), hf_lm_batch(V, 2, 16))
    assert rep.peak_bytes > 0 and rep.emulation["moe_routing"]["assumed"] == "balanced"
    (text,) = [a for a in rep.emulation["assumptions"] if a.startswith("MoE routing")]
    assert "balanced (the default" in text and "MixtralExperts" in text and "32 tokens x top-2 = 64 rows" in text


class IntRead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        n = int((x > 0).sum().item())
        return self.lin(x[:, :8]).sum() * n


class Nonzero(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(512, 512)

    def forward(self, x):
        return self.lin(x[x.sum(-1) > 0]).sum()


class MaskedSelect(Nonzero):
    def forward(self, x):
        return self.lin(x.masked_select(x.sum(-1, keepdim=True) > 0).view(-1, 512)).sum()


class EveryRow(Nonzero):
    def forward(self, x):
        return self.lin(x).sum()


class Unique(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x[:, :8]).sum() * torch.unique(x, dim=1).numel()


class Distinct(Unique):
    def forward(self, x):
        ids = (x * 100).long()
        values, counts = torch.unique(ids, return_counts=True)
        return self.lin(x[:, :8]).sum() * values.numel() + counts.sum()


def test_a_mask_of_unknown_values_selects_every_element():
    """x[mask] on a mask fake tensors cannot know is sized as selecting every row (the largest), said in the
    report: the selected copy of the rows on top of what a step over every row holds, and the mask."""
    x = torch.randn(4096, 512)
    every = measure_step(EveryRow, x, loss_fn=lambda out, b: out)
    for cls in (Nonzero, MaskedSelect):
        masked = measure_step(cls, x, loss_fn=lambda out, b: out)
        assert any(f"a mask of unknown values (module {cls.__name__}) selects every element" in a
                   for a in masked.emulation["assumptions"])
        assert masked.peak_bytes >= every.peak_bytes + 4096 * 512 * 4      # the selected rows' copy


class MyMoE(Nonzero):
    """An expert dispatch fake mode's routing rules do not cover: a mask of unknown values picks each expert's
    rows (every row to every expert would be no answer)."""

    def forward(self, x):
        gate = x.sum(-1)
        return sum(self.lin(x[(gate > t) & (gate <= t + 1)]).sum() for t in range(4))


def test_an_uncovered_expert_dispatch_stays_refused():
    with pytest.raises(LabkitError) as e:
        measure_step(MyMoE, torch.randn(64, 512), loss_fn=lambda out, b: out)
    assert "aten.nonzero" in str(e.value) and "module MyMoE" in str(e.value) and "routing rules" in str(e.value)


def test_unique_of_unknown_values_finds_every_value_distinct():
    """torch.unique of values fake tensors do not have: every value distinct (the largest), its outputs at the
    input's length as CUDA's kernel allocates them whatever the values, said in the report."""
    rep = measure_step(Distinct, torch.randn(4096, 64), loss_fn=lambda out, b: out)
    assert any("torch.unique of unknown values (module Distinct) finds every value distinct, 262144 of them" in a
               for a in rep.emulation["assumptions"])


@pytest.mark.parametrize("cls,op", [(IntRead, "aten._local_scalar_dense"), (Unique, "aten.unique_dim")])
def test_data_dependent_ops_are_refused_by_name(cls, op):
    with pytest.raises(LabkitError) as e:
        measure_step(cls, torch.randn(4, 8), loss_fn=lambda out, b: out)
    msg = str(e.value)
    assert op in msg and f"module {cls.__name__}" in msg and "--device cpu" in msg
    assert "\n" not in msg


def test_hf_padding_mask_is_skipped_only_when_the_batch_has_no_padding():
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    ids = torch.randint(0, V, (2, 32))

    def run(am):
        # fused AdamW: the step's peak stays in forward/backward, where the masks live
        return measure_step(lambda: transformers.BertForMaskedLM(cfg),
                            {"input_ids": ids, "attention_mask": am,
                                                                         "labels": ids.clone()},
                            StepPolicy(optimizer=OptimizerSpec("adamw", "fused")))

    ones = torch.ones_like(ids)
    padded = ones.clone()
    padded[1, 20:] = 0
    skip, keep = run(ones), run(padded)
    # no padding: HF's padding_mask.all() check skips the mask on the GPU (plain mem-efficient, no mask)
    assert list(skip.emulation["sdpa"]) == ["efficient (cudnn: dtype torch.float32 (cuDNN needs fp16/bf16); "
                                            "flash: dtype torch.float32 (flash needs fp16/bf16))"]
    assert any("hf-no-padding" in a for a in skip.emulation["assumptions"])
    # padding: the GPU run builds the (B, 1, S, S) mask too, which flash refuses and each layer keeps
    (key,) = keep.emulation["sdpa"]
    assert key.startswith("efficient") and "explicit attn_mask" in key
    assert not any("hf-no-padding" in a for a in keep.emulation["assumptions"])
    # the mask is held from forward to backward (the step's peak may be the optimizer's: foreach AdamW's
    # temporaries, the default implementation, outgrow it on a model this small)
    assert keep.phase_peaks["backward"] > skip.phase_peaks["backward"]
