"""``labkit comm bench`` and ``labkit comm buckets``: collectives and the DDP bucket sweep.

Both start ``--world`` local processes (gloo on CPUs, nccl on GPUs), or, under
``torchrun --nnodes N --nproc-per-node M -m labkit comm ...``, use torchrun's processes (``--world``
is then ignored). Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import warnings

from labkit.comm.bench import bench_collectives, buffer_budget, machine_buffer_bytes, parse_ops, size_ladder
from labkit.comm.ddp import parse_bucket_sizes, sweep_buckets
from labkit.comm.fit import fit_all
from labkit.comm import launch   # launch.run_ranks looked up when called: tests stop it there before it spawns
from labkit.comm.launch import check_backend, shutdown, under_torchrun
from labkit.comm.predict import attach_predictions
from labkit.core.cliargs import Deprecated, int_at_least, int_between, positive_int
from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps
from labkit.core.spec import add_flags, filled
from labkit.core.table import render
from labkit.core.units import fmt_bytes
from labkit.core.vocab import canonical

# labkit.workloads (torch) is imported where the bucket sweep runs: `labkit --help` builds this parser.


# torch.autocast dtype of each precision the bucket sweep runs (labkit.core.vocab spellings)
BUCKET_PRECISIONS = {"fp32": None, "amp-bf16": "bfloat16", "amp-fp16": "float16"}
MAX_LOCAL_RANKS = 64          # spawned processes on one machine
MAX_BUCKET_SIZES = 64         # points of one bucket sweep
MAX_BUCKET_MB = 1024 * 1024   # 1 TiB: far above any gradient set DDP would bucket


def _old_amp(value: str) -> str:
    """``--amp bfloat16`` (the old flag's autocast dtype) as a precision: amp-bf16."""
    if value not in ("bfloat16", "float16"):
        raise LabkitError(f"{value!r} is not an autocast dtype: bfloat16 or float16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the flag's own note says it
        return canonical("precision", value)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("comm", help="collective benchmark and DDP bucket sweep (gloo CPU processes or NCCL GPUs)",
                       description="Measure collectives and DDP bucket sizes on torch.distributed.")
    csub = p.add_subparsers(dest="comm_command", metavar="SUBCOMMAND")

    b = csub.add_parser("bench", help="all_reduce / all_gather / reduce_scatter / broadcast over sizes",
                        description="Collective benchmark: median of repeats after warm-up; algbw and busbw "
                                    "(GB = 1e9 B/s) with nccl-tests' factors; bytes as nccl-tests counts them.")
    b.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    b.add_argument("--world", type=positive_int, default=2, help="local processes to spawn (ignored under torchrun)")
    b.add_argument("--op", default="all", help="all_reduce, all_gather, reduce_scatter, broadcast, a comma list, or all")
    b.add_argument("--min-bytes", default="4KiB", help="smallest size (default 4KiB)")
    b.add_argument("--max-bytes", default=None, help="largest size (default 4MiB on gloo, 1GiB on nccl)")
    b.add_argument("--factor", type=int_at_least(2), default=4, help="each size is this times the previous (default 4)")
    b.add_argument("--warmup", type=int_between(0, 1000), default=2, help="untimed runs per size (default 2, at most "
                   "1000)")
    b.add_argument("--repeats", type=int_between(1, 10000), default=5, help="timed runs per size, the median is "
                   "reported (default 5, at most 10000)")
    b.add_argument("--link-class", default=None, help="label of the links measured, for the alpha-beta fit "
                                                       "(default: cpu-shm on gloo, gpu on nccl)")
    b.add_argument("--json", action="store_true", help="print one JSON document")
    b.set_defaults(func=run_bench)

    k = csub.add_parser("buckets", help="DDP bucket_cap_mb sweep of the reference GPT",
                        description="Real multi-process DDP training of a reference GPT for each bucket size "
                                    "(MiB, as DDP's bucket_cap_mb), gradient_as_bucket_view off and on.")
    k.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    k.add_argument("--world", type=positive_int, default=2, help="local processes to spawn (ignored under torchrun)")
    k.add_argument("--sizes", default="1,25,100", help="bucket sizes in MiB, comma separated (default 1,25,100)")
    k.add_argument("--model", default="tiny", metavar="WORKLOAD",
                   help="a named reference workload (labkit.workloads; default tiny)")
    k.add_argument("--workload", dest="model", action=Deprecated, new="--model")
    add_flags(k, "micro_batch", notes={"micro_batch": "per rank; not given: the workload's"})
    k.add_argument("--batch-size", dest="micro_batch", type=positive_int, action=Deprecated, new="--micro-batch")
    k.add_argument("--steps", type=int_between(1, 1000), default=5, help="timed steps per point (default 5, at most "
                   "1000)")
    k.add_argument("--warmup", type=int_between(2, 1000), default=2, help="untimed steps per point (default 2, at "
                   "least 2)")
    k.add_argument("--gradient-as-bucket-view", choices=("off", "on", "both"), default="both")
    add_flags(k, "precision", choices={"precision": tuple(BUCKET_PRECISIONS)},
              notes={"precision": "autocast applies on CUDA (nccl) only"})
    k.add_argument("--amp", dest="precision", convert=_old_amp, action=Deprecated, new="--precision amp-bf16 (or amp-fp16)")
    k.add_argument("--json", action="store_true", help="print one JSON document")
    k.set_defaults(func=run_buckets)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def _bench_rank(ctx, ops, sizes, warmup, repeats):
    return bench_collectives(ctx, ops, sizes, warmup=warmup, repeats=repeats)


def _buckets_rank(ctx, kwargs):
    return sweep_buckets(ctx, **kwargs)


def run_bench(args: argparse.Namespace) -> int:
    ops = parse_ops(args.op)
    max_b = args.max_bytes or ("1GiB" if args.backend == "nccl" else "4MiB")
    sizes = size_ladder(args.min_bytes, max_b, args.factor)
    if not under_torchrun():
        _check_world(args.world)
        check_backend(args.backend, args.world)
        if args.backend == "gloo":
            _check_cpu_budget(ops, sizes, args.world)
    res = launch.run_ranks(_bench_rank, ops, sizes, args.warmup, args.repeats, backend=args.backend, world=args.world)
    shutdown()
    if res is None:  # not rank 0 under torchrun
        return 0
    link = args.link_class or ("cpu-shm" if args.backend == "gloo" else "gpu")
    attach_predictions(res)
    fits = []
    for f in _safe_fits(fit_all, res.rows, link):
        fits.append(f)
    if args.json:
        print(dumps({"bench": res, "fits": fits}))
        return 0
    print(f"{res.backend}, world {res.world} ({res.nodes} node(s)), {res.device}, {res.dtype}; "
          "bytes as nccl-tests counts them, GB/s = 1e9 B/s")
    print(render(["op", "bytes", "size", "time_us", "algbw_GBps", "busbw_GBps", "spread_us", "model_us"],
                 [[r.op, r.bytes, fmt_bytes(r.bytes), f"{r.time_us:.1f}", f"{r.algbw_GBps:.3f}", f"{r.busbw_GBps:.3f}",
                   f"{r.time_us_min:.0f}-{r.time_us_max:.0f}",
                   "" if r.predicted_us is None else f"{r.predicted_us:.1f}"] for r in res.rows]))
    if fits:
        print("\nalpha-beta fit (t = alpha + bytes / algbw), link class " + link)
        print(render(["op", "alpha_us", "algbw_GBps", "busbw_GBps", "max_rel_err"],
                     [[f.op, f"{f.alpha_us:.1f}", f"{f.algbw_GBps:.3f}", f"{f.busbw_GBps:.3f}", f"{f.max_rel_error:.0%}"]
                      for f in fits]))
    for n in res.notes:
        print(f"note: {n}")
    return 0


def _check_world(world: int) -> None:
    if world > MAX_LOCAL_RANKS:
        raise LabkitError(f"--world {world}: at most {MAX_LOCAL_RANKS} processes are spawned on one machine "
                          "(use torchrun for more)")


def _check_cpu_budget(ops, sizes, world: int) -> None:
    """Refuse a CPU benchmark none of whose sizes fits the machine's buffer budget (all the local
    ranks' buffers together); sizes above it are skipped with a note by the ranks themselves."""
    budget, what = buffer_budget(False)
    need = min(machine_buffer_bytes(op, sizes[0], world, world, False) for op in ops)
    if need > budget:
        raise LabkitError(f"--min-bytes {sizes[0]} with --world {world}: the buffers would take {fmt_bytes(need)} "
                          f"on this machine, above its {fmt_bytes(budget)} budget ({what})")


def _safe_fits(fit_all, rows, link):
    out = []
    ops = dict.fromkeys(r.op for r in rows)
    for op in ops:
        try:
            out += fit_all([r for r in rows if r.op == op], link)
        except LabkitError:
            pass  # too few sizes, or times that do not grow with size: no fit for that collective
    return out


def run_buckets(args: argparse.Namespace) -> int:
    from labkit.workloads import get_workload

    sizes = parse_bucket_sizes(args.sizes)
    if len(sizes) > MAX_BUCKET_SIZES:
        raise LabkitError(f"--sizes: {len(sizes)} bucket sizes, more than one sweep takes ({MAX_BUCKET_SIZES}); each "
                          "is a DDP run of --steps steps")
    big = [s for s in sizes if s > MAX_BUCKET_MB]
    if big:
        raise LabkitError(f"--sizes: bucket size {big[0]:g} MiB is above {MAX_BUCKET_MB} MiB (1 TiB)")
    get_workload(args.model)
    gav = {"off": (False,), "on": (True,), "both": (False, True)}[args.gradient_as_bucket_view]
    if not under_torchrun():
        _check_world(args.world)
        check_backend(args.backend, args.world)
    filled(args, "precision")
    kwargs = dict(workload=args.model, batch_size=args.micro_batch, sizes_mb=sizes, gradient_as_bucket_view=gav,
                  warmup=args.warmup, steps=args.steps, amp=BUCKET_PRECISIONS[args.precision])
    res = launch.run_ranks(_buckets_rank, kwargs, backend=args.backend, world=args.world)
    shutdown()
    if res is None:
        return 0
    if args.json:
        print(dumps(res))
        return 0
    print(f"{res.backend}, world {res.world}, workload {res.workload} (batch {res.batch_size} per rank), "
          f"{fmt_bytes(res.param_bytes)} of fp32 gradients per step")
    print(render(["bucket_cap_mb", "grad_as_bucket_view", "buckets", "step_ms", "p10-p90", "exposed_ms", "peak_alloc"],
                 [["no_sync" if r.bucket_cap_mb is None else f"{r.bucket_cap_mb:g}", "on" if r.gradient_as_bucket_view else "off",
                   r.num_buckets, f"{r.step_ms_median:.2f}", f"{r.step_ms_p10:.2f}-{r.step_ms_p90:.2f}",
                   "" if r.exposed_ms is None else f"{r.exposed_ms:+.2f}",
                   "" if r.peak_allocated_bytes is None else fmt_bytes(r.peak_allocated_bytes)] for r in res.rows]))
    print(res.best_text())
    for n in res.notes:
        print(f"note: {n}")
    return 0
