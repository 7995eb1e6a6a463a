"""Notebook sections of the allocator chapter built on recorded data (each returns a ``labkit.viz.section.Section``).

:func:`watch_section`: an out-of-memory error caught by ``labkit.allocator.watch`` on the H200, end to end (the
message, the per-step statistics, the doctor's arithmetic, the simulator's check of the fix, the same run under
the fix for real), the measured overhead of watching, and how to use it on your own server.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from labkit.allocator import capture, recorded
from labkit.core.errors import LabkitError
from labkit.core.provenance import describe, load_measurement
from labkit.core.units import fmt_bytes

HOW_TO = ("On your own server: wrap the training loop, `with labkit.allocator.watch('labkit-watch'): ...` (or "
          "decorate the training function with `@watch('labkit-watch')`; optimizer steps are sampled by themselves, "
          "a loop without an optimizer calls `w.step()`), or run the script unedited: `labkit watch -- python "
          "train.py ARGS`, also as `labkit watch -- torchrun --nproc-per-node 8 train.py ARGS`. Each rank writes "
          "labkit-watch/<run>/rank<R>/ (snapshot.pickle.gz, stats.jsonl, stats_at_oom.json, oom_message.txt, "
          "verdict.txt/.json); `labkit watch --show FOLDER` lists them, `labkit alloc doctor --capture FOLDER` "
          "re-reads one. detail='stats' is the cheapest setting (no history, so no simulator check), "
          "detail='stacks' adds Python stacks for torch.cuda.memory._memory_viz.")


def _watch_files(case: str, meas_dir: Path):
    p = meas_dir / f"watch__{case}.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "allocator.watch_capture")
    if not doc["data"].get("capture"):
        return None
    snap = meas_dir / f"watch__{case}.pickle.gz"
    return doc, (snap if snap.exists() else None)


def watch_section(case: str = "fragmentation", meas_dir: str | Path | None = None):
    """The recorded capture of ``case`` (fragmentation, too_large, leak), diagnosed again here, with watch's
    recorded overhead. Without a watch recording, the earlier recorded OOM of the same kind is shown instead,
    and the section says so."""
    from labkit.allocator.doctor import diagnose
    from labkit.viz.section import Section

    meas = Path(meas_dir) if meas_dir is not None else recorded.MEAS_DIR
    got = _watch_files(case, meas)
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
    _overhead(s, meas)
    s.note(HOW_TO)
    return s


def overhead_summary(meas_dir: str | Path | None = None) -> dict | None:
    """Watch's recorded step-time change per setting, with the noise it has to be read against (percent)."""
    meas = Path(meas_dir) if meas_dir is not None else recorded.MEAS_DIR
    p = meas / "watch__overhead.json"
    if not p.exists():
        return None
    doc = load_measurement(p, "allocator.watch_overhead")
    summ = doc["data"]["summary"]
    base = summ.get("none") or {}
    out = {"source": describe(doc["provenance"]), "workload": doc["data"]["workload"], "modes": {}}
    if "q1_s" in base:  # interleaved blocks: the baseline's own quartiles are the noise
        noise = 100 * (base["q3_s"] - base["q1_s"]) / base["median_step_s"]
    else:  # one process per run: the baseline runs' medians disagree by this much
        runs = base.get("per_run_median_s") or [base.get("median_step_s", 1)]
        noise = 100 * (max(runs) - min(runs)) / base["median_step_s"]
    out["noise_pct"] = noise
    for mode, v in summ.items():
        if mode == "none":
            continue
        change = v.get("median_paired_change_pct", v.get("overhead_pct"))
        if change is not None:
            out["modes"][mode] = {"change_pct": change, "median_step_ms": 1000 * v["median_step_s"]}
    out["baseline_step_ms"] = 1000 * base.get("median_step_s", 0)
    return out


def _overhead(s, meas: Path) -> None:
    o = overhead_summary(meas)
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
