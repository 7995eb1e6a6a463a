"""Notebook 05, the critical path: one function per section, each returning a Section.

The numbers come from ``labkit.comm`` (live runs, recordings loaded into the same dataclasses, the
bucket simulator); the figures from ``labkit.viz.comm``. Recorded sections take ``folder`` (default
``data/measurements/comm``) so that a test can point them at a fixture made by
``benchmarks/gpu/record_comm.py --smoke``. A recording that is not there is a note in the section.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from labkit.comm import fit, nominal, predict, simulate
from labkit.comm.bench import row_from_time
from labkit.comm.ddp import parse_bucket_sizes
from labkit.comm.launch import run_ranks
from labkit.comm.recorded import available, load
from labkit.comm.tour import live_tour
from labkit.core.errors import LabkitError
from labkit.core.machine import probe
from labkit.core.units import GiB, KiB, MiB, fmt_bytes
from labkit.topology import list_samples, load_topology
from labkit.viz import comm as vc
from labkit.viz.display import busy
from labkit.viz.section import Section, ShowsSection
from labkit.workloads import get_workload

# What to run where a multi-GPU recording is missing (the lab's recordings so far come from a 1-GPU H200 server)
RECORD_COMMAND = "PYTHONPATH=. python3 benchmarks/gpu/record_comm.py --out data/measurements/comm"
RECORD_HINT = (f"the lab's recordings come from a one-GPU server; on a server with 2 or more GPUs run "
               f"`{RECORD_COMMAND}` in the lab's folder (about 2.5 minutes) and run this notebook again")
SIM_GRID_MB = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 200, 500)
# The nightly report's tolerance for a figure measured here: a live run's medians move by tens of percent from one
# night to the next (CPU processes sharing cores, or a GPU's clocks); a regression is a larger move than that.
HERE_TOLERANCE = 0.30
FIT_ERROR_NOTED = 0.25  # an alpha-beta fit that misses a size by more is shown with that error stated


def _missing(title: str, *names: str, what: str = "") -> Section:
    return Section(title).note(f"Not recorded yet: this section shows {', '.join('comm_' + n + '.json' for n in names)} "
                               f"{what}from data/measurements/comm/, which is not there: {RECORD_HINT}.")


# -- this machine and the live run ------------------------------------------------------------------

@dataclass
class Machine(ShowsSection):
    """This machine and the backend the live runs use."""

    hostname: str
    gpus: int
    gpu_name: str
    cpu_cores: int
    torch_version: str
    backend: str
    world: int
    recordings: list[str]

    @property
    def source(self) -> str:
        return f"measured here ({self.backend}, {self.world} processes on {self.hostname})"

    def section(self) -> Section:
        sec = Section("This machine", source="measured here")
        sec.claim(f"CUDA GPUs on {self.hostname}{' (' + self.gpu_name + ')' if self.gpu_name else ''}", self.gpus)
        sec.claim(f"CPU cores (torch {self.torch_version})", self.cpu_cores)
        sec.claim(f"The live runs use {self.backend} with this many processes", self.world)
        sec.claim("Recordings found in data/measurements/comm", ", ".join(self.recordings) or "none", source="")
        return sec


def this_machine(backend: str = "auto", world: int = 2, folder: str | Path | None = None) -> Machine:
    """This machine; ``backend="auto"`` picks nccl with 2+ GPUs here, else gloo CPU processes."""
    if backend not in ("auto", "nccl", "gloo"):
        raise LabkitError(f"backend {backend!r}: use auto, nccl or gloo")
    m = probe()
    ngpu = len(m.gpus) if m.cuda_available else 0
    be = backend if backend != "auto" else ("nccl" if ngpu >= 2 else "gloo")
    return Machine(m.hostname, ngpu, m.gpu_name or "", m.cpu_logical_cores, m.torch_version, be, world,
                   available(folder))


@dataclass
class LiveRun(ShowsSection):
    """Everything the live run measured (one process group), in the chapter's dataclasses."""

    machine: Machine
    bench: Any            # labkit.comm.bench.BenchResult
    sweep: Any            # labkit.comm.ddp.BucketSweep
    timeline: Any         # labkit.comm.timeline.Timeline
    async_overlap: Any    # labkit.comm.levers.AsyncOverlap
    buffers: Any          # labkit.comm.levers.BufferReuse
    trace_bucket_mb: float

    @property
    def source(self) -> str:
        return self.machine.source

    def section(self) -> Section:
        sec = Section("Live run on this machine", source=self.source)
        sec.claim("Collective measurements (op x size)", len(self.bench.rows))
        sec.claim("DDP bucket sweep points", len(self.sweep.rows))
        sec.claim("All-reduces in the profiled DDP step", self.timeline.n_comm_ops)
        return sec


def live_plan(smoke: bool, backend: str, bucket_sizes_mb: str | Sequence[float]) -> dict[str, Any]:
    """Sizes, bucket caps, steps and repeats of the live run."""
    if smoke:
        return dict(sizes=[4 * KiB, 64 * KiB, 1 * MiB], bucket_sizes_mb=[0.05, 1.0], steps=2, repeats=2)
    n = 6 if backend == "gloo" else 10
    return dict(sizes=[4 * KiB * 4**k for k in range(n)], bucket_sizes_mb=parse_bucket_sizes(bucket_sizes_mb),
                steps=5, repeats=5)


def live_run(machine: Machine, *, smoke: bool = False, workload: str = "tiny",
             bucket_sizes_mb: str | Sequence[float] = "0.05,0.2,1,25", trace_bucket_mb: float = 0.05) -> LiveRun:
    """One process group runs every live measurement (:func:`labkit.comm.tour.live_tour`)."""
    p = live_plan(smoke, machine.backend, bucket_sizes_mb)
    fn = partial(live_tour, sizes=p["sizes"], bucket_sizes_mb=p["bucket_sizes_mb"], workload=workload,
                 steps=p["steps"], repeats=p["repeats"], trace_bucket_mb=trace_bucket_mb,
                 amp="bfloat16" if machine.backend == "nccl" else None)
    with busy(f"live run: {machine.world} {machine.backend} processes"):
        out = run_ranks(fn, backend=machine.backend, world=machine.world)
    return LiveRun(machine, out["bench"], out["sweep"], out["timeline"], out["async"], out["buffers"], trace_bucket_mb)


# -- 1. bus bandwidth -------------------------------------------------------------------------------

def _by_op(rows) -> dict[str, list]:
    return {op: [r for r in rows if r.op == op] for op in dict.fromkeys(r.op for r in rows)}


def bus_bandwidth(bench, source: str, *, link=None, published: dict[str, float] | None = None,
                  title: str = "Bus bandwidth") -> Section:
    """Busbw over sizes, the all-reduce's best point and its smallest message (recorded or live)."""
    sec = Section(title, source=source)
    ar = [r for r in bench.rows if r.op == "all_reduce"]
    if not ar:
        return sec.note("No all_reduce rows in this run.")
    peak = max(ar, key=lambda r: r.busbw_GBps)
    small = min(ar, key=lambda r: r.bytes)
    kind = "recorded" if source.startswith("recorded") else "here"
    up, tol = ("higher", HERE_TOLERANCE) if kind == "here" else (None, None)
    sec.claim(f"All-reduce's best bus bandwidth ({bench.backend}, world {bench.world}, at {fmt_bytes(peak.bytes)})",
              round(peak.busbw_GBps, 4), "GB/s", name=f"comm.{kind}.allreduce_busbw_peak_GBps", direction=up, tolerance=tol)
    if link is not None:
        sec.claim(f"Fraction of the nominal {link.name} rate ({link.GBps_per_direction:g} GB/s per direction)",
                  round(peak.busbw_GBps / link.GBps_per_direction, 3), "",
                  name=f"comm.{kind}.allreduce_busbw_fraction_of_nominal", direction=up, tolerance=tol)
    sec.claim(f"At {fmt_bytes(small.bytes)} an all-reduce moves only (small messages pay latency, not bandwidth)",
              round(small.busbw_GBps, 4), "GB/s")
    picks = sorted({r.bytes for r in ar} & {64 * MiB, 1 * GiB, max(r.bytes for r in ar)})
    sec.table(["op", "size", "time us", "algbw GB/s", "busbw GB/s", "of nominal"],
              [[r.op, fmt_bytes(r.bytes), f"{r.time_us:.0f}", f"{r.algbw_GBps:.3g}", f"{r.busbw_GBps:.3g}",
                f"{r.busbw_fraction_of_nominal:.0%}" if r.busbw_fraction_of_nominal else "-"]
               for r in bench.rows if r.bytes in picks])
    sec.figure(vc.busbw_figure(_by_op(bench.rows), title=f"{bench.backend}, world {bench.world}: busbw against size",
                               nominal_GBps=link.GBps_per_direction if link else None,
                               nominal_label=f"nominal {link.name}" if link else "", published=published))
    if published:
        sec.note("Published nccl-tests all-reduce busbw for 8-GPU boards, for comparison: "
                 + ", ".join(f"{k}: {v:g} GB/s" for k, v in published.items()) + ".")
    return sec


def bus_bandwidth_model() -> Section:
    """The topology model's busbw for two NVLink4 GPUs (a model, not a measurement)."""
    topo = load_topology(predict.DEFAULT_H200_STANDIN)
    ladder = [4 * KiB * 4**k for k in range(11)]
    rows = {op: [row_from_time(op, b, 2, predict.predict_us(topo, [0, 1], op, b) * 1e-6) for b in ladder]
            for op in ("all_reduce", "all_gather")}
    link = nominal.nominal_nvlink("H200")
    src = f"model (sample: {predict.DEFAULT_H200_STANDIN})"
    sec = Section("Bus bandwidth: the model in place of a recording", source=src)
    best = max(rows["all_reduce"], key=lambda r: r.busbw_GBps)
    sec.claim(f"Model: 2 GPUs over NV18 approach, at {fmt_bytes(best.bytes)}", round(best.busbw_GBps, 1), "GB/s")
    sec.figure(vc.busbw_figure(rows, title="model: 2 GPUs over NV18", nominal_GBps=link.GBps_per_direction,
                               nominal_label=f"nominal {link.name}"))
    return sec


def bus_bandwidth_recorded(folder: str | Path | None = None) -> Section:
    """The recorded NCCL collectives, or the model's curve with a note that the recording is missing."""
    rec = load("collectives", folder)
    if rec is None:
        sec = bus_bandwidth_model()
        return sec.note(f"Not recorded yet: comm_collectives.json is not in data/measurements/comm/ ({RECORD_HINT}); "
                        "the curve above is the topology model's, not a measurement.")
    d = rec.data
    sec = bus_bandwidth(d["bench"], rec.source, link=d.get("nominal_link"),
                        published=d.get("published_allreduce_busbw_GBps"), title="Bus bandwidth, recorded")
    return sec.note(f"NCCL_NVLS_ENABLE={d.get('nccl_nvls_enable')} during the recording.")


def bus_bandwidth_here(live: LiveRun) -> Section:
    return bus_bandwidth(live.bench, live.source, title="Bus bandwidth, measured here")


# -- model beside measurement: the alpha-beta fit -----------------------------------------------------

def _fit_each(rows, link_class: str) -> tuple[dict, list[str]]:
    """The alpha-beta fit of each collective, and a note for each one whose time does not grow with size
    (noisy timings at small sizes): {op: fit}, notes."""
    fits, notes = {}, []
    for op in dict.fromkeys(r.op for r in rows):
        try:
            fits[op] = fit.fit_alpha_beta([r for r in rows if r.op == op], op=op, link_class=link_class)
        except LabkitError as exc:
            notes.append(f"No fit for {op}: {exc}")
    return fits, notes


def _fit_table(sec: Section, fits) -> None:
    sec.table(["op", "alpha us", "algbw GB/s", "busbw GB/s", "max rel. error of the line", "sizes"],
              [[f.op, f"{f.alpha_us:.1f}", f"{f.algbw_GBps:.3g}", f"{f.busbw_GBps:.3g}", f"{f.max_rel_error:.0%}",
                f"{fmt_bytes(f.min_bytes)}..{fmt_bytes(f.max_bytes)}"] for f in fits],
              caption="alpha-beta fit t = alpha + bytes / bw")
    for f in fits:
        if f.max_rel_error > FIT_ERROR_NOTED:
            sec.note(f"The {f.op} line misses a measured size by {f.max_rel_error:.0%}: its alpha and bandwidth "
                     "summarise the sizes roughly, they do not predict each one.")


def alpha_beta_recorded(folder: str | Path | None = None) -> Section:
    """The recorded all-reduce against the topology model, and the alpha-beta fit of the recording."""
    rec = load("collectives", folder)
    if rec is None:
        return _missing("Model beside measurement: the alpha-beta fit", "collectives")
    bench = rec.data["bench"]
    # an H200 sample with enough GPUs for the recorded world, else the NV18 stand-in (same NVLink4 rate)
    fits = [s.name for s in list_samples() if "h200" in s.name.lower() and load_topology(s.name).n >= bench.world]
    topo_name = fits[0] if fits else predict.DEFAULT_H200_STANDIN
    topo = load_topology(topo_name, gpu_name=rec.provenance.get("gpu_name"))
    ar = [r for r in bench.rows if r.op == "all_reduce"]
    pred = predict.predict_rows(ar, topo, list(range(bench.world)))
    fits, notes = _fit_each(bench.rows, "nvlink")
    f_ar = fits.get("all_reduce")
    ratio = [r.time_us / p for r, p in zip(ar, pred)]
    sec = Section("Model beside measurement: the alpha-beta fit", source=rec.source)
    sec.claim(f"Measured all-reduce time over the model's (sample {topo_name}), smallest", round(min(ratio), 2), "x")
    sec.claim("... and largest", round(max(ratio), 2), "x")
    if f_ar is not None:
        sec.claim(f"Fixed cost per all-reduce, alpha (the fitted line misses a size by up to {f_ar.max_rel_error:.0%})",
                  round(f_ar.alpha_us, 2), "us", name="comm.recorded.allreduce_alpha_us")
        sec.claim("Bus bandwidth the all-reduce approaches", round(f_ar.busbw_GBps, 1), "GB/s")
        sec.claim("A bucket smaller than alpha x bw spends more time on the fixed cost than on bytes: alpha x bw",
                  fmt_bytes(f_ar.alpha_us * 1e-6 * f_ar.algbw_GBps * 1e9))
    _fit_table(sec, list(fits.values()))
    sec.figure(vc.time_vs_model_figure(ar, pred, fit_us=[f_ar.predict_us(r.bytes) for r in ar] if f_ar else None,
                                       title=f"all_reduce, world {bench.world}: measured vs model"))
    for n in notes:
        sec.note(n)
    return sec


def launch_overhead(folder: str | Path | None = None) -> Section:
    """The benchmark's own overhead: idle gaps between back-to-back collectives (target under 5 %)."""
    rec = load("launch_overhead", folder)
    if rec is None:
        return _missing("The benchmark's own overhead", "launch_overhead")
    rows = rec.data["rows"]
    limit = rec.data.get("limit_fraction", 0.05)
    worst = max(r.gap_fraction for r in rows)
    verdict = ("under the target: the bandwidths above are the collectives', not the harness's" if worst < limit
               else "above the target: at these sizes part of the measured time is the harness's")
    sec = Section("The benchmark's own overhead", source=rec.source)
    sec.claim(f"Largest idle-gap fraction of the timed loop (target under {limit:.0%}), {verdict}", round(worst, 4), "",
              name="comm.recorded.launch_gap_fraction_max")
    sec.table(["op", "size", "loop span us", "idle gaps us", "gap fraction", "host issue us/op"],
              [[r.op, fmt_bytes(r.bytes), f"{r.span_us:.0f}", f"{r.gap_us:.1f}", f"{r.gap_fraction:.2%}",
                f"{r.host_issue_us_per_op:.1f}"] for r in rows], caption="idle gaps from a profiler trace of the timed loop")
    return sec


def alpha_beta_here(live: LiveRun) -> Section:
    """The alpha-beta fit of the live run (a note when noisy CPU timings do not grow with size)."""
    sec = Section("The alpha-beta fit, measured here", source=live.source)
    fits, notes = _fit_each(live.bench.rows, "cpu-shm")
    ar = fits.get("all_reduce")
    if ar is not None:
        sec.claim(f"Fixed cost per all-reduce, alpha (the fitted line misses a size by up to {ar.max_rel_error:.0%})",
                  round(ar.alpha_us, 1), "us")
        sec.claim("Bus bandwidth the all-reduce approaches", round(ar.busbw_GBps, 4), "GB/s")
    if fits:
        _fit_table(sec, list(fits.values()))
    for n in notes:
        sec.note(n)
    return sec


# -- 2. the DDP bucket size ------------------------------------------------------------------------------

def bucket_sweep(sweep, source: str, *, title: str) -> Section:
    """The DDP step time against bucket_cap_mb, gradient_as_bucket_view off and on (recorded or live)."""
    kind = "recorded" if source.startswith("recorded") else "here"
    here = "lower" if kind == "here" else None
    sec = Section(title, source=source)
    best = sweep.best()
    worst = max((r for r in sweep.rows if r.bucket_cap_mb is not None), key=lambda r: r.step_ms_median)
    base = next((r for r in sweep.rows if r.bucket_cap_mb is None), None)
    tied = sweep.tied_with_best()
    if tied:  # overlapping p10-p90 ranges (or one configuration): no size is shown to be faster, so none is a result
        caps = sorted({r.bucket_cap_mb for r in [best, *tied]})
        sec.claim(f"Bucket caps that cannot be told apart here (p10-p90 step-time ranges overlap, or the same "
                  f"bucket count); the fastest median, {best.bucket_cap_mb:g} MiB, is not shown to be faster",
                  ", ".join(f"{c:g}" for c in caps), "MiB")
    else:
        sec.claim(f"Fastest bucket cap ({best.num_buckets or '?'} buckets, gradient_as_bucket_view "
                  f"{'on' if best.gradient_as_bucket_view else 'off'}; its p10-p90 range below every other size's)",
                  best.bucket_cap_mb, "MiB")
    sec.claim(f"The fastest median step time (the slowest cap, {worst.bucket_cap_mb:g} MiB, takes "
              f"{worst.step_ms_median:.2f} ms)", round(best.step_ms_median, 3), "ms", name=f"comm.{kind}.best_step_ms",
              direction=here, tolerance=HERE_TOLERANCE if here else None)
    if base is not None:
        sec.claim("The same step without any all-reduce (no_sync)", round(base.step_ms_median, 3), "ms")
    mem = {(r.bucket_cap_mb, r.gradient_as_bucket_view): r.peak_allocated_bytes for r in sweep.rows
           if r.bucket_cap_mb is not None}
    saved = {mb: mem[(mb, False)] - mem[(mb, True)] for (mb, g) in mem
             if not g and mem.get((mb, True)) and mem[(mb, False)]}
    if saved:
        sec.claim(f"Largest peak-memory saving of gradient_as_bucket_view (one fp32 copy of the gradients is "
                  f"{fmt_bytes(sweep.param_bytes)}; it only lowers the peak where that copy is part of it)",
                  int(max(saved.values())), "B", name=f"comm.{kind}.grad_as_bucket_view_max_saving_bytes",
                  direction="higher" if here else None)
    sec.table(["bucket MiB", "grad. as bucket view", "buckets", "step ms (median)", "p10-p90 ms", "vs no_sync ms",
               "peak allocated", "peak reserved"],
              [["no_sync" if r.bucket_cap_mb is None else f"{r.bucket_cap_mb:g}", "on" if r.gradient_as_bucket_view else "off",
                r.num_buckets or "-", f"{r.step_ms_median:.2f}", f"{r.step_ms_p10:.2f}-{r.step_ms_p90:.2f}",
                "-" if r.exposed_ms is None else f"{r.exposed_ms:+.2f}",
                fmt_bytes(r.peak_allocated_bytes) if r.peak_allocated_bytes else "-",
                fmt_bytes(r.peak_reserved_bytes) if r.peak_reserved_bytes else "-"] for r in sweep.rows])
    sec.figure(vc.bucket_sweep_figure(sweep.rows, title=f"{sweep.workload} DDP, world {sweep.world}: step time"))
    if sweep.world < 2:
        sec.note(f"This run has one rank (world {sweep.world}): there is no peer, so the all-reduce exchanges nothing; "
                 "the time above no_sync is DDP's own work (copying gradients into buckets, launching one-rank "
                 "all-reduces, its hooks), not communication. It does show that overhead and the memory.")
    if sweep.backend == "gloo":
        sec.note("CPU processes on a few cores are noisy: read the p10-p90 whiskers before the medians.")
    return sec


def bucket_sweep_recorded(folder: str | Path | None = None) -> Section:
    rec = load("buckets", folder)
    if rec is None:
        return _missing("The DDP bucket size, recorded", "buckets")
    return bucket_sweep(rec.data, rec.source, title="The DDP bucket size, recorded")


def bucket_sweep_here(live: LiveRun) -> Section:
    return bucket_sweep(live.sweep, live.source, title="The DDP bucket size, measured here")


# -- 3. overlap made visible --------------------------------------------------------------------------------

def overlap(tl, source: str, *, title: str, world: int) -> Section:
    """Backward compute against the bucket all-reduces of one profiled DDP step (recorded or live)."""
    kind = "recorded" if source.startswith("recorded") else "here"
    sec = Section(title, source=source)
    sec.claim("Backward compute (union of compute intervals)", round(tl.backward_compute_us / 1e3, 3), "ms")
    if tl.n_comm_ops:
        sec.claim(f"{tl.n_comm_ops} all-reduces, in total", round(tl.comm_us / 1e3, 3), "ms")
        sec.claim("Fraction of the communication that ran under compute", round(tl.hidden_fraction, 3), "")
        sec.claim(f"Exposed communication, as a fraction of the backward-plus-communication span "
                  f"({tl.span_us / 1e3:.2f} ms; exposed {tl.exposed_comm_us / 1e3:.2f} ms)", round(tl.exposed_fraction, 4),
                  "", name=f"comm.{kind}.exposed_comm_fraction",
                  direction="lower" if kind == "here" else None, tolerance=HERE_TOLERANCE if kind == "here" else None)
    else:
        sec.note("No all-reduce ran in this step, so there is no overlap to measure: only the compute lane is real.")
    idle = (tl.span_us - tl.backward_compute_us) / 1e3
    sec.claim("Time in the span the device did not compute (host launches, profiler): room an all-reduce can hide in",
              round(idle, 3), "ms")
    sec.figure(vc.timeline_figure(tl, title="one DDP step: backward compute and all-reduces"))
    if world < 2:
        sec.note(f"Recorded with one GPU (world {world}): the compute lane is real, the all-reduce lane has nothing "
                 "to exchange. The simulator below uses this backward time.")
    return sec


def overlap_recorded(folder: str | Path | None = None) -> Section:
    rec = load("ddp_timeline", folder)
    if rec is None:
        return _missing("Overlap, recorded", "ddp_timeline")
    d = rec.data
    return overlap(d["timeline"], rec.source, world=d["world"],
                   title=f"Overlap, recorded ({d['workload']}, bucket {d['bucket_cap_mb']:g} MiB)")


def overlap_here(live: LiveRun) -> Section:
    return overlap(live.timeline, live.source, world=live.machine.world,
                   title=f"Overlap, measured here ({live.sweep.workload}, bucket {live.trace_bucket_mb:g} MiB)")


# -- 4. the simulator ---------------------------------------------------------------------------------------

def _schedule(folder):
    """Per-layer gradient events of the recorded step's workload (or gpt2-124m with 50 ms backward)."""
    tlr = load("ddp_timeline", folder)
    if tlr is None:
        w = get_workload("gpt2-124m")
        return simulate.gpt_grad_schedule(w.config, w.batch_size, 0.05), "gpt2-124m", 0.05, "model (assumed 50 ms)"
    d = tlr.data
    bwd = d["timeline"].backward_compute_us * 1e-6
    return (simulate.gpt_grad_schedule(get_workload(d["workload"]).config, d["batch_size"], bwd), d["workload"], bwd,
            tlr.source)


def bucket_simulator(*, gpus_per_node: int = 8, nodes: int = 4, inter_bw_GBps: float = 50.0,
                     inter_latency_us: float = 10.0, interactive: bool = True,
                     folder: str | Path | None = None) -> Section:
    """Exposed all-reduce against bucket size on one node and on several (the simulator: a model)."""
    events, wl, bwd_s, bwd_src = _schedule(folder)
    tlr_found = bwd_src.startswith("recorded")
    one = simulate.LinkModel(gpus_per_node=gpus_per_node, nodes=1)
    many = simulate.LinkModel(gpus_per_node=gpus_per_node, nodes=nodes, inter_bw_GBps=inter_bw_GBps,
                              inter_latency_us=inter_latency_us)
    s1, sn = simulate.sweep(events, SIM_GRID_MB, one), simulate.sweep(events, SIM_GRID_MB, many)
    b1, bn = simulate.best_size(s1), simulate.best_size(sn)
    sec = Section(f"What the bucket size does on bigger machines ({wl})", source="model")
    sec.claim(f"Best bucket on one node of {gpus_per_node} GPUs ({b1.exposed_ms:.2f} ms exposed)", b1.bucket_cap_mb, "MiB")
    sec.claim(f"Best bucket on {nodes} nodes at {inter_bw_GBps:g} GB/s, {inter_latency_us:g} us "
              f"({bn.exposed_ms:.2f} ms exposed, {bn.exposed_fraction:.0%} of backward + exposed)", bn.bucket_cap_mb, "MiB",
              name="comm.model.best_bucket_mb_multinode")
    sec.claim("Backward time fed to the simulator (the profiled step's backward compute)" if tlr_found else
              "Backward time fed to the simulator (an assumption: no profiled step is recorded)",
              round(bwd_s * 1e3, 2), "ms", source=bwd_src)
    sec.figure(vc.simulator_figure({f"{gpus_per_node} GPUs, 1 node": s1, f"{gpus_per_node} x {nodes} GPUs": sn},
                                   title="exposed all-reduce against bucket size (model)"))
    if interactive:
        def redraw(n: int, bw: float, lat: float):
            lm = simulate.LinkModel(gpus_per_node=gpus_per_node, nodes=n, inter_bw_GBps=bw, inter_latency_us=lat)
            return simulate.sweep(events, SIM_GRID_MB, lm)

        sec.widget(vc.simulator_explorer(redraw, nodes=nodes, inter_bw_GBps=inter_bw_GBps,
                                         inter_latency_us=inter_latency_us))
    return sec


def simulator_check(folder: str | Path | None = None) -> Section:
    """The simulator fed with the recorded machine's numbers against the recorded sweep."""
    title = "The simulator against the recorded sweep"
    recs = {n: load(n, folder) for n in ("collectives", "buckets", "ddp_timeline")}
    gone = [n for n, r in recs.items() if r is None]
    if gone:
        return _missing(title, *gone, what="(the check needs all three) ")
    bench, sw, tl = recs["collectives"].data["bench"], recs["buckets"].data, recs["ddp_timeline"].data
    try:
        bw, lat = fit.fit_alpha_beta([r for r in bench.rows if r.op == "all_reduce"]).link_params()
    except LabkitError as exc:
        return Section(title).note(f"No link fit of the recorded all-reduce, so no check: {exc}")
    lm = simulate.LinkModel(gpus_per_node=sw.world, nodes=1, intra_bw_GBps=bw / 1e9, intra_latency_us=lat * 1e6)
    events = simulate.gpt_grad_schedule(get_workload(sw.workload).config, sw.batch_size,
                                        tl["timeline"].backward_compute_us * 1e-6)
    checks = simulate.check_against_sweep(sw.rows, events, lm)
    sec = Section(title, source=f"model vs {recs['buckets'].source}")
    sec.claim("Configurations where the model's bucket count equals DDP's", sum(c.measured_buckets == c.predicted_buckets
                                                                                for c in checks), f"of {len(checks)}")
    sec.table(["bucket MiB", "grad. as view", "buckets measured / model", "measured extra ms", "model exposed ms"],
              [[f"{c.bucket_cap_mb:g}", "on" if c.gradient_as_bucket_view else "off",
                f"{c.measured_buckets} / {c.predicted_buckets}", f"{c.measured_exposed_ms:+.2f}",
                f"{c.predicted_exposed_ms:.2f}"] for c in checks])
    sec.figure(vc.simulator_figure({"model (recorded link fit)": simulate.sweep(events, SIM_GRID_MB, lm)},
                                   measured={f"measured, grad. view {'on' if g else 'off'}":
                                             [dict(bucket_cap_mb=c.bucket_cap_mb, exposed_ms=c.measured_exposed_ms)
                                              for c in checks if c.gradient_as_bucket_view == g] for g in (False, True)},
                                   title="exposed communication: model vs recorded sweep"))
    sec.note("Real DDP also copies gradients into buckets (gradient_as_bucket_view off) and NCCL kernels take SMs "
             "from compute: the model ignores both.")
    return sec


# -- 5. the other levers --------------------------------------------------------------------------------------

def pinned_pageable(folder: str | Path | None = None) -> Section:
    """A non_blocking host-to-device copy on a side stream beside compute: pinned vs pageable host memory."""
    title = "Pinned vs pageable host memory"
    rec = load("pinned_pageable", folder)
    if rec is None:
        return _missing(title, "pinned_pageable", what="(it needs a CUDA GPU) ")
    rows = rec.data.rows
    pg = next(r for r in rows if r.host_memory == "pageable")
    pn = next(r for r in rows if r.host_memory == "pinned")
    sec = Section(title, source=rec.source)
    sec.claim("Pinned copy rate", round(pn.copy_GBps, 1), "GB/s", name="comm.recorded.pinned_copy_GBps")
    sec.claim("Pageable copy rate", round(pg.copy_GBps, 1), "GB/s", name="comm.recorded.pageable_copy_GBps")
    sec.claim("The non_blocking call holds the host, pinned", round(pn.host_call_ms, 3), "ms")
    sec.claim("... pageable (the compute starts that much later)", round(pg.host_call_ms, 3), "ms")
    sec.claim(f"Copy hidden under compute, pinned (pageable: {pg.overlap_fraction:.0%})", round(pn.overlap_fraction, 3), "")
    sec.table(["host memory", "bytes", "copy ms", "copy GB/s", "host blocked in .copy_ ms", "compute ms",
               "copy + compute together ms", "overlap"],
              [[r.host_memory, fmt_bytes(r.bytes), f"{r.copy_ms:.2f}", f"{r.copy_GBps:.1f}", f"{r.host_call_ms:.3f}",
                f"{r.compute_ms:.2f}", f"{r.both_ms:.2f}", f"{r.overlap_fraction:.0%}"] for r in rows])
    return sec


def _async_row(a, src: str) -> list:
    return [src, fmt_bytes(a.bytes), f"{a.comm_ms:.2f}", f"{a.compute_ms:.2f}", f"{a.sequential_ms:.2f}",
            f"{a.overlapped_ms:.2f}", f"{a.hidden_fraction:.0%}"]


def async_overlap(live: LiveRun, folder: str | Path | None = None) -> Section:
    """A collective issued with async_op=True, independent compute, then wait(), against the synchronous order."""
    rec = load("async_overlap", folder)
    sec = Section("async_op=True collectives", source=live.source)
    rows = []
    if rec is not None:
        sec.claim("Fraction of the all-reduce hidden behind compute, recorded", round(rec.data.hidden_fraction, 3), "",
                  source=rec.source, name="comm.recorded.async_hidden_fraction")
        rows.append(_async_row(rec.data, rec.source[:60]))
    else:
        sec.note(f"Not recorded yet: comm_async_overlap.json ({RECORD_HINT}).")
    sec.claim("Fraction of the all-reduce hidden behind compute, measured here", round(live.async_overlap.hidden_fraction, 3),
              "", name="comm.here.async_hidden_fraction", direction="higher", tolerance=HERE_TOLERANCE)
    rows.append(_async_row(live.async_overlap, live.source))
    sec.table(["source", "all_reduce", "comm ms", "compute ms", "sync then compute ms", "async + compute + wait ms",
               "hidden"], rows)
    return sec


def _buffer_rows(b, src: str) -> list[list]:
    return [[src, r.mode, f"{r.step_ms_median:.3f}", f"{r.step_ms_stdev:.3f}", f"{r.step_ms_p10:.3f}-{r.step_ms_p90:.3f}",
             "-" if r.allocator_requests_per_step is None else f"{r.allocator_requests_per_step:.1f}",
             "-" if r.device_mallocs_per_step is None else f"{r.device_mallocs_per_step:.1f}"] for r in b.rows]


def buffer_reuse(live: LiveRun, folder: str | Path | None = None) -> Section:
    """Persistent communication buffers against buffers allocated inside the loop."""
    rec = load("buffer_reuse", folder)
    sec = Section("Persistent buffers vs allocation inside the loop", source=live.source)
    rows = []
    if rec is not None:
        by = {r.mode: r for r in rec.data.rows}
        for mode, what in (("persistent", "persistent buffer"), ("in_loop", "allocated in the loop"),
                           ("in_loop_empty_cache", "allocated in the loop, cache emptied each step")):
            if mode in by:
                sec.claim(f"Step time, {what} (recorded)", round(by[mode].step_ms_median, 3), "ms", source=rec.source)
        if by.get("in_loop_empty_cache") and by["in_loop_empty_cache"].device_mallocs_per_step is not None:
            sec.claim("cudaMalloc calls per step once the cache is emptied (recorded)",
                      by["in_loop_empty_cache"].device_mallocs_per_step, "", source=rec.source)
        rows += _buffer_rows(rec.data, rec.source[:60])
    else:
        sec.note(f"Not recorded yet: comm_buffer_reuse.json ({RECORD_HINT}).")
    here = {r.mode: r for r in live.buffers.rows}
    if "persistent" in here:
        sec.claim("Step time, persistent buffer (measured here)", round(here["persistent"].step_ms_median, 3), "ms")
    rows += _buffer_rows(live.buffers, live.source)
    sec.table(["source", "mode", "step ms", "stdev ms", "p10-p90 ms", "allocator requests/step", "cudaMalloc/step"], rows)
    return sec


def dp_vs_ddp(folder: str | Path | None = None) -> Section:
    """DataParallel against DistributedDataParallel: step time and per-GPU peak memory."""
    title = "DataParallel vs DistributedDataParallel"
    rec = load("dp_vs_ddp", folder)
    if rec is None:
        return _missing(title, "dp_vs_ddp", what="(it needs 2 CUDA GPUs) ")
    runs = rec.data["runs"]
    dp = next(r for r in runs if r.mode == "DataParallel")
    ddp = next(r for r in runs if r.mode == "DistributedDataParallel")
    sec = Section(title, source=rec.source)
    sec.claim(f"DataParallel's step time over DDP's ({dp.step_ms_median:.1f} vs {ddp.step_ms_median:.1f} ms)",
              round(dp.step_ms_median / ddp.step_ms_median, 3), "x", name="comm.recorded.dp_over_ddp_step_ratio")
    sec.claim(f"DataParallel's GPU 0 peak (its last GPU: {fmt_bytes(dp.peak_allocated_bytes[-1])})",
              fmt_bytes(dp.peak_allocated_bytes[0]))
    sec.claim("DDP's largest per-rank peak", fmt_bytes(max(ddp.peak_allocated_bytes)))
    sec.table(["mode", "GPUs", "per-GPU batch", "step ms (median)", "peak allocated per GPU", "peak reserved per GPU"],
              [[r.mode, r.gpus, r.per_gpu_batch, f"{r.step_ms_median:.1f}",
                ", ".join(fmt_bytes(b) for b in r.peak_allocated_bytes),
                ", ".join(fmt_bytes(b) for b in r.peak_reserved_bytes)] for r in runs])
    sec.figure(vc.per_gpu_memory_figure(runs, title="peak allocated per GPU"))
    return sec
