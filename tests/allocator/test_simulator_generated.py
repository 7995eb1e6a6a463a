"""The simulator's hot methods run as generated copies (helpers inlined, labkit.allocator.sim.inline). They must reach
exactly the state the methods as written reach (ReferenceAllocatorSim): on every recorded trace and on random ones
that exercise every path (stream events, retries, OOMs, garbage collection, expandable segments, device limits)."""

import random

import pytest

from labkit.allocator import compile_trace, parse_alloc_conf, read_snapshot, recorded
from labkit.allocator.sim.simulator import CachingAllocatorSim, ReferenceAllocatorSim, run_ops
from labkit.allocator.sim.stream import ALLOC, EMPTY_CACHE, FREE, FREE_DONE, FREE_REQ, OOM_RETRY, Trace

MiB = 1024**2
GiB = 1024**3


def _state(cls, trace, conf, **kw):
    sim = cls(parse_alloc_conf(conf), **kw)
    sim.rec = []
    fits = run_ops(sim, trace.ops, trace.n_ids)
    return {"fits": fits, "stats": sim.memory_stats(), "segments": sim.segments(), "trace": sim.rec,
            "ooms": [vars(o) for o in sim.ooms], "total": sim.total_allocated,
            "free_lists": [list(p.blocks) + list(p.unmapped) for p in (sim.small, sim.large)],
            "expandable": [(e.base, e.size, e.page, e.stream) for e in sim.expandable_segments]}


def _same(trace, conf, **kw):
    generated = _state(CachingAllocatorSim, trace, conf, **kw)
    written = _state(ReferenceAllocatorSim, trace, conf, **kw)
    assert generated == written, (trace.name, conf, kw)
    return generated


def random_trace(seed, n=2500, streams=2):
    """Requests of every kind: frees now or after stream events, empty_cache, retried OOM requests."""
    rng = random.Random(seed)
    sizes = [1, 512, 4096, 65536, MiB, MiB + 512, 3 * MiB, 9 * MiB, 10 * MiB, 12 * MiB, 30 * MiB, 130 * MiB,
             300 * MiB, 700 * MiB]
    ops, live, pending, n_ids = [], [], [], 0
    for _ in range(n):
        r = rng.random()
        if live and r < 0.40:
            ops.append((FREE, live.pop(rng.randrange(len(live))), 0, 0))
        elif live and r < 0.46:
            x = live.pop(rng.randrange(len(live)))
            ops.append((FREE_REQ, x, 0, 0))
            pending.append(x)
        elif pending and r < 0.50:
            ops.append((FREE_DONE, pending.pop(rng.randrange(len(pending))), 0, 0))
        elif r < 0.505:
            ops.append((EMPTY_CACHE, -1, 0, 0))
        elif r < 0.51:
            ops.append((OOM_RETRY, -1, rng.choice(sizes), rng.randrange(streams)))
        else:
            ops.append((ALLOC, n_ids, rng.choice(sizes) + rng.randrange(4) * 512 + rng.randrange(300),
                        rng.randrange(streams)))
            live.append(n_ids)
            n_ids += 1
    return Trace(f"random {seed}", ops, n_ids, len(ops))


def _recorded_traces():
    from labkit.core.paths import TRACES_DIR

    paths = sorted(TRACES_DIR.glob("trace__*.pickle.gz")) + sorted(recorded.MEAS_DIR.glob("oom__*.pickle.gz"))
    return [compile_trace(read_snapshot(p)) for p in paths]


def test_every_recorded_trace_reaches_the_same_state():
    traces = _recorded_traces()
    assert len(traces) >= 6
    for tr in traces:
        for conf in ("", "expandable_segments:True", "max_split_size_mb:128,roundup_power2_divisions:4"):
            _same(tr, conf, address_oracle=tr.segment_oracle, map_oracle=tr.map_oracle)
        _same(tr, "garbage_collection_threshold:0.6", cap_bytes=6 * GiB)


@pytest.mark.parametrize("conf, kw", [
    ("", {}),
    ("", {"cap_bytes": 2 * GiB}),
    ("roundup_power2_divisions:[256:1,>:8]", {"device_bytes": 3 * GiB}),
    ("max_split_size_mb:20", {"cap_bytes": 2 * GiB}),
    ("max_split_size_mb:128,max_non_split_rounding_mb:64,garbage_collection_threshold:0.5", {"cap_bytes": 2 * GiB}),
    ("expandable_segments:True", {"cap_bytes": 2 * GiB}),
    ("expandable_segments:True,roundup_power2_divisions:4", {"device_bytes": 3 * GiB}),
])
def test_random_traces_reach_the_same_state(conf, kw):
    exercised = {"num_ooms": 0, "num_alloc_retries": 0, "num_device_free": 0}
    for seed in range(3):
        st = _same(random_trace(seed), conf, **kw)["stats"]
        for k in exercised:
            exercised[k] += st[k]
    if kw:  # a limit: the retry and OOM paths ran
        assert all(exercised.values()), exercised


def test_the_generated_methods_are_in_use():
    """CachingAllocatorSim runs generated code; ReferenceAllocatorSim the methods as written."""
    for name in ("_apply", "malloc", "free", "_free_block"):
        fn = CachingAllocatorSim.__dict__[name]
        assert "helpers inlined" in fn.__code__.co_filename and fn.generated_source
        assert ReferenceAllocatorSim.__dict__[name].__code__.co_filename.endswith("simulator.py")
    src = CachingAllocatorSim.malloc.generated_source
    assert "self._get_free_block(" not in src and "increase_stat(" not in src  # inlined, not called
