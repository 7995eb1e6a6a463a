"""Replay the tracker's allocation stream through the caching-allocator simulator.

The tracker counts each storage rounded to 512 bytes. The real allocator's ``allocated_bytes``
counts *blocks*: a request served from a cached free block keeps the whole block when the
remainder is too small to split (<= 1 MiB in the large pool), and ``reserved_bytes`` counts the
segments obtained with ``cudaMalloc``. Replaying the same requests, in the same order, through
``labkit.allocator.CachingAllocatorSim`` (the allocator chapter's replica of
``CUDACachingAllocator.cpp``) predicts both, per phase.

Reserved memory is path-dependent: the same step, run again, can find the cache laid out differently
and take one more segment (on the H200, Llama fp32 b4 reserves 22.36 GB in step 2 and 23.41 GB from
step 3 on). The recorded plain loops read ``max_memory_reserved`` over steps 2-4
(``benchmarks/gpu/record_plain.py``); with no ``empty_cache`` and no out-of-memory retry in a step,
reserved only grows, so that maximum is reserved after step 4. A traced steady step (every storage it
allocates it frees, and it frees nothing older: true from step 2 on, once the optimizer state exists)
makes the same requests each time, so :func:`replay_tracker` replays the last traced step again until
step :data:`MEASURED_THROUGH_STEP` instead of tracing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.allocator import CachingAllocatorSim, seed_segments

#: The last step whose reserved peak a recorded plain loop reads (steps 2-4, ``record_plain.py``).
MEASURED_THROUGH_STEP = 4


@dataclass
class AllocatorReplay:
    """Allocator view of a traced run: per tracker phase, the peak of ``allocated_bytes`` (blocks)."""

    phase_peak_allocated: list[int]   # indexed like tracker.phases
    reserved_end: int                 # reserved_bytes at the end (no empty_cache in a step: also its peak)
    reserved_peak: int
    segments: int
    reserved_by_step: list[int]       # reserved at the end of the traced steps, then of each replayed one
    replayed_steps: int = 0           # steady steps replayed after the traced ones


def steady_window(events: list[tuple[int, int, int]], start: int) -> bool:
    """Whether ``events[start:]`` is closed: every storage it allocates it frees, and it frees none older."""
    alloc, freed = set(), set()
    for sid, delta, _ in events[start:]:
        if delta > 0:
            alloc.add(sid)
        elif delta < 0:
            freed.add(sid)
    return alloc == freed


def replay_tracker(tracker: Any, config: Any = None, *, step_starts: list[int] | None = None,
                   through_step: int = 0, state: Any = None, in_state: frozenset[int] = frozenset(),
                   address_space: Any = None) -> AllocatorReplay:
    """Run ``tracker.events`` (allocations and frees, in order) through the allocator simulator.

    ``step_starts``: the index of each traced step's first event. With ``through_step`` greater than
    the number of traced steps (at least two) and a steady last step (:func:`steady_window`), that
    step's events are replayed again, with fresh storage ids, until step ``through_step``.
    ``state``: the segments the process holds before the step (:func:`labkit.allocator.sim.state.seed_segments`);
    their live blocks count in the allocated peaks, and the events of ``in_state`` storages (ones the
    state already holds, e.g. the cuBLAS workspaces of a warm process) are not replayed again.
    ``address_space``: where new segments are placed (:mod:`labkit.allocator.sim.driver_va`; default the
    driver's placement in a fresh process).
    """
    sim = CachingAllocatorSim(*(() if config is None else (config,)), address_space=address_space)
    cur = 0
    if state is not None:
        cur = seed_segments(sim, state).allocated_bytes
    blocks: dict[Any, Any] = {}
    peaks = [0] * len(tracker.phases)
    malloc, free = sim.malloc, sim.free
    last = 0
    events = tracker.events
    bounds = set(step_starts[1:]) if step_starts else set()
    by_step: list[int] = []
    for i, (sid, delta, ph) in enumerate(events):
        if i in bounds:
            by_step.append(sim.reserved_bytes[0])
        if ph != last:   # phases begin at the level they inherit
            for p in range(last + 1, ph + 1):
                peaks[p] = max(peaks[p], cur)
            last = ph
        if sid in in_state:
            continue
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
    if step_starts:
        by_step.append(sim.reserved_bytes[0])
    replayed = 0
    if step_starts and len(step_starts) >= 2 and through_step > len(step_starts) \
            and steady_window(events, step_starts[-1]):
        window = events[step_starts[-1]:]
        for r in range(through_step - len(step_starts)):
            live: dict[int, Any] = {}
            for sid, delta, _ in window:
                if delta > 0:
                    b = malloc(delta)
                    if b is not None:
                        live[sid] = b
                elif delta < 0:
                    b = live.pop(sid, None)
                    if b is not None:
                        free(b)
            replayed += 1
            by_step.append(sim.reserved_bytes[0])
    st = sim.memory_stats()
    return AllocatorReplay(phase_peak_allocated=peaks, reserved_end=st["reserved_bytes.all.current"],
                           reserved_peak=st["reserved_bytes.all.peak"], segments=st["segment.all.current"],
                           reserved_by_step=by_step, replayed_steps=replayed)
