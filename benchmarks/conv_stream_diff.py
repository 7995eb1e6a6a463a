"""Fake mode's cuDNN convolution workspaces beside the H200's own, pass by pass, for a reference case whose allocator
stream was recorded (``benchmarks/gpu/record_alloc_stream.py``, ``data/measurements/measure/alloc_stream/``).

    PYTHONPATH=. .venv/bin/python benchmarks/conv_stream_diff.py CASE [--run cold] [--step step3] [--substitute]

The convolution workspaces are transient blocks: allocated and freed with nothing allocated between them, in fake
mode's stream (``labkit.memory.trace.fake.conv_workspace``) as in the H200's. The transients of 1 MiB or more of one
steady step are aligned in order (``difflib`` on sizes to 0.01 MiB; between two matches, runs of equal length are
paired position by position, others left unpaired)
and each fake one is labelled with the convolution pass that took it. Printed: every pass where the two differ by
more than 0.01 MiB. ``--substitute`` predicts the case again with the H200's size in place of the rule's for every
paired pass (the same pass, same shapes: cuDNN's heuristics choose by the problem alone) and prints the reserved
bytes both ways beside the recorded ones: where the substitution brings them to the recording, the workspaces are
what is wrong, not the allocator's replay. Held-out cases are refused (never used for diagnosis).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import sys
from typing import Any

from labkit.core.errors import LabkitError

MiB = 1 << 20


def _descriptor(pass_: str, x: Any, w: Any, stride: Any, groups: int, dtype: Any, kw: dict) -> tuple:
    return (pass_, tuple(x), tuple(w), tuple(stride), groups, str(dtype), bool(kw.get("transposed")),
            bool(kw.get("channels_last")))


def predict(case: Any, table: dict | None = None) -> tuple[Any, list, list]:
    """Fake mode's prediction of ``case`` in a fresh process, the convolution passes of its last traced step
    (``(descriptor, bytes)``, in order) and its allocation events from that step on; ``table`` replaces the rule's
    bytes for the passes it names."""
    import labkit.memory.trace.backends as backends
    import labkit.memory.trace.fake.fake_cuda as fake_cuda
    from labkit.memory.trace.corpus_check import predict_as_recorded, recorded_process
    from labkit.memory.trace.step import FakeCuda

    calls: list = []
    rule, replay = fake_cuda.conv_workspace_bytes, backends.replay_tracker
    seen: dict[str, Any] = {}

    def workspace(pass_, x, w, y, stride, padding, dilation, groups, dtype, **kw):  # noqa: ANN001, ANN202
        d = _descriptor(pass_, x, w, stride, groups, dtype, kw)
        n, why = rule(pass_, x, w, y, stride, padding, dilation, groups, dtype, **kw)
        if table is not None and d in table:
            n, why = table[d], None
        calls.append((d, n))
        return n, why

    def spy(tracker, *a, **kw):  # noqa: ANN001, ANN202
        seen["tracker"], seen["starts"] = tracker, kw.get("step_starts")
        return replay(tracker, *a, **kw)

    fake_cuda.conv_workspace_bytes, backends.replay_tracker = workspace, spy
    try:
        rep, _ = predict_as_recorded(case, None, None, fake=FakeCuda(allocator_state=[], **recorded_process([])))
    finally:
        fake_cuda.conv_workspace_bytes, backends.replay_tracker = rule, replay
    return rep, calls[len(calls) // 2:], seen["tracker"].events[seen["starts"][-1]:]


def _transients(seq: list[tuple[Any, int]]) -> list[int]:
    return [seq[i][1] for i in range(len(seq) - 1)
            if seq[i][1] > 0 and seq[i + 1][1] < 0 and seq[i][0] == seq[i + 1][0]]


def recorded_transients(path: str, step: str) -> list[int]:
    doc = json.loads(gzip.decompress(open(path, "rb").read()))
    marks = dict(doc["marks"])
    if step not in marks:
        raise LabkitError(f"{path}: no step {step!r} (marks: {', '.join(marks)})")
    t0 = marks[step]
    t1 = min((t for _, t in doc["marks"] if t > t0), default=float("inf"))
    alloc, free = doc["actions"].index("alloc"), doc["actions"].index("free_requested")
    seq = [(addr, size if act == alloc else -size) for act, addr, size, _, t, _ in doc["trace"]
           if t0 <= t < t1 and act in (alloc, free)]
    return [s for s in _transients(seq) if s >= MiB]


def pair(calls: list, events: list, real: list[int]) -> list[tuple[tuple | None, int, int]]:
    """``(descriptor or None, fake bytes, H200 bytes)`` for the aligned transients of one step."""
    pending = [c for c in calls if c[1]]
    fake: list[tuple[int, tuple | None]] = []
    for size in _transients([(sid, d) for sid, d, _ in events]):
        label = None
        if pending and -(-pending[0][1] // 512) * 512 == size:
            label = pending.pop(0)[0]
        if size >= MiB:
            fake.append((size, label))
    sm = difflib.SequenceMatcher(None, [round(s / MiB, 2) for s, _ in fake], [round(s / MiB, 2) for s in real],
                                 autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ("equal", "replace") and i2 - i1 == j2 - j1:
            out += [(fake[i1 + k][1], fake[i1 + k][0], real[j1 + k]) for k in range(i2 - i1)]
    return out


def main(argv: list[str] | None = None) -> int:
    from labkit.memory.trace.corpus_check import load_plain
    from labkit.memory.trace.recorded import measure_dir
    from labkit.workloads.corpus import get_case

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case")
    ap.add_argument("--run", default="cold", help="the recorded run: cold (a fresh process) or warm")
    ap.add_argument("--step", default="step3", help="the recorded step to compare (a steady one)")
    ap.add_argument("--substitute", action="store_true", help="predict again with the H200's workspaces")
    args = ap.parse_args(argv)
    try:
        case = get_case(args.case)
        if case.split != "reference":
            raise LabkitError(f"{args.case}: held-out, never used for diagnosis")
        path = measure_dir() / "alloc_stream" / f"stream__{args.case}__{args.run}.json.gz"
        if not path.exists():
            raise LabkitError(f"{path}: not recorded (benchmarks/gpu/record_alloc_stream.py)")
        rep, calls, events = predict(case)
        pairs = pair(calls, events, recorded_transients(str(path), args.step))
    except LabkitError as exc:
        print(f"conv_stream_diff: {exc}", file=sys.stderr)
        return 2
    labelled = [p for p in pairs if p[0] is not None]
    print(f"# {args.case}: {len(pairs)} transients paired, {len(labelled)} of them convolution passes")
    for d, f, r in labelled:
        if abs(f - r) > 0.01 * MiB:
            print(f"{d[0]:15s} x{list(d[1])} w{list(d[2])} stride {list(d[3])} groups {d[4]}: rule "
                  f"{f / MiB:9.3f} MiB, H200 {r / MiB:9.3f} MiB ({(r - f) / MiB:+.3f})")
    if args.substitute:
        table: dict[tuple, set[int]] = {}
        for d, _, r in labelled:
            table.setdefault(d, set()).add(r)
        table_ = {d: v.pop() for d, v in table.items() if len(v) == 1}   # passes paired with one size only
        sub, _, _ = predict(case, table_)
        recs = {r.name: r for r in load_plain(process="fresh")}
        rec = recs.get(args.case)
        recorded = rec.peak_reserved if rec is not None else None
        for label, r in (("the rule's workspaces", rep), (f"the H200's for {len(table_)} passes", sub)):
            err = f" ({100 * (r.reserved_bytes / recorded - 1):+.2f}% of the recorded)" if recorded else ""
            print(f"reserved with {label}: {r.reserved_bytes / 1e9:.3f} GB{err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
