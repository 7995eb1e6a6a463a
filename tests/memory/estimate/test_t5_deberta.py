"""The estimator's T5 and DeBERTa-v2 rules (issue 26) against the fake-mode trace and the H200, read from recorded
figures (fast): the recorded corpus cases (t5-base, deberta-v2 base, against the H200 in test_hf_rules.py's PINNED)
and the configuration variants ``corpus.TRACED_VARIANTS`` (t5-small, Flan-T5 and mT5 gated-gelu, DeBERTa-v3 xsmall /
small / base, other batches and sequences, fp32, amp-bf16 and bf16), whose traces
``python benchmarks/bench_estimate.py --trace-variants`` wrote to data/measurements/estimate/traced_variants.json
and ``benchmarks/gpu/record_plain.py --variants`` recorded on the H200 afterwards (measure/plain__variants.json).
Reference and held-out cases (the corpus's name hash) alike: the rules were written against t5-base-b16-fp32,
deberta-v2-mlm-b16-amp-bf16 and the reference variants (mt5-small-b16-amp-bf16: gelu_new's float32 output in a
gated MLP; mt5-small-b16-bf16: T5LayerNorm's input)."""

from __future__ import annotations

import dataclasses

import pytest
import transformers

from labkit.core import paths
from labkit.core.provenance import load_measurement
from labkit.memory.estimate import estimate
from labkit.memory.estimate.accuracy import TOLERANCE_PCT, VARIANT_TRACES, case_inputs, check
from labkit.memory.estimate.activations import attention_path, layer_terms, logits_bytes
from labkit.memory.estimate.hf_config import spec_from_hf_config
from labkit.memory.estimate.states import precision_bytes, total_params
from labkit.workloads import corpus
from labkit.workloads.corpus import get_case

TRACED = {r["name"]: r for r in load_measurement(VARIANT_TRACES, "estimate_traced_variants")["data"]}
VARIANTS = [c.name for c in corpus.TRACED_VARIANTS]


def test_every_variant_is_traced_and_in_both_splits():
    assert sorted(TRACED) == sorted(VARIANTS)
    assert {c.split for c in corpus.TRACED_VARIANTS} == {"reference", "held-out"}
    assert {c.arch for c in corpus.TRACED_VARIANTS} == {"t5", "mt5", "deberta-v2"}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_peak_within_one_percent_of_its_trace(name):
    """Each variant's per-GPU peak within 1% of its trace and of the H200 (the issue's target is 5%; each was within
    3.1% when first predicted, before it was traced or recorded); the trace within 0.1% of the H200."""
    row = check([name])[0]
    assert row.traced == TRACED[name]["peak_bytes"] and row.recorded
    assert abs(row.err("trace")) <= 1.0, f"{name} ({row.split}): {row.err('trace'):+.2f}%"
    assert abs(row.err("recorded")) <= 1.0, f"{name} ({row.split}): {row.err('recorded'):+.2f}%"
    assert abs(row.traced / row.recorded - 1) < 0.001


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_categories_match_the_trace_at_the_backward_peak(name):
    """Term by term at the peak (the loss's backward, T5's and DeBERTa's alike): what the trace files as activations
    (every tensor autograd keeps, the logits' log_softmax and autocast's weight copies among them) within 0.5% of the
    estimator's activations, held logits and weight copies; the loss backward's temporaries (the gradients of
    nll_loss and log_softmax) to the allocator's rounding."""
    case = get_case(name)
    m, par, train = case_inputs(case)
    e = estimate(m, par, train)
    trace = TRACED[name]["by_category"]
    assert e.peak_phase == TRACED[name]["peak_phase"] == "backward"
    at = e.by_stage[0].phase_breakdown["backward"]
    held = logits_bytes(m, par, train, precision_bytes(train)).held
    # autocast's 16-bit weights (none without autocast: then only the model's buffers and the rounding, a few KiB)
    copies = at["parameters"] - trace["parameters"]
    assert copies > 2**20 if train.precision == "amp-bf16" else abs(copies) < 2**16
    assert abs((at["activations"] + held + copies) / trace["activations"] - 1) < 0.005
    assert abs((at["logits"] - held) - trace["temporaries"]) <= 512


def test_t5_layer_norm_keeps_its_16_bit_input():
    """T5LayerNorm multiplies its input itself by the float32 rsqrt: in bfloat16 (a 16-bit residual stream) it keeps
    that input beside its float32 copy, 2 norms a layer (3 in the decoder's), 2 final ones; with a float32 residual
    stream (fp32, autocast) the copy is the input and nothing more is kept."""
    bf16 = get_case("t5-small-b32-bf16")
    m, par, train = case_inputs(bf16)
    terms = {n: v for n, v, _ in layer_terms(m, par, train, precision_bytes(train))}
    assert terms["T5LayerNorm: its 16-bit input, which the rsqrt multiplies (2 norms)"] == (
        2 * train.micro_batch * train.seq * m.hidden * 2)
    without = dataclasses.replace(m, hf=dataclasses.replace(m.hf, norm_keeps_input=False))
    norms = 2 * m.layers + m.hf.decoder_layers + 2
    gap = estimate(m, par, train).peak_allocated - estimate(without, par, train).peak_allocated
    assert gap == norms * train.micro_batch * train.seq * m.hidden * 2
    for name in ("t5-small-b32-fp32", "t5-small-b32-amp-bf16"):
        m, par, train = case_inputs(get_case(name))
        assert not any(n.startswith("T5LayerNorm") for n, _, _ in layer_terms(m, par, train, precision_bytes(train)))


def test_t5_self_attention_runs_the_math_path_in_float32():
    """T5's relative bias requires grad: SDPA's math path keeps the (b, heads, s, s) probabilities, its dropout's
    mask and output, and under autocast upcasts the query, key and value to float32 first."""
    for name, elem in (("t5-base-b16-fp32", 4), ("t5-base-b16-amp-bf16", 4)):
        m, par, train = case_inputs(get_case(name))
        assert attention_path(m, train) == "math"
        terms = {n: v for n, v, _ in layer_terms(m, par, train, precision_bytes(train))}
        b, s = train.micro_batch, train.seq
        assert terms["softmax output"] == b * m.heads * s * s * elem
        assert terms["attention dropout output"] == b * m.heads * s * s * elem
        assert terms["Q, K, V as the math path saves them (scaled, repeated to every head)"] == 3 * b * s * m.hidden * 4
    # without the bias trait the estimate is far low: the fused kernel would keep no (s x s) tensor
    m, par, train = case_inputs(get_case("t5-base-b16-fp32"))
    plain = estimate(dataclasses.replace(m, hf=dataclasses.replace(m.hf, rel_bias=0)), par, train).peak_allocated
    assert plain / check(["t5-base-b16-fp32"])[0].recorded < 0.8


def test_deberta_disentangled_terms_are_what_it_keeps():
    """DeBERTa-v2 (c2p and p2c, 256 buckets): two (b x heads, s, 2 x 256) score blocks kept by gather, two position
    projections repeated over the batch, the softmax in float32 under autocast beside the probabilities' 16-bit
    cast; without its traits the estimate misses the 5% target (-8.6%: the logits are most of the peak)."""
    m, par, train = case_inputs(get_case("deberta-v2-mlm-b16-amp-bf16"))
    assert (m.hf.rel_span, m.hf.pos_att, m.hf.attn_impl) == (512, 2, "eager")
    terms = {n: v for n, v, _ in layer_terms(m, par, train, precision_bytes(train))}
    b, s, a = train.micro_batch, train.seq, m.heads
    assert terms["DeBERTa: c2p/p2c score blocks kept by gather"] == 2 * b * a * s * 512 * 2
    assert terms["softmax output"] == b * a * s * s * 4 and terms["attention dropout output"] == b * a * s * s * 2
    plain = estimate(dataclasses.replace(m, hf=dataclasses.replace(m.hf, rel_span=0, pos_att=0)), par, train)
    assert plain.peak_allocated / check(["deberta-v2-mlm-b16-amp-bf16"])[0].recorded < 1 - TOLERANCE_PCT / 100


@pytest.mark.parametrize("name", ["t5-base-b16-fp32", "flan-t5-base-b16-amp-bf16", "mt5-small-b16-amp-bf16",
                                  "deberta-v2-mlm-b16-fp32"])
def test_parameters_are_transformers_own(name):
    """Parameters to the one at CI size: T5's relative-bias tables and cross-attention, an untied LM head (Flan-T5,
    mT5), mT5's d_kv x heads below d_model, DeBERTa's position projections, relative embeddings and MLM head."""
    small = corpus.tiny(get_case(name))
    built = sum(p.numel() for p in corpus.build_model(small).parameters())
    assert total_params(spec_from_hf_config(corpus.hf_config(small).to_dict())) == built


def test_hub_configs_read_as_transformers_reads_them():
    """A config.json as the Hub has it: T5Config derives the activation and the gate from feed_forward_proj and the
    decoder's depth from num_layers; older DeBERTa configs spell the position terms "p2c|c2p"."""
    flan = spec_from_hf_config({"model_type": "t5", "d_model": 768, "d_ff": 2048, "d_kv": 64, "num_layers": 12,
                                "num_heads": 12, "vocab_size": 32128, "feed_forward_proj": "gated-gelu",
                                "tie_word_embeddings": False})
    assert (flan.layers, flan.hf.decoder_layers, flan.hf.act, flan.gated_mlp, flan.tied_embeddings) == (
        24, 12, "gelu_new", True, False)
    assert flan.hf.mlp_in_linears == 2 and flan.hf.attn_dropout == 0.1 and not flan.hf.use_cache
    deb = spec_from_hf_config({"model_type": "deberta-v2", "hidden_size": 768, "num_hidden_layers": 12,
                               "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 128100,
                               "relative_attention": True, "position_buckets": 256, "pos_att_type": "p2c|c2p",
                               "position_biased_input": False})
    assert (deb.hf.rel_span, deb.hf.pos_att, deb.learned_pos_emb, deb.hf.mlm_head) == (512, 2, False, True)
    # DeBERTa-v2's own defaults: no relative attention, absolute positions; parameters still transformers' own
    cfg = dict(model_type="deberta-v2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, vocab_size=512)
    plain = spec_from_hf_config(cfg)
    built = transformers.AutoModelForMaskedLM.from_config(transformers.AutoConfig.for_model(**cfg))
    assert (plain.hf.rel_span, plain.learned_pos_emb) == (0, True)
    assert total_params(plain) == sum(p.numel() for p in built.parameters())


def test_validate_prints_the_variants_beside_the_recorded_cases(capsys, bench_script):
    """``python benchmarks/bench_estimate.py --validate --no-trace --only ...``: a corpus T5 case against the H200,
    a variant against its recorded trace and the H200, each in its split."""
    assert bench_script("bench_estimate").main(["--validate", "--no-trace", "--only", "t5-base-b16-fp32,t5-small-b32-fp32"]) == 0
    out = capsys.readouterr().out
    ref, held = out.split("held-out cases")
    assert "t5-base-b16-fp32" in ref and "vs recorded: 1 of 1 within 5%" in ref
    assert "t5-small-b32-fp32" in held and "vs trace: 1 of 1 within 5%" in held
    assert "vs recorded: 1 of 1 within 5%" in held
