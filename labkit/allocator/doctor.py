"""The OOM doctor: from an OOM message, ``memory_stats()`` (one or a series, per rank) and/or a snapshot,
say which case this is, show the evidence, give the fix, and check it with the simulator where it can.

Cases (``Finding.kind``):

* ``too_large``: allocated + request exceed what the process may use (or fit by less than two pages); no
  allocator setting helps.
* ``fragmentation`` (the fake OOM): allocated + request fit under the limit, but the room for a new segment
  does not and the reserved-but-unallocated bytes could not serve the request: they are in split blocks of partly used segments
  (inside one process the allocator frees its whole cached segments and retries before raising,
  so what is left reserved at an OOM is fragmentation).
* ``cache_held``: reserved far above allocated in whole cached segments; harmless inside one process
  (released on demand, each time a ``num_alloc_retries`` and a sync), but it blocks other processes.
* ``other_process``: other processes hold the device memory (their caches count for them).
* ``growth``: allocated memory grows step after step (a leak, e.g. losses kept with their graph).
* ``imbalance``: ranks use very different amounts (e.g. stray CUDA contexts on GPU 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.allocator.oom_message import OOMMessage, parse_oom_message
from labkit.allocator.sim.replay import replay
from labkit.allocator.sim.stream import compile_trace
from labkit.allocator.snapshot import Snapshot, read_snapshot
from labkit.core.errors import LabkitError
from labkit.core.serialize import DEFAULT_READ_LIMIT, parse_json, path_is, read_json
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
    verified: bool | None = None  # the simulator's replay of the snapshot agrees (True), disagrees (False), or none


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
    """A memory_stats() JSON dict, a list of them (a series), {"ranks": [...]}, or a labkit measurement: a file,
    or the JSON text itself (an argument starting with { or [ that is not a file)."""
    text = str(path).strip()
    if text[:1] in "{[" and not path_is(text, "exists"):
        if len(text) > DEFAULT_READ_LIMIT:
            raise LabkitError("--stats: the JSON given inline is too long (give a file)")
        try:
            doc = parse_json(text, "--stats", "statistics JSON")
        except LabkitError as exc:
            raise LabkitError(f"--stats: neither a file nor valid JSON ({str(exc).removeprefix('--stats: ')})") from None
        check_stats(doc, "--stats")
        return doc
    doc = read_json(path, "stats file")
    if isinstance(doc, dict) and "provenance" in doc and "data" in doc:
        doc = doc["data"]
    check_stats(doc, str(path))
    return doc


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise LabkitError(f"{where}: {what}")


def _check_ints(lst: Any, where: str) -> None:
    _need(isinstance(lst, list), where, f"expected a list of byte counts, got a {type(lst).__name__}")
    for i, v in enumerate(lst):
        _need(_is_int(v) and v >= 0, f"{where}[{i}]", f"expected a byte count, got {str(v)[:40]!r}")


# memory_stats()'s keys: "<stat>.<pool>.<current|peak|allocated|freed>", its num_* counters and max_split_size
_STAT_KEY = re.compile(r"^(\w+\.(all|large_pool|small_pool)\.(current|peak|allocated|freed)|num_\w+|max_split_size)$")
_WRAPPER_KEYS = ("ranks", "stats", "oom_message", "allocated_after_step_bytes", "nvml")


def check_memory_stats(st: dict, where: str) -> None:
    """A ``torch.cuda.memory_stats()`` dict holds counts and byte counts: every value a non-negative integer
    (``CUDACachingAllocator.cpp`` ``Stat``: ``current``, ``peak``, ``allocated``, ``freed``, all counted up
    from 0), each ``current`` at most its ``peak``, and the bytes allocated at most the bytes reserved (every
    allocated block lies in a reserved segment). Names the first entry that breaks this."""
    for key, v in st.items():
        if not (isinstance(key, str) and _STAT_KEY.match(key)):
            continue                                   # not a statistic (a label, a config entry)
        low = -1 if key == "max_split_size" else 0     # -1: no limit set (memory_stats()'s own convention)
        _need(_is_int(v) and v >= low, f"{where}: {key!r}",
              f"expected a non-negative integer (memory_stats() counts), got {str(v)[:40]!r}")
    for key, v in st.items():
        if isinstance(key, str) and key.endswith(".current"):
            peak = st.get(key[: -len("current")] + "peak")
            _need(peak is None or v <= peak, f"{where}: {key!r}", f"current {v} exceeds its peak {peak}: impossible")
    a, r = st.get("allocated_bytes.all.current"), st.get("reserved_bytes.all.current")
    _need(a is None or r is None or a <= r, f"{where}: 'allocated_bytes.all.current'",
          f"{a} bytes allocated exceed the {r} bytes reserved: impossible")


def check_stats(doc: Any, where: str = "stats") -> None:
    """Check the shape of what the doctor reads, naming the first entry it cannot read."""
    if isinstance(doc, list):
        for i, st in enumerate(doc):
            _need(isinstance(st, dict), f"{where}[{i}]", f"a memory_stats() sample is a dict, got a {type(st).__name__}")
            check_memory_stats(st, f"{where}[{i}]")
        return
    _need(isinstance(doc, dict), where, "expected a memory_stats() dict, a list of them, or {\"ranks\": [...]}, "
          f"got a {type(doc).__name__}")
    if "ranks" in doc:
        ranks = doc["ranks"]
        _need(isinstance(ranks, list), f"{where}: 'ranks'", f"expected a list of per-rank dicts, got "
              f"{type(ranks).__name__} {str(ranks)[:40]!r}")
        for i, rk in enumerate(ranks):
            w = f"{where}: ranks[{i}]"
            _need(isinstance(rk, dict), w, f"expected a dict, got a {type(rk).__name__}")
            for k in ("rank", "pid", "used_bytes"):
                if rk.get(k) is not None and not _is_int(rk[k]):
                    raise LabkitError(f"{w}.{k}: expected an integer, got {str(rk[k])[:40]!r}")
            _need(rk.get("stats") is None or isinstance(rk["stats"], dict), f"{w}.stats", "expected a memory_stats() dict")
            _need(rk.get("oom_text") is None or isinstance(rk["oom_text"], str), f"{w}.oom_text", "expected text")
        nvml = doc.get("nvml")
        if nvml is not None:
            _need(isinstance(nvml, list), f"{where}: 'nvml'", "expected a list of per-GPU dicts")
            for i, g in enumerate(nvml):
                w = f"{where}: nvml[{i}]"
                _need(isinstance(g, dict) and _is_int(g.get("gpu")), w, "expected a dict with an integer 'gpu'")
                _need(g.get("used_bytes") is None or _is_int(g["used_bytes"]), f"{w}.used_bytes", "expected an integer")
                procs = g.get("processes", [])
                _need(isinstance(procs, list), f"{w}.processes", "expected a list")
                for j, pr in enumerate(procs):
                    _need(isinstance(pr, dict) and _is_int(pr.get("pid")), f"{w}.processes[{j}]",
                          "expected a dict with an integer 'pid'")
                    _need(pr.get("used_bytes") is None or _is_int(pr["used_bytes"]),
                          f"{w}.processes[{j}].used_bytes", "expected an integer")
    if "stats" in doc and not isinstance(doc["stats"], dict):
        raise LabkitError(f"{where}: 'stats' is a {type(doc['stats']).__name__}, expected a memory_stats() dict")
    if isinstance(doc.get("stats"), dict):
        check_memory_stats(doc["stats"], f"{where}: stats")
    for i, rk in enumerate(doc.get("ranks") or []):
        if isinstance(rk.get("stats"), dict):
            check_memory_stats(rk["stats"], f"{where}: ranks[{i}].stats")
    if not any(k in doc for k in _WRAPPER_KEYS):
        check_memory_stats(doc, where)                 # the memory_stats() dict itself
    if doc.get("oom_message") is not None:
        _need(isinstance(doc["oom_message"], str), f"{where}: 'oom_message'", "expected text")
    if doc.get("allocated_after_step_bytes") is not None:
        _check_ints(doc["allocated_after_step_bytes"], f"{where}: allocated_after_step_bytes")


def _growth(series: list[int], what: str, limit: int | None = None) -> Finding | None:
    """Steadily rising floor of allocated memory across steps (k windows; the floor is each window's minimum)."""
    if len(series) < 4:
        return None
    k = min(8, len(series))
    n = len(series)
    mins = [min(series[i * n // k:(i + 1) * n // k] or [series[-1]]) for i in range(k)]
    rises = sum(1 for a, b in zip(mins, mins[1:]) if b > a)
    grew = mins[-1] - mins[0]
    peak = max(series) or 1
    if rises >= 0.75 * (k - 1) and grew > max(64 * MiB, 0.2 * peak):
        span = (k - 1) * n // k  # first sample of the first window to first sample of the last
        per = grew / span
        ev = [f"{what}: the lowest allocated value rose in {rises} of {k - 1} windows of {n} samples, "
              f"from {fmt_bytes(mins[0])} to {fmt_bytes(mins[-1])}: +{fmt_bytes(grew)}, "
              f"{fmt_bytes(grew)} / {span} samples apart = ~{fmt_bytes(int(per))} per sample"]
        if limit and series[-1] < limit and per > 0:
            ev.append(f"at that rate the limit {fmt_bytes(limit)} is reached after about "
                      f"({fmt_bytes(limit)} - {fmt_bytes(series[-1])}) / {fmt_bytes(int(per))} = "
                      f"{max(1, round((limit - series[-1]) / per))} more sample(s)")
        return Finding("growth", "Allocated memory grows step after step (a leak)", ev, FIXES["growth"])
    return None


# Expandable segments map memory in pages (20 MiB in the large pool); a stretch of free memory keeps at most a
# page mapped at each end. A fix that leaves less headroom than a couple of pages is not a fix the message can promise.
PAGE = 20 * MiB
SLACK = 2 * PAGE


def effective_limit(m: OOMMessage) -> int | None:
    """What PyTorch's allocator of this process could reserve in all: the memory fraction (which counts only the
    allocator's own reservations), or else the device's capacity less what other processes and this process's
    non-PyTorch memory (CUDA context, libraries' workspaces) hold, i.e. reserved + free."""
    if m.allowed_bytes is not None:
        return m.allowed_bytes
    if m.free_bytes is not None and m.allocated_bytes is not None:
        return m.allocated_bytes + (m.reserved_unallocated_bytes or 0) + m.free_bytes
    return m.total_bytes


def _from_oom(m: OOMMessage) -> list[Finding]:
    """The fake-OOM rule. At an OOM, P is allocated, U reserved but unallocated, R requested, L the limit of what
    this process's allocator may reserve. Before raising, the allocator has already freed its whole cached segments
    and retried (PyTorch c10/cuda/CUDACachingAllocator.cpp, ``DeviceCachingAllocator::malloc``: after a failed
    ``alloc_block``, ``release_available_cached_blocks`` then ``release_cached_blocks``, each followed by a retry;
    https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp), so U is what sits in split
    blocks of segments that still hold live tensors (or in private pools). Headroom H = L - (P + U) could not hold
    R. If P + R <= L, the bytes exist but U could not serve the request:
    fragmentation, which expandable segments remove. If P + R > L: too large (or other processes' memory)."""
    out: list[Finding] = []
    R = m.request_bytes
    P = m.allocated_bytes or 0
    U = m.reserved_unallocated_bytes or 0
    L = effective_limit(m)
    others = sum(b for _, b in m.other_processes)
    fraction = m.allowed_bytes is not None
    lim = (f"{fmt_bytes(L)} allowed (memory fraction)" if fraction else
           f"{fmt_bytes(L)} this process could reserve (reserved {fmt_bytes(P + U)} + free {fmt_bytes(m.free_bytes)})"
           if m.free_bytes is not None else f"{fmt_bytes(L)} device capacity") if L else "?"
    nonpt = (m.this_process_bytes - P - U) if m.this_process_bytes is not None else None
    small_foreign = [(pid, b) for pid, b in m.other_processes if b < 1.5 * GiB]
    # under a memory fraction the limit, not the other processes, decided this OOM
    if small_foreign and len(small_foreign) == len(m.other_processes) and not fraction:
        out.append(Finding("imbalance", "Small foreign processes on this GPU: likely other ranks' stray CUDA contexts",
                           [f"GPU {m.device} also hosts {len(small_foreign)} process(es) of "
                            + ", ".join(fmt_bytes(b) for _, b in small_foreign)
                            + " each: the size of a CUDA context (~0.3-1 GiB), not of a training job",
                            "typically every rank touched cuda:0 before torch.cuda.set_device(local_rank)"],
                           FIXES["imbalance"]))
    if L is None:
        return out
    H = max(0, L - P - U)
    fits_without_cache = P + R <= L
    if m.other_processes and not fraction and not fits_without_cache and len(small_foreign) < len(m.other_processes):
        pids = ", ".join(f"{pid} ({fmt_bytes(b)})" for pid, b in m.other_processes)
        out.append(Finding("other_process", "Other processes hold the memory this request needs",
                           [f"request {fmt_bytes(R)} but only {fmt_bytes(m.free_bytes)} free on GPU {m.device}",
                            f"other processes use {fmt_bytes(others)}: {pids}",
                            f"this process: {fmt_bytes(P)} allocated + {fmt_bytes(U)} cached by PyTorch; "
                            f"allocated + request = {fmt_bytes(P + R)} > {lim}"
                            + (f", but <= {fmt_bytes(L + others)} without the other processes" if P + R <= L + others
                               else "")],
                           FIXES["other_process"]))
        return out
    arith = f"allocated {fmt_bytes(P)} + request {fmt_bytes(R)} = {fmt_bytes(P + R)}"
    if not fits_without_cache:
        ev = [f"{arith} > {lim}: short by {fmt_bytes(P + R - L)} even with no cache and no fragmentation"]
        if nonpt is not None and nonpt > 0:
            ev.append(f"besides, {fmt_bytes(nonpt)} of this process is outside PyTorch's allocator (CUDA context, "
                      "cuBLAS/NCCL workspaces)")
        if U:
            ev.append(f"only {fmt_bytes(U)} is reserved but unallocated: freeing all of it would not make room")
        out.append(Finding("too_large", "The request does not fit even with no cache and no fragmentation", ev,
                           FIXES["too_large"]))
        return out
    margin = L - (P + R)
    if R <= H:
        # the headroom alone should have held the request: rounding (2 MiB segments, 20 MiB for small requests)
        # or memory outside the allocator that grew between the failure and the message
        out.append(Finding("too_large", "The memory limit is nearly reached by live tensors",
                           [f"{arith}, {100 * (P + R) / L:.0f}% of {lim}",
                            f"headroom {fmt_bytes(L)} - reserved {fmt_bytes(P + U)} = {fmt_bytes(H)} >= request: the "
                            "request failed on rounding (a new segment is rounded up to 2 MiB, or 20 MiB for requests "
                            "below 10 MiB) or on memory outside PyTorch's allocator"], FIXES["too_large"]))
        return out
    ev = [f"{arith} <= {lim}: the bytes exist (margin {fmt_bytes(margin)})",
          f"reserved {fmt_bytes(P)} + {fmt_bytes(U)} = {fmt_bytes(P + U)}; room for a new segment {fmt_bytes(L)} - "
          f"{fmt_bytes(P + U)} = {fmt_bytes(H)} < request {fmt_bytes(R)}",
          f"the {fmt_bytes(U)} reserved but unallocated could not serve it: before raising, the allocator already "
          "released every whole cached segment and retried, so what stays reserved is free blocks split inside "
          "segments that still hold live tensors" + (f" (or in private pools: {fmt_bytes(m.private_pool_bytes)})"
                                                    if m.private_pool_bytes else ""),
          f"room + stranded = {fmt_bytes(H)} + {fmt_bytes(U)} = {fmt_bytes(H + U)} >= request {fmt_bytes(R)}: "
          "usable as one block, the stranded memory would have been enough"]
    if margin < SLACK:
        ev.append(f"but the margin {fmt_bytes(margin)} is under two 20 MiB pages ({fmt_bytes(SLACK)}): even expandable "
                  "segments may not fit it; only a replay of a snapshot can tell")
        out.append(Finding("too_large", "At the limit: live tensors fill the memory, fragmentation only decides "
                           "which request fails", ev, FIXES["too_large"]))
        return out
    if (P + R) > 0.9 * L:
        ev.append(f"after the fix the peak is {100 * (P + R) / L:.0f}% of the limit: little room for anything more")
    out.append(Finding("fragmentation", "Reserved but unallocated memory is stranded in split blocks (a fake OOM)",
                       ev, FIXES["fragmentation"]))
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


def _from_snapshot(snap: Snapshot, limit: int | None, check: bool) -> tuple[list[Finding], list[str], dict | None]:
    out: list[Finding] = []
    notes: list[str] = []
    sim: dict | None = None
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
        # A trace has no step marks: one large forward pass rises just as a leak does (recorded on the H200: a
        # too-large batch's first step looked like "growth"). Growth is judged from per-step series only; here the
        # rise is a note that says what to give instead.
        g = _growth(series, "the snapshot's trace")
        if g:
            notes.append(f"allocated memory rose by {fmt_bytes(max(series) - min(series))} over the trace's "
                         f"{len(series)} allocations and frees; a trace has no step marks, so this is not judged "
                         "a leak: give per-step statistics (labkit watch records them) to check for one")
        ctr = compile_trace(snap)
        if not ctr.complete:
            notes.append(f"the trace is incomplete ({ctr.incomplete_reason}): it cannot be replayed; growth and "
                         "the current state are still read from it")
        elif check:
            sim = _replays(ctr, limit)
    return out, notes, sim


FIX_CONF = "expandable_segments:True"


def _replays(ctr, cap: int | None) -> dict:
    """Replay the captured request stream under the configuration it was recorded with and under the fixes."""
    base = ctr.recorded_conf or ""
    confs = [base] + [c for c in ("expandable_segments:True", "max_split_size_mb:128") if c != base]
    rows, results = [], {}
    for conf in confs:
        try:
            r = replay(ctr, conf, cap_bytes=cap)
        except LabkitError as exc:
            rows.append(f"{conf or 'default'}: {exc}")
            continue
        results[conf] = r
        rows.append(f"{conf or 'default'}: reserved peak {fmt_bytes(r.reserved_peak_bytes)}, "
                    f"{r.num_ooms} OOM(s), {r.recorded_oom_requests_that_fit} of the recorded OOM requests fit")
    text = ("simulator, replaying this trace" + (f" under a cap of {fmt_bytes(cap)}" if cap else "")
            + ": " + "; ".join(rows))
    return {"text": text, "results": results, "base": base, "cap": cap}


def _fits(r) -> bool:
    return r.num_ooms == 0


def _apply_check(findings: list[Finding], sim: dict) -> None:
    """Each finding's verdict against the simulator: does the same request stream fit under the fix?"""
    res, base = sim["results"], sim["base"]
    b = res.get(base)
    for f in findings:
        f.simulator_check = f.simulator_check or sim["text"]
        if b is None:
            continue
        if f.kind == "fragmentation":
            if "expandable_segments:True" in base.replace(" ", ""):
                f.fix = ("expandable_segments is already on (recorded configuration " + base + "): what is left is "
                         "stranded inside partly used pages; reduce the peak, or free large temporaries earlier")
                continue
            fx = res.get(FIX_CONF)
            if fx is None:
                continue
            f.verified = (not _fits(b)) and _fits(fx)
            f.simulator_check += (f". Under {FIX_CONF} the same requests fit: the fix is confirmed by the simulator"
                                  if f.verified else
                                  f". Not confirmed: under {FIX_CONF} the simulator still counts {fx.num_ooms} OOM(s)"
                                  if not _fits(fx) else ". Not confirmed: the default replay did not run out either")
        elif f.kind in ("too_large", "growth"):
            others = [r for c, r in res.items()]
            f.verified = not any(_fits(r) for r in others)
            f.simulator_check += (". No configuration makes it fit: allocator settings cannot help (confirmed by the "
                                  "simulator)" if f.verified else
                                  ". But " + ", ".join(c or "default" for c, r in res.items() if _fits(r))
                                  + " fits in the simulator: not confirmed")


NO_SETTING = "no setting saves this run"


def _follow_replays(d: Diagnosis, sim: dict) -> str:
    """Make the verdict the replays' (issue 27): the recorded request stream replayed under the recorded setting
    and each fix (:func:`_replays`). Where the recorded setting runs out of memory and

    * no setting fits: ``too_large`` ("no setting saves this run") comes first (after ``growth``, which no setting
      cures either); findings that blame the allocator (``fragmentation``, ``cache_held``) are kept after it,
      marked refuted by the simulator;
    * a setting fits: ``fragmentation`` comes first, its fix the setting that fits; ``too_large`` is refuted.

    Returns ``"none"`` or ``"setting"`` where the replays decided the verdict, ``""`` where they did not (the
    recorded setting did not run out of memory, or did not replay)."""
    res, base = sim["results"], sim["base"]
    b = res.get(base)
    if b is None or _fits(b):
        return ""
    saving = [c for c, r in res.items() if c != base and _fits(r)]
    tried = ", ".join(c or "default" for c in res)
    blame_allocator = ("fragmentation", "cache_held")
    if not saving:
        tl = next((f for f in d.findings if f.kind == "too_large"), None)
        if tl is None:
            tl = Finding("too_large", "The step needs more memory than the cap: " + NO_SETTING, [], FIXES["too_large"],
                         simulator_check=sim["text"])
        tl.evidence.insert(0, f"{NO_SETTING}: the recorded requests replayed under {tried} run out of memory under "
                              "each" + (f" (cap {fmt_bytes(sim['cap'])})" if sim.get("cap") else ""))
        tl.verified = True
        for f in d.findings:
            if f.kind in blame_allocator:
                f.verified = False
                f.simulator_check = (f.simulator_check or sim["text"]) + f". Refuted: {NO_SETTING}"
        growth = [f for f in d.findings if f.kind == "growth"]
        rest = [f for f in d.findings if f.kind not in ("growth", "too_large") and f.kind not in blame_allocator]
        d.findings = growth + [tl] + rest + [f for f in d.findings if f.kind in blame_allocator]
        return "none"
    conf = FIX_CONF if FIX_CONF in saving else saving[0]
    fr = next((f for f in d.findings if f.kind == "fragmentation"), None)
    if fr is None:
        fr = Finding("fragmentation", "Free memory the allocator cannot use for the request", [], FIXES["fragmentation"],
                     simulator_check=sim["text"])
    fr.evidence.insert(0, f"the recorded requests run out of memory under {base or 'default'} and fit under "
                          f"{', '.join(saving)} (the simulator's replays)")
    if f"PYTORCH_ALLOC_CONF={conf}" not in fr.fix:
        fr.fix = f"Start the process with PYTORCH_ALLOC_CONF={conf} (the simulator's replay fits under it). " + fr.fix
    fr.verified = True
    for f in d.findings:
        if f.kind == "too_large":
            f.verified = False
            f.simulator_check = (f.simulator_check or sim["text"]) + f". Refuted: {conf} saves this run"
    d.findings = [fr] + [f for f in d.findings if f is not fr]
    return "setting"


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
    replayed = ""
    if stats is not None:
        check_stats(stats)
    if ranks is not None:
        check_stats({"ranks": ranks, **({"nvml": nvml} if nvml is not None else {})}, "ranks")
    if step_allocated is not None:
        _check_ints(list(step_allocated) if isinstance(step_allocated, tuple) else step_allocated, "step_allocated")
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
        limit = limit or effective_limit(d.oom)
        d.findings += _from_oom(d.oom)
    if isinstance(stats, list):
        d.inputs.append(f"memory_stats() series ({len(stats)} samples)")
        series = [_stat(s, "allocated_bytes.all.current") for s in stats if isinstance(s, dict)]
        g = _growth(series, "allocated_bytes.all.current across the samples", limit)
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
        g = _growth(list(step_allocated), "torch.cuda.memory_allocated() after each step", limit)
        if g and "growth" not in d.kinds:
            d.findings.insert(0, g)
    if snapshot is not None:
        snap = snapshot if isinstance(snapshot, Snapshot) else read_snapshot(snapshot)
        d.inputs.append(f"snapshot {snap.source}")
        fs, notes, sim = _from_snapshot(snap, limit, check_with_simulator)
        for f in fs:
            existing = [x for x in d.findings if x.kind == f.kind]
            if existing:
                existing[0].evidence += f.evidence
            else:
                d.findings.append(f)
        if sim is not None:
            _apply_check(d.findings, sim)
            replayed = _follow_replays(d, sim)
            if not d.findings:
                notes.append(sim["text"])
        d.notes += notes
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
    # growth explains an OOM better than the symptom it ends in; where the snapshot's replays decided the verdict,
    # their order stands (growth first where no setting saves the run)
    order = ({"growth": 0} if replayed == "none" else {} if replayed == "setting"
             else {"growth": 0, "other_process": 1, "imbalance": 2})
    d.findings.sort(key=lambda f: order.get(f.kind, 5))
    if not d.findings:
        d.notes.append("no out-of-memory cause found in these inputs")
    elif snapshot is None and any(f.kind == "fragmentation" for f in d.findings):
        d.notes.append("to check a fix with the simulator, record a snapshot and pass it too: run the job under "
                       "`labkit watch -- ...` (or `with labkit.allocator.watch(): ...`), which captures it at the OOM")
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
