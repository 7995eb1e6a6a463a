"""Timing on the GPU: CUDA events around a copy on the stream that runs it, warm-up runs first.

torch is imported only inside the functions.
"""

from __future__ import annotations

import statistics
from typing import Callable

from labkit.topology.measure.results import Point

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


def cuda_unavailable_reason() -> str | None:
    """Why nothing can be measured here (no torch, no CUDA GPU), or None when a GPU is visible."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        return f"no CUDA GPU visible to torch {torch.__version__} ({build})"
    return None


def time_events(fn: Callable[[], object], warmup: int, repeats: int, stream) -> list[float]:
    """Seconds of each of ``repeats`` runs of ``fn`` between two events recorded on ``stream``."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(stream.device)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def point(size: int, times: list[float], traffic: int | None = None) -> Point:
    """The median of ``times`` as a :class:`Point`; bandwidth counts ``traffic`` bytes (default ``size``)."""
    med = statistics.median(times)
    return Point(size_bytes=size, median_s=med, bytes_per_s=(traffic or size) / med, times_s=times)
