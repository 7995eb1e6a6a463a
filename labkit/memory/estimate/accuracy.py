"""The estimator against the fake-mode trace and the H200 recordings on the corpus's transformers at
tp=pp=dp=1 (issue 26): each recorded Hugging Face case of :mod:`labkit.workloads.corpus`
as the estimator reads it (its ``config.json`` through :func:`spec_from_hf_config`, the case's batch,
precision, recompute policy, optimizer and loop), beside ``measure_step`` in fake mode and the
recorded peak (``data/measurements/measure/plain__fresh.json``). Reference and held-out cases (the
corpus's name hash) are reported apart; the estimator's rules were written against reference cases.

LoRA cases (a frozen bfloat16 base, peft's adapters: ``TrainSpec.lora``), BERT-like masked-LM encoders
(BERT, RoBERTa: ``HfTraits.mlm_head``; DeBERTa-v2's disentangled attention: ``HfTraits.rel_span``), BART
(``HfTraits.decoder_layers``), T5 / mT5 (``HfTraits.rel_bias``: the relative-position bias that sends SDPA down its
math path), ViT image classifiers (``HfTraits.patch``) and Mixtral / Qwen2-MoE mixtures of experts
(``HfTraits.experts``) are estimated. Beside the corpus, ``corpus.TRACED_VARIANTS`` (more T5 and DeBERTa
configurations) are compared with their fake-mode trace (:data:`VARIANT_TRACES`) and their H200 recording
(:data:`VARIANT_RECORDING`), both made after they were estimated.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement
from labkit.memory.estimate import ModelSpec, ParallelSpec, TrainSpec, estimate
from labkit.memory.estimate.spec import LoraSpec
from labkit.memory.trace.corpus_check import predict_as_recorded

# transformers (10 s to import: python -X importtime, 2-core machine), torch and the tracer are imported where a
# case runs: `labkit --help` imports this module.

RECORDING = paths.DATA_DIR / "measurements" / "measure" / "plain__fresh.json"
#: the fake-mode traces of corpus.TRACED_VARIANTS (T5 and DeBERTa configurations not recorded on the H200), written by
#: ``python benchmarks/bench_estimate.py --trace-variants``
VARIANT_TRACES = paths.DATA_DIR / "measurements" / "estimate" / "traced_variants.json"
#: their H200 recording (``benchmarks/gpu/record_plain.py --variants``, after they were estimated and traced)
VARIANT_RECORDING = paths.DATA_DIR / "measurements" / "measure" / "plain__variants.json"
TOLERANCE_PCT = 5.0
# What `python benchmarks/bench_estimate.py --validate` measured (tests/memory/estimate/test_hf_rules.py
# keeps the recorded half of it true); advise and the planner state it where they use the estimator.
ESTIMATOR_ERROR = ("per-GPU peak within 5% of the H200 on 166 of 166 recorded Hugging Face causal-LM (LoRA and "
                   "mixture-of-experts included), BERT-like and DeBERTa-v2 masked-LM, BART, T5 and ViT cases at "
                   "tp=pp=dp=1 (median 0.7%, worst 4.8%), and within 1.5% of "
                   "rank 0 of FSDP2 and DDP launches at world 2-8 (recorded), of DTensor TP ones and of both stages "
                   "of a torch.distributed.pipelining launch (traced); "
                   "benchmarks/bench_estimate.py --validate")


@dataclass
class EstimateCheck:
    name: str
    split: str
    estimated: int | None
    recorded: int | None
    traced: int | None = None
    reason: str = ""                     # why the estimator does not cover the case (then estimated is None)
    trace_error: str = ""                # why tracing the rank here failed (then traced is None)

    def err(self, against: str) -> float | None:
        ref = self.traced if against == "trace" else self.recorded
        if self.estimated is None or not ref:
            return None
        return (self.estimated / ref - 1) * 100


def case_inputs(case: Any):
    """(ModelSpec, ParallelSpec, TrainSpec) of a corpus case, or LabkitError naming why not."""
    from labkit.memory.estimate.hf_config import _ENCODERS, spec_from_hf_config
    from labkit.workloads.corpus import hf_config

    if case.family == "transformers" and case.task == "masked-lm" and case.arch not in _ENCODERS:
        raise LabkitError(f"{case.name}: {case.arch}'s encoder is not one the estimator reads (BERT, RoBERTa, "
                          "DeBERTa-v2)")
    read = case.task in ("causal-lm", "masked-lm") or case.arch in ("vit", "bart", "t5", "mt5")
    if case.family != "transformers" or not read:
        raise LabkitError(f"{case.name}: a {case.family} {case.task} model (the estimator covers transformers' causal "
                          "LMs, BERT-like masked-LM encoders, BART and ViT)")
    lora = None
    if case.lora:

        # peft's adapters are float32 unless autocast_adapter_dtype=False or the model is cast after get_peft_model
        lora = LoraSpec(rank=16, targets=4, dropout=case.lora_dropout,
                        adapter_bytes=2 if case.lora_order in ("cast-before-bf16-adapters", "cast-after") else 4)
    seq = None if case.arch == "vit" else case.seq   # a ViT's case.seq is the image side: its tokens are the patches
    model = spec_from_hf_config(hf_config(case).to_dict(), seq=seq, name=case.name)
    if case.recompute != "none" and case.checkpoint_impl != "torch":
        # transformers' gradient_checkpointing_enable turns the KV cache off in training
        model = dataclasses.replace(model, hf=dataclasses.replace(model.hf, use_cache=False))
    train = TrainSpec(micro_batch=case.micro_batch, seq=seq, precision=case.precision,
                      optimizer=case.optimizer, optimizer_impl=case.optimizer_impl,
                      recompute=case.recompute, framework="pytorch", keep_logits=case.loop == "keep-output",
                      lora=lora, padded=case.padded)
    return model, ParallelSpec(), train


def recorded_rows(path=RECORDING) -> dict[str, dict]:
    """name -> the recorded row, with the recording's transformers version under ``transformers``; the corpus
    recording's rows include those of :data:`VARIANT_RECORDING` where it exists."""
    doc = load_measurement(path)
    version = doc["provenance"].get("transformers")
    rows = {c["name"]: {**c, "transformers": version} for c in doc["data"]["cases"] if c.get("peak_allocated")}
    if path == RECORDING and VARIANT_RECORDING.exists():
        rows.update(recorded_rows(VARIANT_RECORDING))
    return rows


def recorded_peaks(path=RECORDING) -> dict[str, int]:
    return {n: int(r["peak_allocated"]) for n, r in recorded_rows(path).items()}


def check(names: list[str] | None = None, *, trace: bool = False) -> list[EstimateCheck]:
    """One row per recorded transformers case and per traced variant (``names``: only these); ``trace`` also runs
    fake mode on the recorded cases (about 10 s a case on a 2-core CPU). A variant's trace is always the one
    :data:`VARIANT_TRACES` holds (``bench_estimate.py --trace-variants`` writes it)."""
    from labkit.workloads import corpus

    from labkit.memory.trace.step import FakeModeUnsupported

    rec = recorded_rows()
    variants = traced_variant_peaks()
    out = []
    for case in corpus.CASES + corpus.TRACED_VARIANTS:
        if case.family != "transformers" or (names is not None and case.name not in names) or (
                case.name not in rec and case.name not in variants):
            continue
        r = rec.get(case.name, {})
        row = EstimateCheck(case.name, case.split, None, int(r["peak_allocated"]) if r else None,
                            variants.get(case.name))
        try:
            row.estimated = estimate(*case_inputs(case)).peak_allocated
        except LabkitError as exc:
            row.reason = str(exc).split(": ", 1)[-1]
        if trace and row.estimated is not None and r and row.traced is None:
            # the program the recording ran (its transformers' attention, rotary embedding, cache dtype)
            try:
                row.traced = predict_as_recorded(case, r.get("transformers"), r.get("attn_implementation"))[0].peak_bytes
            except FakeModeUnsupported as exc:
                row.reason = f"not traced: {str(exc)[:120]}"
        out.append(row)
    return out


def traced_variant_peaks(path=VARIANT_TRACES) -> dict[str, int]:
    """name -> the traced peak of each of corpus.TRACED_VARIANTS (fake mode, the H200 target), as recorded in
    ``path``; empty where the file does not exist yet."""
    if not path.exists():
        return {}
    return {r["name"]: int(r["peak_bytes"]) for r in load_measurement(path, "estimate_traced_variants")["data"]}


def trace_variants(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Trace corpus.TRACED_VARIANTS (``names``: only these) in fake mode, each in this process (about 20 s to a
    minute a case on a 2-core CPU): one row each, with the estimator's figure beside it."""
    import torch
    import transformers

    from labkit.workloads import corpus

    rows = []
    for case in corpus.TRACED_VARIANTS:
        if names is not None and case.name not in names:
            continue
        rep = corpus.predict(case)
        rows.append({"name": case.name, "split": case.split, "peak_bytes": int(rep.peak_bytes),
                     "peak_phase": rep.peak_phase, "by_category": dict(rep.by_category),
                     "estimated": estimate(*case_inputs(case)).peak_allocated, "device": "fake-cuda (NVIDIA H200 target)",
                     "torch": torch.__version__, "transformers": transformers.__version__})
    return rows


def summary(rows: list[EstimateCheck], against: str = "recorded") -> dict[str, dict[str, Any]]:
    """Per split: cases, within TOLERANCE_PCT, median and worst absolute error (%)."""
    out = {}
    for split in ("reference", "held-out"):
        errs = sorted(abs(e) for r in rows if r.split == split and (e := r.err(against)) is not None)
        out[split] = {"cases": len(errs), "within": sum(e <= TOLERANCE_PCT for e in errs),
                      "median_pct": errs[len(errs) // 2] if errs else None, "worst_pct": errs[-1] if errs else None}
    return out


# ---------------------------------------------------------------- sharded layouts: the traced ranks

RANK_RECORDING = paths.DATA_DIR / "measurements" / "script" / "ranks__fake_pg.json"
SCRIPTS = paths.DATA_DIR / "scripts"
#: launches traced here (no H200 recording yet; benchmarks/gpu/record_scripts.py has them, and a recording of one
#: replaces its entry here): (name, script under data/scripts/, args, world[, rank: 0 where none])
TRACED_ONLY = (("tp-llama-s1024-w2", "ranks/tp_llama.py", ["--seq", "1024"], 2),
               ("tp-llama-w2", "ranks/tp_llama.py", [], 2), ("tp-llama-w4", "ranks/tp_llama.py", [], 4),
               ("ddp-llama-w2", "ranks/ddp_llama.py", [], 2), ("fsdp2-llama7b-w8", "ranks/fsdp2_llama7b.py", [], 8),
               *((f"pp-{k}-w2-r{r}", "ranks/pp_gpipe.py", a, 2, r) for k, a in (("gpipe", []), ("1f1b", ["--1f1b"]))
                 for r in (0, 1)))
# the Llama-style model of ranks/fsdp2_llama.py, tp_llama.py and ddp_llama.py, and Llama-2-7B's of fsdp2_llama7b.py
_LLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
              num_key_value_heads=4, vocab_size=32000, use_cache=False)
_LLAMA7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False)


def _script_int(args: list[str], name: str, default: int) -> int:
    """The value of a bundled script's integer option ``name`` in ``args`` (``--name N`` or ``--name=N``)."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith(name + "="):
            return int(a.split("=", 1)[1])
    return default


def rank_case_inputs(script: str, args: list[str], world: int):
    """(ModelSpec, ParallelSpec, TrainSpec) of one rank of a bundled torchrun script (data/scripts/ranks/), as
    the script builds its model, batch and layout; LabkitError for a script the estimator does not model."""
    from transformers import GPT2Config, LlamaConfig

    from labkit.memory.estimate.hf_config import spec_from_hf_config

    name = script.rsplit("/", 1)[-1]
    ap = argparse.ArgumentParser(add_help=False)  # the scripts' own options
    ap.add_argument("--mp", action="store_true")
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--1f1b", dest="one_f_one_b", action="store_true")
    o, sizes = ap.parse_known_args(args)
    o.micro_batch = _script_int(sizes, "--micro-batch", 4)   # the script's own sizes, not labkit's flags
    o.seq = _script_int(sizes, "--seq", 2048)
    if name == "fsdp2_llama.py":
        model = spec_from_hf_config(LlamaConfig(**_LLAMA).to_dict(), seq=o.seq, name="llama-1b-like")
        train = TrainSpec(micro_batch=o.micro_batch, seq=o.seq, precision="bf16-mixed" if o.mp else "fp32",
                          recompute="full" if o.ckpt else "none")
        return model, ParallelSpec(dp=world, zero=3), train
    if name == "fsdp2_llama7b.py":
        model = spec_from_hf_config(LlamaConfig(**_LLAMA7B).to_dict(), seq=4096, name="llama-2-7b")
        return model, ParallelSpec(dp=world, zero=3), TrainSpec(micro_batch=1, seq=4096, precision="bf16-mixed",
                                                                 recompute="full")
    if name == "tp_llama.py":
        model = spec_from_hf_config(LlamaConfig(**_LLAMA).to_dict(), seq=o.seq, name="llama-1b-like")
        return model, ParallelSpec(tp=world, vocab_parallel=False), TrainSpec(
            micro_batch=o.micro_batch, seq=o.seq, precision="amp-bf16", optimizer_impl="for-loop")
    if name == "ddp_llama.py":
        model = spec_from_hf_config(LlamaConfig(**_LLAMA).to_dict(), seq=2048, name="llama-1b-like")
        return model, ParallelSpec(dp=world, ddp_bucket_view=True), TrainSpec(micro_batch=4, seq=2048,
                                                                                precision="amp-bf16")
    if name == "ddp_gpt2.py":
        model = spec_from_hf_config(GPT2Config(n_layer=24, n_embd=1024, n_head=16).to_dict(), seq=1024,
                                    name="gpt2-medium")
        return model, ParallelSpec(dp=world, ddp_bucket_view=True), TrainSpec(micro_batch=4, seq=1024,
                                                                                precision="amp-bf16")
    if name == "pp_gpipe.py":  # the lab's generic PyTorch block (no transformers), 4 micro-batches of 4
        model = ModelSpec(layers=8, hidden=1024, heads=8, vocab=32000, seq=1024, tied_embeddings=False,
                          learned_pos_emb=False, name="gpt-style")
        return model, ParallelSpec(pp=world, schedule="1f1b" if o.one_f_one_b else "gpipe"), TrainSpec(
            micro_batch=4, global_batch=16, seq=1024, precision="fp32")
    raise LabkitError(f"{script}: not a transformer language model (the estimator models decoder-only LMs)")


def rank_cases() -> list[dict]:
    """The rank launches: the H200's fake-process-group recordings, then :data:`TRACED_ONLY`."""
    rows = [dict(r) for r in load_measurement(RANK_RECORDING)["data"] if r.get("status") == "ok"]
    recorded = {r["name"] for r in rows}
    return rows + [{"name": t[0], "script": t[1], "args": t[2], "world_size": t[3], "rank": (t[4:] or (0,))[0]}
                   for t in TRACED_ONLY if t[0] not in recorded]


def check_ranks(names: list[str] | None = None, *, trace: bool = False, jobs: int | None = None) -> list[EstimateCheck]:
    """The estimator's per-GPU peak against one rank (rank 0, or a pipeline stage's) of each launch of
    :func:`rank_cases`: recorded on the H200 (one GPU, PyTorch's fake process group) and, with ``trace``,
    traced here (``labkit measure --script --nproc-per-node``, 10 s to a minute a launch on a 2-core CPU; ``jobs``
    launches at once, each its own process: by default one per two CPUs, at most 4)."""
    from labkit.memory.script.run import trace_launch
    from labkit.workloads.corpus import split_of

    out = []
    for r in rank_cases():
        if names is not None and r["name"] not in names:
            continue
        row = EstimateCheck(r["name"], split_of(r["name"]), None, r.get("peak_allocated"))
        rank, world = r.get("rank", 0), r["world_size"]
        try:
            model, par, train = rank_case_inputs(r["script"], r["args"], world)
            # the rank's pipeline stage (stages outermost: world / pp consecutive ranks a stage)
            row.estimated = estimate(model, par, train).by_stage[rank * par.pp // world].peak_allocated
        except LabkitError as exc:
            row.reason = str(exc).split(": ", 1)[-1]
        out.append((row, r))

    def traced(pair: tuple[EstimateCheck, dict]) -> EstimateCheck:
        row, r = pair
        if trace and row.estimated is not None:
            try:
                doc = trace_launch(str(SCRIPTS / r["script"]), r["args"], nproc_per_node=r["world_size"],
                                   ranks=str(r.get("rank", 0)))
            except LabkitError as exc:       # one launch fake mode cannot run: said beside it, the others go on
                row.trace_error = str(exc)
                return row
            row.traced = doc["ranks"][0]["peak_bytes"]
        return row

    with ThreadPoolExecutor(max_workers=jobs or max(1, min(4, (os.cpu_count() or 2) // 2))) as pool:
        return list(pool.map(traced, out))
