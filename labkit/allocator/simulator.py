"""A replica of PyTorch's CUDA caching allocator (``DeviceCachingAllocator``) in plain Python.

Every decision follows ``c10/cuda/CUDACachingAllocator.cpp``; the function names below are those
of the C++ source so that each rule can be checked against it:

* ``round_size``: 512 B rounding, or ``roundup_power2_divisions`` (see :mod:`.config`).
* pools: requests <= 1 MiB use the small pool, larger ones the large pool; per stream.
* ``get_allocation_size``: new segments of 2 MiB (small), 20 MiB (< 10 MiB), else rounded to 2 MiB.
* ``get_free_block``: best fit, ordered by (stream, size, address); with ``max_split_size`` a
  request below it never takes a block >= it, and a request >= it takes a block only if smaller
  than request + ``max_non_split_rounding_size``; expandable blocks compare by what they can grow to.
* ``should_split``: small pool or expandable segments: remainder >= 512 B; large pool: request <
  max_split_size and remainder > 1 MiB. ``free_block`` merges free neighbours.
* ``malloc``: free-block search; garbage collection (fraction set and threshold > 0);
  ``alloc_block``; ``release_available_cached_blocks`` (with max_split_size) and retry;
  ``release_cached_blocks`` and retry (``num_alloc_retries``); otherwise OOM (``num_ooms``).
* expandable segments: one virtual range per stream and pool (1 1/8 of the device's memory),
  pages of 2 MiB (small) / 20 MiB (large) mapped on demand (``map_block``: one
  ``num_device_alloc`` per mapping call), unmapped by ``empty_cache`` and on the retry path.
  Mapping does not change ``segment.*`` (only ``cudaMalloc`` segments count there), and
  ``inactive_split*`` excludes expandable blocks, as in the source.
* ``set_fraction`` caps ``total_allocated_memory + alloc_size`` (checked before mapping too).

Blocks are kept in sorted Python lists of integer keys (stream, size, address packed into one
int) searched with ``bisect``: the hot path stays in C.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from labkit.allocator.config import DEFAULT, NO_LIMIT, AllocatorConfig, allocation_size, round_size

kMinBlockSize = 512
kSmallSize = 1048576
kSmallBuffer = 2097152
kLargeBuffer = 20971520
A48 = (1 << 48) - 1
S96 = 96
STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")


class Block:
    __slots__ = ("addr", "size", "stream", "pool", "prev", "next", "allocated", "mapped", "es",
                 "requested", "pending", "gc_base")

    def __init__(self, addr: int, size: int, stream: int, pool: "Pool") -> None:
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.mapped = True
        self.es: ExpandableSegment | None = None
        self.requested = 0
        self.pending = False  # freed by the program, awaiting stream events (free_completed)
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        st = "alloc" if self.allocated else ("unmapped" if not self.mapped else "free")
        return f"Block({self.addr:#x}, {self.size}, {st})"


class Pool:
    __slots__ = ("small", "keys", "unmapped", "gc_calls", "poff")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.poff = 2 if small else 4  # offset of this pool's slots in a stat (see ALLOCATION ...)
        self.keys: list[int] = []  # free mapped blocks: stream<<96 | size<<48 | addr
        self.unmapped: list[int] = []  # unmapped expandable blocks: stream<<48 | addr
        self.gc_calls = 0


class ExpandableSegment:
    __slots__ = ("base", "size", "page", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int) -> None:
        self.base, self.size, self.page, self.stream = base, size, page, stream


# memory_stats() counters live in one flat list: 6 slots per stat (all current, all peak, small pool
# current, small pool peak, large pool current, large pool peak); the hot path updates them inline.
ALLOCATION, SEGMENT, ACTIVE, INACTIVE_SPLIT, ALLOCATED_BYTES, RESERVED_BYTES, ACTIVE_BYTES, \
    INACTIVE_SPLIT_BYTES, REQUESTED_BYTES = range(0, 54, 6)


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
                 address_oracle: list[tuple[int, int]] | None = None, map_oracle: list[int] | None = None) -> None:
        self.config = config
        self.expandable = config.expandable_segments
        self.max_split = config.max_split_size
        self.max_nsr = config.max_non_split_rounding_size
        self.device_total = device_total_bytes
        if cap_bytes is None and config.per_process_memory_fraction is not None:
            cap_bytes = int(config.per_process_memory_fraction * device_total_bytes)
        self.set_fraction = cap_bytes is not None
        self.allowed = cap_bytes if cap_bytes is not None else 0
        self.device_limit = device_bytes if device_bytes is not None else NO_LIMIT
        self.gc = self.set_fraction and config.garbage_collection_threshold > 0.0
        # the inlined path of run_ops: no expandable segments, no garbage collection
        self._plain = not self.expandable and not self.gc
        self._simple_search = self._plain and self.max_split == NO_LIMIT  # get_free_block is a plain best fit
        self.small = Pool(True)
        self.large = Pool(False)
        self.by_addr: dict[int, Block] = {}  # every block that exists, by address
        self.total_allocated = 0  # bytes obtained from the device (cudaMalloc + mapped pages)
        self.S = [0] * 54  # see ALLOCATION ... REQUESTED_BYTES
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_sync_all_streams = 0
        self.oversize_allocations = [0, 0]
        self.oversize_segments = [0, 0]
        self.pending: dict[int, Block] = {}
        self._next_va = 1 << 46  # synthetic addresses grow down from here, far from the recorded ones
        self._oracle: list[tuple[int, int]] | None = list(address_oracle or [])
        self._oracle_i = 0
        self._map_oracle = list(map_oracle or [])
        self.ooms: list[OOMEvent] = []
        self.expandable_segments: list[ExpandableSegment] = []
        self._round_cache: dict[int, int] = {}
        self.rec: list[dict] | None = None  # when a list: trace entries like _record_memory_history's

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        self.rec.append({"action": action, "addr": addr, "size": size, "stream": stream})  # type: ignore[union-attr]

    # ------------------------------------------------------------------ stats (slow paths)
    def _inc(self, stat: int, small: bool, n: int) -> None:
        S = self.S
        S[stat] += n
        if S[stat] > S[stat + 1]:
            S[stat + 1] = S[stat]
        j = stat + (2 if small else 4)
        S[j] += n
        if S[j] > S[j + 1]:
            S[j + 1] = S[j]

    def _dec(self, stat: int, small: bool, n: int) -> None:
        S = self.S
        S[stat] -= n
        S[stat + (2 if small else 4)] -= n

    # ------------------------------------------------------------------ addresses
    def _new_address(self, size: int, align: int = 2097152) -> int:
        if self._oracle is not None and self._oracle_i < len(self._oracle):
            osize, oaddr = self._oracle[self._oracle_i]
            if osize == size and oaddr not in self.by_addr:
                self._oracle_i += 1
                return oaddr
            self._oracle = None  # diverged from the recording: synthetic addresses from here on
        # cudaMalloc's address choice matters only to break ties between equal-size cached blocks (best fit
        # orders by address). In the recorded H200 traces the driver handed out addresses mostly top-down;
        # doing the same made every recorded configuration's replay exact, where bottom-up left one segment
        # off in 77 (train_then_eval, max_split_size_mb:128,roundup_power2_divisions:4).
        a = (self._next_va - size) // align * align
        self._next_va = a - align
        return a

    # ------------------------------------------------------------------ pool helpers
    def _insert(self, b: Block) -> None:
        pool = b.pool
        if self.gc:
            b.gc_base = pool.gc_calls
        insort(pool.keys, (b.stream << S96) | (b.size << 48) | b.addr)

    def _erase(self, b: Block) -> None:
        keys = b.pool.keys
        k = (b.stream << S96) | (b.size << 48) | b.addr
        i = bisect_left(keys, k)
        if i < len(keys) and keys[i] == k:
            del keys[i]

    def _insert_unmapped(self, b: Block) -> None:
        insort(b.pool.unmapped, (b.stream << 48) | b.addr)

    def _erase_unmapped(self, b: Block) -> None:
        lst = b.pool.unmapped
        k = (b.stream << 48) | b.addr
        i = bisect_left(lst, k)
        if i < len(lst) and lst[i] == k:
            del lst[i]

    # ------------------------------------------------------------------ public API
    def round(self, size: int) -> int:
        r = self._round_cache.get(size)
        if r is None:
            r = self._round_cache[size] = round_size(size, self.config)
        return r

    def malloc(self, orig_size: int, stream: int = 0, index: int = -1) -> Block | None:
        """``DeviceCachingAllocator::malloc``; None when it would raise OutOfMemoryError."""
        size = self._round_cache.get(orig_size)
        if size is None:
            size = self.round(orig_size)
        small = size <= kSmallSize
        pool = self.small if small else self.large
        block = None
        if self._simple_search:  # get_free_block, inlined
            keys = pool.keys
            i = bisect_left(keys, (stream << S96) | (size << 48))
            if i < len(keys):
                k = keys[i]
                if (k >> S96) == stream:
                    block = self.by_addr[k & A48]
                    del keys[i]
        else:
            block = self._get_free_block(pool, stream, size)
        if block is None:
            alloc_size = allocation_size(size)
            if self.gc:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None and self._release_available_cached_blocks(pool, stream, size):
                block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, size, alloc_size, True)
            if block is None:
                self._oom(orig_size, size, alloc_size, index)
                return None
        # ---- alloc_found_block, inlined
        S = self.S
        p = 2 if small else 4
        remaining_size = block.size - size
        if small or self.expandable:
            split = remaining_size >= kMinBlockSize
        else:
            split = size < self.max_split and remaining_size > kSmallSize
        if split:
            remaining = block
            already_split = remaining.prev is not None or remaining.next is not None
            block = Block(remaining.addr, size, stream, pool)
            es = block.es = remaining.es
            prev = block.prev = remaining.prev
            if prev is not None:
                prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size = remaining_size
            by_addr = self.by_addr
            by_addr[block.addr] = block
            by_addr[remaining.addr] = remaining
            if self.gc:
                remaining.gc_base = pool.gc_calls
            insort(pool.keys, (stream << S96) | (remaining_size << 48) | remaining.addr)
            if es is None:
                if already_split:
                    S[INACTIVE_SPLIT_BYTES] -= size
                    S[INACTIVE_SPLIT_BYTES + p] -= size
                else:
                    self._inc(INACTIVE_SPLIT_BYTES, small, remaining_size)
                    self._inc(INACTIVE_SPLIT, small, 1)
        elif block.es is None and (block.prev is not None or block.next is not None):
            bs = block.size
            S[INACTIVE_SPLIT_BYTES] -= bs
            S[INACTIVE_SPLIT_BYTES + p] -= bs
            S[INACTIVE_SPLIT] -= 1
            S[INACTIVE_SPLIT + p] -= 1
        block.allocated = True
        block.requested = orig_size
        bs = block.size
        # ALLOCATION, ALLOCATED_BYTES, ACTIVE, ACTIVE_BYTES, REQUESTED_BYTES (unrolled: the hot path)
        v = S[0] + 1  # ALLOCATION
        S[0] = v
        if v > S[1]:
            S[1] = v
        j = 0 + p
        v = S[j] + 1
        S[j] = v
        if v > S[j + 1]:
            S[j + 1] = v
        v = S[24] + bs  # ALLOCATED_BYTES
        S[24] = v
        if v > S[25]:
            S[25] = v
        j = 24 + p
        v = S[j] + bs
        S[j] = v
        if v > S[j + 1]:
            S[j + 1] = v
        v = S[12] + 1  # ACTIVE
        S[12] = v
        if v > S[13]:
            S[13] = v
        j = 12 + p
        v = S[j] + 1
        S[j] = v
        if v > S[j + 1]:
            S[j + 1] = v
        v = S[36] + bs  # ACTIVE_BYTES
        S[36] = v
        if v > S[37]:
            S[37] = v
        j = 36 + p
        v = S[j] + bs
        S[j] = v
        if v > S[j + 1]:
            S[j + 1] = v
        v = S[48] + orig_size  # REQUESTED_BYTES
        S[48] = v
        if v > S[49]:
            S[49] = v
        j = 48 + p
        v = S[j] + orig_size
        S[j] = v
        if v > S[j + 1]:
            S[j + 1] = v
        if bs >= self.max_split:
            o = self.oversize_allocations
            o[0] += 1
            if o[0] > o[1]:
                o[1] = o[0]
        if self.rec is not None:
            self._record("alloc", block.addr, orig_size, stream)
        return block

    def free(self, block: Block) -> None:
        """``free()`` immediately followed by ``free_block()`` (no pending stream uses)."""
        S = self.S
        small = block.pool.small
        p = 2 if small else 4
        bs = block.size
        block.allocated = False
        if self.rec is not None:
            self._record("free_requested", block.addr, block.requested, block.stream)
            self._record("free_completed", block.addr, block.requested, block.stream)
        S[ALLOCATION] -= 1
        S[ALLOCATION + p] -= 1
        S[ALLOCATED_BYTES] -= bs
        S[ALLOCATED_BYTES + p] -= bs
        if bs >= self.max_split:
            self.oversize_allocations[0] -= 1
        self._free_block(block)

    def free_requested(self, block: Block) -> None:
        block.allocated = False
        block.pending = True
        if self.rec is not None:
            self._record("free_requested", block.addr, block.requested, block.stream)
        small = block.pool.small
        self._dec(ALLOCATION, small, 1)
        self._dec(ALLOCATED_BYTES, small, block.size)
        if block.size >= self.max_split:
            self.oversize_allocations[0] -= 1
        self.pending[id(block)] = block

    def free_completed(self, block: Block) -> None:
        if not block.pending:
            return
        block.pending = False
        self.pending.pop(id(block), None)
        if self.rec is not None:
            self._record("free_completed", block.addr, block.requested, block.stream)
        self._free_block(block)

    def empty_cache(self) -> None:
        self._release_cached_blocks()

    # ------------------------------------------------------------------ the C++ functions
    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        if self.gc:
            pool.gc_calls += 1
        keys = pool.keys
        i = bisect_left(keys, (stream << S96) | (size << 48))
        n = len(keys)
        if i == n:
            return None
        k = keys[i]
        if (k >> S96) != stream:
            return None
        b = self.by_addr[k & A48]
        if b.es is not None:
            if self.expandable:
                def exp_size(x: Block) -> int:
                    nx = x.next
                    return x.size + (nx.size if nx is not None and not nx.mapped else 0)
                j = i + 1
                while b.es is not None and j < n and (keys[j] >> S96) == stream:
                    c = self.by_addr[keys[j] & A48]
                    if exp_size(c) < exp_size(b):
                        b, i = c, j
                        j += 1
                    else:
                        break
            else:  # expandable segments turned off later: only non-expandable blocks
                j = i + 1
                while j < n and (keys[j] >> S96) == stream and self.by_addr[keys[j] & A48].es is not None:
                    j += 1
                if j == n or (keys[j] >> S96) != stream:
                    return None
                i = j
                b = self.by_addr[keys[j] & A48]
        ms = self.max_split
        if size < ms and b.size >= ms:
            return None
        if size >= ms and b.size >= size + self.max_nsr:
            return None
        del keys[i]
        return b

    def _free_block(self, block: Block) -> None:
        """``free_block``: merge with free neighbours, back into the pool, stats."""
        pool = block.pool
        small = pool.small
        original_size = block.size
        d_blocks = 0
        d_size = 0
        by_addr = self.by_addr
        keys = pool.keys
        src = block.prev
        if src is not None and not src.allocated and not src.pending and src.mapped == block.mapped:
            k = (src.stream << S96) | (src.size << 48) | src.addr
            del keys[bisect_left(keys, k)]
            del by_addr[block.addr]
            block.addr = src.addr
            by_addr[src.addr] = block
            block.prev = src.prev
            if src.prev is not None:
                src.prev.next = block
            block.size += src.size
            d_blocks -= 1
            d_size -= src.size
        src = block.next
        if src is not None and not src.allocated and not src.pending and src.mapped == block.mapped:
            if src.mapped:
                k = (src.stream << S96) | (src.size << 48) | src.addr
                del keys[bisect_left(keys, k)]
            else:
                self._erase_unmapped(src)
            del by_addr[src.addr]
            block.next = src.next
            if src.next is not None:
                src.next.prev = block
            block.size += src.size
            d_blocks -= 1
            d_size -= src.size
        if self.gc:
            block.gc_base = pool.gc_calls
        insort(keys, (block.stream << S96) | (block.size << 48) | block.addr)
        if block.prev is not None or block.next is not None:
            d_blocks += 1
            d_size += block.size
        S = self.S
        p = 2 if small else 4
        if block.es is None:
            if d_blocks > 0:
                self._inc(INACTIVE_SPLIT, small, d_blocks)
            elif d_blocks < 0:
                S[INACTIVE_SPLIT] += d_blocks
                S[INACTIVE_SPLIT + p] += d_blocks
            if d_size > 0:
                self._inc(INACTIVE_SPLIT_BYTES, small, d_size)
            elif d_size < 0:
                S[INACTIVE_SPLIT_BYTES] += d_size
                S[INACTIVE_SPLIT_BYTES + p] += d_size
        S[ACTIVE] -= 1
        S[ACTIVE + p] -= 1
        S[ACTIVE_BYTES] -= original_size
        S[ACTIVE_BYTES + p] -= original_size
        r = block.requested
        S[REQUESTED_BYTES] -= r
        S[REQUESTED_BYTES + p] -= r

    def _try_merge(self, dst: Block, src: Block | None) -> int:
        if src is None or src.allocated or src.pending or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._erase(src)
        else:
            self._erase_unmapped(src)
        if dst.prev is src:
            del self.by_addr[dst.addr]
            dst.addr = src.addr
            self.by_addr[dst.addr] = dst
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            del self.by_addr[src.addr]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int, is_retry: bool) -> Block | None:
        if is_retry:
            self.num_alloc_retries += 1
        if self.set_fraction and self.total_allocated + alloc_size > self.allowed:
            return None
        if self.expandable:
            return self._try_allocate_expandable_block(pool, stream, size)
        if self.total_allocated + alloc_size > self.device_limit:
            return None  # cudaMalloc fails: the device has no room
        addr = self._new_address(alloc_size)
        b = Block(addr, alloc_size, stream, pool)
        self.by_addr[addr] = b
        self.total_allocated += alloc_size
        small = pool.small
        self._inc(SEGMENT, small, 1)
        self._inc(RESERVED_BYTES, small, alloc_size)
        if alloc_size >= self.max_split:
            o = self.oversize_segments
            o[0] += 1
            if o[0] > o[1]:
                o[1] = o[0]
        self.num_device_alloc += 1
        if self.rec is not None:
            self._record("segment_alloc", addr, alloc_size, stream)
        return b

    # -------------------------------------------------------------- expandable segments
    @staticmethod
    def _allocatable(b: Block | None) -> bool:
        return b is not None and not b.allocated and not b.pending

    def _find_expandable_block(self, pool: Pool, stream: int, size: int) -> Block:
        lst = pool.unmapped
        i = bisect_left(lst, stream << 48)
        while i < len(lst) and (lst[i] >> 48) == stream:
            c = self.by_addr[lst[i] & A48]
            if c.prev is not None and self._allocatable(c.prev):
                c = c.prev
            total = 0
            x: Block | None = c
            while total < size and self._allocatable(x):
                total += x.size  # type: ignore[union-attr]
                x = x.next  # type: ignore[union-attr]
            if total >= size:
                return c
            i += 1
        page = kSmallBuffer if pool.small else kLargeBuffer
        space = self.device_total + self.device_total // 8
        es_size = page * ((space + page - 1) // page)
        base = None
        for a in self._map_oracle:  # the recording's base: its first mapping outside every known range
            if not any(e.base <= a < e.base + e.size for e in self.expandable_segments) and a not in self.by_addr:
                base = a
                break
        if base is None:
            self._map_oracle = []
            base = self._new_address(es_size, page)
        es = ExpandableSegment(base, es_size, page, stream)
        self.expandable_segments.append(es)
        cand = Block(base, es_size, stream, pool)
        cand.mapped = False
        cand.es = es
        self.by_addr[base] = cand
        self._insert_unmapped(cand)
        return cand

    def _map_block(self, to_map: Block, size: int) -> bool:
        es = to_map.es
        page = es.page
        begin = (to_map.addr - es.base) // page
        end = (to_map.addr + size - es.base + page - 1) // page
        mapped = (end - begin) * page
        if mapped == 0:
            return False
        if self.total_allocated + mapped > self.device_limit:
            return False  # cuMemCreate fails
        pool = to_map.pool
        mptr = to_map.addr
        self._erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rem = Block(to_map.addr + mapped, to_map.size - mapped, to_map.stream, pool)
            rem.mapped = False
            rem.es = es
            rem.prev = to_map
            rem.next = to_map.next
            if to_map.next is not None:
                to_map.next.prev = rem
            to_map.next = rem
            self.by_addr[rem.addr] = rem
            self._insert_unmapped(rem)
            to_map.size = mapped
        self._try_merge(to_map, to_map.prev)
        self._try_merge(to_map, to_map.next)
        self._insert(to_map)
        self.total_allocated += mapped
        self._inc(RESERVED_BYTES, pool.small, mapped)
        self.num_device_alloc += 1
        if self.rec is not None:
            self._record("segment_map", mptr, mapped, to_map.stream)
        return True

    def _try_allocate_expandable_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        cand = self._find_expandable_block(pool, stream, size)
        if not cand.mapped and not self._map_block(cand, min(cand.size, size)):
            return None
        while cand.size < size:
            remaining = size - cand.size
            nxt = cand.next
            if not self._map_block(nxt, min(remaining, nxt.size)):
                return None
            cand = nxt
        self._erase(cand)
        return cand

    def _unmap_block(self, block: Block) -> None:
        es = block.es
        page = es.page
        begin = (block.addr - es.base + page - 1) // page
        end = (block.addr + block.size - es.base) // page
        if begin >= end:
            return
        pool = block.pool
        self._erase(block)
        u_addr = es.base + begin * page
        u_size = (end - begin) * page
        before = u_addr - block.addr
        if before > 0:
            bf = Block(block.addr, before, block.stream, pool)
            bf.es = es
            bf.prev = block.prev
            bf.next = block
            if block.prev is not None:
                block.prev.next = bf
            block.prev = bf
            block.addr = u_addr
            self.by_addr[bf.addr] = bf
            self.by_addr[u_addr] = block
            self._insert(bf)
        after = block.size - (before + u_size)
        if after > 0:
            af = Block(u_addr + u_size, after, block.stream, pool)
            af.es = es
            af.prev = block
            af.next = block.next
            if block.next is not None:
                block.next.prev = af
            block.next = af
            self.by_addr[af.addr] = af
            self._insert(af)
        block.size = u_size
        block.mapped = False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_unmapped(block)
        self.total_allocated -= u_size
        self._dec(RESERVED_BYTES, pool.small, u_size)
        self.num_device_free += 1
        if self.rec is not None:
            self._record("segment_unmap", u_addr, u_size, block.stream)

    def _release_expandable_segment(self, block: Block) -> None:
        self._erase_unmapped(block)
        del self.by_addr[block.addr]
        self.expandable_segments.remove(block.es)

    # -------------------------------------------------------------- releasing memory
    def _release_block(self, block: Block) -> None:
        self.num_device_free += 1
        if self.rec is not None:
            self._record("segment_free", block.addr, block.size, block.stream)
        self.total_allocated -= block.size
        small = block.pool.small
        self._dec(SEGMENT, small, 1)
        self._dec(RESERVED_BYTES, small, block.size)
        if block.size >= self.max_split:
            self.oversize_segments[0] -= 1
        self._erase(block)
        del self.by_addr[block.addr]

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        ms = self.max_split
        if ms == NO_LIMIT:
            return False
        ksize = ms if size < ms else size
        keys = pool.keys
        i = bisect_left(keys, (stream << S96) | (ksize << 48))
        if i == len(keys) or (keys[i] >> S96) != stream:
            if i == 0:
                return False
            released = 0
            i -= 1
            while i >= 0:
                b = self.by_addr[keys[i] & A48]
                if released >= ksize or b.size < ms or b.stream != stream:
                    break
                released += b.size
                if b.es is None:
                    self._release_block(b)
                i -= 1
            return released >= ksize
        b = self.by_addr[keys[i] & A48]
        if b.es is None:
            self._release_block(b)
        return True

    def _release_blocks(self, pool: Pool) -> None:
        to_unmap = []
        for k in list(pool.keys):
            b = self.by_addr.get(k & A48)
            if b is None or b.size != ((k >> 48) & A48):
                continue
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b)
        for b in to_unmap:
            self._unmap_block(b)
            if b.prev is None and b.next is None and not b.mapped:
                self._release_expandable_segment(b)

    def _release_cached_blocks(self) -> bool:
        self.num_sync_all_streams += 1
        for b in list(self.pending.values()):
            self.free_completed(b)
        self._release_blocks(self.large)
        self._release_blocks(self.small)
        return True

    def _garbage_collect(self) -> None:
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.total_allocated <= threshold:
            return
        target = self.total_allocated - threshold
        pool = self.large

        def freeable() -> list[Block]:
            return [self.by_addr[k & A48] for k in pool.keys
                    if self.by_addr[k & A48].es is None and not self.by_addr[k & A48].is_split()]

        blocks = freeable()
        if not blocks:
            return
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

    def _oom(self, orig_size: int, size: int, alloc_size: int, index: int) -> None:
        self.num_ooms += 1
        a = self.S[ALLOCATED_BYTES]
        r = self.S[RESERVED_BYTES]
        from labkit.core.units import fmt_bytes

        allowed = f"{fmt_bytes(self.allowed)} allowed; " if self.set_fraction else ""
        msg = (f"CUDA out of memory (simulated). Tried to allocate {fmt_bytes(alloc_size)}. {allowed}"
               f"Of the allocated memory {fmt_bytes(a)} is allocated by PyTorch, and {fmt_bytes(r - a)} "
               f"is reserved by PyTorch but unallocated.")
        self.ooms.append(OOMEvent(index, orig_size, alloc_size, a, r, msg))
        if self.rec is not None:
            self.rec.append({"action": "oom", "device_free": 0, "size": size, "stream": 0})

    # -------------------------------------------------------------- self-checks (tests)
    def check_invariants(self) -> None:
        """Raise AssertionError if the block structures disagree with each other or with the stats."""
        for pool in (self.small, self.large):
            for k in pool.keys:
                b = self.by_addr.get(k & A48)
                assert b is not None and b.size == ((k >> 48) & A48) and b.mapped and not b.allocated, k
            for k in pool.unmapped:
                b = self.by_addr.get(k & A48)
                assert b is not None and not b.mapped, k
        mapped = 0
        for addr, b in self.by_addr.items():
            assert b.addr == addr
            if b.next is not None:
                assert b.next.prev is b and b.next.addr == b.addr + b.size
            if b.mapped:
                mapped += b.size
        assert mapped == self.total_allocated == self.S[RESERVED_BYTES], (mapped, self.total_allocated)

    # -------------------------------------------------------------- reporting
    def memory_stats(self) -> dict[str, int]:
        """The ``torch.cuda.memory_stats()`` keys this simulator tracks (current and peak)."""
        out: dict[str, int] = {}
        for n, name in enumerate(STAT_NAMES):
            for j, pool in ((0, "all"), (2, "small_pool"), (4, "large_pool")):
                out[f"{name}.{pool}.current"] = self.S[6 * n + j]
                out[f"{name}.{pool}.peak"] = self.S[6 * n + j + 1]
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["oversize_allocations.current"], out["oversize_allocations.peak"] = self.oversize_allocations
        out["oversize_segments.current"], out["oversize_segments.peak"] = self.oversize_segments
        return out

    def segments(self) -> list[dict]:
        """The segment map now: one entry per cudaMalloc segment / mapped expandable range."""
        heads = [b for b in self.by_addr.values() if (b.prev is None or not b.prev.mapped) and b.mapped]
        out = []
        for h in sorted(heads, key=lambda b: b.addr):
            blocks = []
            b: Block | None = h
            while b is not None and b.mapped:
                blocks.append({"address": b.addr, "size": b.size, "requested_size": b.requested if b.allocated else 0,
                               "state": "active_allocated" if b.allocated else
                               ("active_awaiting_free" if b.pending else "inactive")})
                b = b.next
            out.append({"address": h.addr, "total_size": sum(x["size"] for x in blocks), "stream": h.stream,
                        "segment_type": "small" if h.pool.small else "large", "is_expandable": h.es is not None,
                        "allocated_size": sum(x["size"] for x in blocks if x["state"] == "active_allocated"),
                        "blocks": blocks})
        return out


def run_ops(sim: CachingAllocatorSim, ops: list[tuple[int, int, int, int]], n_ids: int, *,
            every: int = 0, samples: list[Sample] | None = None, force_generic: bool = False) -> int:
    """Apply a compiled request stream (see :mod:`labkit.allocator.trace`) to ``sim``.

    For the plain configuration (no expandable segments, no max_split_size, no garbage collection)
    the common cases (a cached block is found; a free without pending stream uses) are inlined in
    :func:`_run_core`: they are ``malloc``/``alloc_found_block`` and ``free``/``free_block`` of the class
    above, statement for statement. Everything else goes through the methods. ``force_generic`` uses the
    methods only (tests check both give identical results). ``every`` > 0 appends an (allocated,
    reserved) sample to ``samples`` every that many ops. Returns how many recorded OOM requests fit.
    """
    from labkit.allocator.trace import FREE_REQ

    blocks: list = [None] * n_ids
    plain = sim._plain and not force_generic
    # Without pending frees (record_stream), active == allocation and active_bytes == allocated_bytes at
    # every moment; the fast path then skips those two stats and copies them at the end.
    fast_free = not sim.gc and not force_generic  # free_block inlined (gc needs its block ages)
    mirror = fast_free and not sim.pending and all(o[0] != FREE_REQ for o in ops)
    S = sim.S
    fits = 0
    if every and samples is not None:
        for start in range(0, len(ops), every):
            samples.append(Sample(start, S[ALLOCATED_BYTES], S[RESERVED_BYTES]))
            fits += _run_core(sim, ops[start:start + every], blocks, plain, fast_free, mirror)
        samples.append(Sample(len(ops), S[ALLOCATED_BYTES], S[RESERVED_BYTES]))
    else:
        fits = _run_core(sim, ops, blocks, plain, fast_free, mirror)
    if mirror:
        S[ACTIVE:ACTIVE + 6] = S[ALLOCATION:ALLOCATION + 6]
        S[ACTIVE_BYTES:ACTIVE_BYTES + 6] = S[ALLOCATED_BYTES:ALLOCATED_BYTES + 6]
    sim.live_blocks = blocks  # type: ignore[attr-defined]
    return fits


def _run_core(sim: CachingAllocatorSim, ops, blocks: list, plain: bool, fast_free: bool, mirror: bool) -> int:
    from labkit.allocator.trace import ALLOC, EMPTY_CACHE, FREE, FREE_DONE, FREE_REQ, OOM_RETRY

    S = sim.S
    by_addr = sim.by_addr
    small_pool, large_pool = sim.small, sim.large
    rc = sim._round_cache
    rnd = sim.round
    malloc, free = sim.malloc, sim.free
    fits = 0
    bisect_left_, insort_, Block_, A48_ = bisect_left, insort, Block, A48
    ms, nsr, oversize = sim.max_split, sim.max_nsr, sim.oversize_allocations
    for op, ident, size, stream in ops:
        if op == ALLOC:
            if plain:
                rs = rc.get(size)
                if rs is None:
                    rs = rnd(size)
                small = rs <= 1048576
                pool = small_pool if small else large_pool
                keys = pool.keys
                i = bisect_left_(keys, (stream << 96) | (rs << 48))
                if i < len(keys) and (keys[i] >> 96) == stream:
                    b = by_addr[keys[i] & A48_]
                    bsize = b.size
                    # max_split_size rules of get_free_block (no-ops when it is unlimited)
                    if (rs < ms and bsize >= ms) or (rs >= ms and bsize >= rs + nsr):
                        blocks[ident] = malloc(size, stream, ident)
                        continue
                    del keys[i]
                    p = 2 if small else 4
                    rem = bsize - rs
                    if (rem >= 512) if small else (rs < ms and rem > 1048576):
                        already = b.prev is not None or b.next is not None
                        nb = Block_(b.addr, rs, stream, pool)
                        pv = nb.prev = b.prev
                        if pv is not None:
                            pv.next = nb
                        nb.next = b
                        b.prev = nb
                        b.addr += rs
                        b.size = rem
                        by_addr[nb.addr] = nb
                        by_addr[b.addr] = b
                        insort_(keys, (stream << 96) | (rem << 48) | b.addr)
                        if already:
                            S[42] -= rs
                            S[42 + p] -= rs
                        else:
                            v = S[42] + rem
                            S[42] = v
                            if v > S[43]:
                                S[43] = v
                            j = 42 + p
                            v = S[j] + rem
                            S[j] = v
                            if v > S[j + 1]:
                                S[j + 1] = v
                            v = S[18] + 1
                            S[18] = v
                            if v > S[19]:
                                S[19] = v
                            j = 18 + p
                            v = S[j] + 1
                            S[j] = v
                            if v > S[j + 1]:
                                S[j + 1] = v
                        b = nb
                    elif b.prev is not None or b.next is not None:
                        S[42] -= bsize
                        S[42 + p] -= bsize
                        S[18] -= 1
                        S[18 + p] -= 1
                    b.allocated = True
                    b.requested = size
                    bs = b.size
                    v = S[0] + 1
                    S[0] = v
                    if v > S[1]:
                        S[1] = v
                    v = S[p] + 1
                    S[p] = v
                    if v > S[p + 1]:
                        S[p + 1] = v
                    v = S[24] + bs
                    S[24] = v
                    if v > S[25]:
                        S[25] = v
                    j = 24 + p
                    v = S[j] + bs
                    S[j] = v
                    if v > S[j + 1]:
                        S[j + 1] = v
                    if not mirror:
                        v = S[12] + 1
                        S[12] = v
                        if v > S[13]:
                            S[13] = v
                        j = 12 + p
                        v = S[j] + 1
                        S[j] = v
                        if v > S[j + 1]:
                            S[j + 1] = v
                        v = S[36] + bs
                        S[36] = v
                        if v > S[37]:
                            S[37] = v
                        j = 36 + p
                        v = S[j] + bs
                        S[j] = v
                        if v > S[j + 1]:
                            S[j + 1] = v
                    v = S[48] + size
                    S[48] = v
                    if v > S[49]:
                        S[49] = v
                    j = 48 + p
                    v = S[j] + size
                    S[j] = v
                    if v > S[j + 1]:
                        S[j + 1] = v
                    if bs >= ms:
                        o = oversize
                        o[0] += 1
                        if o[0] > o[1]:
                            o[1] = o[0]
                    blocks[ident] = b
                    continue
            blocks[ident] = malloc(size, stream, ident)
        elif op == FREE:
            b = blocks[ident]
            if b is None:
                continue
            blocks[ident] = None
            if not fast_free:
                free(b)
                continue
            pool = b.pool
            p = pool.poff
            bs = b.size
            b.allocated = False
            S[0] -= 1
            S[p] -= 1
            S[24] -= bs
            S[24 + p] -= bs
            if bs >= ms:
                oversize[0] -= 1
            keys = pool.keys
            d_blocks = 0
            d_size = 0
            src = b.prev
            if src is not None and not src.allocated and not src.pending and src.mapped:
                del keys[bisect_left_(keys, (src.stream << 96) | (src.size << 48) | src.addr)]
                del by_addr[b.addr]
                b.addr = src.addr
                by_addr[b.addr] = b
                pp = b.prev = src.prev
                if pp is not None:
                    pp.next = b
                b.size += src.size
                d_blocks -= 1
                d_size -= src.size
            src = b.next
            if src is not None and not src.allocated and not src.pending and src.mapped:
                del keys[bisect_left_(keys, (src.stream << 96) | (src.size << 48) | src.addr)]
                del by_addr[src.addr]
                nn = b.next = src.next
                if nn is not None:
                    nn.prev = b
                b.size += src.size
                d_blocks -= 1
                d_size -= src.size
            insort_(keys, (b.stream << 96) | (b.size << 48) | b.addr)
            if b.prev is not None or b.next is not None:
                d_blocks += 1
                d_size += b.size
            if b.es is None:  # expandable blocks are left out of inactive_split, as in free_block
                if d_blocks > 0:
                    sim._inc(INACTIVE_SPLIT, pool.small, d_blocks)
                elif d_blocks < 0:
                    S[18] += d_blocks
                    S[18 + p] += d_blocks
                if d_size > 0:
                    sim._inc(INACTIVE_SPLIT_BYTES, pool.small, d_size)
                elif d_size < 0:
                    S[42] += d_size
                    S[42 + p] += d_size
            if not mirror:
                S[12] -= 1
                S[12 + p] -= 1
                S[36] -= bs
                S[36 + p] -= bs
            r = b.requested
            S[48] -= r
            S[48 + p] -= r
        elif op == FREE_REQ:
            b = blocks[ident]
            if b is not None:
                sim.free_requested(b)
        elif op == FREE_DONE:
            b = blocks[ident]
            if b is not None:
                sim.free_completed(b)
                blocks[ident] = None
        elif op == EMPTY_CACHE:
            sim.empty_cache()
        elif op == OOM_RETRY:
            b = malloc(size, stream, -1)
            if b is not None:
                fits += 1
                free(b)
    return fits
