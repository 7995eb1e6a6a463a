"""The caching allocator of a faked program, fed in step with its tracker.

``measure_step`` replays a finished trace; a user's program asks ``torch.cuda.memory_allocated()`` in the
middle of its run, may call ``empty_cache()`` or ``reset_peak_memory_stats()``, and may run out of memory.
:class:`LiveAllocator` feeds the tracker's events (allocations and frees, rounded as the target rounds
them) through :class:`labkit.allocator.CachingAllocatorSim` as they happen, so that every answer is the
simulator's at that moment and the whole run's figures are its final statistics. A request the simulated
device cannot serve raises ``torch.OutOfMemoryError`` inside the program, as the GPU would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.allocator import CachingAllocatorSim


@dataclass
class StepMark:
    """One optimizer step: the peak of allocated bytes since the previous step ended (or the run began)."""

    step: int
    peak_bytes: int
    peak_event: int                 # index into the tracker's events where that peak was reached
    reserved_bytes: int             # reserved at the end of the step
    end_bytes: int                  # allocated at the end of the step


@dataclass
class OomEvent:
    """A request the simulated device could not serve."""

    requested: int
    allocated: int
    reserved: int
    event: int
    limit: int


@dataclass
class LiveAllocator:
    """See the module docstring. ``device_bytes``: what the program can obtain from the device."""

    tracker: Any
    device_bytes: int
    config: Any = None
    cursor: int = 0
    allocated: int = 0
    peak: int = 0
    peak_event: int = 0
    reserved_peak: int = 0
    window_peak: int = 0              # since the last step mark
    window_event: int = 0
    steps: list[StepMark] = field(default_factory=list)
    oom: OomEvent | None = None
    _blocks: dict[int, Any] = field(default_factory=dict)
    _sim: Any = None

    def __post_init__(self) -> None:
        kw = {} if self.config is None else {"config": self.config}
        self._sim = CachingAllocatorSim(**kw, device_bytes=self.device_bytes, device_total_bytes=self.device_bytes)

    @property
    def sim(self) -> Any:
        return self._sim

    @property
    def reserved(self) -> int:
        return self._sim.reserved_bytes[0]

    def sync(self) -> None:
        """Feed the events the tracker logged since the last call; raise ``torch.OutOfMemoryError`` where
        the device is full."""
        events = self.tracker.events
        n = len(events)
        i = self.cursor
        sim, blocks = self._sim, self._blocks
        while i < n:
            sid, delta, _ = events[i]
            if delta > 0:
                b = sim.malloc(delta)
                if b is None:
                    self.cursor = i + 1
                    self._out_of_memory(delta, i)
                blocks[sid] = b
                self.allocated += b.size
                if self.allocated > self.window_peak:
                    self.window_peak, self.window_event = self.allocated, i
                if self.allocated > self.peak:
                    self.peak, self.peak_event = self.allocated, i
                r = sim.reserved_bytes[0]
                if r > self.reserved_peak:
                    self.reserved_peak = r
            elif delta < 0:
                b = blocks.pop(sid, None)
                if b is not None:
                    self.allocated -= b.size
                    sim.free(b)
            i += 1
        self.cursor = n

    def address(self, sid: int | None) -> int | None:
        """The simulated block address of tracker storage ``sid`` while it is allocated, else None."""
        if sid is None:
            return None
        self.sync()
        b = self._blocks.get(sid)
        return None if b is None else b.addr

    def _out_of_memory(self, nbytes: int, event: int) -> None:
        self.oom = OomEvent(requested=nbytes, allocated=self.allocated, reserved=self.reserved, event=event,
                            limit=self.device_bytes)
        gib = 1 << 30
        raise torch.OutOfMemoryError(
            f"CUDA out of memory (predicted by labkit's fake GPU). Tried to allocate {nbytes / gib:.2f} GiB. "
            f"GPU 0 has a total capacity of {self.device_bytes / gib:.2f} GiB; {self.allocated / gib:.2f} GiB is "
            f"allocated by PyTorch and {self.reserved / gib:.2f} GiB reserved")

    def mark_step(self) -> StepMark:
        self.sync()
        m = StepMark(step=len(self.steps) + 1, peak_bytes=self.window_peak, peak_event=self.window_event,
                     reserved_bytes=self.reserved, end_bytes=self.allocated)
        self.steps.append(m)
        self.window_peak, self.window_event = self.allocated, max(len(self.tracker.events) - 1, 0)
        return m

    def empty_cache(self) -> None:
        self.sync()
        self._sim.empty_cache()

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: every peak becomes the current value."""
        self.sync()
        self._sim.reset_peak_stats()
        self.peak, self.peak_event = self.allocated, max(len(self.tracker.events) - 1, 0)
        self.reserved_peak = self.reserved

    def stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()``: the simulator's statistics, with this run's peaks."""
        self.sync()
        st = self._sim.memory_stats()
        st["allocated_bytes.all.peak"] = self.peak
        st["reserved_bytes.all.peak"] = self.reserved_peak
        return st
