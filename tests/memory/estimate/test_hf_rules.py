"""The estimator's Hugging Face rules against the H200 recordings at tp=pp=dp=1 (issue 26): a few corpus
cases, one per rule, pinned within 5% of the recorded peak (the fake-mode trace matches those recordings
within 1-3%: tests/memory/trace/test_plain_validation.py). The whole table:
``python benchmarks/bench_estimate.py --validate``."""

from __future__ import annotations

import dataclasses

import pytest

from labkit.core.errors import LabkitError
from labkit.memory.estimate import estimate
from labkit.memory.estimate.activations import attention_path
from labkit.memory.estimate.accuracy import TOLERANCE_PCT, case_inputs, check, recorded_peaks
from labkit.workloads.corpus import get_case

PINNED = {
    "llama-gqa-b4-fp32": "float32 GQA: SDPA's math path keeps the probabilities",
    "bloom-b2-fp32": "eager attention (ALiBi)",
    "gpt2-b8-fp32": "gelu_new's intermediates, config dropout",
    "opt-b4-fp32": "ReLU keeps one tensor, config dropout",
    "qwen2-b4-bf16": "RMSNorm's float32 intermediates",
    "gemma2-b2-amp-bf16": "logit soft-capping",
    "falcon-b4-fp32": "Falcon expands K/V itself: no math path",
    "llama-mha-b4-amp-bf16": "autocast: q, k, v, gate and up each cast the norm's output",
    "gpt-neox-b4-fp32": "parallel residual: both norms read the layer's input",
    "llama-gqa-b8-ckpt2-fp32": "checkpointing with the KV cache: the first segment's last layer at its backward",
    "llama-mha-b4-ckpt2-bf16": "a fused kernel recomputed on the grown cache keeps no keys and values of its own",
    "tinyllama-b4-lora-bf16": "LoRA: frozen linears keep no inputs, float32 adapters cast their inputs each",
    "tinyllama-b4-lora-cast-after-amp-bf16": "LoRA: bfloat16 adapters under autocast share their inputs",
    "tinyllama-b4-lora-padded-bf16": "a padded batch: SDPA's mask, keys and values repeated to every head",
    "tinyllama-b4-lora-drop-bf16": "LoRA dropout: each adapter's dropout output and mask",
    "bert-base-mlm-b32-bf16": "BERT: post-norm layers, the MLM head, the loss in the logits' dtype",
    "bert-base-mlm-b32-amp-bf16": "BERT under autocast: nll_loss keeps its float32 copy of log_softmax's output",
    "vit-base-b64-fp32": "ViT: patches + [CLS] as the sequence, the images kept by the patch convolution",
    "bart-base-b16-fp32": "BART: two stacks, the decoder's cross-attention, the loss in the logits' dtype",
    "bart-base-b16-amp-bf16": "BART under autocast: the float32 final_logits_bias makes the logits float32",
    "t5-base-b16-fp32": "T5: its relative bias sends SDPA down the math path; cross-attention, the MLP's dropout",
    "t5-base-b16-amp-bf16": "T5 under autocast: the math path in float32, the loss in the logits' dtype",
    "deberta-v2-mlm-b16-fp32": "DeBERTa-v2: disentangled attention's c2p/p2c blocks and position projections",
    "deberta-v2-mlm-b16-amp-bf16": "DeBERTa-v2 under autocast: the softmax in float32, the probabilities cast back",
    "mixtral-b4-bf16": "MoE: grouped_mm's T x k rows (no routing assumption needed)",
    "qwen2-moe-b4-bf16": "MoE with a shared expert and its sigmoid gate",
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_case_within_tolerance_of_the_h200(name):
    row = check([name])[0]
    assert row.estimated is not None, row.reason
    assert abs(row.err("recorded")) <= TOLERANCE_PCT, f"{name} ({PINNED[name]}): {row.err('recorded'):+.1f}%"


def test_rules_matter_without_them_the_estimate_is_low():
    """The same Llama case read without its transformers traits (the generic PyTorch layer) is >25% low."""
    m, par, train = case_inputs(get_case("llama-gqa-b4-fp32"))
    assert attention_path(m, train) == "math"
    plain = estimate(dataclasses.replace(m, hf=None), par, train).peak_allocated
    assert plain / recorded_peaks()["llama-gqa-b4-fp32"] < 0.75


def test_out_of_domain_cases_are_named_not_guessed():
    from labkit.memory.estimate.hf_config import spec_from_hf_config

    with pytest.raises(LabkitError, match="mixture-of-experts model .* the analytical model does not read"):
        spec_from_hf_config({"model_type": "deepseek_v3", "n_routed_experts": 8, "num_hidden_layers": 2,
                             "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100})
    m, par, train = case_inputs(get_case("bart-base-b16-fp32"))
    with pytest.raises(LabkitError, match="recomputation of an encoder-decoder"):
        estimate(m, par, dataclasses.replace(train, recompute="full"))
    with pytest.raises(LabkitError, match="one stack on one pipeline stage"):
        estimate(m, dataclasses.replace(par, pp=2), train)
    with pytest.raises(LabkitError, match="encoder-decoder model other than BART and T5"):
        spec_from_hf_config({"model_type": "pegasus", "is_encoder_decoder": True, "d_model": 64})


def test_the_stated_error_is_what_the_recordings_give():
    """ESTIMATOR_ERROR (what advise and the planner print) against the recorded half of --validate."""
    import re

    from labkit.memory.estimate.accuracy import ESTIMATOR_ERROR, summary

    rows = check()
    s = summary(rows, "recorded")
    within = s["reference"]["within"] + s["held-out"]["within"]
    cases = s["reference"]["cases"] + s["held-out"]["cases"]
    n, total = map(int, re.search(r"within 5% of the H200 on (\d+) of (\d+)", ESTIMATOR_ERROR).groups())
    assert (within, cases) == (n, total)
    # both splits apart: the rules were written against reference cases, the held-out ones check them (107 and 59
    # cases when this was written, the T5 and DeBERTa variants among them, every one within 5%; the sixth batch's
    # StableLM 2, +8.8% while its nn.LayerNorm was read as an RMSNorm, is +1.8%)
    for split, least in (("reference", 107), ("held-out", 59)):
        assert s[split]["cases"] >= least and s[split]["within"] == s[split]["cases"], (split, s[split])
    worst = max(s["reference"]["worst_pct"], s["held-out"]["worst_pct"])
    assert worst <= float(re.search(r"worst ([\d.]+)%", ESTIMATOR_ERROR).group(1)) + 0.05


def test_llama_like_decoders_with_torchs_layernorm_are_read_so():
    """StableLM and StarCoder2 are Llama-like decoders whose norms are nn.LayerNorm (the input's dtype, mean and rstd
    kept), not a float32 RMSNorm; StarCoder2's MLP is ungated. Read as RMSNorm, StableLM 2 1.6B bf16 was estimated
    8.8% above its H200 recording; read so, 1.8%."""
    from labkit.memory.estimate.hf_config import spec_from_hf_config

    base = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                intermediate_size=128, max_position_embeddings=64, hidden_act="silu")
    stablelm = spec_from_hf_config(dict(base, model_type="stablelm", layer_norm_eps=1e-5), seq=32)
    starcoder2 = spec_from_hf_config(dict(base, model_type="starcoder2", norm_epsilon=1e-5, hidden_act="gelu_pytorch_tanh"),
                                     seq=32)
    llama = spec_from_hf_config(dict(base, model_type="llama", rms_norm_eps=1e-5), seq=32)
    assert (stablelm.norm, stablelm.gated_mlp) == ("layernorm", True)
    assert (starcoder2.norm, starcoder2.gated_mlp) == ("layernorm", False)
    assert (llama.norm, llama.gated_mlp) == ("rmsnorm", True)


def test_traits_take_the_model_types_defaults_for_keys_a_config_leaves_out():
    """A GPT-2 config.json without dropout keys still trains with GPT2Config's 0.1 dropouts."""
    from labkit.memory.estimate.hf_config import spec_from_hf_config

    m = spec_from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512})
    assert (m.hf.act, m.hf.attn_dropout, m.hf.hidden_dropout, m.hf.embd_dropout) == ("gelu_new", 0.1, 0.1, 0.1)
    off = spec_from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
                               "resid_pdrop": 0.0, "use_cache": False})
    assert off.hf.hidden_dropout == 0.0 and not off.hf.use_cache


def test_estimate_cli_reads_a_hf_config(tmp_path, capsys):
    """`labkit estimate --hf-config` applies the transformers rules (the same figure as the API)."""
    import json

    from labkit.cli import main
    from labkit.memory.estimate import ParallelSpec, TrainSpec
    from labkit.memory.estimate.hf_config import spec_from_hf_config

    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 512}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    assert main(["estimate", "--hf-config", str(f), "--seq", "256", "--precision", "fp32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = estimate(spec_from_hf_config(cfg, seq=256), ParallelSpec(), TrainSpec(precision="fp32", optimizer_impl="foreach"))
    assert doc["peak_allocated"] == want.peak_allocated and doc["model"]["hf"]["model_type"] == "llama"
    assert main(["estimate", "--hf-config", str(f), "--model", "llama3-8b"]) == 2
    assert "not both" in capsys.readouterr().err


def test_autocast_copies_one_input_per_linear():
    """Under autocast Llama's q, k, v (and gate, up) each keep their own 16-bit copy of the norm's output; GPT-2's
    fused c_attn and single c_fc keep one; without autocast the norm's output is shared."""
    from labkit.memory.estimate.activations import layer_terms
    from labkit.memory.estimate.states import precision_bytes

    def extra(name):
        m, par, train = case_inputs(get_case(name))
        terms = {n: v for n, v, _ in layer_terms(m, par, train, precision_bytes(train))}
        return terms.get("autocast: 16-bit copies of a norm's output, one per linear reading it", 0), m, train

    v, m, train = extra("llama-mha-b4-amp-bf16")
    assert v == 3 * train.micro_batch * train.seq * m.hidden * 2
    assert extra("gpt2-b8-amp-bf16")[0] == 0 and extra("llama-gqa-b4-fp32")[0] == 0


def test_lora_states_are_the_adapters_and_a_frozen_base():
    """LoRA: the base's weights in bfloat16, gradients and AdamW's two states for the adapters only (float32 by
    peft's default); a LoRA job sharded or on a float32 base is refused in one line."""
    from labkit.memory.estimate import ParallelSpec
    from labkit.memory.estimate.spec import LoraSpec
    from labkit.memory.estimate.states import lora_params, total_params

    m, par, train = case_inputs(get_case("tinyllama-b4-lora-bf16"))
    e = estimate(m, par, train)
    n_a = lora_params(m, train) * m.layers
    assert n_a == m.layers * 16 * (2 * (m.hidden + m.heads * m.d_head) + 2 * (m.hidden + m.kv * m.d_head))
    assert e.model_states["gradients"] == 4 * n_a and e.model_states["optimizer_state"] == 8 * n_a
    assert e.model_states["parameters"] == 2 * total_params(m) + 4 * n_a
    with pytest.raises(LabkitError, match="one GPU"):
        estimate(m, ParallelSpec(dp=2), train)
    with pytest.raises(LabkitError, match="bfloat16 base"):
        estimate(m, par, dataclasses.replace(train, precision="fp32"))
    with pytest.raises(LabkitError, match="rank"):
        LoraSpec(rank=0)


def test_vit_reads_its_patches_as_the_sequence():
    """A ViT config: 224 / 16 = 14 x 14 patches and [CLS] (197 tokens), the classifier's labels as the vocabulary."""
    from labkit.memory.estimate.hf_config import spec_from_hf_config
    from labkit.workloads.corpus import hf_config

    case = get_case("vit-base-b64-fp32")
    m = spec_from_hf_config(hf_config(case).to_dict())
    assert (m.seq, m.vocab, m.hf.patch, m.hf.use_cache) == (197, 1000, 16, False)


def test_bart_vit_and_mixtral_parameters_are_transformers_own():
    """The estimator's parameter count of BART, ViT and Mixtral configs is the built transformers model's, to the
    one."""
    from labkit.memory.estimate.hf_config import spec_from_hf_config
    from labkit.memory.estimate.states import total_params
    from labkit.workloads.corpus import build_model, hf_config, tiny

    for name in ("bart-base-b16-fp32", "vit-base-b64-fp32", "mixtral-b4-bf16"):
        small = tiny(get_case(name))
        built = sum(p.numel() for p in build_model(small).parameters())
        assert total_params(spec_from_hf_config(hf_config(small).to_dict())) == built, name
