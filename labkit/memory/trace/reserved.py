"""Replay the tracker's allocation stream through the caching-allocator simulator.

The tracker counts each storage rounded to 512 bytes. The real allocator's ``allocated_bytes``
counts *blocks*: a request served from a cached free block keeps the whole block when the
remainder is too small to split (<= 1 MiB in the large pool), and ``reserved_bytes`` counts the
segments obtained with ``cudaMalloc``. Replaying the same requests, in the same order, through
``labkit.allocator.CachingAllocatorSim`` (the allocator chapter's replica of
``CUDACachingAllocator.cpp``) predicts both, per phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class AllocatorReplay:
    """Allocator view of a traced run: per tracker phase, the peak of ``allocated_bytes`` (blocks)."""

    phase_peak_allocated: list[int]   # indexed like tracker.phases
    reserved_end: int                 # reserved_bytes at the end (no empty_cache in a step: also its peak)
    reserved_peak: int
    segments: int


def replay_tracker(tracker: Any, config: Any = None) -> AllocatorReplay:
    """Run ``tracker.events`` (allocations and frees, in order) through the allocator simulator."""
    from labkit.allocator import CachingAllocatorSim

    sim = CachingAllocatorSim(config) if config is not None else CachingAllocatorSim()
    blocks: dict[int, Any] = {}
    peaks = [0] * len(tracker.phases)
    cur = 0
    malloc, free = sim.malloc, sim.free
    last = 0
    for sid, delta, ph in tracker.events:
        if ph != last:   # phases begin at the level they inherit
            for p in range(last + 1, ph + 1):
                peaks[p] = max(peaks[p], cur)
            last = ph
        if delta > 0 and sid not in blocks:
            b = malloc(delta)
            if b is None:  # the simulated device is full: count the request as is
                cur += delta
                continue
            blocks[sid] = b
            cur += b.size
        elif delta < 0:
            b = blocks.pop(sid, None)
            if b is None:
                cur += delta
                continue
            cur -= b.size
            free(b)
        if cur > peaks[ph]:
            peaks[ph] = cur
    for p in range(last + 1, len(peaks)):
        peaks[p] = max(peaks[p], cur)
    st = sim.memory_stats()
    return AllocatorReplay(phase_peak_allocated=peaks, reserved_end=st["reserved_bytes.all.current"],
                           reserved_peak=st["reserved_bytes.all.peak"], segments=st["segment.all.current"])
