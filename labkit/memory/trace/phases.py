"""The measurement practice for your own training loop: per-phase peak statistics.

    snaps = phase_snapshots()              # CUDA allocator stats on a GPU; a storage tracker elsewhere
    with snaps.phase("forward"):
        loss = model(x).loss
    with snaps.phase("backward"):
        loss.backward()
    print(snaps.table())

On a CUDA device each phase resets the allocator's peak statistics, then reads
``max_memory_allocated``/``max_memory_reserved`` and keeps an excerpt of ``memory_summary``. On other
devices (or with ``tracker=True``) a :class:`~labkit.memory.trace.storage.StorageTracker` counts the
storages the phase's ops create (what a CUDA allocator would hand out, rounded to 512 bytes).

:func:`profiler_memory_timeline` runs a function under ``torch.profiler`` with memory profiling and
exports its memory timeline (categories parameter, optimizer state, activation, gradient, ...).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from labkit.core.errors import LabkitError
from labkit.core.units import fmt_bytes as format_bytes
from labkit.core.vocab import CategoryBytes
from labkit.memory.trace.storage import StorageTracker


@dataclass
class PhaseSnapshot:
    """One phase: bytes allocated at its start and end, the peak inside it, and where that came from."""

    name: str
    start_allocated: int
    end_allocated: int
    peak_allocated: int
    peak_reserved: int | None
    source: str                    # "torch.cuda allocator stats" or "storage tracker"
    summary_excerpt: str = ""


SUMMARY_ROWS = ("CUDA OOMs", "Metric", "Allocated memory", "Requested memory", "GPU reserved memory",
                "Non-releasable memory", "Allocations", "GPU reserved segments")


def summary_excerpt(text: str, max_lines: int = 12) -> str:
    """The rows of ``torch.cuda.memory_summary()`` that matter per phase: OOMs and retries, the column
    header, allocated / requested / reserved / non-releasable memory, allocation and segment counts."""
    keep = [ln for ln in text.splitlines() if any(ln.lstrip("| ").startswith(r) for r in SUMMARY_ROWS)]
    return "\n".join(keep[:max_lines])


@dataclass
class PhaseSnapshots:
    """Per-phase memory statistics of a user's loop; create it with :func:`phase_snapshots`."""

    device: str
    use_tracker: bool
    summary_lines: int = 12
    snapshots: list[PhaseSnapshot] = field(default_factory=list)
    _tracker: Any = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.use_tracker:
            if self._tracker is None:
                self._tracker = StorageTracker(device_type=torch.device(self.device).type,
                                               rounding=512 if self.device.startswith("cuda") else 1)
            tr = self._tracker
            idx = tr.begin_phase(name)
            start = tr.current
            with tr:
                yield
            self.snapshots.append(PhaseSnapshot(name, start, tr.current, tr.phase_peaks[idx], None, "storage tracker"))
            return
        dev = torch.device(self.device)
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        yield
        torch.cuda.synchronize(dev)
        excerpt = summary_excerpt(torch.cuda.memory_summary(dev, abbreviated=True), self.summary_lines)
        self.snapshots.append(PhaseSnapshot(
            name, start, torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev),
            torch.cuda.max_memory_reserved(dev), "torch.cuda allocator stats", excerpt))

    def track_existing(self, tensors: Any) -> None:
        """Count tensors that existed before the first phase (parameters, a batch); tracker mode only."""
        if not self.use_tracker:
            return
        if self._tracker is None:
            self._tracker = StorageTracker(device_type=torch.device(self.device).type,
                                           rounding=512 if self.device.startswith("cuda") else 1)
        self._tracker.track(list(tensors))

    @property
    def peaks(self) -> dict[str, int]:
        """The highest peak seen per phase name (over repeated phases)."""
        out: dict[str, int] = {}
        for s in self.snapshots:
            out[s.name] = max(out.get(s.name, 0), s.peak_allocated)
        return out

    def table(self) -> str:
        rows = [f"{'phase':<12} {'start':>12} {'peak':>12} {'end':>12}  source"]
        for s in self.snapshots:
            rows.append(f"{s.name:<12} {format_bytes(s.start_allocated):>12} {format_bytes(s.peak_allocated):>12} "
                        f"{format_bytes(s.end_allocated):>12}  {s.source}")
        return "\n".join(rows)


def phase_snapshots(device: str | None = None, *, tracker: bool | None = None) -> PhaseSnapshots:
    """A per-phase recorder for your own loop (see the module docstring).

    ``device`` defaults to ``cuda`` when a GPU is visible, else ``cpu``. ``tracker`` defaults to
    False on CUDA (allocator statistics) and True elsewhere (there are no allocator statistics).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    is_cuda = torch.device(device).type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise LabkitError(f"device {device!r}: torch sees no CUDA GPU here")
    use_tracker = (not is_cuda) if tracker is None else bool(tracker)
    return PhaseSnapshots(device=device, use_tracker=use_tracker)


def profiler_memory_timeline(fn: Callable[[], Any], path: str | Path, *, device: str | None = None,
                             steps: int = 1) -> Path:
    """Run ``fn`` ``steps`` times under ``torch.profiler`` (memory, shapes, stacks) and export its
    memory timeline to ``path`` (``.json``: [timestamps, per-category bytes]; ``.html``: a plot)."""
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=acts, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(steps):
            fn()

    with warnings.catch_warnings():
        # deprecated in favour of the allocator's memory history (labkit's allocator chapter reads those)
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(path), device=device)
    return path


# torch.profiler's memory timeline columns (torch/profiler/_memory_profiler.py, _CATEGORY_TO_INDEX + 1),
# in the lab's vocabulary (labkit.core.vocab). The profiler's last two classes have no counterpart
# in the lab and keep torch's names: autograd bookkeeping, and storages it could not classify.
PROFILER_CATEGORIES = ("parameters", "optimizer_state", "inputs", "temporaries", "activations", "gradients",
                       "autograd_detail", "unknown")


@dataclass
class ProfilerTimeline:
    """A memory timeline exported by ``torch.profiler``: bytes per category over time (microseconds)."""

    times_us: list[float]
    by_category: dict[str, list[int]]     # PROFILER_CATEGORIES; torch's singular names still read (deprecated)

    @property
    def peak_bytes(self) -> int:
        n = len(self.times_us)
        return max((sum(v[i] for v in self.by_category.values()) for i in range(n)), default=0)


def read_profiler_timeline(path: str | Path) -> ProfilerTimeline:
    """Read the JSON written by :func:`profiler_memory_timeline` (``[times, sizes]``)."""
    try:
        times, sizes = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LabkitError(f"{path}: not a torch.profiler memory timeline ({exc})") from None
    t0 = times[0] if times else 0
    cols = CategoryBytes({c: [int(row[i + 1]) for row in sizes] for i, c in enumerate(PROFILER_CATEGORIES)})
    # torch writes microseconds (_memory_profiler.py, _coalesce_timeline: "Convert timestamps from ns to us")
    return ProfilerTimeline([float(t - t0) for t in times], cols)
