"""The program's request stream, separated from the allocator's own behaviour.

A recorded trace mixes what the program asked for (``alloc``, ``free_requested`` /
``free_completed``, on a stream) with what the allocator did under the recording configuration
(``segment_alloc``/``segment_free``/``segment_map``/``segment_unmap``, the rounded sizes it chose).
Replaying under another configuration must keep only the former: ``alloc`` sizes are the
requested (unrounded) sizes in the trace, frees are matched to their alloc by address, and a run
of ``segment_free``/``segment_unmap`` that is not the retry before an ``oom`` entry is the program's
``empty_cache()`` (a retry that later succeeded looks the same in a trace; a trace recorded
without memory pressure has none). ``oom`` entries become requests that are tried again.

Completeness: a history that does not begin with the allocation of every segment it uses (the
ring buffer of ``max_entries`` overflowed, or recording started late) is marked incomplete with
the reason, and :func:`labkit.allocator.sim.replay.replay` refuses it.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass, field

from labkit.allocator.snapshot import Snapshot
from labkit.core.errors import LabkitError

# op codes
ALLOC, FREE, FREE_REQ, FREE_DONE, EMPTY_CACHE, OOM_RETRY = range(6)
OP_NAMES = ("alloc", "free", "free_requested", "free_completed", "empty_cache", "oom_request")


@dataclass
class Trace:
    """A compiled request stream: ``ops`` are ``(op, id, size, stream)`` tuples.

    ``id`` numbers the allocations (frees refer to it); ``stream`` is the rank of the CUDA stream
    in address order (the allocator orders blocks by stream first).
    """

    name: str
    ops: list[tuple[int, int, int, int]]
    n_ids: int
    events: int  # trace entries this stream came from (the replay rate counts these)
    complete: bool = True
    incomplete_reason: str = ""
    recorded_conf: str | None = None
    device: int = 0
    streams: list[int] = field(default_factory=lambda: [0])
    segment_oracle: list[tuple[int, int]] = field(default_factory=list)  # (size, address) of segment_alloc
    map_oracle: list[int] = field(default_factory=list)  # address of each segment_map (expandable segments)
    recorded_addresses: list[int] = field(default_factory=list)  # address each alloc id got when recorded
    empty_cache_runs: int = 0  # runs of segment_free/unmap replayed as the program's empty_cache()
    ambiguous_runs: int = 0  # of those, runs directly followed by a new segment (could be a retry that succeeded)

    @property
    def requests(self) -> int:
        return self.n_ids


class TraceBuilder:
    """Build a synthetic request stream: ``a = tb.alloc(size)``, ``tb.free(a)``, ``tb.empty_cache()``."""

    def __init__(self, name: str = "synthetic") -> None:
        self.name = name
        self.ops: list[tuple[int, int, int, int]] = []
        self.n = 0
        self._live: set[int] = set()

    def alloc(self, size: int, stream: int = 0) -> int:
        if size <= 0:
            raise LabkitError(f"{self.name}: allocation size must be positive, got {size}")
        i = self.n
        self.n += 1
        self.ops.append((ALLOC, i, int(size), stream))
        self._live.add(i)
        return i

    def free(self, ident: int) -> None:
        if ident not in self._live:
            raise LabkitError(f"{self.name}: free of allocation {ident}, which is not live")
        self._live.discard(ident)
        self.ops.append((FREE, ident, 0, 0))

    def empty_cache(self) -> None:
        self.ops.append((EMPTY_CACHE, -1, 0, 0))

    def build(self) -> Trace:
        return Trace(self.name, list(self.ops), self.n, len(self.ops))


def compile_trace(snap: Snapshot, device: int | None = None) -> Trace:
    """Turn a snapshot's trace for one device into the program's request stream."""
    devs = snap.devices_with_traces
    if not devs:
        raise LabkitError(f"{snap.source}: the snapshot has no trace history (record it with "
                          "torch.cuda.memory._record_memory_history() before the work, then _snapshot())")
    if device is None:
        device = devs[0]
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise LabkitError(f"{snap.source}: device index must be a non-negative integer, got {device!r}")
    if device >= len(snap.device_traces) or not snap.device_traces[device]:
        raise LabkitError(f"{snap.source}: no trace for device {device} (devices with traces: {devs})")
    tr = snap.device_traces[device]
    private = [s for s in snap.segments if s.get("device", device) == device
               and tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)]
    if private:
        raise LabkitError(f"{snap.source}: {len(private)} segment(s) belong to a private memory pool (CUDA graphs or "
                          f"torch.cuda.MemPool, pool {tuple(private[0]['segment_pool_id'])}); the trace does not say "
                          "which requests went there, and this lab simulates the default pools only")

    streams = sorted({e.get("stream", 0) for e in tr if e["action"] in ("alloc", "oom")} | {0})
    srank = {s: i for i, s in enumerate(streams)}
    ops: list[tuple[int, int, int, int]] = []
    live: dict[int, int] = {}
    pending: dict[int, int] = {}
    seg_starts: list[int] = []  # sorted starts of segments created inside the trace
    seg_size: dict[int, int] = {}
    oracle: list[tuple[int, int]] = []
    maps: list[int] = []
    rec_addr: list[int] = []
    problems: list[str] = []
    n_empty = n_ambiguous = 0
    n = 0
    i = 0
    N = len(tr)

    def in_segment(addr: int) -> bool:
        j = bisect_right(seg_starts, addr) - 1
        return j >= 0 and addr < seg_starts[j] + seg_size[seg_starts[j]]

    while i < N:
        e = tr[i]
        a = e["action"]
        if a == "alloc":
            addr = e["addr"]
            if not in_segment(addr) and not problems:
                problems.append(f"entry {i}: alloc at {addr:#x} inside memory whose segment was allocated before "
                                "the history starts")
            live[addr] = n
            rec_addr.append(addr)
            ops.append((ALLOC, n, e["size"], srank.get(e.get("stream", 0), 0)))
            n += 1
        elif a == "free_requested":
            addr = e["addr"]
            ident = live.pop(addr, None)
            if ident is None:
                if not problems:
                    problems.append(f"entry {i}: free of {addr:#x}, which was allocated before the history starts")
                i += 1
                continue
            nxt = tr[i + 1] if i + 1 < N else None
            if nxt is not None and nxt["action"] == "free_completed" and nxt.get("addr") == addr:
                ops.append((FREE, ident, 0, 0))
                i += 2
                continue
            pending[addr] = ident
            ops.append((FREE_REQ, ident, 0, 0))
        elif a == "free_completed":
            ident = pending.pop(e["addr"], None)
            if ident is None:
                if not problems:
                    problems.append(f"entry {i}: free_completed of {e['addr']:#x}, whose free_requested is before "
                                    "the history starts")
            else:
                ops.append((FREE_DONE, ident, 0, 0))
        elif a in ("segment_alloc", "segment_map"):
            addr, size = e["addr"], e["size"]
            if a == "segment_alloc":
                oracle.append((size, addr))
            else:
                maps.append(addr)
            j = bisect_right(seg_starts, addr) - 1
            if j >= 0 and seg_starts[j] + seg_size[seg_starts[j]] == addr and a == "segment_map":
                seg_size[seg_starts[j]] += size  # grows a mapped range
            else:
                insort(seg_starts, addr)
                seg_size[addr] = size
        elif a in ("segment_free", "segment_unmap"):
            j = i
            while j < N and tr[j]["action"] in ("segment_free", "segment_unmap"):
                _drop_range(seg_starts, seg_size, tr[j]["addr"], tr[j]["size"])
                j += 1
            # skip snapshot markers when looking at what follows the run
            k = j
            while k < N and tr[k]["action"] in ("snapshot", "user_defined"):
                k += 1
            followed_by_oom = k < N and tr[k]["action"] == "oom"
            if not followed_by_oom:
                ops.append((EMPTY_CACHE, -1, 0, 0))
                n_empty += 1
                if k < N and tr[k]["action"] in ("segment_alloc", "segment_map"):
                    n_ambiguous += 1
            i = j
            continue
        elif a == "oom":
            ops.append((OOM_RETRY, -1, e["size"], srank.get(e.get("stream", 0), 0)))
        i += 1

    # segments alive at the end must all have been created inside the history
    if not problems:
        for s in snap.segments:
            if s.get("device", device) != device:
                continue
            if not in_segment(s["address"]):
                problems.append(f"segment at {s['address']:#x} ({s['total_size']} B) is in the final state but its "
                                "allocation is not in the history")
                break
    t = Trace(name=snap.source, ops=ops, n_ids=n, events=N, complete=not problems,
              incomplete_reason=problems[0] if problems else "", recorded_conf=snap.alloc_conf(), device=device,
              streams=streams, segment_oracle=oracle, map_oracle=maps, recorded_addresses=rec_addr,
              empty_cache_runs=n_empty, ambiguous_runs=n_ambiguous)
    return t


def _drop_range(starts: list[int], sizes: dict[int, int], addr: int, size: int) -> None:
    """Remove [addr, addr+size) from the known segment ranges (unmaps can cut a range in pieces)."""
    j = bisect_right(starts, addr) - 1
    if j < 0:
        return
    s = starts[j]
    end = s + sizes[s]
    if addr >= end:
        return
    del starts[j]
    del sizes[s]
    if s < addr:
        insort(starts, s)
        sizes[s] = addr - s
    if addr + size < end:
        insort(starts, addr + size)
        sizes[addr + size] = end - (addr + size)
