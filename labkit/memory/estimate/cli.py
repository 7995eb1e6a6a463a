"""``labkit estimate``: per-GPU memory of a training configuration, from the analytical model."""

from __future__ import annotations

import argparse
import dataclasses

from labkit.memory.estimate import step_tracer
from labkit.core.cliargs import Deprecated, finite_float, nonnegative_int, positive_int
from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps, to_jsonable
from labkit.core.spec import add_flags, filled
from labkit.core.table import render
from labkit.core.units import GB, GiB, fmt_bytes, parse_bytes
from labkit.core.vocab import Recompute
from labkit.memory.estimate import (
    CATEGORIES, ModelSpec, ParallelSpec, TrainSpec, estimate, model_states_only, total_params,
)
from labkit.memory.estimate.planner import (DEFAULT_ACHIEVABLE_FLOPS, SEARCHED_MICRO_BATCHES, cluster_from_topology,
                                            explain, headline, nic_400g, nvswitch_nvlink4, plan, uniform_cluster)
from labkit.memory.estimate.rates import measured_rates
from labkit.memory.estimate.totals import spec_dict

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

DIMS = ("layers", "hidden", "heads", "seq", "vocab", "kv_heads", "ffn")     # --seq: labkit.core.spec


# Flags of one estimate that --plan does not take (it searches the layout itself), and the reverse.
ESTIMATE_ONLY = ("tp", "pp", "dp", "cp", "zero", "sp", "vpp", "schedule", "no_vocab_parallel", "shard_size",
                 "no_reshard", "micro_batch", "recompute", "recompute_every", "optimizer_impl", "dropout", "fp32_grads",
                 "no_flash", "keep_logits", "model_states_only", "params")
PLAN_ONLY = ("gpus", "gpus_per_node", "gpu_memory", "topology", "margin", "tflops")
DEFAULTS = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "zero": 0, "micro_batch": 1, "dropout": 0.0, "gpus": 8,
            "gpu_memory": "80GiB", "margin": 0.10, "tflops": None}
SPEC_FIELDS = ("precision", "optimizer", "optimizer_impl")     # their one default: labkit.core.spec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate", help="per-GPU memory of a training configuration (analytical model: DP/ZeRO, TP+SP, PP, CP)",
        description="Bytes on the most loaded GPU (parameters, gradients, optimizer states, activations, logits, comm "
                    "buffers, context, allocator overhead) at the peak of a steady-state training step, and per pipeline "
                    "stage. Give the model by --model PRESET or by its dimensions; --params N with --model-states-only "
                    "gives the ZeRO/DeepSpeed model-states figures.")
    m = p.add_argument_group("model")
    m.add_argument("--model", metavar="PRESET", help="a preset name (see --list-models); dimension flags override it")
    m.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    m.add_argument("--hf-config", metavar="PATH_OR_TYPE",
                   help="a Hugging Face config.json (or a model type): its dimensions and what its transformers "
                        "implementation keeps (RMSNorm copies, the KV cache...); dimension flags override it")
    for d in DIMS:
        if d != "seq":
            m.add_argument(f"--{d.replace('_', '-')}", type=positive_int, dest=d)
    m.add_argument("--gated", action="store_true", default=None, help="gated (SwiGLU) MLP")
    m.add_argument("--untied", action="store_true", help="untied input and output embeddings")
    m.add_argument("--params", type=finite_float(ge=1, le=1e15), help="parameter count (with --model-states-only; "
                   "at most 1e15)")
    m.add_argument("--model-states-only", action="store_true", help="weights + grads + optimizer states only")
    t = p.add_argument_group("training")
    add_flags(t, "micro_batch", "seq", notes={"micro_batch": "not given: 1", "seq": "not given: the model's"})
    t.add_argument("--global-batch", type=positive_int)
    t.add_argument("--dropout", type=finite_float(ge=0, lt=1), help="dropout probability (default 0)")
    add_flags(t, "precision")
    t.add_argument("--fp32-grads", action="store_true", help="fp32 gradient accumulation (Megatron: 18 B/param)")
    add_flags(t, "optimizer", "optimizer_impl", "recompute")
    t.add_argument("--recompute-every", type=positive_int, action=Deprecated, new="--recompute every-K")
    t.add_argument("--no-flash", action="store_true", help="math attention (keeps the s x s scores)")
    t.add_argument("--keep-logits", action="store_true", help="the training loop holds the logits through backward")
    t.add_argument("--framework", choices=("pytorch", "megatron"),
                   help="activation layout: pytorch (default, as advise) or megatron")
    q = p.add_argument_group("parallelism")
    for d in ("tp", "pp", "dp", "cp"):
        q.add_argument(f"--{d}", type=positive_int, help="default 1")
    q.add_argument("--zero", type=nonnegative_int, choices=(0, 1, 2, 3), help="ZeRO stage (default 0)")
    q.add_argument("--sp", action="store_true", help="sequence parallelism (with --tp > 1)")
    q.add_argument("--vpp", type=positive_int, help="virtual pipeline stages per rank (interleaved 1F1B)")
    q.add_argument("--schedule", choices=("1f1b", "gpipe", "interleaved"), help="default 1f1b (interleaved with --vpp)")
    q.add_argument("--no-vocab-parallel", action="store_true", help="embeddings and LM head replicated over tp")
    q.add_argument("--shard-size", type=positive_int, help="ZeRO/FSDP sharding group (hybrid shard)")
    q.add_argument("--no-reshard", action="store_true", help="ZeRO-3: keep gathered params from forward to backward")
    pl = p.add_argument_group("planner (--plan: search layouts for a cluster instead of estimating one)")
    pl.add_argument("--plan", action="store_true", help="rank (tp, pp, dp, ZeRO, micro-batch, recompute) layouts")
    pl.add_argument("--gpus", type=positive_int, help="GPUs in the cluster (default 8)")
    pl.add_argument("--gpus-per-node", type=positive_int, help="default: 8, or --gpus when fewer")
    pl.add_argument("--gpu-memory", help="memory per GPU with its unit, e.g. 80GiB, 141GB (default 80GiB; a bare number is refused)")
    pl.add_argument("--topology", metavar="SAMPLE", help="one node's topology (a sample from `labkit topo --list`, or a saved `nvidia-smi topo -m` file); "
                    "default: every GPU on NVSwitch with its NVLink4 links (labkit.core.interconnect)")
    pl.add_argument("--margin", type=finite_float(ge=0, lt=1), help="memory kept free, fraction (default 0.10)")
    pl.add_argument("--tflops", type=finite_float(gt=0), help="achievable TFLOP/s per GPU (default: the recorded H200 matmul "
                    "rate at the model's MLP GEMM per micro-batch, the rate advise uses)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def _given(args, names) -> list[str]:
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]


def _check_mode(args) -> None:
    """Refuse the flags that do not apply to the chosen mode, then fill in the defaults."""
    if args.plan:
        wrong = _given(args, ESTIMATE_ONLY)
        if wrong:
            raise LabkitError(f"{', '.join(wrong)} does not apply to --plan (the planner searches tp, pp, dp, ZeRO, "
                              "micro-batch and recompute itself)")
    else:
        wrong = _given(args, PLAN_ONLY)
        if wrong:
            raise LabkitError(f"{', '.join(wrong)} only applies to --plan")
    if args.recompute_every is not None:
        rc = args.recompute
        if rc is None or rc.kind not in ("full", "every"):
            raise LabkitError(f"--recompute-every {args.recompute_every} needs --recompute full "
                              f"(better: --recompute every-{args.recompute_every})")
        if rc.kind == "every" and rc.every != args.recompute_every:
            raise LabkitError(f"--recompute {rc} contradicts --recompute-every {args.recompute_every}")
    for k, v in DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    filled(args, *SPEC_FIELDS)


def _model(args):
    from labkit.memory.estimate.presets import get_preset

    given = {d: getattr(args, d) for d in DIMS if getattr(args, d) is not None}
    if args.gated:
        given["gated_mlp"] = True
    if args.untied:
        given["tied_embeddings"] = False
    if args.model and args.hf_config:
        raise LabkitError("give --model PRESET or --hf-config CONFIG, not both")
    if args.model:
        return dataclasses.replace(get_preset(args.model), **given)
    if args.hf_config:
        from labkit.memory.estimate.hf_config import load_hf_config, spec_from_hf_config

        spec = spec_from_hf_config(load_hf_config(args.hf_config), seq=given.pop("seq", None),
                                   layers=given.pop("layers", None), hidden=given.pop("hidden", None))
        return dataclasses.replace(spec, **given)
    missing = [f"--{d}" for d in ("layers", "hidden", "heads", "vocab") if d not in given]
    if missing:
        raise LabkitError(f"give --model PRESET, --hf-config CONFIG or the dimensions: missing {' '.join(missing)}")
    return ModelSpec(**given)


def build(args):
    schedule = args.schedule or ("interleaved" if (args.vpp or 1) > 1 else "1f1b")
    par = ParallelSpec(tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, zero=args.zero, sp=args.sp, vpp=args.vpp,
                       schedule=schedule, vocab_parallel=not args.no_vocab_parallel, shard_size=args.shard_size,
                       reshard_after_forward=not args.no_reshard)
    recompute = args.recompute or Recompute()
    if args.recompute_every is not None and recompute.kind == "full":
        recompute = Recompute("every", args.recompute_every)  # the deprecated --recompute full --recompute-every K
    train = TrainSpec(micro_batch=args.micro_batch, global_batch=args.global_batch, precision=args.precision,
                      optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, recompute=recompute,
                      flash=not args.no_flash, dropout=args.dropout,
                      fp32_grad_accum=args.fp32_grads, keep_logits=args.keep_logits,
                      framework=args.framework or "pytorch")
    return par, train


def _row(name, n):
    return [name, str(int(n)), fmt_bytes(n), f"{n / GB:.2f} GB"]


def run(args: argparse.Namespace) -> int:
    _check_mode(args)
    if args.model is not None and not args.model.strip():
        raise LabkitError("--model: empty; name a preset (labkit estimate --list-models) or give the dimensions")
    if args.list_models and (args.model or args.plan):
        raise LabkitError(f"--list-models lists the presets; {'--model' if args.model else '--plan'} does not apply")
    if args.list_models:
        from labkit.memory.estimate.presets import presets

        rows = [[p.name, p.family, f"{total_params(p.model) / 1e9:.3f}", p.model.layers, p.model.hidden, p.model.heads,
                 p.model.kv, p.model.ffn_size, p.model.vocab, p.model.seq] for p in presets().values()]
        print(render(["preset", "family", "params (1e9)", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq"], rows))
        return 0
    if args.plan:
        return run_plan(args)
    par, train = build(args)
    if args.model_states_only:
        if args.params is not None:
            n = int(args.params)
        else:
            n = total_params(_model(args))
        ms = model_states_only(n, par, train)
        doc = {"params": n, "per_gpu_bytes": {"parameters": ms.params, "gradients": ms.grads,
                                              "optimizer_state": ms.optimizer, "total": ms.total},
               "parallel": spec_dict(par), "train": spec_dict(train)}
        if args.json:
            print(dumps(doc))
        else:
            print(f"model states of {n:,} parameters per GPU (tp={par.tp}, pp={par.pp}, ZeRO-{par.zero} over "
                  f"{par.shard_group if par.zero else 1}, {train.precision}, {train.optimizer}):")
            print(render(["part", "bytes", "GiB-based", "GB-based"],
                         [_row(k, v) for k, v in doc["per_gpu_bytes"].items()]))
        return 0
    if args.params is not None:
        raise LabkitError("--params only goes with --model-states-only (activations need the dimensions)")
    model = _model(args)
    est = estimate(model, par, train)
    if args.json:
        print(dumps(est))
        return 0
    total = est.per_gpu_bytes["total"]
    print(f"{model.name}: {est.params_total / 1e9:.3f} x 1e9 parameters; tp={par.tp} pp={par.pp} dp={par.dp} "
          f"cp={par.cp} ZeRO-{par.zero}{' +SP' if par.sp else ''}; {train.precision}, {train.optimizer}, "
          f"recompute {train.recompute}; micro-batch {train.micro_batch} x {est.micro_batches} per step, "
          f"sequence length {train.seq or model.seq}")
    # one answer to "will it fit": the table's total; the allocator's figures are parts of it, named as such
    print(f"most loaded GPU: pipeline stage {est.most_loaded_stage}, peak in {est.peak_phase}: needs "
          f"{fmt_bytes(total)} of GPU memory (the table's total) = {fmt_bytes(est.peak_allocated)} allocated "
          f"(max_memory_allocated) + {fmt_bytes(est.peak_reserved - est.peak_allocated)} allocator overhead "
          f"(reserved {fmt_bytes(est.peak_reserved)}) + {fmt_bytes(total - est.peak_reserved)} outside the "
          "allocator (CUDA context, NCCL)\n")
    print(render(["part, at that peak", "bytes", "GiB-based", "GB-based"],
                 [_row(c, est.per_gpu_bytes[c]) for c in CATEGORIES + ("total",)]))
    if len(est.by_stage) > 1:
        print()
        rows = [[s.stage, s.layers, f"{s.in_flight:g}", s.peak_phase, fmt_bytes(s.per_gpu_bytes["activations"]),
                 fmt_bytes(s.per_gpu_bytes["total"])] for s in est.by_stage]
        print(render(["stage", "layers", "in flight", "peak phase", "activations", "total"], rows))
    for n in est.notes:
        print(f"note: {n}")
    print(f"(1 GiB = {GiB} B, 1 GB = {GB} B; model, not a measurement)")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    model = _model(args)
    if args.global_batch is None:
        raise LabkitError("--plan needs --global-batch")
    mem = parse_bytes(args.gpu_memory, what="--gpu-memory", require_unit=True)
    if mem < 1:
        raise LabkitError(f"--gpu-memory must be positive, got {args.gpu_memory!r}")
    flops = args.tflops * 1e12 if args.tflops is not None else DEFAULT_ACHIEVABLE_FLOPS
    rate = None
    if args.tflops is None:
        rate = measured_rates(model, args.precision, model.seq)
    per_node = args.gpus_per_node if args.gpus_per_node is not None else min(8, args.gpus)
    if per_node > args.gpus:
        raise LabkitError(f"--gpus-per-node {per_node} is more than --gpus {args.gpus}")
    if args.gpus % per_node:
        raise LabkitError(f"--gpus {args.gpus} is not a multiple of --gpus-per-node {per_node}")
    if args.topology:
        cl = cluster_from_topology(args.topology, nodes=args.gpus // per_node, gpu_memory_bytes=mem, achievable_flops=flops)
        if cl.gpus_per_node != per_node:
            raise LabkitError(f"--topology {args.topology} has {cl.gpus_per_node} GPUs per node, not --gpus-per-node {per_node}")
    else:
        cl = uniform_cluster(f"{args.gpus} GPUs", args.gpus, per_node, mem,
                             nvswitch_nvlink4("NVLink4-class through NVSwitch"), nic_400g(),
                             achievable_flops=flops)
    # the activation layout advise uses (transformers' rules), so that both verbs headline one per-GPU peak
    framework = args.framework or "pytorch"
    result = plan(model, cl, args.global_batch, precision=args.precision, optimizer=args.optimizer, margin=args.margin,
                  framework=framework, rate=rate, micro_batches=SEARCHED_MICRO_BATCHES)
    head = None
    if result.best is not None:
        traced = None
        trace = step_tracer.tracer()
        same_model = not (args.gated or args.untied or any(getattr(args, d) is not None for d in DIMS
                                                            if d not in ("layers", "hidden", "seq")))
        if args.hf_config and trace is not None and same_model:   # the same traced step advise headlines
            best = result.best
            try:
                traced = trace(args.hf_config, layers=args.layers, hidden=args.hidden, seq=model.seq,
                               micro_batch=best.micro_batch, precision=args.precision, optimizer=args.optimizer,
                               recompute=best.recompute)
            except LabkitError as exc:   # the plan still answers, from the estimator, and says why
                result.assumptions.append(f"the model could not be traced ({exc}): the estimator's peak and the "
                                          "FLOPs model's step time")
        head = headline(model, result.best, cl, global_batch=args.global_batch, precision=args.precision,
                        optimizer=args.optimizer, framework=framework, traced=traced)
    if args.json:
        print(dumps({**to_jsonable(result), "headline": head}))
        return 0
    print(f"{model.name} on {cl.name}, global batch {args.global_batch}: {result.considered} layouts, {result.fitting} fit "
          f"(model, not a measurement)")
    if head is not None:
        print(f"best layout {result.best.label}: per-GPU peak {fmt_bytes(head.peak_bytes)} allocated "
              f"({head.peak_source}; the estimator: {fmt_bytes(head.estimator_peak_bytes)}"
              + (f", {head.estimator_error:+.1%} vs the trace on the unsharded step" if head.estimator_error is not None
                 else "") + "); step time "
              f"{head.step_s * 1e3:.1f} ms ({head.step_source}"
              + (f"; the FLOPs model: {head.flops_step_s * 1e3:.1f} ms)" if head.step_s != head.flops_step_s else ")"))
        print("the layouts, ranked by the FLOPs model with the estimator's memory:")
    for line in explain(result):
        print(line)
    print("assumptions: " + "; ".join(result.assumptions))
    return 0
