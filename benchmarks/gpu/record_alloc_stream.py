"""Ground truth for fake mode's reserved figure: the real allocation stream of a few plain-loop corpus cases.

Fake mode predicts ``max_memory_reserved`` by replaying its own allocation stream through the allocator
simulator. Where the allocated peak is right but the reserved figure is not, the stream's order or
content differs from the GPU's. This script records the GPU's stream for a few REFERENCE cases of
``labkit.workloads.corpus`` (never held-out ones), exactly as ``record_plain.py`` runs them
(:func:`labkit.workloads.corpus.prepare_plain`, four :func:`~labkit.workloads.corpus.plain_step` calls,
``reset_peak_memory_stats`` before each), with ``torch.cuda.memory._record_memory_history`` on from
before the model is built, so that it can be diffed against the fake stream.

Runs, in this order, in one process:

1. ``CASE__cold``: the first case before anything else touched the GPU (a fresh user process: the cuBLAS
   workspaces are allocated lazily, at the first matmul of the forward thread and of the autograd
   engine's device thread).
2. a warm-up (one small linear forward and backward: both threads' cuBLAS workspaces), as the recorded
   corpus had from its earlier cases; ``empty_cache``.
3. each case ``CASE__warm``, as in ``plain__corpus.json``.

    PYTHONPATH=. python3 benchmarks/gpu/record_alloc_stream.py --out DIR [--cases A,B,C] [--cold CASE] [--smoke]

Writes ``DIR/stream__CASE__MODE.json.gz`` per run (compact: the trace as rows ``[action, addr, size,
stream, time_us, frame]`` with an interned table of Python frames, the segments at the end, per-step
peaks, step boundaries as times) and ``DIR/summary.json`` (provenance, per-step peaks). ``--smoke`` runs
the CI size of one case on the CPU (no allocator to record: the files say so), to check the script.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from labkit.core.provenance import header, write_measurement
from labkit.workloads.corpus import CASES, Case, plain_step, prepare_plain, tiny

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_plain import cleanup  # noqa: E402  (the same clean slate between cases as the corpus recording)

DEFAULT_CASES = ("gpt2-b8-bf16", "mistral-b4-fp32", "gemma3-b2-amp-bf16")
DEFAULT_COLD = "gpt2-b8-bf16"
STEPS = 4
MAX_ENTRIES = 600_000
FRAMES_KEPT = 6           # innermost Python frames kept per trace entry
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _frame_key(frames: list[dict]) -> str:
    parts = []
    for f in frames[:FRAMES_KEPT]:
        fn = str(f.get("filename", ""))
        short = "/".join(fn.split("/")[-2:])
        parts.append(f"{short}:{f.get('line', '')}:{f.get('name', '')}")
    return " < ".join(parts)


def compact_snapshot(snap: dict[str, Any], device: int = 0) -> dict[str, Any]:
    """The trace of ``device`` as integer rows with interned frames, and the segments without history."""
    frames: dict[str, int] = {}
    rows = []
    traces = snap.get("device_traces") or []
    for e in traces[device] if device < len(traces) else []:
        key = _frame_key(e.get("frames") or [])
        fi = frames.setdefault(key, len(frames))
        act = e.get("action")
        rows.append([ACTIONS.index(act) if act in ACTIONS else -1, int(e.get("addr", 0)), int(e.get("size", 0)),
                     int(e.get("stream", 0)), int(e.get("time_us", 0)), fi])
    segs = []
    for s in snap.get("segments", []):
        if s.get("device", device) != device:
            continue
        segs.append({"address": int(s["address"]), "total_size": int(s["total_size"]), "stream": int(s.get("stream", 0)),
                     "segment_type": s.get("segment_type"),
                     "blocks": [[int(b["size"]), b.get("state"), int(b.get("requested_size", 0))] for b in s["blocks"]]})
    return {"actions": list(ACTIONS), "trace": rows, "frames": [k for k, _ in sorted(frames.items(), key=lambda x: x[1])],
            "segments": segs}


def warm_up(device: str) -> None:
    """One small linear forward and backward: the forward thread's and the autograd engine's cuBLAS workspaces."""
    lin = torch.nn.Linear(256, 256, device=device)
    x = torch.randn(64, 256, device=device, requires_grad=True)
    lin(x).sum().backward()
    del lin, x
    cleanup(device == "cuda")


def run(case: Case, mode: str, device: str, out: Path) -> dict[str, Any]:
    cuda = device == "cuda"
    cleanup(cuda)
    tag = f"{case.name}__{mode}"
    row: dict[str, Any] = {"run": tag, "case": case.name, "mode": mode}
    row["base_allocated"] = torch.cuda.memory_allocated() if cuda else None
    row["base_reserved"] = torch.cuda.memory_reserved() if cuda else None
    marks: list[tuple[str, int]] = []
    model = opt = batch = None
    try:
        if cuda:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=MAX_ENTRIES)
        marks.append(("init", time.time_ns() // 1000))
        model, opt, batch = prepare_plain(case, device)
        if cuda:
            torch.cuda.synchronize()
        row["init_allocated"] = torch.cuda.memory_allocated() if cuda else None
        row["init_reserved"] = torch.cuda.memory_reserved() if cuda else None
        peaks, reserved = [], []
        for i in range(1, STEPS + 1):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            marks.append((f"step{i}", time.time_ns() // 1000))
            plain_step(case, model, opt, batch, device_type=device)
            if cuda:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated())
                reserved.append(torch.cuda.max_memory_reserved())
        marks.append(("end", time.time_ns() // 1000))
        row["step_peaks_allocated"], row["step_peaks_reserved"] = peaks, reserved
        if cuda:
            st = torch.cuda.memory_stats()
            row["stats"] = {k: int(st.get(k, 0)) for k in ("num_alloc_retries", "num_device_alloc", "segment.all.current",
                                                          "reserved_bytes.all.current", "allocated_bytes.all.current")}
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            doc = compact_snapshot(snap)
            del snap
        else:
            doc = {"actions": list(ACTIONS), "trace": [], "frames": [], "segments": [],
                   "why": "no CUDA allocator here (--smoke or a CPU-only machine): nothing to record"}
        doc.update({"run": tag, "marks": marks, "case": row})
        raw = json.dumps(doc, separators=(",", ":")).encode()
        name = f"stream__{tag}.json.gz"
        (out / name).write_bytes(gzip.compress(raw, compresslevel=9))
        row["file"] = name
        row["trace_entries"] = len(doc["trace"])
        row["file_bytes"] = (out / name).stat().st_size
    except Exception as exc:  # noqa: BLE001 - one failing run must not lose the others
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        row["traceback_tail"] = traceback.format_exc()[-1500:]
        if cuda:
            torch.cuda.memory._record_memory_history(enabled=None)
    del model, opt, batch
    cleanup(cuda)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="reference cases, comma-separated")
    ap.add_argument("--cold", default=DEFAULT_COLD, help="the case run first, in the fresh process ('' for none)")
    ap.add_argument("--smoke", action="store_true", help="the CI size of one case on the CPU (checks the script)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    by_name = {c.name: c for c in CASES}
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names + ([args.cold] if args.cold else []) if n not in by_name]
    if unknown:
        print(f"record_alloc_stream: unknown case(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    todo = [by_name[n] for n in names]
    held = [c.name for c in todo + ([by_name[args.cold]] if args.cold else []) if c.split != "reference"]
    if held:
        print(f"record_alloc_stream: {', '.join(held)}: held-out, never used for diagnosis", file=sys.stderr)
        return 2
    cold = by_name[args.cold] if args.cold else None
    global STEPS
    if args.smoke:
        STEPS = 2
        todo, cold = [tiny(c) for c in todo[:1]], (tiny(cold) if cold else None)
    log(f"device {device}; torch {torch.__version__}; runs: {[c.name for c in todo]} warm, {cold.name if cold else '-'} cold")
    rows = []
    if cold is not None:
        rows.append(run(cold, "cold", device, args.out))
        log(f"{rows[-1]['run']}: {rows[-1].get('error') or rows[-1].get('step_peaks_reserved')}")
    warm_up(device)
    for case in todo:
        rows.append(run(case, "warm", device, args.out))
        log(f"{rows[-1]['run']}: {rows[-1].get('error') or rows[-1].get('step_peaks_reserved')}")
    cmd = "python3 benchmarks/gpu/record_alloc_stream.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_measurement(args.out / "summary.json", "measure_alloc_stream",
                      {"device": device, "smoke": args.smoke, "steps": STEPS, "runs": rows}, provenance=header(cmd))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
