"""Invariants of the caching allocator, checked after every call of seeded random request streams (plain seeded
random: Hypothesis is not in the environment). Each property is read from the simulator's outside view (the segment
map, memory_stats(), the trace it records) and the requests the test made, not from its internal structures."""

import random

import pytest

from labkit.allocator import CachingAllocatorSim, parse_alloc_conf

MiB = 1024**2
GiB = 1024**3
SIZES = [1, 512, 700, 4096, 65536, MiB - 1, MiB, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB, 12 * MiB + 7, 21 * MiB,
         64 * MiB, 130 * MiB, 300 * MiB]

CASES = [
    ("", None, 0), ("", None, 1), ("", 1 * GiB, 2),
    ("roundup_power2_divisions:4", None, 3),
    ("max_split_size_mb:64", 1 * GiB, 4), ("max_split_size_mb:128,garbage_collection_threshold:0.5", 1 * GiB, 5),
    ("expandable_segments:True", None, 6), ("expandable_segments:True", 1 * GiB, 7),
    ("expandable_segments:True,roundup_power2_divisions:4", None, 8),
]


class Checker:
    """Drives one simulator with random requests and checks every property after each call."""

    def __init__(self, conf, cap, seed):
        self.cfg = parse_alloc_conf(conf)
        self.cap = cap
        self.rng = random.Random(seed)
        self.sim = CachingAllocatorSim(self.cfg, cap_bytes=cap, device_total_bytes=8 * GiB)
        self.sim.rec = []
        self.seen = 0  # trace entries already read
        self.cuda_segments = {}  # address -> size of live cudaMalloc segments, from the trace
        self.live = {}  # request id -> (block, requested bytes)
        self.pending = {}  # freed, awaiting stream events
        self.next_id = 0
        self.ooms = 0

    # ------------------------------------------------------------------ the requests
    def step(self):
        r = self.rng.random()
        if self.live and r < 0.42:
            self.free(self.rng.choice(list(self.live)), now=self.rng.random() < 0.85)
        elif self.pending and r < 0.48:
            ident = self.rng.choice(list(self.pending))
            self.sim.free_completed(self.pending.pop(ident)[0])
        elif r < 0.50:
            self.empty_cache()
        else:
            self.malloc(self.rng.choice(SIZES) + self.rng.randrange(3) * 512, self.rng.randrange(2))
        self.check()

    def malloc(self, size, stream):
        st0 = self.sim.memory_stats()
        rounded = self.sim.round(size)
        expected_addr = self.best_fit(rounded, stream)
        b = self.sim.malloc(size, stream)
        st = self.sim.memory_stats()
        if st["num_sync_all_streams"] > st0["num_sync_all_streams"]:
            self.pending.clear()  # the retry path waited for every stream: pending frees completed
        if b is None:
            self.ooms += 1
            self.check_oom(st)
            return
        self.live[self.next_id] = (b, size)
        self.next_id += 1
        assert b.size >= rounded
        untouched = st["num_device_alloc"] == st0["num_device_alloc"] and st["num_device_free"] == st0["num_device_free"]
        if untouched and expected_addr is not None:  # served from the cache: best fit
            assert b.addr == expected_addr, (size, stream)
        if self.cfg.expandable_segments and st["num_device_free"] == st0["num_device_free"]:
            page = 2 * MiB if rounded <= MiB else 20 * MiB
            mapped = st["reserved_bytes.all.current"] - st0["reserved_bytes.all.current"]
            assert mapped <= -(-rounded // page) * page, (size, mapped)  # never more pages than the request needs

    def free(self, ident, now):
        b, size = self.live.pop(ident)
        if now:
            self.sim.free(b)
        else:
            self.sim.free_requested(b)
            self.pending[ident] = (b, size)

    def empty_cache(self):
        before = self.sim.segments()
        alloc_before = self.sim.memory_stats()["allocated_bytes.all.current"]
        self.sim.empty_cache()
        self.pending.clear()  # release_cached_blocks waits for every stream first
        after = self.sim.segments()
        busy = {(s["address"], s["total_size"]) for s in before if not s["is_expandable"]
                and any(x["state"] == "active_allocated" for x in s["blocks"])}
        kept = {(s["address"], s["total_size"]) for s in after if not s["is_expandable"]}
        assert kept == busy  # whole segments without live tensors are freed, the others stay exactly as they were
        assert self.sim.memory_stats()["allocated_bytes.all.current"] == alloc_before
        for s in after:  # expandable: no mapped page is left without a live tensor
            if s["is_expandable"]:
                page = 2 * MiB if s["segment_type"] == "small" else 20 * MiB
                es = next(e for e in self.sim.expandable_segments if e.base <= s["address"] < e.base + e.size)
                for start in range(s["address"], s["address"] + s["total_size"], page):
                    assert (start - es.base) % page == 0
                    assert any(x["state"] != "inactive" and x["address"] < start + page
                               and x["address"] + x["size"] > start for x in s["blocks"]), hex(start)

    # ------------------------------------------------------------------ what must hold
    def best_fit(self, rounded, stream):
        """The block best fit should pick (smallest, then lowest address) in the plain configuration, else None."""
        if self.cfg.expandable_segments or self.cfg.max_split_size != parse_alloc_conf("").max_split_size:
            return None
        kind = "small" if rounded <= MiB else "large"
        free = [(x["size"], x["address"]) for s in self.sim.segments() if s["stream"] == stream
                and s["segment_type"] == kind for x in s["blocks"] if x["state"] == "inactive" and x["size"] >= rounded]
        return min(free)[1] if free else None

    def read_trace(self):
        for e in self.sim.rec[self.seen:]:
            if e["action"] == "segment_alloc":
                assert e["addr"] not in self.cuda_segments
                self.cuda_segments[e["addr"]] = e["size"]
            elif e["action"] == "segment_free":
                assert self.cuda_segments.pop(e["addr"]) == e["size"]
        self.seen = len(self.sim.rec)

    def check(self):
        self.read_trace()
        st = self.sim.memory_stats()
        segs = self.sim.segments()
        for pool in ("all", "small_pool", "large_pool"):
            cur = {k: st[f"{k}.{pool}.current"] for k in ("allocated_bytes", "reserved_bytes", "active_bytes")}
            assert 0 <= cur["allocated_bytes"] <= cur["active_bytes"] <= cur["reserved_bytes"], (pool, cur)
            for k in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "segment"):
                assert st[f"{k}.{pool}.peak"] >= st[f"{k}.{pool}.current"] >= 0
        # blocks tile their segment exactly; segments do not overlap; together they are what is reserved
        ends = []
        for s in segs:
            addr = s["address"]
            for x in s["blocks"]:
                assert x["address"] == addr and x["size"] > 0
                addr += x["size"]
            assert addr - s["address"] == s["total_size"]
            ends.append((s["address"], addr))
            # free neighbours are always merged
            states = [x["state"] for x in s["blocks"]]
            assert all(not (a == b == "inactive") for a, b in zip(states, states[1:])), s["address"]
        ends.sort()
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(ends, ends[1:]))
        assert sum(s["total_size"] for s in segs) == st["reserved_bytes.all.current"] == self.sim.total_allocated
        # cudaMalloc segments are exactly those the trace says were allocated and not freed
        assert {(s["address"], s["total_size"]) for s in segs if not s["is_expandable"]} == set(self.cuda_segments.items())
        assert st["segment.all.current"] == len(self.cuda_segments)
        # the byte counters agree with the blocks and with the requests made
        allocated = sum(x["size"] for s in segs for x in s["blocks"] if x["state"] == "active_allocated")
        pending = sum(x["size"] for s in segs for x in s["blocks"] if x["state"] == "active_pending_free")
        split_free = sum(x["size"] for s in segs if not s["is_expandable"] and len(s["blocks"]) > 1
                         for x in s["blocks"] if x["state"] == "inactive")
        assert st["allocated_bytes.all.current"] == allocated == sum(b.size for b, _ in self.live.values())
        assert st["active_bytes.all.current"] == allocated + pending
        assert st["inactive_split_bytes.all.current"] == split_free
        assert st["requested_bytes.all.current"] == sum(n for _, n in [*self.live.values(), *self.pending.values()])
        assert st["allocation.all.current"] == len(self.live)
        assert st["active.all.current"] == len(self.live) + len(self.pending)
        if self.cap is not None:
            slack = 20 * MiB if self.cfg.expandable_segments else 0  # mapping rounds up to a page after the check
            assert st["reserved_bytes.all.current"] <= self.cap + slack

    def check_oom(self, st):
        """An OOM happens only after every unsplit cached segment was given back: what stays reserved is live
        or free inside segments that hold live tensors, and the request does not fit beside it."""
        oom = self.sim.ooms[-1]
        assert oom.reserved_bytes == st["reserved_bytes.all.current"] and oom.allocated_bytes == st["allocated_bytes.all.current"]
        if not self.cfg.expandable_segments:
            assert st["reserved_bytes.all.current"] - st["active_bytes.all.current"] == st["inactive_split_bytes.all.current"]
            assert self.cap is not None and oom.reserved_bytes + oom.alloc_bytes > self.cap


@pytest.mark.parametrize("conf, cap, seed", CASES)
def test_invariants_hold_after_every_call(conf, cap, seed):
    c = Checker(conf, cap, seed)
    for _ in range(500):
        c.step()
    c.empty_cache()
    c.check()
    st = c.sim.memory_stats()
    assert st["num_device_alloc"] > 3 and c.next_id > 100  # the stream did exercise the allocator
    if cap is not None:
        assert st["num_alloc_retries"] > 0 and c.ooms > 0  # and, under a cap, its retry and OOM paths
