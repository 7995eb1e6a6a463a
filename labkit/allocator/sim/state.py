"""A process's allocator state rebuilt in the simulator: the segments it holds before a replay starts.

Reserved memory is path-dependent. A process that ran something earlier and called ``empty_cache`` keeps
every segment that still holds a live block (the cuBLAS workspaces, a model kept around) together with the
free space inside it, and the next job's requests are served from those free blocks first. On the H200
corpus recording (``benchmarks/gpu/record_plain.py``) the cases started from 330 MiB of such segments
(80 + 246 + 2 (+ 2) MiB holding 66 MiB of blocks), and OPT bf16's reserved peak came out 0.8 GB higher
than a replay from two bare 32 MiB workspaces, within 0.1% of the GPU's once the replay starts from the
recorded segments.

:func:`seed_segments` rebuilds such a state through the simulator's own ``malloc`` and ``free``: each
segment is obtained whole (``cudaMalloc`` of its size), carved into its blocks in address order while the
segments before it are full, and at the end the blocks that were free in the state are freed again. A
large-pool block of 1 MiB or less cannot be carved on its own (the allocator would not have split it off):
it is folded into the block before it; free space in a small (2 MiB) segment is carved in requests of at
most 1 MiB, or left as the segment's remainder at its end.

The segments are rebuilt from the highest recorded address down, so that the simulator's own addresses
(handed out top-down, :mod:`labkit.allocator.sim.driver_va`) keep the recorded order: best fit breaks ties
between equal-size free blocks by address. In the recorded order GPT-2 medium bf16's predicted reserved
peak is within 0.1% of the H200's; rebuilt in the opposite order it came out 7.5% high.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.allocator.sim.simulator import CachingAllocatorSim, kSmallSize
from labkit.core.errors import LabkitError


@dataclass(frozen=True)
class SeededState:
    allocated_bytes: int     # bytes of the blocks live in the state (they stay allocated)
    reserved_bytes: int      # the segments' total
    segments: int


def _segments(state: Any) -> list[dict]:
    segs = state.get("segments") if isinstance(state, dict) else state
    if not isinstance(segs, (list, tuple)):
        raise LabkitError("allocator state: expected a list of segments (torch.cuda.memory_snapshot() or "
                          "record_plain.py's base_segments)")
    out = []
    for i, s in enumerate(segs):
        try:
            total = int(s["total_size"])
            blocks = [(int(b["size"]), str(b["state"])) if isinstance(b, dict) else (int(b[0]), str(b[1]))
                      for b in s["blocks"]]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise LabkitError(f"allocator state: segment {i} has no total_size/blocks ({exc})") from None
        if total <= 0 or sum(b for b, _ in blocks) != total:
            raise LabkitError(f"allocator state: segment {i}: its blocks do not add up to its total_size {total}")
        out.append({"total": total, "small": s.get("segment_type") == "small", "stream": int(s.get("stream", 0)),
                    "address": int(s.get("address", i)), "blocks": blocks})
    return sorted(out, key=lambda s: (s["small"], -s["address"]))


def seed_segments(sim: CachingAllocatorSim, state: Any) -> SeededState:
    """Give ``sim`` the segments of ``state`` (a list of segments as ``torch.cuda.memory_snapshot()`` lists
    them, blocks as dicts or ``[size, state]``); blocks in state ``active_allocated`` stay allocated."""
    temps, kept = [], 0
    n = 0
    for seg in _segments(state):
        blocks: list[list] = []
        for size, st in seg["blocks"]:
            if not seg["small"] and size <= kSmallSize and blocks:
                blocks[-1][0] += size            # an unsplittable remainder: part of the block before it
            elif seg["small"] and size > kSmallSize:  # free space in a small segment: requests of <= 1 MiB
                blocks += [[min(kSmallSize, size - o), st] for o in range(0, size, kSmallSize)]
            else:
                blocks.append([size, st])
        if seg["small"]:
            while blocks and blocks[-1][1] != "active_allocated":
                blocks.pop()                     # the free end of a small segment stays its remainder
        if not seg["small"]:
            whole = sim.malloc(seg["total"], seg["stream"])
            if whole is None or whole.size != seg["total"]:
                raise LabkitError(f"allocator state: could not rebuild a segment of {seg['total']} bytes")
            sim.free(whole)
        for size, st in blocks:
            b = sim.malloc(size, seg["stream"])
            if b is None:
                raise LabkitError(f"allocator state: could not rebuild a block of {size} bytes")
            if st == "active_allocated":
                kept += b.size
            else:
                temps.append(b)
        n += 1
    for b in temps:
        sim.free(b)
    st = sim.memory_stats()
    return SeededState(allocated_bytes=kept, reserved_bytes=st["reserved_bytes.all.current"], segments=n)


def live_bytes(state: Any) -> int:
    """Bytes of the blocks live (``active_allocated``) in ``state``."""
    return sum(b for s in _segments(state) for b, st in s["blocks"] if st == "active_allocated")


__all__ = ["SeededState", "live_bytes", "seed_segments"]
