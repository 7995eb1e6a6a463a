"""The CUDA caching allocator chapter: a faithful simulator, snapshot replay, experiments, OOM doctor.

Public names (other chapters and notebooks use only these):

* :func:`parse_alloc_conf`, :class:`AllocatorConfig`: ``PYTORCH_ALLOC_CONF`` strings.
* :class:`CachingAllocatorSim`: the allocator itself, request by request; :class:`DriverVA` /
  :class:`ShuffledVA`: where its new segments are placed (the driver's placement, or a random order).
* :func:`read_snapshot`, :func:`compile_trace`, :func:`replay`, :func:`compare`: snapshot files and replays.
* :func:`seed_segments`: a process's segments (a snapshot's) rebuilt in the simulator before a replay.
* :func:`diagnose`, :func:`parse_oom_message`: the OOM doctor.
* :func:`watch`, :class:`Watch`: capture an OOM in a user's own training loop (:mod:`labkit.allocator.capture`
  reads the folders).
* :mod:`labkit.allocator.sim.synthetic`: modelled request streams; :mod:`labkit.allocator.recorded`: the
  recorded H200 results.
"""

from labkit.allocator.sim.config import AllocatorConfig, parse_alloc_conf, round_size
from labkit.allocator.sim.driver_va import DriverVA, ShuffledVA
from labkit.allocator.doctor import Diagnosis, Finding, diagnose, format_diagnosis
from labkit.allocator.oom_message import OOMMessage, parse_oom_message
from labkit.allocator.sim.replay import ReplayResult, compare, load_trace, replay, replay_with_sim
from labkit.allocator.sim.simulator import CachingAllocatorSim
from labkit.allocator.snapshot import Snapshot, read_snapshot
from labkit.allocator.sim.state import SeededState, live_bytes, seed_segments
from labkit.allocator.sim.stream import Trace, TraceBuilder, compile_trace
from labkit.allocator.watcher import Watch, watch

__all__ = [
    "AllocatorConfig", "CachingAllocatorSim", "Diagnosis", "Finding", "OOMMessage", "ReplayResult", "Snapshot",
    "Trace", "TraceBuilder", "compare", "compile_trace", "diagnose", "format_diagnosis", "load_trace",
    "parse_alloc_conf", "parse_oom_message", "read_snapshot", "replay", "replay_with_sim", "round_size",
    "SeededState", "live_bytes", "seed_segments", "DriverVA", "ShuffledVA",
    "Watch", "watch",
]
