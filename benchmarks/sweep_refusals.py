"""Which model types fake mode refuses: every type the installed transformers registers for a task and the corpus
lacks (or every torchvision classifier it lacks), built from its default configuration shrunk, one fake-mode step
each under amp-bf16 (torchvision: fp32 too). A refused type is run again on the CPU, to tell a limit of fake mode
from a shrunk configuration the model does not accept.

    PYTHONPATH=. .venv/bin/python benchmarks/sweep_refusals.py --task causal-lm [--start N] [--limit N]
    PYTHONPATH=. .venv/bin/python benchmarks/sweep_refusals.py --task torchvision

Prints one line per type: ``ok`` with the predicted peak, ``SKIP`` (the shrink did not reach the configuration: it
fails to build, or has over 50M parameters), ``REFUSED [CPU ok | CPU fails too: ...]``, or ``ERROR``. The README's
sweep of 2026-12-07 is this script's run over the four transformers tasks and torchvision.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from labkit.core.provenance import format_header, header

AUTO = {"causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
        "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
        "seq2seq-lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
        "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification")}
# the shrink: each key the type's configuration has
SMALL = dict(num_labels=10, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256, vocab_size=1024, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)
MAX_PARAMS = 50e6


def _try(case, predict, unsupported) -> str:
    t = time.perf_counter()
    try:
        rep = predict(case, steps=1)
        took = time.perf_counter() - t
        return f"ok   {case.arch:28s} {case.precision:9s} {rep.peak_bytes / 2**20:9.1f} MiB {took:.1f} s"
    except unsupported as exc:
        try:
            predict(case, device="cpu", steps=1)
            cpu = "CPU ok"
        except Exception as exc2:  # noqa: BLE001 - any failure on the CPU is the answer
            cpu = f"CPU fails too: {type(exc2).__name__}: {str(exc2)[:100]}"
        return f"REFUSED {case.arch} {case.precision} [{cpu}]: {str(exc)[:300]}"
    except Exception as exc:  # noqa: BLE001 - a sweep reports every failure and goes on
        return f"ERROR {case.arch} {case.precision}: {type(exc).__name__}: {str(exc)[:300]}"


def _hf_cases(task: str):
    import torch
    import transformers
    import transformers.models.auto.modeling_auto as auto

    from labkit.workloads.corpus import CASES, COMPAT_EXTRA, Case

    have = {c.arch for c in CASES if c.family == "transformers"} | set(COMPAT_EXTRA)
    mapping, cls = AUTO[task]
    for arch in [t for t in getattr(auto, mapping) if t not in have]:
        try:
            default = transformers.AutoConfig.for_model(arch)
            o = {k: v for k, v in SMALL.items() if hasattr(default, k)}
            cfg = transformers.AutoConfig.for_model(arch, **o)
            with torch.device("meta"):
                n = sum(p.numel() for p in getattr(transformers, cls).from_config(cfg).parameters())
            if n > MAX_PARAMS:
                raise ValueError(f"{n / 1e6:.0f}M parameters: the shrink did not reach it")
        except Exception as exc:  # noqa: BLE001 - a configuration the shrink cannot make is skipped, said so
            yield f"SKIP {arch}: {type(exc).__name__}: {str(exc)[:120]}"
            continue
        side = getattr(cfg, "image_size", 224)
        yield Case(f"sweep-{arch}-amp-bf16", "transformers", arch, task, o, 2,
                   (side if isinstance(side, int) else 224) if task == "image-classification" else 64, "amp-bf16")


def _torchvision_cases():
    from labkit.workloads.corpus import CASES, Case, torchvision_models

    have = {c.arch for c in CASES if c.family == "torchvision"}
    for arch in [n for n in torchvision_models().list_models(module=torchvision_models()) if n not in have]:
        for p in ("fp32", "amp-bf16"):
            yield Case(f"sweep-{arch}-{p}", "torchvision", arch, "image-classification", {}, 2,
                       299 if arch == "inception_v3" else 224, p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, choices=(*AUTO, "torchvision"))
    ap.add_argument("--start", type=int, default=0, help="skip this many cases (default 0)")
    ap.add_argument("--limit", type=int, default=None, help="stop after this many cases")
    args = ap.parse_args(argv)
    print(format_header(header()), flush=True)
    warnings.simplefilter("ignore")
    from labkit.memory.trace.step import FakeModeUnsupported
    from labkit.workloads.corpus import predict

    cases = _torchvision_cases() if args.task == "torchvision" else _hf_cases(args.task)
    for i, case in enumerate(cases):
        if i < args.start:
            continue
        if args.limit is not None and i >= args.start + args.limit:
            break
        print(case if isinstance(case, str) else _try(case, predict, FakeModeUnsupported), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
