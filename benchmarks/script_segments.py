"""A script's allocator segments on the H200 beside script mode's, at the peak of reserved bytes.

    PYTHONPATH=. python benchmarks/script_segments.py data/scripts/cnn_dataloader.py \
        data/measurements/script/memory_trace__cnn_dataloader.json [-- ARGS]

The recording is ``record_scripts.py --segments``'s ``memory_trace__NAME.json`` (the caching allocator's history of
the script's run on the H200: every alloc, free and segment event with its size and innermost Python frames).
Script mode runs the same script here, in this process, with the simulated allocator's segments kept at its own
peak of reserved bytes. Printed for both: the peak of reserved bytes, the segments then by size (count and bytes
per size), the large segments' first allocations, and the large transient blocks (allocated and freed with
nothing allocated between: cuDNN workspaces and the like) by size. Where reserved bytes differ, this says whether
it is the segments' sizes (what was asked of the allocator) or their number. Diagnosis only: no figure of
the lab depends on it.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20


def recorded(doc: dict[str, Any]) -> dict[str, Any]:
    """Segments at the reserved peak and large transients from a ``memory_trace__NAME.json``."""
    acts = doc["actions"]
    segs = [(size, stream) for _, size, stream, _ in doc["segments_at_peak_reserved"]]
    first: dict[int, str] = {}
    seg_addr = {a: s for a, s, _, _ in doc["segments_at_peak_reserved"]}
    transients: list[int] = []
    last_alloc: tuple[int, int] | None = None
    for act, addr, size, _, frame in doc["trace"]:
        name = acts[act] if act >= 0 else ""
        if name == "alloc":
            for a, s in seg_addr.items():
                if a <= addr < a + s and a not in first:
                    first[a] = f"{size / MiB:.1f} MiB at {doc['frames'][frame]}"
            last_alloc = (addr, size)
        elif name == "free_requested":
            if last_alloc is not None and last_alloc[0] == addr and size >= MiB:
                transients.append(size)
            last_alloc = None
    return {"reserved": doc["peak_reserved_replayed"], "segments": segs,
            "first": [(s, first.get(a, "")) for a, s in sorted(seg_addr.items())], "transients": transients}


def predicted(script: str, argv: list[str]) -> dict[str, Any]:
    """Script mode's segments at its reserved peak and its large transients, from a run in this process."""
    from labkit.memory.script import live_allocator
    from labkit.memory.script.run import run_script

    cls = live_allocator.LiveAllocator
    sync = cls.sync
    seen: dict[str, Any] = {"reserved": 0, "segments": [], "transients": []}
    last: dict[str, Any] = {"sid": None, "size": 0}

    def watched(self: Any) -> None:
        events, start = self.tracker.events, self.cursor
        sync(self)
        for sid, delta, _ in events[start:self.cursor]:
            if delta > 0:
                last.update(sid=sid, size=delta)
            else:
                if last["sid"] == sid and last["size"] >= MiB:
                    seen["transients"].append(last["size"])
                last["sid"] = None
        r = self.sim.reserved_bytes[0]
        if r > seen["reserved"]:
            seen["reserved"] = r
            seen["segments"] = [(s["total_size"], s["stream"]) for s in self.sim.segments()]

    cls.sync = watched
    try:
        rep = run_script(script, argv, banner=False)
    finally:
        cls.sync = sync
    seen["report"] = (rep.peak_bytes, rep.reserved_bytes)
    return seen


def show(label: str, d: dict[str, Any]) -> None:
    sizes = collections.Counter(s for s, _ in d["segments"])
    print(f"\n{label}: peak reserved {d['reserved']:,d} B in {len(d['segments'])} segments "
          f"({sum(s for s, _ in d['segments']):,d} B)")
    for size, n in sorted(sizes.items(), reverse=True):
        print(f"  {n:4d} x {size / MiB:10.2f} MiB = {n * size / MiB:10.1f} MiB")
    for size, what in d.get("first", []):
        if size >= 20 * MiB:
            print(f"  segment {size / MiB:.1f} MiB: first block {what}")
    tr = collections.Counter(round(t / MiB, 2) for t in d["transients"])
    print(f"  large transients (>= 1 MiB, alloc then free with nothing between): {len(d['transients'])}")
    for size, n in sorted(tr.items(), reverse=True)[:25]:
        print(f"    {n:4d} x {size:10.2f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("trace", help="record_scripts.py --segments's memory_trace__NAME.json (or its merged copy)")
    ap.add_argument("args", nargs="*", help="the script's arguments (after --)")
    a = ap.parse_args()
    doc = json.loads(Path(a.trace).read_text())
    rec = recorded(doc.get("data", doc))          # as merged under data/ (with provenance) or as recorded
    pred = predicted(a.script, a.args)
    show("H200 (recorded)", rec)
    show(f"script mode (report: peak {pred['report'][0]:,d} B, reserved {pred['report'][1]:,d} B)", pred)
    print(f"\nreserved: script mode {100 * (pred['reserved'] / rec['reserved'] - 1):+.2f}% of the H200's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
