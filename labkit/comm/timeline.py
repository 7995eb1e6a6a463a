"""A torch.profiler trace of one DDP step, reduced to backward compute and all-reduce intervals.

The step is profiled with its phases wrapped in ``record_function("labkit::forward")``,
``("labkit::backward")`` and ``("labkit::optimizer")`` (see :func:`labkit.comm.ddp.profile_ddp_step`)
and exported as a Chrome trace. From it:

* **GPU traces** (NCCL): communication is every kernel whose name contains ``nccl``; backward compute
  is every other kernel whose launch (the CUDA runtime call with the same ``correlation`` id) lies
  inside the CPU-side ``labkit::backward`` range, whichever thread launched it.
* **CPU traces** (gloo): communication is the ``gloo:*`` ranges on gloo's worker threads; backward
  compute is the autograd engine's ``evaluate_function`` ranges inside ``labkit::backward``.

Exposed communication is the part of the communication union not covered by the compute union,
between the start of backward compute and the end of the last all-reduce; the exposed fraction
divides it by that span (the backward-plus-communication critical path).
"""

from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from labkit.core.errors import LabkitError
from labkit.core.serialize import parse_json, read_bytes

#: The largest Chrome trace read (unpacked): a profiled step of a large model is tens of MB.
MAX_TRACE_BYTES = 256 << 20

Interval = tuple[float, float]


@dataclass
class Timeline:
    source: str  # "cuda" or "cpu"
    span_us: float  # from the first backward compute to the last end (compute or communication)
    backward_compute_us: float  # union of compute intervals
    comm_us: float  # union of communication intervals
    overlapped_us: float
    exposed_comm_us: float
    exposed_fraction: float  # exposed_comm_us / span_us
    hidden_fraction: float  # overlapped_us / comm_us
    n_comm_ops: int
    compute: list[Interval] = field(default_factory=list)  # merged, relative to the span start, microseconds
    comm: list[Interval] = field(default_factory=list)  # one per communication op (not merged)
    comm_names: list[str] = field(default_factory=list)


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint ones."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in merge(intervals))


def intersect(a: list[Interval], b: list[Interval]) -> float:
    """Total length of the intersection of two interval unions."""
    a, b = merge(a), merge(b)
    i = j = 0
    acc = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            acc += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return acc


def overlap_summary(compute: list[Interval], comm: list[Interval], comm_names: list[str] | None = None,
                    source: str = "model") -> Timeline:
    """Exposed communication of given compute and communication intervals (any time unit, called us)."""
    if not compute and not comm:
        raise LabkitError("timeline has neither compute nor communication intervals")
    start = min([s for s, _ in compute] + [s for s, _ in comm])
    end = max([e for _, e in compute] + [e for _, e in comm])
    span = end - start
    cu, co = total(compute), total(comm)
    ov = intersect(compute, comm)
    exposed = co - ov
    mc = merge(compute)
    # Keep the plot's payload small: at most 2000 merged compute intervals.
    if len(mc) > 2000:
        mc = _coarsen(mc, 2000)
    order = sorted(range(len(comm)), key=lambda i: comm[i][0])
    return Timeline(source=source, span_us=span, backward_compute_us=cu, comm_us=co, overlapped_us=ov,
                    exposed_comm_us=exposed, exposed_fraction=exposed / span if span > 0 else 0.0,
                    hidden_fraction=ov / co if co > 0 else 1.0, n_comm_ops=len(comm),
                    compute=[(s - start, e - start) for s, e in mc],
                    comm=[(comm[i][0] - start, comm[i][1] - start) for i in order],
                    comm_names=[(comm_names or [""] * len(comm))[i] for i in order])


def _coarsen(iv: list[Interval], n: int) -> list[Interval]:
    """Merge the smallest gaps until ``n`` intervals remain (for plotting only)."""
    gaps = sorted(range(len(iv) - 1), key=lambda i: iv[i + 1][0] - iv[i][1])
    drop = set(gaps[: len(iv) - n])
    out: list[Interval] = []
    cur = list(iv[0])
    for i in range(len(iv) - 1):
        if i in drop:
            cur[1] = iv[i + 1][1]
        else:
            out.append((cur[0], cur[1]))
            cur = list(iv[i + 1])
    out.append((cur[0], cur[1]))
    return out


def load_trace(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    raw = read_bytes(path, "trace file", limit=MAX_TRACE_BYTES)
    if path.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                raw = f.read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise LabkitError(f"{path}: not a readable gzip'd Chrome trace ({exc})") from None
        if len(raw) > MAX_TRACE_BYTES:
            raise LabkitError(f"{path}: unpacks to more than {MAX_TRACE_BYTES} bytes, more than a trace file can be")
    try:
        doc = parse_json(raw.decode("utf-8", errors="replace"), str(path), "Chrome trace")
    except LabkitError as exc:
        raise LabkitError(f"{path}: not a readable Chrome trace ({str(exc).removeprefix(f'{path}: ')})") from None
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise LabkitError(f"{path}: not a Chrome trace (no 'traceEvents')")
    return doc


def reduce_trace(trace: dict[str, Any] | str | Path, *, phase: str = "labkit::backward") -> Timeline:
    """Reduce a profiler Chrome trace (dict or path) to a :class:`Timeline` of the ``phase`` range."""
    doc = trace if isinstance(trace, dict) else load_trace(trace)
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    ranges = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events if e.get("name") == phase
              and e.get("cat") in ("user_annotation", "cpu_op")]
    if not ranges:
        raise LabkitError(f"trace has no {phase!r} range: profile the step with record_function({phase!r})")
    lo, hi = ranges[-1]  # the last profiled step
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        launch_ts = {e.get("args", {}).get("correlation"): float(e["ts"]) for e in events
                     if e.get("cat") in ("cuda_runtime", "cuda_driver")}
        compute, comm, names = [], [], []
        for k in kernels:
            s, e_ = float(k["ts"]), float(k["ts"]) + float(k.get("dur", 0))
            name = str(k.get("name", ""))
            t_launch = launch_ts.get(k.get("args", {}).get("correlation"))
            if "nccl" in name.lower():
                # the last buckets' all-reduces may be launched after the range ends: keep every
                # all-reduce launched (or, launch unknown, running) after backward began
                if (t_launch if t_launch is not None else s) >= lo:
                    comm.append((s, e_))
                    names.append(name)
            elif t_launch is not None and lo <= t_launch <= hi:
                compute.append((s, e_))
        return overlap_summary(compute, comm, names, source="cuda")
    compute = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
               if str(e.get("name", "")).startswith("autograd::engine::evaluate_function") and lo <= float(e["ts"]) <= hi]
    comm_ev = [e for e in events if str(e.get("name", "")).startswith(("gloo:", "nccl:")) and float(e["ts"]) >= lo]
    comm = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in comm_ev]
    return overlap_summary(compute, comm, [str(e["name"]) for e in comm_ev], source="cpu")
