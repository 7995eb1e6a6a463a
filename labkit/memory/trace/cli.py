"""``labkit measure``: one training step of a GPT under the tracer, on a GPU, the CPU, or a faked GPU.

    labkit measure --model gpt --layers 12 --hidden 768 --heads 12 --seq 1024 --batch 8 \\
        --precision amp-bf16 --checkpointing full --device fake-cuda --json
"""

from __future__ import annotations

import argparse

from labkit.core.serialize import dumps
from labkit.core.table import render


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "measure", help="peak memory of one training step, per phase and category (GPU, CPU or fake GPU)",
        description="Run training steps of a GPT (the lab's reference GPT or Hugging Face GPT-2 built from a "
                    "config, no weights) under the memory tracer and report the steady-state peak, per phase "
                    "and per category. --device fake-cuda predicts an H200's allocations without a GPU.")
    p.add_argument("--model", choices=("gpt", "hf-gpt2"), default="gpt",
                   help="gpt: labkit's reference GPT; hf-gpt2: transformers.GPT2LMHeadModel (needs labkit[hf])")
    p.add_argument("--workload", help="a named reference workload (labkit.workloads.REFERENCE_WORKLOADS); "
                                      "other size flags override it")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--precision", default="fp32", help="fp32, amp-bf16, amp-fp16 or bf16 (default fp32)")
    p.add_argument("--checkpointing", default="none", help="none, full, every-K or selective (default none)")
    p.add_argument("--optimizer", default="adamw", help="adamw (fused), adamw-foreach or sgd (default adamw)")
    p.add_argument("--device", default="fake-cuda", help="fake-cuda (default), cuda or cpu")
    p.add_argument("--steps", type=int, default=2, help="steps to run; the last one is reported (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON document (the MeasureReport)")
    p.set_defaults(func=run)


def _sizes(args: argparse.Namespace) -> tuple[dict[str, int], int]:
    from labkit.core.errors import LabkitError
    from labkit.workloads import get_workload

    if args.workload:
        w = get_workload(args.workload)
        c = w.config
        base = {"layers": c.n_layer, "hidden": c.n_embd, "heads": c.n_head, "seq": c.seq_len, "vocab": c.vocab_size}
        batch = w.batch_size
    else:
        base = {"layers": 4, "hidden": 256, "heads": 4, "seq": 256,
                "vocab": 50257 if args.model == "hf-gpt2" else 8192}
        batch = 4
    for k in base:
        v = getattr(args, k)
        if v is not None:
            if v < 1:
                raise LabkitError(f"--{k} must be >= 1, got {v}")
            base[k] = v
    if args.batch is not None:
        if args.batch < 1:
            raise LabkitError(f"--batch must be >= 1, got {args.batch}")
        batch = args.batch
    return base, batch


def run(args: argparse.Namespace) -> int:
    from labkit.core.units import fmt_bytes
    from labkit.memory.trace.step import measure_step

    s, batch = _sizes(args)
    if args.model == "gpt":
        from labkit.workloads import GPT, GPTConfig
        from labkit.workloads import gpt_batch, gpt_call, gpt_loss

        cfg = GPTConfig(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"], seq_len=s["seq"],
                        vocab_size=s["vocab"])
        rep = measure_step(lambda: GPT(cfg), gpt_batch(cfg, batch), loss_fn=gpt_loss, call=gpt_call,
                           optimizer=args.optimizer, precision=args.precision, checkpointing=args.checkpointing,
                           device=args.device, steps=args.steps)
    else:
        from labkit.core.errors import LabkitError
        from labkit.workloads import HFGPT2Spec, hf_gpt2_factory, hf_lm_batch

        if s["hidden"] % s["heads"]:
            raise LabkitError(f"--hidden {s['hidden']} is not divisible by --heads {s['heads']}")
        spec = HFGPT2Spec(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"], n_positions=s["seq"],
                          vocab_size=s["vocab"])
        rep = measure_step(hf_gpt2_factory(spec), hf_lm_batch(spec.vocab_size, batch, s["seq"]),
                           optimizer=args.optimizer, precision=args.precision, checkpointing=args.checkpointing,
                           device=args.device, steps=args.steps)
    if args.json:
        print(dumps(rep))
        return 0
    where = {"fake-cuda": "predicted for an H200 (fake tensors, no GPU used)", "cuda": "measured on this GPU",
             "cpu": "measured on this CPU"}[args.device]
    print(f"peak {fmt_bytes(rep.peak_bytes)} ({rep.peak_bytes} bytes) in phase {rep.peak_phase}, {where}; "
          f"{rep.num_params / 1e6:.1f}M parameters, step {rep.steps} of {rep.steps}")
    print(render(["phase", "peak allocated", "tensor storages: start", "peak", "end"],
                 [[p.phase, fmt_bytes(p.peak_bytes), fmt_bytes(p.start_bytes), fmt_bytes(p.storage_peak_bytes),
                   fmt_bytes(p.end_bytes)] for p in rep.by_phase]))
    print()
    print(render(["category (at the peak)", "bytes"], [[k, fmt_bytes(v)] for k, v in rep.by_category.items() if v]))
    if rep.reserved_bytes is not None:
        what = "predicted by the allocator simulator" if args.device == "fake-cuda" else "torch.cuda.memory_stats"
        print(f"\ntensor storages at their peak {fmt_bytes(rep.storage_peak_bytes)}; allocator reserved "
              f"{fmt_bytes(rep.reserved_bytes)} ({what})")
    return 0
