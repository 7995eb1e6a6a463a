"""A replica of PyTorch's CUDA caching allocator (``DeviceCachingAllocator``) in plain Python.

Every rule is written once, as a small method named after the function of
``c10/cuda/CUDACachingAllocator.cpp`` it mirrors, in the order ``malloc`` applies them:

1. ``round_size``: 512 B, or ``roundup_power2_divisions`` (:func:`labkit.allocator.sim.config.round_size`).
2. ``get_pool``: requests <= 1 MiB use the small pool, larger ones the large pool (blocks are per stream).
3. ``get_free_block``: best fit in (stream, size, address) order, honouring ``max_split_size`` and
   ``max_non_split_rounding_size``; expandable blocks compare by the size they can grow to.
4. ``trigger_free_memory_callbacks``: none are simulated (nothing to free outside the allocator).
5. ``garbage_collect_cached_blocks``: only with a memory fraction and ``garbage_collection_threshold``.
6. ``alloc_block``: ``cudaMalloc`` of ``get_allocation_size`` (2 MiB / 20 MiB / rounded to 2 MiB), or
   pages mapped into an expandable segment; the fraction caps ``total_allocated_memory + alloc_size``.
7. ``release_available_cached_blocks`` (free oversize blocks) and retry.
8. ``release_cached_blocks`` (free every unsplit cached segment) and retry: ``num_alloc_retries``.
9. Out of memory: ``num_ooms`` and the message's numbers.
10. ``should_split`` / ``alloc_found_block``: small pool or expandable: remainder >= 512 B; large
    pool: request < max_split_size and remainder > 1 MiB.
11. ``free`` / ``free_block`` / ``try_merge_blocks``: free neighbours merge.
12. Expandable segments: ``find_expandable_block``, ``map_block``, ``unmap_block``,
    ``release_expandable_segment`` (one virtual range per stream and pool, 1 1/8 of the device's memory,
    pages of 2 MiB small / 20 MiB large; mapping counts in ``num_device_alloc`` but not in ``segment.*``,
    and ``inactive_split*`` leaves expandable blocks out, as in the source).
13. ``emptyCache`` = ``release_cached_blocks``: whole unsplit segments and whole free pages only.

The methods below are the only place a rule is written. :func:`run_ops` replays a compiled request
stream through them. For speed, the methods on the hot path run as copies *generated* from these
sources at import, with the small methods and helpers they call inlined (:mod:`labkit.allocator.sim.inline`,
see the end of this module); :class:`ReferenceAllocatorSim` runs the methods as written, and
``tests/allocator/test_simulator_generated.py`` requires both to reach identical states on every
recorded trace and on random ones. Free blocks of a pool are one sorted list of integer keys
(stream, size, address packed into one int) searched with ``bisect``: the ``std::set`` of the source.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from labkit.allocator.sim.config import DEFAULT, NO_LIMIT, AllocatorConfig, allocation_size, round_size
from labkit.allocator.sim.driver_va import DriverVA
from labkit.allocator.sim.inline import inline
from labkit.allocator.sim.stream import ALLOC, EMPTY_CACHE, FREE, FREE_DONE, FREE_REQ, OOM_RETRY
from labkit.core.units import fmt_bytes

kMinBlockSize = 512
kSmallSize = 1048576
kSmallBuffer = 2097152
kLargeBuffer = 20971520

# A free block's key in its pool: stream << 96 | size << 48 | address (addresses < 2**48, sizes < 2**48).
_SIZE_SHIFT = 48
_STREAM_SHIFT = 96
_ADDR_MASK = (1 << 48) - 1

# memory_stats() counters: each stat is a list [all.current, all.peak, small.current, small.peak,
# large.current, large.peak]; a pool's ``stat`` (2 or 4) is where its own pair starts (StatType).
STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
_SMALL, _LARGE = 2, 4


def increase_stat(stat: list[int], pool: int, amount: int) -> None:
    """``increase_stat`` for the AGGREGATE entry and the pool's own entry: current up, peak follows."""
    c = stat[0] + amount
    stat[0] = c
    if c > stat[1]:
        stat[1] = c
    c = stat[pool] + amount
    stat[pool] = c
    if c > stat[pool + 1]:
        stat[pool + 1] = c


def decrease_stat(stat: list[int], pool: int, amount: int) -> None:
    """``decrease_stat`` for the AGGREGATE entry and the pool's own entry (peaks stay)."""
    stat[0] -= amount
    stat[pool] -= amount


class Block:
    """``struct Block``: a piece of a segment, free, allocated or (expandable segments) unmapped."""

    __slots__ = ("addr", "size", "stream", "pool", "prev", "next", "allocated", "mapped", "es",
                 "requested", "pending", "gc_base")

    def __init__(self, addr: int, size: int, stream: int, pool: Pool, es: ExpandableSegment | None = None) -> None:
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.mapped = True
        self.es = es  # expandable_segment_
        self.requested = 0  # requested_size
        self.pending = False  # freed by the program, awaiting stream events (event_count > 0)
        self.gc_base = 0  # gc_count_base

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        st = "alloc" if self.allocated else ("unmapped" if not self.mapped else "free")
        return f"Block({self.addr:#x}, {self.size}, {st})"


class Pool:
    """``struct BlockPool``: the free mapped blocks (``blocks``) and unmapped expandable ranges (``unmapped``)."""

    __slots__ = ("small", "stat", "blocks", "unmapped", "gc_calls")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.stat = _SMALL if small else _LARGE
        self.blocks: list[int] = []  # sorted keys: stream << 96 | size << 48 | addr
        self.unmapped: list[int] = []  # sorted keys: stream << 48 | addr
        self.gc_calls = 0  # get_free_blocks_call_count

    def insert_into_blocks(self, b: Block) -> None:
        """``BlockPool::insert_into_blocks``: the block becomes findable; its age restarts."""
        b.gc_base = self.gc_calls
        insort(self.blocks, (b.stream << _STREAM_SHIFT) | (b.size << _SIZE_SHIFT) | b.addr)

    def erase(self, b: Block) -> None:
        """``blocks.erase(block)`` (a no-op for a block that is not there)."""
        keys = self.blocks
        k = (b.stream << _STREAM_SHIFT) | (b.size << _SIZE_SHIFT) | b.addr
        i = bisect_left(keys, k)
        if i < len(keys) and keys[i] == k:
            del keys[i]

    def insert_unmapped(self, b: Block) -> None:
        insort(self.unmapped, (b.stream << _SIZE_SHIFT) | b.addr)

    def erase_unmapped(self, b: Block) -> None:
        keys = self.unmapped
        k = (b.stream << _SIZE_SHIFT) | b.addr
        i = bisect_left(keys, k)
        if i < len(keys) and keys[i] == k:
            del keys[i]


class ExpandableSegment:
    """``struct ExpandableSegment``: a reserved virtual range whose pages are mapped on demand."""

    __slots__ = ("base", "size", "page", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int) -> None:
        self.base, self.size, self.page, self.stream = base, size, page, stream


class _RoundedSizes(dict):
    """``round_size`` memoised: ``sizes[n]`` is the rounded size of a request of n bytes."""

    def __init__(self, config: AllocatorConfig) -> None:
        super().__init__()
        self.config = config

    def __missing__(self, size: int) -> int:
        r = self[size] = round_size(size, self.config)
        return r


@dataclass
class OOMEvent:
    """A request the simulated allocator could not satisfy."""

    index: int  # the request (allocation number) that failed; -1 for a recorded OOM request retried
    request_bytes: int
    alloc_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    message: str


@dataclass
class Sample:
    index: int
    allocated_bytes: int
    reserved_bytes: int


class CachingAllocatorSim:
    """One device's caching allocator. Sizes in bytes; streams are small ints (their sort order)."""

    def __init__(self, config: AllocatorConfig = DEFAULT, *, cap_bytes: int | None = None,
                 device_bytes: int | None = None, device_total_bytes: int = 150_000_000_000,
                 address_oracle: list[tuple[int, int]] | None = None, map_oracle: list[int] | None = None,
                 address_space: DriverVA | None = None) -> None:
        self.config = config
        self.expandable = config.expandable_segments
        self.max_split = config.max_split_size
        self.max_nsr = config.max_non_split_rounding_size
        self.device_total = device_total_bytes
        if cap_bytes is None and config.per_process_memory_fraction is not None:
            cap_bytes = int(config.per_process_memory_fraction * device_total_bytes)
        self.set_fraction = cap_bytes is not None  # setMemoryFraction was called
        self.allowed = cap_bytes if cap_bytes is not None else 0  # allowed_memory_maximum
        self.device_limit = device_bytes if device_bytes is not None else NO_LIMIT  # what cudaMalloc can get
        self.gc = self.set_fraction and config.garbage_collection_threshold > 0.0
        self.rounded = _RoundedSizes(config)
        self.small = Pool(True)
        self.large = Pool(False)
        self.by_addr: dict[int, Block] = {}  # every block that exists, by address
        self.total_allocated = 0  # total_allocated_memory: cudaMalloc'd segments + mapped pages
        for name in STAT_NAMES:
            setattr(self, name, [0] * 6)
        # active counts blocks allocated or awaiting their stream events: until a block first awaits events
        # (free_requested) it is allocation, and active_bytes is allocated_bytes; they share one list until then
        self.active = self.allocation
        self.active_bytes = self.allocated_bytes
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_sync_all_streams = 0
        self.oversize_allocations = [0, 0]  # current, peak
        self.oversize_segments = [0, 0]
        self.pending: dict[int, Block] = {}  # blocks awaiting their stream events (cuda_events)
        self.ooms: list[OOMEvent] = []
        self.expandable_segments: list[ExpandableSegment] = []
        # synthetic addresses: the driver's placement (far below the recorded ones), or the one given
        self._va = address_space if address_space is not None else DriverVA()
        self._oracle: list[tuple[int, int]] | None = list(address_oracle or [])
        self._oracle_i = 0
        self._map_oracle = list(map_oracle or [])
        self.rec: list[dict] | None = None  # when a list: trace entries like _record_memory_history's

    # ================================================================== the program's calls
    def malloc(self, orig_size: int, stream: int = 0, index: int = -1) -> Block | None:
        """``DeviceCachingAllocator::malloc``; None where PyTorch raises OutOfMemoryError."""
        size = self.rounded[orig_size]  # round_size
        pool = self.small if size <= kSmallSize else self.large  # get_pool
        block = self._get_free_block(pool, stream, size)
        if block is None and self._trigger_free_memory_callbacks():
            block = self._get_free_block(pool, stream, size)
        if block is None:
            block = self._new_block(pool, stream, size, orig_size, index)
            if block is None:
                return None
        split = self._should_split(block, size)
        return self._alloc_found_block(block, pool, stream, size, orig_size, split)

    def free(self, block: Block) -> None:
        """``free`` of a block without uses on other streams: ``free_block`` at once."""
        self._release(block)
        self._free_block(block)

    def free_requested(self, block: Block) -> None:
        """``free`` of a block used on other streams (``record_stream``): it waits for their events."""
        if self.active is self.allocation:  # from now on active and allocation differ
            self.active, self.active_bytes = list(self.allocation), list(self.allocated_bytes)
        self._release(block)
        block.pending = True
        self.pending[id(block)] = block

    def _release(self, block: Block) -> None:
        """What ``free`` does before the block is freed or waits for its streams: no longer allocated, the
        allocation stats decreased, the request recorded."""
        block.allocated = False
        p = block.pool.stat
        decrease_stat(self.allocation, p, 1)
        decrease_stat(self.allocated_bytes, p, block.size)
        if self.rec is not None:
            self._record("free_requested", block.addr, block.requested, block.stream)
        if block.size >= self.max_split:
            self.oversize_allocations[0] -= 1

    def free_completed(self, block: Block) -> None:
        """The block's last stream event completed (``process_events``): ``free_block``."""
        if not block.pending:
            return
        block.pending = False
        del self.pending[id(block)]
        self._free_block(block)

    def empty_cache(self) -> None:
        """``emptyCache``: ``release_cached_blocks``."""
        self._release_cached_blocks()

    def reset_peak_stats(self) -> None:
        """``resetPeakStats`` (``torch.cuda.reset_peak_memory_stats``): every statistic's peak becomes its current
        value."""
        for name in STAT_NAMES:
            stat = getattr(self, name)
            for j in range(0, len(stat), 2):
                stat[j + 1] = stat[j]

    # ================================================================== malloc, rule by rule
    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        """``get_free_block``: the smallest cached block >= size on this stream, subject to max_split_size."""
        if self.gc:
            pool.gc_calls += 1  # block ages are counted only when garbage collection is on
        keys = pool.blocks
        n = len(keys)
        i = bisect_left(keys, (stream << _STREAM_SHIFT) | (size << _SIZE_SHIFT))
        if i == n or (keys[i] >> _STREAM_SHIFT) != stream:
            return None
        b = self.by_addr[keys[i] & _ADDR_MASK]
        if b.es is not None:
            if self.expandable:
                # an expandable block counts as the size it can grow to (itself + the unmapped range after it)
                j = i + 1
                while b.es is not None and j < n and (keys[j] >> _STREAM_SHIFT) == stream:
                    c = self.by_addr[keys[j] & _ADDR_MASK]
                    if _expandable_size(c) >= _expandable_size(b):
                        break
                    b, i = c, j
                    j += 1
            else:  # expandable segments turned off after some were made: skip their blocks
                i += 1
                while i < n and (keys[i] >> _STREAM_SHIFT) == stream and self.by_addr[keys[i] & _ADDR_MASK].es:
                    i += 1
                if i == n or (keys[i] >> _STREAM_SHIFT) != stream:
                    return None
                b = self.by_addr[keys[i] & _ADDR_MASK]
        ms = self.max_split
        if size < ms and b.size >= ms:  # do not return an oversize block for a smaller request
            return None
        if size >= ms and b.size >= size + self.max_nsr:  # an oversize block only within the rounding limit
            return None
        del keys[i]
        return b

    @staticmethod
    def _trigger_free_memory_callbacks() -> bool:
        """``trigger_free_memory_callbacks``: the callback PyTorch registers collects CUDA IPC blocks; none here."""
        return False

    def _new_block(self, pool: Pool, stream: int, size: int, orig_size: int, index: int) -> Block | None:
        """malloc without a cached block: garbage collection, then cudaMalloc, then free oversize blocks and retry,
        then free every cached block and retry; None after counting the out-of-memory error."""
        alloc_size = allocation_size(size)  # get_allocation_size
        if self.gc:
            self._garbage_collect_cached_blocks()
        block = (self._alloc_block(pool, stream, size, alloc_size, False)
                 or (self._release_available_cached_blocks(pool, stream, size)
                     and self._alloc_block(pool, stream, size, alloc_size, False))
                 or (self._release_cached_blocks()
                     and self._alloc_block(pool, stream, size, alloc_size, True)))
        if not block:
            self._out_of_memory(orig_size, size, alloc_size, index)
            return None
        return block

    def _garbage_collect_cached_blocks(self) -> None:
        """``garbage_collect_cached_blocks``: above threshold x allowed, free unsplit large blocks of above-average
        age (in get_free_block calls) until enough is reclaimed."""
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.total_allocated <= threshold:
            return
        target = self.total_allocated - threshold
        pool = self.large

        def freeable() -> list[Block]:
            blocks = (self.by_addr[k & _ADDR_MASK] for k in pool.blocks)
            return [b for b in blocks if b.es is None and not b.is_split()]

        blocks = freeable()
        total_age = sum(pool.gc_calls - b.gc_base for b in blocks)
        count = len(blocks)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for b in freeable():
                age = pool.gc_calls - b.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int, is_retry: bool) -> Block | None:
        """``alloc_block``: a new segment from cudaMalloc (or pages mapped into an expandable segment)."""
        if is_retry:
            self.num_alloc_retries += 1
        if self.set_fraction and self.total_allocated + alloc_size > self.allowed:
            return None
        if self.expandable:
            return self._try_allocate_expandable_block(pool, stream, size)
        if self.total_allocated + alloc_size > self.device_limit:
            return None  # cudaMalloc fails: the device has no room
        addr = self._new_address(alloc_size)
        b = self.by_addr[addr] = Block(addr, alloc_size, stream, pool)
        self.total_allocated += alloc_size
        increase_stat(self.segment, pool.stat, 1)
        increase_stat(self.reserved_bytes, pool.stat, alloc_size)
        if alloc_size >= self.max_split:
            _increase_counter(self.oversize_segments)
        self.num_device_alloc += 1
        if self.rec is not None:
            self._record("segment_alloc", addr, alloc_size, stream)
        return b

    def _new_address(self, size: int) -> int:
        """The address cudaMalloc returns: the recorded one while the replay follows the recording, else
        synthetic (:mod:`labkit.allocator.sim.driver_va`). It matters only to break ties between equal-size cached
        blocks (best fit orders by address)."""
        if self._oracle is not None and self._oracle_i < len(self._oracle):
            osize, oaddr = self._oracle[self._oracle_i]
            if osize == size and oaddr not in self.by_addr:
                self._oracle_i += 1
                return oaddr
            self._oracle = None  # diverged from the recording: synthetic addresses from here on
        return self._va.place(size)

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        """``release_available_cached_blocks`` (max_split_size set): free the smallest oversize block that covers
        the request, else the largest oversize blocks until their sizes add up to it."""
        ms = self.max_split
        if ms == NO_LIMIT:
            return False
        key_size = ms if size < ms else size
        keys = pool.blocks
        i = bisect_left(keys, (stream << _STREAM_SHIFT) | (key_size << _SIZE_SHIFT))
        if i < len(keys) and (keys[i] >> _STREAM_SHIFT) == stream:
            self._release_block_if_cudamalloced(self.by_addr[keys[i] & _ADDR_MASK])
            return True
        released = 0
        i -= 1
        while i >= 0 and released < key_size:
            b = self.by_addr[keys[i] & _ADDR_MASK]
            if b.size < ms or b.stream != stream:
                break
            released += b.size
            self._release_block_if_cudamalloced(b)
            i -= 1
        return released >= key_size

    def _release_block_if_cudamalloced(self, b: Block) -> None:
        # release_block frees cudaMalloc segments only; an expandable block is counted but stays
        if b.es is None:
            self._release_block(b)

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks``: wait for every stream (pending frees complete), then free every unsplit
        cached block of both pools (``release_blocks``). This is also ``empty_cache()``."""
        self.num_sync_all_streams += 1  # synchronize_and_free_events
        for b in list(self.pending.values()):
            self.free_completed(b)
        self._release_blocks(self.large)
        self._release_blocks(self.small)
        return True

    def _release_blocks(self, pool: Pool) -> None:
        """``release_blocks``: whole unsplit segments go back to cudaFree; expandable blocks give back their whole
        free pages, and a segment left with nothing mapped is released."""
        to_unmap = []
        for k in list(pool.blocks):
            b = self.by_addr[k & _ADDR_MASK]
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b)
        for b in to_unmap:
            self._unmap_block(b)
            if b.prev is None and b.next is None and not b.mapped:
                self._release_expandable_segment(b)

    def _release_block(self, block: Block) -> None:
        """``release_block``: cudaFree of a whole cached segment."""
        self.num_device_free += 1
        if self.rec is not None:
            self._record("segment_free", block.addr, block.size, block.stream)
        self.total_allocated -= block.size
        p = block.pool.stat
        decrease_stat(self.segment, p, 1)
        decrease_stat(self.reserved_bytes, p, block.size)
        if block.size >= self.max_split:
            self.oversize_segments[0] -= 1
        block.pool.erase(block)
        del self.by_addr[block.addr]
        self._va.release(block.addr, block.size)

    def _out_of_memory(self, orig_size: int, size: int, alloc_size: int, index: int) -> None:
        """malloc's failure branch: ``num_ooms`` and the OutOfMemoryError message's numbers."""
        self.num_ooms += 1
        a = self.allocated_bytes[0]
        r = self.reserved_bytes[0]
        allowed = f"{fmt_bytes(self.allowed)} allowed; " if self.set_fraction else ""
        msg = (f"CUDA out of memory (simulated). Tried to allocate {fmt_bytes(alloc_size)}. {allowed}"
               f"Of the allocated memory {fmt_bytes(a)} is allocated by PyTorch, and {fmt_bytes(r - a)} "
               f"is reserved by PyTorch but unallocated.")
        self.ooms.append(OOMEvent(index, orig_size, alloc_size, a, r, msg))
        if self.rec is not None:
            self.rec.append({"action": "oom", "device_free": 0, "size": size, "stream": 0})

    def _should_split(self, block: Block, size: int) -> bool:
        """``should_split``: small pool or expandable segments: any remainder of a block's minimum size; large
        pool: a request below max_split_size leaving more than 1 MiB."""
        remaining = block.size - size
        if block.pool.small or self.expandable:
            return remaining >= kMinBlockSize
        return size < self.max_split and remaining > kSmallSize

    def _alloc_found_block(self, block: Block, pool: Pool, stream: int, size: int, orig_size: int,
                           split_remainder: bool) -> Block:
        """``alloc_found_block``: split off the remainder (back to the pool), mark allocated, count."""
        p = pool.stat
        already_split = block.prev is not None or block.next is not None
        if split_remainder:
            remaining = block
            block = Block(remaining.addr, size, stream, pool, remaining.es)
            prev = block.prev = remaining.prev
            if prev is not None:
                prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            self.by_addr[block.addr] = block
            self.by_addr[remaining.addr] = remaining
            pool.insert_into_blocks(remaining)
            if block.es is None:
                if already_split:  # an inactive split block shrinks by size
                    decrease_stat(self.inactive_split_bytes, p, size)
                else:  # a new inactive split block: the remainder of a previously whole block
                    increase_stat(self.inactive_split_bytes, p, remaining.size)
                    increase_stat(self.inactive_split, p, 1)
        elif already_split and block.es is None:  # an inactive split block becomes active
            decrease_stat(self.inactive_split_bytes, p, block.size)
            decrease_stat(self.inactive_split, p, 1)
        block.allocated = True
        block.requested = orig_size
        if self.rec is not None:
            self._record("alloc", block.addr, orig_size, stream)
        bs = block.size
        increase_stat(self.allocation, p, 1)
        increase_stat(self.allocated_bytes, p, bs)
        if self.active is not self.allocation:
            increase_stat(self.active, p, 1)
            increase_stat(self.active_bytes, p, bs)
        increase_stat(self.requested_bytes, p, orig_size)
        if bs >= self.max_split:
            _increase_counter(self.oversize_allocations)
        return block

    # ================================================================== free, merge
    def _free_block(self, block: Block) -> None:
        """``free_block``: merge with free neighbours, back into the pool, count."""
        if self.rec is not None:
            self._record("free_completed", block.addr, block.requested, block.stream)
        original_size = block.size
        pool = block.pool
        net_blocks = net_size = 0
        subsumed = self._try_merge_blocks(block, block.prev, pool)
        if subsumed:
            net_blocks -= 1
            net_size -= subsumed
        subsumed = self._try_merge_blocks(block, block.next, pool)
        if subsumed:
            net_blocks -= 1
            net_size -= subsumed
        pool.insert_into_blocks(block)
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_size += block.size
        p = pool.stat
        if block.es is None:  # expandable blocks are left out of inactive_split
            if net_blocks > 0:
                increase_stat(self.inactive_split, p, net_blocks)
            elif net_blocks < 0:
                decrease_stat(self.inactive_split, p, -net_blocks)
            if net_size > 0:
                increase_stat(self.inactive_split_bytes, p, net_size)
            elif net_size < 0:
                decrease_stat(self.inactive_split_bytes, p, -net_size)
        if self.active is not self.allocation:
            decrease_stat(self.active, p, 1)
            decrease_stat(self.active_bytes, p, original_size)
        decrease_stat(self.requested_bytes, p, block.requested)

    def _try_merge_blocks(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """``try_merge_blocks``: absorb a free neighbour in the same state (mapped or not); its size, or 0."""
        if src is None or src.allocated or src.pending or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        by_addr = self.by_addr
        if dst.prev is src:  # [src dst]
            del by_addr[dst.addr]
            dst.addr = src.addr
            by_addr[dst.addr] = dst
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            del by_addr[src.addr]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ================================================================== expandable segments
    def _try_allocate_expandable_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        """``try_allocate_expandable_block``: the lowest free/unmapped run with room, mapped as far as needed."""
        cand = self._find_expandable_block(pool, stream, size)
        if not cand.mapped and not self._map_block(cand, min(cand.size, size)):
            return None
        while cand.size < size:  # free -> unmapped -> ...: map the next range and merge it in
            nxt = cand.next
            if not self._map_block(nxt, min(size - cand.size, nxt.size)):
                return None
            cand = nxt
        pool.erase(cand)
        return cand

    def _find_expandable_block(self, pool: Pool, stream: int, size: int) -> Block:
        """``find_expandable_block``: the lowest address where free and unmapped blocks hold size; else a new
        segment of 1 1/8 of the device's memory."""
        keys = pool.unmapped
        i = bisect_left(keys, stream << _SIZE_SHIFT)
        while i < len(keys) and (keys[i] >> _SIZE_SHIFT) == stream:
            c = self.by_addr[keys[i] & _ADDR_MASK]
            if _allocatable(c.prev):
                c = c.prev
            room = 0
            x: Block | None = c
            while room < size and _allocatable(x):
                room += x.size  # type: ignore[union-attr]
                x = x.next  # type: ignore[union-attr]
            if room >= size:
                return c
            i += 1
        page = kSmallBuffer if pool.small else kLargeBuffer
        space = self.device_total + self.device_total // 8
        es = ExpandableSegment(self._expandable_base(page * ((space + page - 1) // page), page),
                               page * ((space + page - 1) // page), page, stream)
        self.expandable_segments.append(es)
        cand = self.by_addr[es.base] = Block(es.base, es.size, stream, pool, es)
        cand.mapped = False
        pool.insert_unmapped(cand)
        return cand

    def _expandable_base(self, size: int, page: int) -> int:
        """cuMemAddressReserve's address: the recording's (its first mapping outside every known range), else
        synthetic."""
        for a in self._map_oracle:
            if not any(e.base <= a < e.base + e.size for e in self.expandable_segments) and a not in self.by_addr:
                return a
        self._map_oracle = []
        return self._va.reserve(size, page)

    def _map_block(self, to_map: Block, size: int) -> bool:
        """``map_block``: map whole pages covering size at the start of an unmapped block; merge with free
        neighbours. One ``num_device_alloc`` per call; reserved grows, ``segment.*`` does not."""
        es = to_map.es
        page = es.page
        begin = (to_map.addr - es.base) // page
        end = (to_map.addr + size - es.base + page - 1) // page
        mapped = (end - begin) * page
        if mapped == 0 or self.total_allocated + mapped > self.device_limit:
            return False  # cuMemCreate fails
        pool = to_map.pool
        addr = to_map.addr
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:  # to_map -> remaining (unmapped) -> to_map.next
            rest = self.by_addr[addr + mapped] = Block(addr + mapped, to_map.size - mapped, to_map.stream, pool, es)
            rest.mapped = False
            _splice(rest, to_map, to_map.next)
            pool.insert_unmapped(rest)
            to_map.size = mapped
        self._try_merge_blocks(to_map, to_map.prev, pool)
        self._try_merge_blocks(to_map, to_map.next, pool)
        pool.insert_into_blocks(to_map)
        self.total_allocated += mapped
        increase_stat(self.reserved_bytes, pool.stat, mapped)
        self.num_device_alloc += 1
        if self.rec is not None:
            self._record("segment_map", addr, mapped, to_map.stream)
        return True

    def _unmap_block(self, block: Block) -> None:
        """``unmap_block``: unmap the whole pages inside a free expandable block; the free ends stay mapped."""
        es = block.es
        page = es.page
        begin = (block.addr - es.base + page - 1) // page
        end = (block.addr + block.size - es.base) // page
        if begin >= end:
            return
        pool = block.pool
        pool.erase(block)
        u_addr = es.base + begin * page
        u_size = (end - begin) * page
        before = u_addr - block.addr
        if before > 0:  # prev -> before_free -> block
            bf = self.by_addr[block.addr] = Block(block.addr, before, block.stream, pool, es)
            _splice(bf, block.prev, block)
            pool.insert_into_blocks(bf)
        after = block.size - (before + u_size)
        if after > 0:  # block -> after_free -> next
            af = self.by_addr[u_addr + u_size] = Block(u_addr + u_size, after, block.stream, pool, es)
            _splice(af, block, block.next)
            pool.insert_into_blocks(af)
        block.addr = u_addr
        self.by_addr[u_addr] = block
        block.size = u_size
        block.mapped = False
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self.total_allocated -= u_size
        decrease_stat(self.reserved_bytes, pool.stat, u_size)
        self.num_device_free += 1
        if self.rec is not None:
            self._record("segment_unmap", u_addr, u_size, block.stream)

    def _release_expandable_segment(self, block: Block) -> None:
        """``release_expandable_segment``: a segment with nothing mapped gives back its address range."""
        block.pool.erase_unmapped(block)
        del self.by_addr[block.addr]
        self.expandable_segments.remove(block.es)

    # ================================================================== a request stream
    def _apply(self, ops: list[tuple[int, int, int, int]], blocks: list) -> int:
        """Apply compiled ops (see :mod:`labkit.allocator.sim.stream`); ``blocks[id]`` is each live request's block.
        Returns how many recorded OOM requests fit."""
        fits = 0
        for op, ident, size, stream in ops:
            if op == ALLOC:
                b = self.malloc(size, stream, ident)
                blocks[ident] = b
            elif op == FREE:
                b = blocks[ident]
                if b is not None:
                    blocks[ident] = None
                    self.free(b)
            elif op == FREE_REQ:
                b = blocks[ident]
                if b is not None:
                    self.free_requested(b)
            elif op == FREE_DONE:
                b = blocks[ident]
                if b is not None:
                    blocks[ident] = None
                    self.free_completed(b)
            elif op == EMPTY_CACHE:
                self.empty_cache()
            elif op == OOM_RETRY:
                b = self.malloc(size, stream, -1)
                if b is not None:
                    fits += 1
                    self.free(b)
        return fits

    # ================================================================== recording, reporting, checks
    def round(self, size: int) -> int:
        """``round_size`` of a request of ``size`` bytes under this configuration."""
        return self.rounded[size]

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        self.rec.append({"action": action, "addr": addr, "size": size, "stream": stream})  # type: ignore[union-attr]

    def memory_stats(self) -> dict[str, int]:
        """The ``torch.cuda.memory_stats()`` keys this simulator tracks (current and peak)."""
        out: dict[str, int] = {}
        for name in STAT_NAMES:
            stat = getattr(self, name)
            for j, pool in ((0, "all"), (_SMALL, "small_pool"), (_LARGE, "large_pool")):
                out[f"{name}.{pool}.current"] = stat[j]
                out[f"{name}.{pool}.peak"] = stat[j + 1]
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["oversize_allocations.current"], out["oversize_allocations.peak"] = self.oversize_allocations
        out["oversize_segments.current"], out["oversize_segments.peak"] = self.oversize_segments
        return out

    def segments(self) -> list[dict]:
        """The segment map now (``snapshot()``): one entry per cudaMalloc segment / mapped expandable range."""
        heads = [b for b in self.by_addr.values() if b.mapped and (b.prev is None or not b.prev.mapped)]
        out = []
        for h in sorted(heads, key=lambda b: b.addr):
            blocks = []
            b: Block | None = h
            while b is not None and b.mapped:
                blocks.append({"address": b.addr, "size": b.size, "requested_size": b.requested if b.allocated else 0,
                               "state": "active_allocated" if b.allocated else
                               ("active_pending_free" if b.pending else "inactive")})
                b = b.next
            out.append({"address": h.addr, "total_size": sum(x["size"] for x in blocks), "stream": h.stream,
                        "segment_type": "small" if h.pool.small else "large", "is_expandable": h.es is not None,
                        "allocated_size": sum(x["size"] for x in blocks if x["state"] == "active_allocated"),
                        "blocks": blocks})
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError if the block structures disagree with each other or with the stats."""
        for pool in (self.small, self.large):
            assert pool.blocks == sorted(pool.blocks) and pool.unmapped == sorted(pool.unmapped)
            for k in pool.blocks:
                b = self.by_addr.get(k & _ADDR_MASK)
                assert b is not None and b.size == (k >> _SIZE_SHIFT) & _ADDR_MASK and b.mapped, k
                assert not b.allocated and not b.pending and b.pool is pool, k
            for k in pool.unmapped:
                b = self.by_addr.get(k & _ADDR_MASK)
                assert b is not None and not b.mapped and b.pool is pool, k
        mapped = 0
        for addr, b in self.by_addr.items():
            assert b.addr == addr
            if b.next is not None:
                assert b.next.prev is b and b.next.addr == b.addr + b.size
            if b.mapped:
                mapped += b.size
        assert mapped == self.total_allocated == self.reserved_bytes[0], (mapped, self.total_allocated)
        assert self.allocated_bytes[0] == sum(b.size for b in self.by_addr.values() if b.allocated)


def _expandable_size(b: Block) -> int:
    """What a free expandable block can grow to: itself and the unmapped range right after it."""
    nx = b.next
    return b.size + (nx.size if nx is not None and not nx.mapped else 0)


def _allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated and not b.pending


def _splice(b: Block, before: Block | None, after: Block | None) -> None:
    """``Block::splice``: put b between two neighbours."""
    if before is not None:
        before.next = b
    b.prev = before
    if after is not None:
        after.prev = b
    b.next = after


def _increase_counter(c: list[int]) -> None:
    c[0] += 1
    if c[0] > c[1]:
        c[1] = c[0]


def run_ops(sim: CachingAllocatorSim, ops: list[tuple[int, int, int, int]], n_ids: int, *,
            every: int = 0, samples: list[Sample] | None = None, force_generic: bool = False) -> int:
    """Apply a compiled request stream (see :mod:`labkit.allocator.sim.stream`) to ``sim``, request by request.

    ``every`` > 0 appends an (allocated, reserved) sample to ``samples`` every that many ops. Returns
    how many recorded OOM requests fit. ``force_generic`` is accepted for older callers: there is
    only one path.
    """
    blocks: list = [None] * n_ids
    if not (every and samples is not None):
        return sim._apply(ops, blocks)
    fits = 0
    for start in range(0, len(ops), every):
        samples.append(Sample(start, sim.allocated_bytes[0], sim.reserved_bytes[0]))
        fits += sim._apply(ops[start:start + every], blocks)
    samples.append(Sample(len(ops), sim.allocated_bytes[0], sim.reserved_bytes[0]))
    return fits


# ---------------------------------------------------------------------------------------------- generated fast path
# The methods above are the rules' only source. Those on the hot path run as copies generated from them, with the small
# methods and helpers they call inlined; ReferenceAllocatorSim runs every method as written, and
# tests/allocator/test_simulator_generated.py requires both to reach identical states on every recorded trace and on
# random ones. CachingAllocatorSim.malloc.generated_source (and the others') show what runs.
_GENERATED = ("_apply", "malloc", "free", "free_requested", "free_completed", "_free_block", "_alloc_block",
              "_release_block", "_map_block", "_unmap_block")
_AS_WRITTEN = {name: CachingAllocatorSim.__dict__[name] for name in _GENERATED}
ReferenceAllocatorSim = type("ReferenceAllocatorSim", (CachingAllocatorSim,), dict(
    _AS_WRITTEN, __doc__="The simulator with every method run as written (no generated code), for tests."))
_INLINED_FUNCTIONS = [increase_stat, decrease_stat, _increase_counter, _splice]
_INLINED_METHODS = [Pool.insert_into_blocks, Pool.erase, Pool.insert_unmapped, Pool.erase_unmapped, *(
    CachingAllocatorSim.__dict__[n] for n in ("malloc", "free", "_release", "_get_free_block", "_should_split", "_alloc_found_block",
                                              "_free_block", "_try_merge_blocks"))]
try:
    _FAST = {name: inline(fn, _INLINED_FUNCTIONS, _INLINED_METHODS) for name, fn in _AS_WRITTEN.items()}
except OSError:  # no source files to generate from (a bytecode-only install): the methods as written, slower
    _FAST = {}
for _name, _fn in _FAST.items():
    setattr(CachingAllocatorSim, _name, _fn)
