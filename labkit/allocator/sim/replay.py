"""Replay a request stream under any allocator configuration; compare configurations."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.allocator.sim.config import AllocatorConfig, parse_alloc_conf
from labkit.allocator.sim.simulator import CachingAllocatorSim, OOMEvent, Sample, run_ops
from labkit.allocator.snapshot import Snapshot, read_snapshot
from labkit.allocator.sim.stream import ALLOC, EMPTY_CACHE, FREE, FREE_DONE, FREE_REQ, OOM_RETRY, Trace, compile_trace
from labkit.core.errors import LabkitError


@dataclass
class ReplayResult:
    """What the simulated allocator did with one request stream under one configuration."""

    trace: str
    config: str
    cap_bytes: int | None
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    segments_peak: int
    num_device_alloc: int
    num_alloc_retries: int
    num_ooms: int
    requests: int
    events: int
    inactive_split_peak_bytes: int
    reserved_end_bytes: int
    allocated_end_bytes: int
    recorded_oom_requests_that_fit: int = 0
    ooms: list[OOMEvent] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict, repr=False)
    wall_s: float = 0.0
    events_per_s: float = 0.0  # trace events per wall-clock second
    cpu_s: float = 0.0
    events_per_cpu_s: float = 0.0  # per second of this process's CPU time (fairer on a shared machine)

    @property
    def fragmentation_peak_bytes(self) -> int:
        """Reserved minus allocated at their respective peaks (a rough 'cache overhead')."""
        return self.reserved_peak_bytes - self.allocated_peak_bytes


def load_trace(src: str | Path | bytes | dict | Snapshot | Trace, device: int | None = None, *,
               max_bytes: int | None = None) -> Trace:
    """A compiled trace from a snapshot file/bytes/dict; ``max_bytes`` caps a file's decompressed size."""
    if isinstance(src, Trace):
        return src
    kw = {"max_bytes": max_bytes} if max_bytes is not None else {}
    snap = src if isinstance(src, Snapshot) else read_snapshot(src, **kw)
    return compile_trace(snap, device)


def _same_config(a: AllocatorConfig, b: AllocatorConfig) -> bool:
    return (a.max_split_size, a.max_non_split_rounding_size, a.roundup_power2_divisions, a.garbage_collection_threshold,
            a.expandable_segments) == (b.max_split_size, b.max_non_split_rounding_size, b.roundup_power2_divisions,
                                       b.garbage_collection_threshold, b.expandable_segments)


def replay(trace: Trace | str | Path | Snapshot | dict, conf: str | AllocatorConfig | None = None, *,
           cap_bytes: int | None = None, device_bytes: int | None = None,
           device_total_bytes: int = 150_000_000_000, timeline_points: int = 0,
           allow_incomplete: bool = False, force_generic: bool = False) -> ReplayResult:
    """Replay the program's requests of ``trace`` under ``conf`` (a ``PYTORCH_ALLOC_CONF`` string).

    ``cap_bytes`` caps memory like ``set_per_process_memory_fraction`` (OOMs are counted, the replay
    goes on without the failed request); ``device_bytes`` is what cudaMalloc can obtain in total.
    ``timeline_points`` > 0 keeps about that many (allocated, reserved) samples for plotting.
    """
    tr = load_trace(trace)
    if not tr.complete and not allow_incomplete:
        raise LabkitError(f"{tr.name}: the trace is incomplete ({tr.incomplete_reason}); its history does not start "
                          "with the allocation of the segments it uses, so a replay would be wrong. Record with a larger "
                          "max_entries in torch.cuda.memory._record_memory_history(), starting before the work.")
    cfg = conf if isinstance(conf, AllocatorConfig) else parse_alloc_conf(conf)
    oracle = None
    if (tr.segment_oracle or tr.map_oracle) and tr.recorded_conf is not None:
        try:
            if _same_config(cfg, parse_alloc_conf(tr.recorded_conf)):
                oracle = tr.segment_oracle
        except LabkitError:
            oracle = None
    sim = CachingAllocatorSim(cfg, cap_bytes=cap_bytes, device_bytes=device_bytes,
                              device_total_bytes=device_total_bytes, address_oracle=oracle,
                              map_oracle=tr.map_oracle if oracle is not None else None)
    every = max(1, len(tr.ops) // timeline_points) if timeline_points else 0
    samples: list[Sample] = []
    t0 = time.perf_counter()
    c0 = time.process_time()
    fits = run_ops(sim, tr.ops, tr.n_ids, every=every, samples=samples, force_generic=force_generic)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    st = sim.memory_stats()
    return ReplayResult(
        trace=tr.name, config=cfg.label, cap_bytes=cap_bytes,
        allocated_peak_bytes=st["allocated_bytes.all.peak"], reserved_peak_bytes=st["reserved_bytes.all.peak"],
        segments_peak=st["segment.all.peak"], num_device_alloc=st["num_device_alloc"],
        num_alloc_retries=st["num_alloc_retries"], num_ooms=st["num_ooms"], requests=tr.n_ids, events=tr.events,
        inactive_split_peak_bytes=st["inactive_split_bytes.all.peak"], reserved_end_bytes=st["reserved_bytes.all.current"],
        allocated_end_bytes=st["allocated_bytes.all.current"], recorded_oom_requests_that_fit=fits,
        ooms=sim.ooms[:20], timeline=samples, stats=st, wall_s=wall,
        events_per_s=tr.events / wall if wall > 0 else float("inf"), cpu_s=cpu,
        events_per_cpu_s=tr.events / cpu if cpu > 0 else float("inf"))


def replay_with_sim(trace: Trace, conf: str | AllocatorConfig | None = None, **kw) -> CachingAllocatorSim:
    """Replay and return the simulator itself (for its segment map and block-level checks)."""
    tr = load_trace(trace)
    cfg = conf if isinstance(conf, AllocatorConfig) else parse_alloc_conf(conf)
    oracle = None
    if (tr.segment_oracle or tr.map_oracle) and tr.recorded_conf is not None \
            and _same_config(cfg, parse_alloc_conf(tr.recorded_conf)):
        oracle = tr.segment_oracle
    sim = CachingAllocatorSim(cfg, address_oracle=oracle, map_oracle=tr.map_oracle if oracle is not None else None, **kw)
    blocks: list = [None] * tr.n_ids
    sim.addresses = [0] * tr.n_ids  # type: ignore[attr-defined]
    for idx, (op, ident, size, stream) in enumerate(tr.ops):
        if op == ALLOC:
            b = blocks[ident] = sim.malloc(size, stream, idx)
            if b is not None:
                sim.addresses[ident] = b.addr  # type: ignore[attr-defined]
        elif op in (FREE, FREE_DONE):
            b = blocks[ident]
            if b is not None:
                (sim.free if op == FREE else sim.free_completed)(b)
                blocks[ident] = None
        elif op == FREE_REQ:
            if blocks[ident] is not None:
                sim.free_requested(blocks[ident])
        elif op == EMPTY_CACHE:
            sim.empty_cache()
        elif op == OOM_RETRY:
            b = sim.malloc(size, stream, idx)
            if b is not None:
                sim.free(b)
    return sim


def compare(trace: Trace | str | Path | Snapshot | dict, confs: list[str], **kw) -> list[ReplayResult]:
    """Replay one trace under several configurations (the what-if table)."""
    tr = load_trace(trace)
    return [replay(tr, c, **kw) for c in confs]
