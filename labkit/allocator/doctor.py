"""The OOM doctor: from an OOM message, ``memory_stats()`` (one or a series, per rank) and/or a snapshot,
say which case this is, show the evidence, give the fix, and check it with the simulator where it can.

Cases (``Finding.kind``):

* ``too_large``: allocated + request exceed what the process may use; no allocator setting helps.
* ``fragmentation``: memory is reserved but unallocated in split blocks of partly used segments
  (inside one process the allocator frees its whole cached segments and retries before raising,
  so what is left reserved at an OOM is fragmentation).
* ``cache_held``: reserved far above allocated in whole cached segments; harmless inside one process
  (released on demand, each time a ``num_alloc_retries`` and a sync), but it blocks other processes.
* ``other_process``: other processes hold the device memory (their caches count for them).
* ``growth``: allocated memory grows step after step (a leak, e.g. losses kept with their graph).
* ``imbalance``: ranks use very different amounts (e.g. stray CUDA contexts on GPU 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.allocator.oom_message import OOMMessage, parse_oom_message
from labkit.allocator.snapshot import Snapshot, read_snapshot
from labkit.core.errors import LabkitError
from labkit.core.serialize import read_json
from labkit.core.units import fmt_bytes

GiB = 1024**3
MiB = 1024**2


@dataclass
class Finding:
    kind: str
    title: str
    evidence: list[str]
    fix: str
    simulator_check: str | None = None
    rank: int | None = None


@dataclass
class Diagnosis:
    inputs: list[str]
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    oom: OOMMessage | None = None

    @property
    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    @property
    def primary(self) -> str | None:
        return self.findings[0].kind if self.findings else None


FIXES = {
    "too_large": ("Reduce what is live at the peak: smaller micro-batch or sequence length, activation "
                  "checkpointing, bf16 activations, sharded optimizer/gradients (ZeRO/FSDP), or a GPU with more "
                  "memory. Allocator settings cannot help: the bytes are really in use."),
    "fragmentation": ("Start the process with PYTORCH_ALLOC_CONF=expandable_segments:True (segments grow and shrink "
                      "by pages, so free space is not stranded in split blocks); alternatively "
                      "max_split_size_mb:<a size above your common large tensors> keeps big cached blocks unsplit."),
    "cache_held": ("Inside one process this cache is given back on demand before any OOM. If another process needs the "
                   "GPU, call torch.cuda.empty_cache() at the phase boundary (e.g. after training, before evaluation "
                   "in another process), or set a memory fraction with garbage_collection_threshold:0.8."),
    "other_process": ("Another process holds this GPU's memory: stop it, or make it call torch.cuda.empty_cache(); "
                      "check `nvidia-smi` for the PIDs; give each job its own GPUs with CUDA_VISIBLE_DEVICES."),
    "growth": ("Something keeps tensors alive across steps. Typical: `losses.append(loss)` keeps each step's graph; "
               "store loss.item() or loss.detach(); also metrics kept as tensors, caches in lists, hooks. Compare "
               "torch.cuda.memory_allocated() at the same point of successive steps."),
    "imbalance": ("Call torch.cuda.set_device(local_rank) (or set CUDA_VISIBLE_DEVICES per rank) before anything touches "
                  "CUDA; avoid .cuda()/torch.device('cuda') without an index in rank code, and map_location in "
                  "torch.load; check `nvidia-smi` for extra processes on GPU 0."),
}


def _stat(stats: dict, key: str) -> int:
    v = stats.get(key, 0)
    return int(v) if isinstance(v, (int, float)) else 0


def load_stats_file(path: str | Path) -> Any:
    """A memory_stats() JSON dict, a list of them (a series), {"ranks": [...]}, or a labkit measurement."""
    doc = read_json(path, "stats file")
    if isinstance(doc, dict) and "provenance" in doc and "data" in doc:
        doc = doc["data"]
    return doc


def _growth(series: list[int], what: str) -> Finding | None:
    """Steadily rising floor of allocated memory across steps."""
    if len(series) < 4:
        return None
    k = min(8, len(series))
    n = len(series)
    mins = [min(series[i * n // k:(i + 1) * n // k] or [series[-1]]) for i in range(k)]
    rises = sum(1 for a, b in zip(mins, mins[1:]) if b > a)
    grew = mins[-1] - mins[0]
    peak = max(series) or 1
    if rises >= 0.75 * (k - 1) and grew > max(64 * MiB, 0.2 * peak):
        per = grew / max(1, n - 1) * (n / k) / (n / k)
        return Finding("growth", "Allocated memory grows step after step (a leak)",
                       [f"{what}: the lowest allocated value rose in {rises} of {k - 1} windows, by {fmt_bytes(grew)} "
                        f"in total (from {fmt_bytes(mins[0])} to {fmt_bytes(mins[-1])}; ~{fmt_bytes(int(per))} per "
                        "sample)"], FIXES["growth"])
    return None


def _from_oom(m: OOMMessage) -> list[Finding]:
    out: list[Finding] = []
    R = m.request_bytes
    L = m.limit_bytes
    P = m.allocated_bytes or 0
    U = m.reserved_unallocated_bytes or 0
    others = sum(b for _, b in m.other_processes)
    lim = f"{fmt_bytes(L)} {'allowed (memory fraction)' if m.allowed_bytes is not None else 'device capacity'}" if L else "?"
    nonpt = (m.this_process_bytes - P - U) if m.this_process_bytes is not None else None
    small_foreign = [(pid, b) for pid, b in m.other_processes if b < 1.5 * GiB]
    # under a memory fraction the limit, not the other processes, decided this OOM
    if small_foreign and len(small_foreign) == len(m.other_processes) and m.allowed_bytes is None:
        out.append(Finding("imbalance", "Small foreign processes on this GPU: likely other ranks' stray CUDA contexts",
                           [f"GPU {m.device} also hosts {len(small_foreign)} process(es) of "
                            + ", ".join(fmt_bytes(b) for _, b in small_foreign)
                            + " each: the size of a CUDA context (~0.3-1 GiB), not of a training job",
                            "typically every rank touched cuda:0 before torch.cuda.set_device(local_rank)"],
                           FIXES["imbalance"]))
    if m.other_processes and m.allowed_bytes is None and m.free_bytes is not None and m.free_bytes < R \
            and len(small_foreign) < len(m.other_processes):
        pids = ", ".join(f"{pid} ({fmt_bytes(b)})" for pid, b in m.other_processes)
        out.append(Finding("other_process", "Other processes hold the memory this request needs",
                           [f"request {fmt_bytes(R)} but only {fmt_bytes(m.free_bytes)} free on GPU {m.device}",
                            f"other processes use {fmt_bytes(others)}: {pids}",
                            f"this process: {fmt_bytes(P)} allocated + {fmt_bytes(U)} cached by PyTorch"],
                           FIXES["other_process"]))
    if L is not None and P + R > L - max(0, others if m.allowed_bytes is None else 0):
        ev = [f"allocated by PyTorch {fmt_bytes(P)} + request {fmt_bytes(R)} = {fmt_bytes(P + R)} > {lim}"]
        if nonpt is not None and nonpt > 0:
            ev.append(f"besides, {fmt_bytes(nonpt)} of this process is outside PyTorch's allocator (CUDA context, "
                      "cuBLAS/NCCL workspaces)")
        if U:
            ev.append(f"only {fmt_bytes(U)} is reserved but unallocated: freeing all of it would not make room")
        if not any(f.kind == "other_process" for f in out):
            out.append(Finding("too_large", "The request does not fit even with no cache and no fragmentation", ev,
                               FIXES["too_large"]))
    elif U >= R or (L and U > 0.1 * L):
        out.append(Finding("fragmentation", "Reserved but unallocated memory is stranded in split blocks",
                           [f"{fmt_bytes(U)} reserved by PyTorch but unallocated, request {fmt_bytes(R)}",
                            f"allocated {fmt_bytes(P)} + request {fmt_bytes(R)} = {fmt_bytes(P + R)} <= {lim}: "
                            "the bytes exist, but not in one free block",
                            "before raising, the allocator already released every whole cached segment and retried; "
                            "what stays reserved sits in segments that still hold live tensors"],
                           FIXES["fragmentation"]))
        if L and P + R > 0.9 * L:
            out.append(Finding("too_large", "Even without fragmentation the device would be nearly full",
                               [f"allocated {fmt_bytes(P)} + request {fmt_bytes(R)} = {fmt_bytes(P + R)}, "
                                f"{100 * (P + R) / L:.0f}% of {lim}"], FIXES["too_large"]))
    elif not out:
        used = P + U + R
        ev = [f"allocated {fmt_bytes(P)} + reserved-unallocated {fmt_bytes(U)} + request {fmt_bytes(R)} = "
              f"{fmt_bytes(used)}" + (f", {100 * used / L:.0f}% of {lim}" if L else "")]
        if m.allowed_bytes is None and m.free_bytes is not None:
            ev.append(f"the device reports {fmt_bytes(m.free_bytes)} free")
        out.append(Finding("too_large", "The memory limit is nearly reached by live tensors", ev, FIXES["too_large"]))
    return out


def _from_stats(st: dict, rank: int | None = None) -> list[Finding]:
    out: list[Finding] = []
    if "allocated_bytes.all.current" not in st or "reserved_bytes.all.current" not in st:
        return out  # partial statistics (e.g. only reserved per rank): nothing to compare
    a = _stat(st, "allocated_bytes.all.current")
    r = _stat(st, "reserved_bytes.all.current")
    isb = _stat(st, "inactive_split_bytes.all.current")
    ap = _stat(st, "allocated_bytes.all.peak")
    rp = _stat(st, "reserved_bytes.all.peak")
    retries = _stat(st, "num_alloc_retries")
    ooms = _stat(st, "num_ooms")
    if isb > max(512 * MiB, 0.2 * max(r, 1)):
        out.append(Finding("fragmentation", "Free memory stranded in split blocks (inactive_split_bytes)",
                           [f"inactive_split_bytes.all.current = {fmt_bytes(isb)} of reserved {fmt_bytes(r)} "
                            f"(allocated {fmt_bytes(a)})",
                            "these free blocks sit inside segments that also hold live tensors: empty_cache() cannot "
                            "release them and larger requests cannot use them"]
                           + ([f"num_ooms = {ooms}"] if ooms else []), FIXES["fragmentation"], rank=rank))
    cached_whole = r - a - isb
    if cached_whole > max(1 * GiB, 0.25 * max(r, 1)):
        out.append(Finding("cache_held", "The allocator caches far more than is allocated",
                           [f"reserved {fmt_bytes(r)} vs allocated {fmt_bytes(a)}: {fmt_bytes(cached_whole)} cached in "
                            "whole free segments (releasable by empty_cache())"]
                           + ([f"peaks: reserved {fmt_bytes(rp)}, allocated {fmt_bytes(ap)}"] if rp else [])
                           + ([f"num_alloc_retries = {retries}: the cache was already flushed {retries} time(s) to make "
                               "room (each a full synchronisation)"] if retries else []),
                           FIXES["cache_held"], rank=rank))
    return out


def _from_snapshot(snap: Snapshot, limit: int | None, check: bool) -> tuple[list[Finding], list[str]]:
    from labkit.allocator.trace import compile_trace

    out: list[Finding] = []
    notes: list[str] = []
    reserved = sum(s["total_size"] for s in snap.segments)
    allocated = sum(int(s.get("allocated_size", 0)) for s in snap.segments)
    stranded = 0
    largest_free = 0
    for s in snap.segments:
        blocks = s.get("blocks", [])
        for b in blocks:
            if b.get("state") == "inactive":
                largest_free = max(largest_free, int(b.get("size", 0)))
                if len(blocks) > 1 and not s.get("is_expandable"):
                    stranded += int(b.get("size", 0))
    notes.append(f"snapshot: {len(snap.segments)} segments, reserved {fmt_bytes(reserved)}, allocated "
                 f"{fmt_bytes(allocated)}, largest free block {fmt_bytes(largest_free)}")
    if stranded > max(512 * MiB, 0.2 * max(reserved, 1)):
        out.append(Finding("fragmentation", "Free blocks inside partly used segments",
                           [f"{fmt_bytes(stranded)} free in segments that also hold live blocks (of {fmt_bytes(reserved)} "
                            f"reserved); the largest free block is {fmt_bytes(largest_free)}"], FIXES["fragmentation"]))
    traces = [t for t in snap.device_traces if t]
    if traces:
        tr = traces[0]
        rel = 0
        series = []
        for e in tr:
            a = e["action"]
            if a == "alloc":
                rel += e["size"]
                series.append(rel)
            elif a == "free_requested":
                rel -= e["size"]
                series.append(rel)
        g = _growth(series, "the snapshot's trace (allocated memory relative to where the history starts)")
        if g:
            out.append(g)
        ctr = compile_trace(snap)
        if not ctr.complete:
            notes.append(f"the trace is incomplete ({ctr.incomplete_reason}): it cannot be replayed; growth and "
                         "the current state are still read from it")
        elif check:
            from labkit.allocator.replay import replay

            cap = limit
            rows = []
            for conf in ("", "expandable_segments:True", "max_split_size_mb:128"):
                try:
                    r = replay(ctr, conf, cap_bytes=cap)
                except LabkitError as exc:
                    rows.append(f"{conf or 'default'}: {exc}")
                    continue
                rows.append(f"{conf or 'default'}: reserved peak {fmt_bytes(r.reserved_peak_bytes)}, "
                            f"{r.num_ooms} OOM(s), {r.recorded_oom_requests_that_fit} of the recorded OOM requests fit")
            check_text = ("simulator, replaying this trace" + (f" under a cap of {fmt_bytes(cap)}" if cap else "")
                          + ": " + "; ".join(rows))
            for f in out:
                f.simulator_check = check_text
            notes.append(check_text)
    return out, notes


def _from_ranks(ranks: list[dict]) -> list[Finding]:
    used = []
    for i, rk in enumerate(ranks):
        st = rk.get("stats") or {}
        u = rk.get("used_bytes")
        used.append((rk.get("rank", i), _stat(st, "reserved_bytes.all.current"), u))
    out = []
    res = [r for _, r, _ in used]
    if len(res) >= 2 and max(res) - min(res) > max(1 * GiB, 0.2 * max(res)):
        out.append(Finding("imbalance", "Ranks reserve very different amounts",
                           [", ".join(f"rank {r}: reserved {fmt_bytes(v)}" for r, v, _ in used)], FIXES["imbalance"]))
    return out


def _from_nvml(nvml: list[dict], ranks: list[dict] | None) -> list[Finding]:
    if len(nvml) < 2:
        return []
    counts = [len(g.get("processes", [])) for g in nvml]
    used = [int(g.get("used_bytes", 0)) for g in nvml]
    extra = [g for g, c in zip(nvml, counts) if c > min(counts)]
    if extra or max(used) - min(used) > max(1 * GiB, 0.2 * max(used)):
        ev = [", ".join(f"GPU {g['gpu']}: {fmt_bytes(int(g.get('used_bytes', 0)))} used by "
                        f"{len(g.get('processes', []))} process(es)" for g in nvml)]
        if extra:
            pids = {p["pid"] for g in nvml for p in g.get("processes", [])}
            # rank r is expected on GPU r (set_device(local_rank)); a rank's PID on another GPU is a stray context
            own_gpu = {r.get("pid"): r.get("rank", i) for i, r in enumerate(ranks or []) if r.get("pid") is not None}
            for g in extra:
                stray = [p for p in g.get("processes", []) if p["pid"] in own_gpu and own_gpu[p["pid"]] != g["gpu"]]
                ev.append(f"GPU {g['gpu']} hosts {len(g.get('processes', []))} processes while others host "
                          f"{min(counts)}: {len(pids)} distinct PIDs in all"
                          + (f"; PIDs {[p['pid'] for p in stray]} (ranks {[own_gpu[p['pid']] for p in stray]}, "
                             f"{', '.join(fmt_bytes(int(p.get('used_bytes') or 0)) for p in stray)}) belong on other "
                             "GPUs: stray CUDA contexts" if stray else ""))
        return [Finding("imbalance", "GPU memory is unbalanced across the ranks' GPUs", ev, FIXES["imbalance"])]
    return []


def diagnose(*, oom_text: str | None = None, stats: Any = None, snapshot: str | Path | Snapshot | dict | None = None,
             ranks: list[dict] | None = None, nvml: list[dict] | None = None, step_allocated: list[int] | None = None,
             check_with_simulator: bool = True, cap_bytes: int | None = None) -> Diagnosis:
    """Classify an out-of-memory case from whatever is at hand (at least one input).

    ``cap_bytes`` is the memory limit the simulator checks against (default: the limit the OOM message
    names, if any)."""
    if oom_text is None and stats is None and snapshot is None and not ranks and not nvml and not step_allocated:
        raise LabkitError("doctor: give an OOM message, memory_stats(), a snapshot, or per-rank data")
    d = Diagnosis(inputs=[])
    limit = cap_bytes
    if isinstance(stats, dict) and "ranks" in stats and ranks is None:
        ranks = stats["ranks"]
        nvml = nvml or stats.get("nvml")
        stats = None
    if isinstance(stats, dict) and "stats" in stats and isinstance(stats["stats"], dict):
        rec = stats  # a recorded labkit OOM case: message + stats (+ per-step allocation)
        if oom_text is None and rec.get("oom_message"):
            oom_text = rec["oom_message"]
        if step_allocated is None and rec.get("allocated_after_step_bytes"):
            step_allocated = rec["allocated_after_step_bytes"]
        stats = rec["stats"]
    if oom_text is not None:
        d.inputs.append("OOM message")
        d.oom = parse_oom_message(oom_text)
        limit = limit or d.oom.limit_bytes
        d.findings += _from_oom(d.oom)
    if isinstance(stats, list):
        d.inputs.append(f"memory_stats() series ({len(stats)} samples)")
        series = [_stat(s, "allocated_bytes.all.current") for s in stats if isinstance(s, dict)]
        g = _growth(series, "allocated_bytes.all.current across the samples")
        if g:
            d.findings.append(g)
        if stats and isinstance(stats[-1], dict):
            stats = stats[-1]
    if isinstance(stats, dict):
        d.inputs.append("memory_stats()")
        for f in _from_stats(stats):
            if f.kind not in d.kinds:
                d.findings.append(f)
    if step_allocated:
        d.inputs.append(f"allocated after each step ({len(step_allocated)} steps)")
        g = _growth(list(step_allocated), "torch.cuda.memory_allocated() after each step")
        if g and "growth" not in d.kinds:
            d.findings.insert(0, g)
    if snapshot is not None:
        snap = snapshot if isinstance(snapshot, Snapshot) else read_snapshot(snapshot)
        d.inputs.append(f"snapshot {snap.source}")
        fs, notes = _from_snapshot(snap, limit, check_with_simulator)
        for f in fs:
            existing = [x for x in d.findings if x.kind == f.kind]
            if existing:
                existing[0].evidence += f.evidence
                existing[0].simulator_check = existing[0].simulator_check or f.simulator_check
            else:
                d.findings.append(f)
        if check_with_simulator:
            for f in d.findings:
                if f.simulator_check is None and fs and fs[0].simulator_check:
                    f.simulator_check = fs[0].simulator_check
        d.notes += notes
        if not fs and any(n.startswith("simulator") for n in notes):
            for f in d.findings:
                f.simulator_check = f.simulator_check or next(n for n in notes if n.startswith("simulator"))
    if ranks:
        d.inputs.append(f"{len(ranks)} ranks")
        for i, rk in enumerate(ranks):
            if rk.get("oom_text"):
                for f in _from_oom(parse_oom_message(rk["oom_text"], source=f"rank {rk.get('rank', i)} OOM message")):
                    f.rank = rk.get("rank", i)
                    d.findings.append(f)
            for f in _from_stats(rk.get("stats") or {}, rank=rk.get("rank", i)):
                d.findings.append(f)
        d.findings += _from_ranks(ranks)
    if nvml:
        d.inputs.append(f"NVML, {len(nvml)} GPUs")
        f2 = _from_nvml(nvml, ranks)
        if f2 and "imbalance" in d.kinds:
            d.findings = [f for f in d.findings if f.kind != "imbalance"]
        d.findings += f2
    # growth explains an OOM better than the symptom it ends in
    order = {"growth": 0, "other_process": 1, "imbalance": 2}
    d.findings.sort(key=lambda f: order.get(f.kind, 5))
    if not d.findings:
        d.notes.append("no out-of-memory cause found in these inputs")
    elif snapshot is None and any(f.kind == "fragmentation" for f in d.findings):
        d.notes.append("to check a fix with the simulator, record a snapshot (torch.cuda.memory._record_memory_history("
                       "max_entries=200000, context=None) ... _dump_snapshot()) and pass it too")
    return d


def format_diagnosis(d: Diagnosis) -> str:
    lines = [f"inputs: {', '.join(d.inputs)}"]
    for i, f in enumerate(d.findings, 1):
        who = f" (rank {f.rank})" if f.rank is not None else ""
        lines.append(f"\n{i}. [{f.kind}]{who} {f.title}")
        lines += [f"   evidence: {e}" for e in f.evidence]
        lines.append(f"   fix: {f.fix}")
        if f.simulator_check:
            lines.append(f"   checked: {f.simulator_check}")
    shown = {f.simulator_check for f in d.findings}
    lines += [f"\nnote: {n}" for n in d.notes if n not in shown]
    return "\n".join(lines)
