"""Notebook 03, the caching allocator: one function per section, each returning a Section.

The numbers come from ``labkit.allocator`` (the simulator, replays, the OOM doctor, the recorded H200
runs through ``labkit.allocator.recorded``, watch's captures too); the figures from ``labkit.viz.allocator``. Recorded
sections take ``meas_dir``/``traces_dir`` (default ``data/measurements/allocator``, ``data/traces``) so
a test can point them at a fixture; a recording that is not there is a note in the section.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.allocator import (CachingAllocatorSim, Trace, capture, compare, diagnose, load_trace, recorded, replay,
                              replay_with_sim)
from labkit.allocator.sim import synthetic
from labkit.core.errors import LabkitError
from labkit.core.machine import probe
from labkit.core.provenance import describe
from labkit.core.units import fmt_bytes
from labkit.viz import allocator as vz
from labkit.viz.section import Section, ShowsSection

GiB = 1024**3
MiB = 1024**2
RECORD_HINT = "run benchmarks/gpu/record_allocator.py on a GPU (see benchmarks/gpu/README.md)"
OOM_CASES = ("too_large", "fragmentation", "fragmentation_expandable", "leak", "other_process")
EMPTY_CACHE_LABELS = ("after 6 training steps (model and optimizer state alive)", "after empty_cache()",
                      "a 1 GiB tensor allocated and freed", "a 100 MiB tensor allocated",
                      "empty_cache() while the 100 MiB tensor lives", "the 100 MiB tensor freed, then empty_cache()")


def parse_configs(configs: str) -> list[str]:
    """``"default;expandable_segments:True"`` -> ``["", "expandable_segments:True"]`` (``default`` is "")."""
    out = ["" if c.strip() == "default" else c.strip() for c in configs.split(";") if c.strip()]
    if not out:
        raise LabkitError(f"configs {configs!r}: name at least one allocator configuration (e.g. 'default')")
    return out


def this_machine(meas_dir: str | Path | None = None) -> Section:
    m = probe()
    sec = Section("This machine", source="measured here")
    sec.claim(f"CUDA GPUs on {m.hostname}{' (' + m.gpu_name + ')' if m.gpus else ''}", len(m.gpus))
    runs = recorded.recorded_runs(meas_dir)
    sec.claim("Recorded allocator runs (one fresh process per configuration)", len(runs),
              source=runs[0].source if runs else "")
    return sec


# -- 1. caching ---------------------------------------------------------------------------------------------

def caching(meas_dir: str | Path | None = None) -> Section:
    """Reserved above allocated: the recorded runs of one workload, one fresh process per configuration."""
    title = "Caching: reserved stays above allocated"
    runs = recorded.recorded_runs(meas_dir)
    if not runs:
        return Section(title).note(f"Not recorded here: no fid__*.json in data/measurements/allocator ({RECORD_HINT}). "
                                   "Section 2 shows the same effect with the simulator (model).")
    wl = "varlen_train" if any(r.workload == "varlen_train" for r in runs) else runs[0].workload
    sel = [r for r in runs if r.workload == wl and r.cap_bytes is None]  # the capped runs are in section 3
    src = sel[0].source
    base = next((r for r in sel if r.config == "default"), sel[0])
    best = min(sel, key=lambda r: r.stats["reserved_bytes.all.peak"])
    sec = Section(f"{title} ({wl})", source=src)
    sec.claim("Allocated peak (live tensors), default configuration", fmt_bytes(base.stats["allocated_bytes.all.peak"]))
    sec.claim("Reserved peak (what nvidia-smi sees), default configuration", base.stats["reserved_bytes.all.peak"],
              "bytes", name="alloc.varlen.reserved_peak_default")
    sec.claim(f"Lowest reserved peak: {best.config}", best.stats["reserved_bytes.all.peak"], "bytes",
              name="alloc.varlen.reserved_peak_best")
    sec.table(["configuration", "allocated peak", "reserved peak", "reserved / allocated", "device allocations"],
              [(r.config, fmt_bytes(r.stats["allocated_bytes.all.peak"]), fmt_bytes(r.stats["reserved_bytes.all.peak"]),
                f"{r.stats['reserved_bytes.all.peak'] / max(1, r.stats['allocated_bytes.all.peak']):.2f}",
                r.stats["num_device_alloc"]) for r in sel],
              caption=f"{wl}: {len(base.steps)} steps, memory_stats() at the end")
    series = {r.config: [dict(index=s["step"], allocated_bytes=s["allocated_bytes"], reserved_bytes=s["reserved_bytes"])
                         for s in r.steps] for r in sel}
    sec.figure(vz.timeline_figure(series, title=f"{wl}: memory after each step", x_label="training step"))
    return sec


# -- 2. what-if ---------------------------------------------------------------------------------------------

@dataclass
class WhatIf(ShowsSection):
    """One request stream replayed under several configurations (the simulator: a model)."""

    trace: Any                 # labkit.allocator.Trace
    trace_source: str
    results: list[Any]         # labkit.allocator.ReplayResult, one per configuration
    cap_bytes: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def best(self):
        return min(self.results, key=lambda r: r.reserved_peak_bytes)

    def section(self) -> Section:
        first, best = self.results[0], self.best
        sec = Section("Your trace under other configurations (what-if)", source="model")
        sec.claim(f"Replayed: {self.trace_source}; requests", self.trace.n_ids, source=self.trace_source)
        sec.claim("Lowest reserved peak under", best.config or "default", name="alloc.whatif.best_config")
        sec.claim(f"Reserved memory it saves against {first.config or 'default'}",
                  round(1 - best.reserved_peak_bytes / first.reserved_peak_bytes, 4), "fraction",
                  name="alloc.whatif.reserved_saving_vs_first")
        sec.table(["configuration", "allocated peak", "reserved peak", "vs first", "segments peak", "device allocs",
                   "retries", "OOMs"],
                  [(r.config or "default", fmt_bytes(r.allocated_peak_bytes), fmt_bytes(r.reserved_peak_bytes),
                    f"{100 * (r.reserved_peak_bytes / first.reserved_peak_bytes - 1):+.1f}%", r.segments_peak,
                    r.num_device_alloc, r.num_alloc_retries, r.num_ooms) for r in self.results],
                  caption="model: simulator replay" + (f", cap {fmt_bytes(self.cap_bytes)}" if self.cap_bytes else ""))
        sec.figure(vz.whatif_figure(self.results, title="reserved vs allocated peak per configuration (model)"))
        sec.figure(vz.timeline_figure({r.config or "default": r.timeline for r in self.results[:3]},
                                      title="allocated (dashed) and reserved (solid) over the trace (model)"))
        for n in self.notes:
            sec.note(n)
        return sec


def pick_trace(snapshot_path: str = "", *, smoke: bool = False, traces_dir: str | Path | None = None):
    """Your snapshot if given (and complete), else the recorded trace, else a synthetic training-shaped
    stream (shorter in smoke mode). Returns (trace, where it comes from, notes)."""
    notes = []
    if snapshot_path:
        tr = load_trace(snapshot_path)
        if tr.complete:
            return tr, f"your snapshot {snapshot_path}", notes
        notes.append(f"Your snapshot's history is incomplete ({tr.incomplete_reason}): record again with a larger "
                     "max_entries, starting before the work. The lab's own trace is shown instead.")
    try:
        p = recorded.trace_path("varlen_train", traces_dir=traces_dir, meas_dir=traces_dir)
    except LabkitError as exc:
        notes.append(f"Not recorded here: {exc}; a synthetic stream is shown instead.")
    else:
        return load_trace(p), "trace recorded on an H200 (varlen_train, default configuration)", notes
    tr = synthetic.training_like(steps=4 if smoke else 30)
    return tr, "sample: synthetic training-shaped request stream (model)", notes


def whatif(snapshot_path: str = "", configs: str = "default;expandable_segments:True", *, cap_gib: float = 0.0,
           smoke: bool = False, traces_dir: str | Path | None = None) -> WhatIf:
    tr, src, notes = pick_trace(snapshot_path, smoke=smoke, traces_dir=traces_dir)
    cap = int(cap_gib * GiB) if cap_gib > 0 else None
    return WhatIf(tr, src, compare(tr, parse_configs(configs), cap_bytes=cap, timeline_points=300), cap, notes)


# -- 3. fidelity ---------------------------------------------------------------------------------------------

def fidelity(meas_dir: str | Path | None = None, traces_dir: str | Path | None = None) -> Section:
    """The simulator replaying the default trace against the real allocator under each configuration."""
    title = "Is the simulator right? Replay against the real allocator"
    rows = recorded.fidelity(meas_dir, traces_dir)
    if not rows:
        return Section(title).note(f"Not recorded here: no recorded runs with a default trace ({RECORD_HINT}).")
    worst = max(rows, key=lambda r: r.max_rel_error)
    sec = Section(title, source=rows[0].source)
    sec.claim(f"Largest relative error over {len(rows)} (workload, configuration) pairs "
              f"({worst.workload}, {worst.config})", round(worst.max_rel_error, 5), "fraction",
              name="alloc.fidelity.max_rel_error", digits=4, direction="lower")
    sec.claim("Pairs where the simulator's reserved peak equals the real one exactly",
              sum(r.simulated["reserved_bytes.all.peak"] == r.real["reserved_bytes.all.peak"] for r in rows),
              f"of {len(rows)}")
    sec.table(["workload", "configuration", "cap", "reserved peak: real", "simulated", "segments peak real / sim",
               "device allocs real / sim", "retries real / sim", "device frees real / sim", "largest error",
               "same requests"],
              [(r.workload, r.config, fmt_bytes(r.cap_bytes) if r.cap_bytes else "-",
                fmt_bytes(r.real["reserved_bytes.all.peak"]), fmt_bytes(r.simulated["reserved_bytes.all.peak"]),
                f"{r.real['segment.all.peak']} / {r.simulated['segment.all.peak']}",
                f"{r.real['num_device_alloc']} / {r.simulated['num_device_alloc']}",
                f"{r.extra['num_alloc_retries_real']} / {r.extra['num_alloc_retries_sim']}",
                f"{r.extra['num_device_free_real']} / {r.extra['num_device_free_sim']}",
                f"{100 * r.max_rel_error:.2f}%", r.same_requests) for r in rows],
              caption="real: memory_stats() of a fresh process per configuration (some under a cap set with "
                      "set_per_process_memory_fraction); simulated: replay of the default configuration's trace")
    sec.figure(vz.fidelity_figure(rows, title="simulated vs real reserved peak"))
    return sec


# -- 4. segment map ----------------------------------------------------------------------------------------

def segment_map(w: WhatIf, confs: tuple[str, ...] = ("", "expandable_segments:True")) -> Section:
    """The simulated segments at the moment of peak allocated memory, per configuration."""
    r0 = w.results[0]
    tr = w.trace
    peak_at = max(r0.timeline, key=lambda s: s.allocated_bytes).index if r0.timeline else len(tr.ops) - 1
    cut = Trace(tr.name, tr.ops[:peak_at + 1], tr.n_ids, peak_at + 1, recorded_conf=tr.recorded_conf,
                segment_oracle=tr.segment_oracle)
    sec = Section(f"The segment map at the peak (request {peak_at})", source="model")
    for conf in confs:
        sim = replay_with_sim(cut, conf)
        segs, st = sim.segments(), sim.memory_stats()
        name = conf or "default"
        sec.claim(f"{name}: {len(segs)} segments, reserved {fmt_bytes(st['reserved_bytes.all.current'])}, allocated "
                  f"{fmt_bytes(st['allocated_bytes.all.current'])}; free inside partly used segments (inactive_split)",
                  fmt_bytes(st["inactive_split_bytes.all.current"]))
        sec.figure(vz.segment_map_figure(segs, title=f"{name}: {len(segs)} segments (model)"))
    return sec


# -- 5. empty_cache ----------------------------------------------------------------------------------------

def empty_cache_recorded(meas_dir: str | Path | None = None) -> Section:
    """What empty_cache() gave back on the H200, and what it could not."""
    title = "What empty_cache() frees and what it cannot"
    try:
        doc = recorded.experiment("empty_cache", meas_dir)
    except LabkitError:
        return Section(title).note(f"Not recorded here: exp__empty_cache.json ({RECORD_HINT}). The rule in isolation "
                                   "below is the simulator's (model).")
    er = doc["data"]["rows"]
    sec = Section(title, source=describe(doc["provenance"]))
    sec.claim("empty_cache() gave back (whole cached segments)", er[0]["reserved_bytes"] - er[1]["reserved_bytes"],
              "bytes", name="alloc.empty_cache.released")
    sec.claim("... and could not give back (free blocks inside segments that still hold the model's tensors)",
              er[1]["inactive_split_bytes"], "bytes", name="alloc.empty_cache.stranded")
    sec.claim("New memory the next 1 GiB request needed (served from one of those free blocks)",
              fmt_bytes(max(0, er[2]["reserved_bytes"] - er[1]["reserved_bytes"])))
    sec.table(["state", "allocated", "reserved", "inactive split (free inside partly used segments)", "segments"],
              [(EMPTY_CACHE_LABELS[i] if i < len(EMPTY_CACHE_LABELS) else r["label"], fmt_bytes(r["allocated_bytes"]),
                fmt_bytes(r["reserved_bytes"]), fmt_bytes(r["inactive_split_bytes"]), r["segments"])
               for i, r in enumerate(er)])
    return sec


def empty_cache_rule() -> Section:
    """The rule in isolation on a fresh simulated allocator: a live block pins its segment."""
    s = CachingAllocatorSim()
    a = s.malloc(GiB)
    s.free(a)
    b = s.malloc(100 * MiB)
    s.empty_cache()
    kept = s.memory_stats()["reserved_bytes.all.current"]
    s.free(b)
    s.empty_cache()
    left = s.memory_stats()["reserved_bytes.all.current"]
    sec = Section("The rule in isolation: a cached 1 GiB segment split by a live 100 MiB tensor", source="model")
    sec.claim("empty_cache() while the tensor lives keeps reserved", fmt_bytes(kept))
    sec.claim("once the tensor is freed, empty_cache() leaves", fmt_bytes(left))
    return sec


# -- 6. OOMs and the doctor ----------------------------------------------------------------------------------

def _verdict(d) -> tuple[str, str, str]:
    if not d.findings:
        return "-", "no finding", ""
    f = d.findings[0]
    return f.kind, f.title, f.simulator_check or "; ".join(f.evidence[:2])


def oom_cases(meas_dir: str | Path | None = None) -> Section:
    """The OOMs provoked on the H200 and what the doctor says about each (checked with the simulator
    against the saved snapshot where there is one)."""
    sec = Section("Real OOMs and what the doctor says")
    rows, missing, src = [], [], ""
    for case in OOM_CASES:
        try:
            doc = recorded.oom_case(case, meas_dir)
        except LabkitError:
            missing.append(case)
            continue
        src = src or describe(doc["provenance"])
        data = doc["data"]
        msg = data.get("oom_message") or (data.get("victim") or {}).get("oom_message")
        if not msg:
            rows.append((case, "no OOM in this run", "-", "", ""))
            continue
        snap = recorded.oom_snapshot_path(case, meas_dir)
        d = diagnose(oom_text=msg, stats=data if "stats" in data else None, snapshot=snap)
        kind, title, check = _verdict(d)
        rows.append((case, msg.split(" Including non-PyTorch memory")[0].splitlines()[0], kind, title, check))
    sec.source = src
    if rows:
        sec.claim("Recorded OOM cases the doctor classified", sum(r[2] != "-" for r in rows), f"of {len(rows)}",
                  source=src)
        sec.table(["case", "the OOM message (its start)", "doctor: kind", "finding", "evidence / simulator check"], rows)
    if missing:
        sec.note(f"Not recorded here: {', '.join('oom__' + c + '.json' for c in missing)} ({RECORD_HINT}).")
    return sec


def other_process(meas_dir: str | Path | None = None) -> Section:
    """The other_process case: the holder's own statistics say its memory is cache it could give back."""
    title = "Memory held by another process"
    try:
        doc = recorded.oom_case("other_process", meas_dir)
    except LabkitError:
        return Section(title).note(f"Not recorded here: oom__other_process.json ({RECORD_HINT}).")
    op = doc["data"]
    h = op["holder_before"]
    d = diagnose(stats={"reserved_bytes.all.current": h["reserved"], "allocated_bytes.all.current": h["allocated"],
                        "inactive_split_bytes.all.current": 0})
    kind, finding, _ = _verdict(d)
    sec = Section(title, source=describe(doc["provenance"]))
    sec.claim("The holder process reserved", fmt_bytes(h["reserved"]))
    sec.claim("... of which its live tensors", fmt_bytes(h["allocated"]))
    sec.claim(f"What the doctor finds in the holder's own statistics ({finding.rstrip('.').lower()})", kind)
    sec.claim("Holder's reserved memory after its empty_cache()", fmt_bytes(op["holder_after_empty_cache"]["reserved"]))
    sec.claim("The victim's second try", str(op["victim_after"].get("second_try")))
    return sec


def fragmentation_check(cap_gib: float = 6.0) -> Section:
    """The fragmentation pattern of the recorded OOM, replayed under a cap: default vs expandable (model)."""
    fp = synthetic.fragmentation_pattern()
    cap = int(cap_gib * GiB)
    res = [replay(fp, conf, cap_bytes=cap) for conf in ("", "expandable_segments:True", "max_split_size_mb:512")]
    sec = Section(f"Checked by the simulator: the fragmentation pattern under a {cap_gib:g} GiB cap", source="model")
    sec.claim("OOMs under the default configuration", res[0].num_ooms, "", name="alloc.fragmentation.ooms_default")
    sec.claim("OOMs with expandable segments", res[1].num_ooms, "", name="alloc.fragmentation.ooms_expandable")
    sec.table(["configuration", "reserved peak", "retries", "OOMs", "outcome"],
              [(r.config or "default", fmt_bytes(r.reserved_peak_bytes), r.num_alloc_retries, r.num_ooms,
                r.ooms[0].message if r.ooms else "fits") for r in res],
              caption=f"model: simulator, fragmentation pattern under a {cap_gib:g} GiB cap")
    return sec


SAMPLE_RANKS = [{"rank": 0, "pid": 100, "stats": {}}, {"rank": 1, "pid": 101, "stats": {}}]
SAMPLE_NVML = [{"gpu": 0, "used_bytes": 3 * GiB, "processes": [{"pid": 100, "used_bytes": int(2.5 * GiB)},
                                                                {"pid": 101, "used_bytes": 512 * MiB}]},
               {"gpu": 1, "used_bytes": int(2.5 * GiB), "processes": [{"pid": 101, "used_bytes": int(2.5 * GiB)}]}]


def imbalance(meas_dir: str | Path | None = None) -> Section:
    """Imbalance across ranks (stray CUDA contexts on GPU 0): recorded on 2 GPUs, else a sample."""
    try:
        doc = recorded.experiment("imbalance", meas_dir)
    except LabkitError:
        doc = None
    if doc is None:
        ranks, nvml = SAMPLE_RANKS, SAMPLE_NVML
        src = "sample: two ranks that both touched cuda:0 before set_device; NVML view of both GPUs"
    else:
        ranks, nvml, src = doc["data"]["ranks"], doc["data"]["nvml"], describe(doc["provenance"])
    d = diagnose(ranks=ranks, nvml=nvml)
    sec = Section("Imbalance across ranks", source=src)
    sec.table(["kind", "rank", "finding", "evidence", "fix"],
              [(f.kind, "-" if f.rank is None else f.rank, f.title, "; ".join(f.evidence), f.fix) for f in d.findings])
    sec.claim("The doctor's first finding", d.primary or "none")
    if doc is None:
        sec.note(f"Not recorded here: exp__imbalance.json (it needs 2 GPUs; {RECORD_HINT}); the doctor reads a sample.")
    return sec


def captured_oom(case: str = "fragmentation") -> Section:
    """An OOM caught where it happened by ``labkit.allocator.watch`` on the H200 (recorded): the
    capture, the doctor's verdict checked by the simulator, and how to use watch on your server."""
    return watch_section(case=case)


WATCH_HOW_TO = ("On your own server: wrap the training loop, `with labkit.allocator.watch('labkit-watch'): ...` (or "
                "decorate the training function with `@watch('labkit-watch')`; optimizer steps are sampled by "
                "themselves, a loop without an optimizer calls `w.step()`), or run the script unedited: `labkit watch "
                "-- python train.py ARGS`, also as `labkit watch -- torchrun --nproc-per-node 8 train.py ARGS`. Each "
                "rank writes labkit-watch/<run>/rank<R>/ (snapshot.pickle.gz, stats.jsonl, stats_at_oom.json, "
                "oom_message.txt, verdict.txt/.json); `labkit watch --show FOLDER` lists them, `labkit alloc doctor "
                "--capture FOLDER` re-reads one. detail='stats' is the cheapest setting (no history, so no simulator "
                "check), detail='stacks' adds Python stacks for torch.cuda.memory._memory_viz.")


def watch_section(case: str = "fragmentation", meas_dir: str | Path | None = None) -> Section:
    """The recorded capture of ``case`` (fragmentation, too_large, leak), diagnosed again here, with watch's
    recorded overhead. Without a watch recording, the earlier recorded OOM of the same kind is shown instead,
    and the section says so."""
    meas = Path(meas_dir) if meas_dir is not None else recorded.MEAS_DIR
    got = recorded.watch_capture(case, meas)
    if got is not None:
        doc, snap = got
        data = doc["data"]
        src = describe(doc["provenance"])
        with tempfile.TemporaryDirectory() as tmp:
            folder = capture.unpack(data["capture"], Path(tmp) / "rank0", snap)
            d = capture.diagnose_capture(folder)
        steps = data["capture"].get("steps") or []
        message = data["capture"].get("oom_message")
        at_gpu = data.get("verdict")
        title = f"A {case.replace('_', ' ')} OOM caught by labkit watch on the GPU, end to end"
    else:
        try:
            rec = recorded.oom_case(case, meas)
        except LabkitError:
            raise LabkitError(f"no recorded capture for {case!r} under {meas} (watch__{case}.json or oom__{case}.json)")
        data = rec["data"]
        src = describe(rec["provenance"])
        d = diagnose(stats=data, snapshot=recorded.oom_snapshot_path(case, meas))
        steps = [{"step": i, "allocated_bytes.all.current": a}
                 for i, a in enumerate(data.get("allocated_after_step_bytes") or [])]
        message = data.get("oom_message")
        at_gpu = None
        title = f"A {case.replace('_', ' ')} OOM recorded on the GPU (before watch: recorded by record_allocator)"
    s = Section(title, source=src)
    f = d.findings[0] if d.findings else None
    if f is not None:
        s.claim("the doctor's verdict (computed here from the recorded capture)", f.kind,
                source="model: labkit doctor on a recorded capture", name=f"alloc.watch.{case}.verdict")
        if at_gpu is not None:
            s.claim("the verdict watch wrote on the GPU when the OOM happened", at_gpu, source=src)
            if at_gpu != f.kind:
                s.note(f"the verdict written on the GPU ({at_gpu}) came from an earlier rule that read a single large "
                       "step's rising trace as a leak; the doctor now judges growth from per-step statistics only")
        if f.verified is not None:
            s.claim("the simulator, replaying the captured requests, agrees", "yes" if f.verified else "no",
                    source="model: labkit allocator simulator replaying the recorded snapshot")
    if d.oom is not None:
        m = d.oom
        s.claim("requested", round(m.request_bytes / 2**30, 2), "GiB")
        s.claim("allocated by PyTorch at the OOM", round((m.allocated_bytes or 0) / 2**30, 2), "GiB")
        s.claim("reserved but unallocated at the OOM", round((m.reserved_unallocated_bytes or 0) / 2**30, 2), "GiB")
        if m.limit_bytes:
            s.claim("limit (memory fraction)" if m.allowed_bytes is not None else "device capacity",
                    round(m.limit_bytes / 2**30, 2), "GiB")
    truth = data.get("expandable_truth") if got is not None else None
    if truth:
        s.claim("the same loop under expandable_segments:True on the GPU", "OOM" if truth.get("oom") else "no OOM",
                source=src, name=f"alloc.watch.{case}.expandable_truth")
    elif case == "fragmentation" and got is None:
        try:
            e = recorded.oom_case("fragmentation_expandable", meas)["data"]
            s.claim("the same program under expandable_segments:True on the GPU", "OOM" if e.get("oom") else "no OOM",
                    source=describe(recorded.oom_case("fragmentation_expandable", meas)["provenance"]))
        except LabkitError:
            pass
    if f is not None:
        rows = [[i, e] for i, e in enumerate(f.evidence, 1)]
        rows.append(["fix", f.fix])
        if f.simulator_check:
            rows.append(["checked", f.simulator_check])
        s.table(["#", "the doctor's evidence, with its arithmetic"], rows,
                caption=f"[{f.kind}] {f.title}")
    if steps:
        series = ", ".join(fmt_bytes(int(r.get("allocated_bytes.all.current", 0))) for r in steps[-12:])
        how = "memory_stats() sampled by watch" if got is not None else "torch.cuda.memory_allocated() after each step"
        s.note(f"allocated after each of the last {min(12, len(steps))} of {len(steps)} steps ({how}): {series}")
    if message:
        s.note("the OOM message: " + " ".join(message.split())[:600])
    _watch_overhead(s, meas)
    s.note(WATCH_HOW_TO)
    return s


def _watch_overhead(s: Section, meas: Path) -> None:
    o = recorded.overhead_summary(meas)
    if o is None:
        s.note("watch's overhead: not recorded yet (benchmarks/gpu/record_watch.py records it on the GPU)")
        return
    for mode, label in (("trace", "default settings (history without stacks)"), ("stats", "detail='stats'"),
                        ("stacks", "detail='stacks'")):
        if mode in o["modes"]:
            s.claim(f"step-time change with watch, {label}", round(o["modes"][mode]["change_pct"], 1), "%",
                    source=o["source"], name=f"alloc.watch.overhead.{mode}")
    s.claim(f"step time without watch ({o['workload']})", round(o["baseline_step_ms"], 2), "ms", source=o["source"])
    worst = max((abs(v["change_pct"]) for v in o["modes"].values()), default=0.0)
    if worst <= o["noise_pct"]:
        s.note(f"watch's overhead: no setting moves the step time by more than the baseline's own spread "
               f"({o['noise_pct']:.1f}%): not measurable at this step size (the negative changes are noise, not "
               "speed-ups); device memory is the same with and without watch (the history lives in host memory)")
    else:
        s.note(f"watch's overhead: the largest change, {worst:.1f}%, is beyond the baseline's own spread "
               f"({o['noise_pct']:.1f}%)")
