"""``labkit measure``: the peak memory of training steps of your model, on a GPU, the CPU, or a faked GPU.

    labkit measure --model gpt --layers 12 --hidden 768 --heads 12 --seq 1024 --micro-batch 8 \\
        --precision amp-bf16 --recompute full --device fake-cuda --json
    labkit measure --hf-config llama --layers 4 --hidden 1024 --micro-batch 4 --seq 2048 --precision bf16
    labkit measure --hf-config path/to/config.json --lora --precision bf16
    labkit measure --factory mypkg.models:build --micro-batch 8 --seq 512       # your own nn.Module
    labkit measure --factory mypkg.vision:net --image-size 224 --micro-batch 64
    labkit measure --hf-config path/to/mixtral/config.json --moe-routing 0.4,0.2,0.2,0.2   # skewed routing
    labkit measure --script train.py --steps 3 -- --lr 3e-4      # your own training script, unmodified
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from typing import Any

from labkit.allocator import read_snapshot
from labkit.core.cliargs import int_between, moe_routing_value
from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps
from labkit.core.spec import MAX_MICRO_BATCH, add_flags, default, filled
from labkit.core.table import render
from labkit.core.units import fmt_bytes
from labkit.core.vocab import OptimizerSpec, Recompute, TRACEABLE_PRECISIONS
from labkit.memory.trace.corpus_check import cache_pairs

# What runs a step (torch, transformers, the tracer, the workloads) is imported in the functions that use it:
# `labkit --help` builds this parser, and those imports take seconds (python -X importtime: torch alone about
# 2.5 s on a 2-core machine); the rest is imported here.


TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "image-classification")

# Bounds on the counts a user gives, so that the work is bounded: the largest published models have 126 layers,
# 16,384 hidden, 128 heads, 256k vocabularies; a step of 2^20 tokens per sample is past any trained context.
MAX_LAYERS, MAX_HIDDEN, MAX_HEADS, MAX_VOCAB = 512, 1 << 17, 1024, 1 << 22
MAX_IMAGE, MAX_STEPS, MAX_PLACEMENTS = 8192, 50, 64   # the batch's bounds: labkit.core.spec
#: The batch is built on the host (in fake mode too): token ids and labels (int64) or float32 images.
MAX_BATCH_BYTES = 1 << 30
TRACED_OPTIMIZERS = ("adamw", "adam", "sgd")     # adam8bit is the model's only (bitsandbytes)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "measure", help="peak memory of training steps of a model, per phase and category (GPU, CPU or fake GPU)",
        description="Run training steps of a model under the memory tracer and report the steady-state peak, per "
                    "phase and per category. The model: the lab's reference GPT (the default; --model NAME for a "
                    "named reference workload), a "
                    "Hugging Face model built from its configuration without weights (--hf-config), or your "
                    "own code (--factory). --device fake-cuda (the default) predicts an H200's allocations "
                    "without a GPU; a model fake mode cannot run is refused with the op and module named.")
    m = p.add_argument_group("model")
    m.add_argument("--model", metavar="NAME", default=None,
                   help="a named reference workload of the lab's GPT (labkit.workloads.REFERENCE_WORKLOADS, e.g. "
                        "gpt2-124m, tiny); size flags override it. Default: the lab's GPT at a small size")
    m.add_argument("--workload", help=argparse.SUPPRESS)                  # deprecated: --model NAME
    m.add_argument("--hf-config", metavar="PATH_OR_MODEL_TYPE",
                   help="a local config.json (or its folder) or a transformers model type (llama, mistral, bert, "
                        "t5, vit, ...): the model built from it, no weights (transformers)")
    m.add_argument("--factory", metavar="MODULE:FUNCTION",
                   help="your own code: FUNCTION() in MODULE (importable from here) returns the nn.Module")
    m.add_argument("--script", metavar="PATH",
                   help="your own training script, unmodified: run as `python PATH ARGS` (ARGS after --) on a fake "
                        "GPU; reports the whole run's peak allocated and reserved, each optimizer step's peak, the "
                        "phase, categories and your code's lines at the peak. On a GPU, `labkit watch -- python PATH` "
                        "is the real twin")
    m.add_argument("--task", choices=TASKS, help="what the batch and the loss are (default: from the config; "
                                                 "causal-lm, or image-classification with --image-size)")
    m.add_argument("--lora", action="store_true", help="peft LoRA (r=16 on the attention projections) on a bf16 "
                                                       "base (--hf-config; needs peft)")
    m.add_argument("--no-kv-cache", action="store_true",
                   help="--hf-config: build the model with use_cache=False (transformers' default builds the KV cache "
                        "in every training forward; under torch.utils.checkpoint it is kept through backward)")
    m.add_argument("--layers", type=int_between(1, MAX_LAYERS))
    m.add_argument("--hidden", type=int_between(1, MAX_HIDDEN))
    m.add_argument("--heads", type=int_between(1, MAX_HEADS))
    m.add_argument("--vocab", type=int_between(1, MAX_VOCAB))
    b = p.add_argument_group("batch")
    add_flags(b, "micro_batch", "seq",
              notes={"micro_batch": "not given: the named workload's, else 4",
                     "seq": "not given: the named workload's, else 256 (the lab's GPT) or 512"})
    b.add_argument("--image-size", type=int_between(1, MAX_IMAGE), help="image side in pixels (vision models)")
    b.add_argument("--batch", type=int_between(1, MAX_MICRO_BATCH), help=argparse.SUPPRESS)          # deprecated: --micro-batch
    s = p.add_argument_group("step")
    add_flags(s, "precision", "recompute", choices={"precision": TRACEABLE_PRECISIONS})
    s.add_argument("--checkpointing", default=None, help=argparse.SUPPRESS)   # deprecated: --recompute
    s.add_argument("--recompute-via", choices=("torch", "hf", "hf-reentrant"), default="torch",
                   help="Hugging Face models: labkit's torch.utils.checkpoint per layer (torch, the default) or "
                        "the model's gradient_checkpointing_enable (hf: non-reentrant; hf-reentrant)")
    add_flags(s, "optimizer", "optimizer_impl", choices={"optimizer": TRACED_OPTIMIZERS},
              notes={"optimizer": "the old adamw-foreach is adamw with --optimizer-impl foreach"})
    s.add_argument("--loop", choices=("plain", "keep-output"), default="plain",
                   help="plain: loss = model(**batch).loss (the output freed before backward, the default); "
                        "keep-output: the output object alive through backward")
    s.add_argument("--moe-routing", type=moe_routing_value, default=None, metavar="balanced|SHARES",
                   help="fake-cuda, mixture-of-experts models: how tokens are assumed to be routed where the memory "
                        "depends on it (an eager per-expert loop): balanced (the default) or each expert's share of "
                        "the tokens x top-k rows, e.g. 0.4,0.2,0.2,0.2; the report says which was assumed")
    s.add_argument("--allocator-state", metavar="SNAPSHOT", default=None,
                   help="fake-cuda: replay reserved from the segments a process already holds, from a memory snapshot "
                        "of that process (torch.cuda.memory._dump_snapshot(): a .pickle, optionally gzip'd)")
    s.add_argument("--reserved-placements", type=int_between(0, MAX_PLACEMENTS), default=0, metavar="N",
                   help="fake-cuda: also replay reserved under N other orders of the segments' addresses and print "
                        "the range (where the driver puts segments depends on the process's history)")
    add_flags(s, "process", notes={"process": "warm is implied by --allocator-state"})
    r = p.add_argument_group("a rank of a torchrun launch (with --script)")
    r.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="run the script as a rank of `torchrun --nproc-per-node N`: the launcher's environment, "
                        "init_process_group and init_device_mesh on a fake process group (FSDP2, DDP, DTensor)")
    r.add_argument("--nnodes", type=int, default=None, metavar="M", help="nodes of the launch (default 1)")
    r.add_argument("--ranks", default=None, metavar="all|R,R,...",
                   help="the global ranks to trace, each in its own process (default 0; ranks differ with pipeline "
                        "stages or uneven shards)")
    add_flags(p, "device")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to run; the last one is reported (default 2). With --script: stop the script after N "
                        "optimizer steps (default: run it to its end)")
    p.add_argument("--json", action="store_true", help="print one JSON document (the MeasureReport; with --script "
                   "the ScriptReport, and the script's own output goes to stderr)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                   help="with --script: the script's own arguments, after --")
    p.set_defaults(func=run)


def _deprecated(args: argparse.Namespace) -> None:
    """Old flags keep working, each with one line on stderr."""
    if args.checkpointing is not None:
        print("labkit measure: --checkpointing is deprecated: use --recompute", file=sys.stderr)
        if args.recompute is None:
            args.recompute = args.checkpointing
    if args.batch is not None:
        print("labkit measure: --batch is deprecated: use --micro-batch", file=sys.stderr)
        if args.micro_batch is None:
            args.micro_batch = args.batch
    if args.workload is not None:
        print("labkit measure: --workload is deprecated: use --model NAME", file=sys.stderr)
        args.model = args.model or args.workload
    if args.model == "hf-gpt2":
        print("labkit measure: --model hf-gpt2 is deprecated: use --hf-config gpt2", file=sys.stderr)
        if args.hf_config is None:
            args.hf_config = "gpt2"
        args.model = None
    elif args.model == "gpt":
        print("labkit measure: --model gpt is deprecated: the lab's GPT is the default (--model NAME names one "
              "of its workloads)", file=sys.stderr)
        args.model = None
    args.workload = args.model   # below, the named workload (one name per concept: --model, as in estimate)
    args.recompute = str(Recompute.parse(args.recompute if args.recompute is not None else default("recompute"),
                                         what="--recompute"))


def _quiet_transformers() -> None:
    """transformers' advice lines (use_cache with checkpointing, loss_type) are not this report's."""
    if importlib.util.find_spec("transformers") is not None:
        # transformers sets its logger's level from TRANSFORMERS_VERBOSITY when it first configures it (at
        # import), undoing a level set on the logger before: the setting goes through its own API, after import
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()


def _positive(args: argparse.Namespace, *names: str) -> None:
    for n in names:
        v = getattr(args, n.replace("-", "_"))
        if v is not None and v < 1:
            raise LabkitError(f"--{n} must be >= 1, got {v}")


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work, a model named by an empty string, a count past its bound, a flag that does not
    apply to the model or device given (the README's contract: exit 2; a flag at its default is let be), and a
    batch too large to build on the host."""
    for flag, v in (("--hf-config", args.hf_config), ("--factory", args.factory), ("--model", args.workload)):
        if v is not None and not str(v).strip():
            raise LabkitError(f"{flag}: empty; name a model (or leave the flag out for the lab's GPT)")
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise LabkitError(f"--steps must be from 1 to {MAX_STEPS}, got {args.steps}")
    if args.recompute_via != "torch" and not args.hf_config:
        raise LabkitError("--recompute-via applies to a Hugging Face model: give --hf-config")
    if args.device != "fake-cuda":
        for flag, given in (("--moe-routing", args.moe_routing is not None),
                            ("--allocator-state", args.allocator_state is not None),
                            ("--reserved-placements", bool(args.reserved_placements)),
                            ("--process", args.process != "fresh")):
            if given:
                raise LabkitError(f"{flag} applies to fake mode (--device fake-cuda), not --device {args.device}")
    if not (args.hf_config or args.factory):
        for flag, v in (("--image-size", args.image_size), ("--task", args.task)):
            if v is not None:
                raise LabkitError(f"{flag} does not apply to the lab's GPT (a causal LM of tokens): give --hf-config "
                                  "or --factory")
        if args.moe_routing is not None:
            raise LabkitError("--moe-routing does not apply to the lab's GPT: it is a dense model (no experts)")
    if args.task == "image-classification" and args.seq is not None:
        raise LabkitError("--seq does not apply to image classification: give --image-size")
    _check_batch(args)


def _check_routing(args: argparse.Namespace, rep: Any, what: str) -> None:
    """``--moe-routing`` on a model that ran no mixture-of-experts layer: refused (it would be said nowhere)."""
    routing = (rep.emulation or {}).get("moe_routing") or {}
    if args.moe_routing is not None and not (routing.get("used_by") or routing.get("not_needed_by")):
        raise LabkitError(f"--moe-routing does not apply to {what}: it ran no mixture-of-experts layer (a dense model)")


def _check_batch(args: argparse.Namespace) -> None:
    """The batch is a host tensor (in fake mode too): its bytes are bounded by :data:`MAX_BATCH_BYTES`."""
    mb = args.micro_batch or 4
    if args.image_size is not None or args.task == "image-classification":
        side = args.image_size or 224
        need, what = mb * 3 * side * side * 4, f"{mb} x 3 x {side} x {side} float32 images"
    else:
        seq = args.seq or 1024
        need, what = mb * seq * 16, f"{mb} x {seq} token ids and labels (int64)"
    if need > MAX_BATCH_BYTES:
        raise LabkitError(f"--micro-batch {mb}: a batch of {what} is {fmt_bytes(need)} on the host, more than "
                          f"{fmt_bytes(MAX_BATCH_BYTES)}; measure a smaller micro-batch (memory scales with it)")


def _gpt_sizes(args: argparse.Namespace) -> tuple[dict[str, int], int]:
    from labkit.workloads import get_workload

    if args.workload:
        w = get_workload(args.workload)
        c = w.config
        base = {"layers": c.n_layer, "hidden": c.n_embd, "heads": c.n_head, "seq": c.seq_len, "vocab": c.vocab_size}
        batch = w.batch_size
    else:
        base = {"layers": 4, "hidden": 256, "heads": 4, "seq": 256, "vocab": 8192}
        batch = 4
    for k in base:
        v = getattr(args, k)
        if v is not None:
            base[k] = v
    return base, args.micro_batch or batch


def run(args: argparse.Namespace) -> int:
    filled(args, "precision", "optimizer", "device", "process")    # the spec's defaults (a script's check reads them)
    if args.script is not None:
        from labkit.memory.script.cli import run_script_cli

        return run_script_cli(args)
    for flag in ("nproc_per_node", "nnodes", "ranks"):
        if getattr(args, flag) is not None:
            raise LabkitError(f"--{flag.replace('_', '-')} applies to a script (--script PATH): a rank of a torchrun "
                              "launch")
    if args.script_args:
        raise LabkitError(f"unexpected arguments {' '.join(args.script_args)!r}: arguments after -- are a script's "
                          "(--script PATH)")
    if args.steps is None:
        args.steps = 2
    _deprecated(args)
    _quiet_transformers()
    _check_flags(args)
    _positive(args, "layers", "hidden", "heads", "vocab", "micro-batch", "seq", "image-size")
    sources = [x for x in (args.hf_config and "--hf-config", args.factory and "--factory",
                           args.workload and "--model") if x]
    if len(sources) > 1:
        raise LabkitError(f"give one model: {' and '.join(sources)} both given")
    if args.lora and not args.hf_config:
        raise LabkitError("--lora applies to a Hugging Face model: give --hf-config")
    if args.no_kv_cache and not args.hf_config:
        raise LabkitError("--no-kv-cache applies to a Hugging Face model: give --hf-config")
    try:
        if args.hf_config:
            rep, what = _run_hf(args)
        elif args.factory:
            rep, what = _run_factory(args)
        else:
            rep, what = _run_gpt(args)
    except LabkitError as exc:
        if args.device != "fake-cuda" or not _fake_refusal(exc):
            raise
        if args.factory and _batch_misfits(args, exc):
            raise LabkitError(_misfit_line(args, str(exc.cause))) from None
        raise LabkitError(_refusal_with_command(args, exc, _runs_without_cache(args))) from None
    if args.json:
        print(dumps(rep))
        return 0
    _print_report(args, rep, what)
    return 0


def _fake_refusal(exc: Exception) -> bool:
    from labkit.memory.trace.step import FakeModeUnsupported

    return isinstance(exc, FakeModeUnsupported) or str(exc).startswith(("fake-cuda cannot run", "fake mode cannot run"))


def _kv_cache_grows(args: argparse.Namespace) -> bool:
    """A Hugging Face causal LM with its KV cache on under torch.utils.checkpoint: the recomputation appends to the
    cache the forward filled, so the recomputed layer's keys no longer match its mask (Gemma 2: "Attempting to
    broadcast a dimension of length 32", on the CPU and on a GPU alike); ``use_cache=False`` runs."""
    return bool(args.hf_config and args.recompute != "none" and args.recompute_via == "torch"
                and not args.no_kv_cache and (args.task or "causal-lm") == "causal-lm")


def _runs_without_cache(args: argparse.Namespace) -> bool:
    """Whether the refused step runs in fake mode with ``use_cache=False`` (tried, where the cache may be the cause)."""
    if not _kv_cache_grows(args):
        return False
    try:
        _run_hf(argparse.Namespace(**{**vars(args), "no_kv_cache": True}))
    except LabkitError:
        return False
    return True


def suggested_command(args: argparse.Namespace, without_cache: bool = False) -> list[str]:
    """The command to run instead of a step fake mode refused: the same command with ``--no-kv-cache`` where the
    step runs so (``without_cache``: :func:`_runs_without_cache` tried it), else on the CPU (``--device cpu``: real
    tensors run what fake tensors cannot)."""
    argv = list(getattr(args, "argv", None) or ["measure"])
    if without_cache:
        return ["labkit", *argv, "--no-kv-cache"]
    out, skip = [], False
    for a in argv:                      # drop --device X / --device=X, then ask for the CPU
        if skip:
            skip = False
            continue
        if a == "--device":
            skip = True
            continue
        if a.startswith("--device="):
            continue
        out.append(a)
    return ["labkit", *out, "--device", "cpu"]


def _refusal_with_command(args: argparse.Namespace, exc: Exception, without_cache: bool) -> str:
    """Fake mode's refusal with one command that runs (a test executes it)."""
    from labkit.memory.trace.step import FakeModeUnsupported

    cmd = shlex.join(suggested_command(args, without_cache))
    if isinstance(exc, FakeModeUnsupported):
        where = f" in module {exc.module}" if exc.module else ""
        head = f"fake mode cannot run {'op ' + exc.op if exc.op else 'this step'}{where} during {exc.phase} ({exc.cause})"
    else:
        head = str(exc).split("; measure it with", 1)[0]
    if without_cache:
        why = ("the model keeps its KV cache on under recomputation (use_cache, transformers' default: the recomputed "
               "layers append to the cache the forward filled, and their shapes no longer match on any device); "
               "with use_cache=False the step runs")
    else:
        why = "real tensors run it on the CPU (slowly for a large model; or size it with labkit estimate)"
    return f"{head}; {why}: {cmd}"


def _optimizer(args: argparse.Namespace):
    return OptimizerSpec.parse(args.optimizer, args.optimizer_impl)


def _allocator_state(args: argparse.Namespace) -> list[dict] | None:
    """The segments of ``--allocator-state`` (device 0's, as the snapshot lists them)."""
    if not args.allocator_state:
        return None

    segments = read_snapshot(args.allocator_state).segments
    mine = [s for s in segments if s.get("device", 0) == 0]
    if segments and not mine:
        others = sorted({s.get("device") for s in segments})
        raise LabkitError(f"--allocator-state {args.allocator_state}: segments only of device(s) "
                          f"{', '.join(map(str, others))}; the step runs on device 0 (take the snapshot on that GPU, "
                          "or with CUDA_VISIBLE_DEVICES naming it)")
    return mine


def _process(args: argparse.Namespace, state: list[dict] | None) -> dict[str, Any]:
    """The fake target for ``--process`` (warm where asked for or given the segments a process holds)."""
    if args.device != "fake-cuda":
        return {}
    from labkit.memory.trace.fake.fake_cuda import CudaTarget

    return {"target": CudaTarget(warm_process=args.process == "warm" or bool(state))}


def _step_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from labkit.workloads import StepPolicy

    return {"policy": StepPolicy(precision=args.precision, optimizer=_optimizer(args), recompute=args.recompute,
                                 loop=args.loop),
            "device": args.device, "steps": args.steps, "fake": _fake_options(args)}


def _fake_options(args: argparse.Namespace) -> Any:
    """Fake mode's options from the flags (refused by measure_step on a real device where any is given)."""
    from labkit.memory.trace.step import FakeCuda

    state = _allocator_state(args)
    return FakeCuda(moe_routing=args.moe_routing, allocator_state=state, reserved_placements=args.reserved_placements,
                     **_process(args, state))


def _run_gpt(args: argparse.Namespace) -> tuple[Any, str]:
    from labkit.memory.trace.step import measure_step
    from labkit.workloads import GPT, GPTConfig, gpt_batch, gpt_call, gpt_loss

    s, batch = _gpt_sizes(args)
    if s["hidden"] % s["heads"]:
        raise LabkitError(f"--hidden {s['hidden']} is not divisible by --heads {s['heads']}")
    cfg = GPTConfig(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"], seq_len=s["seq"],
                    vocab_size=s["vocab"])
    rep = measure_step(lambda: GPT(cfg), gpt_batch(cfg, batch), loss_fn=gpt_loss, call=gpt_call, **_step_kwargs(args))
    return rep, f"labkit GPT, {batch} x {s['seq']} tokens"


def _run_hf(args: argparse.Namespace) -> tuple[Any, str]:
    from labkit.workloads.corpus import Case, predict
    from labkit.workloads.user_model import config_source

    arch, overrides, task = config_source(args.hf_config, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                          vocab=args.vocab, image_size=args.image_size)
    task = args.task or task
    if args.no_kv_cache:
        overrides = dict(overrides, use_cache=False)
    seq = args.image_size if task == "image-classification" else args.seq
    case = Case(name=f"cli-{arch}", family="transformers", arch=arch, task=task, overrides=overrides,
                micro_batch=args.micro_batch or 4, seq=seq or (overrides.get("image_size", 224)
                                                               if task == "image-classification" else 512),
                precision=args.precision, recompute=args.recompute, checkpoint_impl=args.recompute_via,
                optimizer=_optimizer(args).name, optimizer_impl=_optimizer(args).impl, loop=args.loop, lora=args.lora)
    rep = predict(case, device=args.device, steps=args.steps, fake=_fake_options(args))
    _check_routing(args, rep, f"{arch} from {args.hf_config}")
    if task == "causal-lm" and case.recompute != "none" and case.checkpoint_impl == "torch" and not args.no_kv_cache:
        rep.notes.append(_kv_cache_note())
    return rep, f"{arch} ({task}) from {args.hf_config}, {case.micro_batch} x {case.seq}" + (
        ", LoRA on a bf16 base" if args.lora else "")


def _kv_cache_note() -> str:
    """Why a checkpointed causal LM keeps its KV cache, with the recorded H200 pairs' savings."""
    saved = sorted(100 * (on.peak_allocated - off.peak_allocated) / on.peak_allocated for on, off in cache_pairs())
    recorded = (f" (recorded on the H200: {saved[0]:.0f}-{saved[-1]:.0f}% lower peaks in {len(saved)} models, "
                "notebook 04)") if saved else ""
    return ("the model builds its KV cache in every training forward (use_cache, transformers' default); under "
            "torch.utils.checkpoint the cache is kept through backward and grown by the recomputation: add "
            f"--no-kv-cache to see the step with use_cache=False{recorded}")


def _factory_batch(args: argparse.Namespace) -> tuple[Any, str, dict]:
    """``--factory``'s function, its task and the batch the lab gives it (token ids, or images for
    image-classification)."""
    from labkit.workloads.user_model import load_factory, make_shaped_batch

    factory = load_factory(args.factory)
    task = args.task or ("image-classification" if args.image_size else "causal-lm")
    batch = make_shaped_batch(task, micro_batch=args.micro_batch or 4,
                              seq=(args.image_size or 224) if task == "image-classification" else (args.seq or 512),
                              vocab=args.vocab, factory=factory)
    return factory, task, batch


def _run_factory(args: argparse.Namespace) -> tuple[Any, str]:
    from labkit.memory.trace.step import measure_step
    from labkit.workloads.corpus import vision_call, vision_loss

    factory, task, batch = _factory_batch(args)
    kw: dict[str, Any] = {}
    if task == "image-classification":
        kw = {"loss_fn": vision_loss, "call": vision_call}
    try:
        rep = measure_step(factory, batch, **kw, **_step_kwargs(args))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        import torch

        # fake mode's own refusals are LabkitErrors; a GPU running out of memory is no misfit of the batch
        if args.device == "fake-cuda" or isinstance(exc, torch.OutOfMemoryError):
            raise
        first = (str(exc).splitlines() or [""])[0]
        raise LabkitError(_misfit_line(args, f"{type(exc).__name__}: {first}")) from None
    _check_routing(args, rep, f"{args.factory}()")
    return rep, f"{args.factory}() ({task})"


def _batch_misfits(args: argparse.Namespace, exc: Exception) -> bool:
    """Whether a step fake mode refused in the forward, outside any op it could not run (the model's own Python: an
    unpacking, a reshape's size check), fails the same way on meta tensors, which have shapes and no values: then
    the lab's batch does not fit the model (a video model given images), and real tensors fail too. An op without a
    fake kernel (a custom op) has no meta kernel either: that refusal keeps its --device cpu."""
    import torch

    from labkit.memory.trace.step import FakeModeUnsupported
    from labkit.workloads.corpus import vision_call

    if not isinstance(exc, FakeModeUnsupported) or exc.op or exc.phase != "forward" or not exc.cause:
        return False
    factory, task, batch = _factory_batch(args)
    try:
        with torch.device("meta"):
            model = factory()
        meta = {k: v.to("meta") for k, v in batch.items()}
        vision_call(model, meta) if task == "image-classification" else model(**meta)
    except Exception as meta_exc:  # noqa: BLE001 - any error of the model's own forward is compared, none raised
        first = (str(meta_exc).strip().splitlines() or [""])[0]
        return (bool(first) and not isinstance(meta_exc, NotImplementedError)
                and str(exc.cause).startswith(f"{type(meta_exc).__name__}: {first[:240]}"))
    return False


def _misfit_line(args: argparse.Namespace, cause: str) -> str:
    """One line for a ``--factory`` model that raises on the lab's batch: the batch it was given and what to run."""
    _, task, batch = _factory_batch(args)
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items())
    return (f"--factory {args.factory}: the model raised on the batch labkit makes for --task {task} ({shapes}): {cause}; "
            "a model that takes other inputs (a video clip, several tensors) is measured with its own training loop: "
            "labkit measure --script YOUR_TRAIN.py")


def _print_report(args: argparse.Namespace, rep: Any, what: str) -> None:
    where = {"fake-cuda": "predicted for an H200 (fake tensors, no GPU used)", "cuda": "measured on this GPU",
             "cpu": "measured on this CPU"}.get(args.device, args.device)
    print(f"{what}: peak {fmt_bytes(rep.peak_bytes)} ({rep.peak_bytes} bytes) in phase {rep.peak_phase}, {where}; "
          f"{rep.num_params / 1e6:.1f}M parameters, step {rep.steps} of {rep.steps}")
    print(render(["phase", "peak allocated", "tensor storages: start", "peak", "end"],
                 [[p.phase, fmt_bytes(p.peak_bytes), fmt_bytes(p.start_bytes), fmt_bytes(p.storage_peak_bytes),
                   fmt_bytes(p.end_bytes)] for p in rep.by_phase]))
    print()
    print(render(["category (at the peak)", "bytes"], [[k, fmt_bytes(v)] for k, v in rep.by_category.items() if v]))
    if rep.reserved_bytes is not None:
        how = "predicted by the allocator simulator" if args.device == "fake-cuda" else "torch.cuda.memory_stats"
        if args.device == "fake-cuda":
            how += (f", from the segments of {args.allocator_state}" if args.allocator_state
                    else (", a fresh process: an empty cache, the cuBLAS workspaces allocated at the first matmuls"
                          if args.process == "fresh" else ", a warm process: an empty cache and the cuBLAS workspaces")
                    + "; --allocator-state for a process that holds more")
        print(f"\ntensor storages at their peak {fmt_bytes(rep.storage_peak_bytes)}; allocator reserved "
              f"{fmt_bytes(rep.reserved_bytes)} ({how})")
        if rep.reserved_range:
            lo, hi = rep.reserved_range
            print(f"reserved over {args.reserved_placements + 1} segment placements: {fmt_bytes(lo)} to "
                  f"{fmt_bytes(hi)}")
    emulation = rep.emulation or {}
    routing = emulation.get("moe_routing") or {}
    if routing.get("used_by") or routing.get("not_needed_by"):
        print(f"\nMoE routing assumed: {routing['assumed']}" + (" (the default)" if routing.get("default") else ""))
    torch_note = (emulation.get("torch") or {}).get("note")
    if torch_note:
        print(f"\nnote: {torch_note}")
    if emulation.get("assumptions"):
        print("\nassumed where fake tensors have no values:")
        for text in emulation["assumptions"]:
            print(f"  - {text}")
    for text in rep.notes:
        print(f"\nnote: {text}")
