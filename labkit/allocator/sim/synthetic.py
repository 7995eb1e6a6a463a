"""Synthetic request streams: shapes of real programs, for tests, benchmarks and the notebook.

They are models of a program's requests (``sample``/``model`` figures, never measurements).
"""

from __future__ import annotations

import random

from labkit.allocator.sim.config import parse_alloc_conf
from labkit.allocator.sim.simulator import CachingAllocatorSim, run_ops
from labkit.allocator.sim.stream import Trace, TraceBuilder

MiB = 1024 * 1024
GiB = 1024 * MiB


def training_like(steps: int = 50, layers: int = 12, hidden: int = 768, batch: int = 8, seq_choices=(256, 512, 768, 1024),
                  vocab: int = 50304, seed: int = 0, name: str = "synthetic training loop") -> Trace:
    """A transformer-training-shaped stream: weights and optimizer state live throughout; each step
    allocates per-layer activations (sequence length varies), frees them in reverse during backward,
    with short-lived temporaries and small tensors in between."""
    rng = random.Random(seed)
    tb = TraceBuilder(name)
    per_layer_w = 12 * hidden * hidden * 4
    weights = [tb.alloc(per_layer_w // 4) for _ in range(4 * layers)]
    emb = tb.alloc(vocab * hidden * 4)
    opt = []
    for step in range(steps):
        T = rng.choice(seq_choices)
        tok = batch * T
        acts = []
        x = tb.alloc(tok * 8)
        for _ in range(layers):
            for mult in (1, 3, 1, 4, 4, 1):
                acts.append(tb.alloc(tok * hidden * 4 * mult // 4 + rng.randrange(0, 4) * 512))
                tmp = tb.alloc(tok * hidden * 4)
                small = tb.alloc(rng.choice((512, 2048, 4096, 65536)))
                tb.free(tmp)
                tb.free(small)
        logits = tb.alloc(tok * vocab * 4)
        grad_logits = tb.alloc(tok * vocab * 4)
        tb.free(logits)
        grads = []
        for a in reversed(acts):
            g = tb.alloc(tok * hidden * 4)
            tb.free(a)
            tb.free(g)
        tb.free(grad_logits)
        tb.free(x)
        for w in weights[:8]:
            grads.append(tb.alloc(per_layer_w // 4))
        if not opt:
            opt = [tb.alloc(per_layer_w // 4) for _ in range(2 * len(weights))]
        for g in grads:
            tb.free(g)
    for a in opt + weights + [emb]:
        tb.free(a)
    return tb.build()


def fragmentation_pattern(name: str = "fragmentation pattern") -> Trace:
    """The pattern of the recorded fragmentation OOM: 5 x 1 GiB freed, refilled by 1000 MiB tensors whose
    24 MiB tails then hold 20 MiB tensors, the 1000 MiB tensors freed, then 2 GiB requested."""
    tb = TraceBuilder(name)
    first = [tb.alloc(GiB) for _ in range(5)]
    for a in first:
        tb.free(a)
    big = [tb.alloc(1000 * MiB) for _ in range(5)]
    keep = [tb.alloc(20 * MiB) for _ in range(5)]
    for a in big:
        tb.free(a)
    tb.alloc(2 * GiB)
    del keep
    return tb.build()


def growth(steps: int = 30, per_step: int = 200 * MiB, name: str = "leak: losses kept with their graph") -> Trace:
    """Each step keeps part of its activations alive (a leak): allocated memory grows step by step."""
    tb = TraceBuilder(name)
    for _ in range(steps):
        tmp = [tb.alloc(per_step // 4) for _ in range(4)]
        kept = tb.alloc(per_step // 2)
        for t in tmp:
            tb.free(t)
        del kept
    return tb.build()


def to_snapshot(trace: Trace, conf: str = "", *, cap_bytes: int | None = None, end_empty_cache: bool = False) -> dict:
    """Run ``trace`` through the simulator under ``conf`` and write what PyTorch would record: a
    ``torch.cuda.memory._snapshot()``-shaped dict (segments at the end, one device trace). A model of
    a recording, for tests and demos without a GPU."""
    cfg = parse_alloc_conf(conf)
    sim = CachingAllocatorSim(cfg, cap_bytes=cap_bytes)
    sim.rec = []
    run_ops(sim, trace.ops, trace.n_ids, force_generic=True)
    if end_empty_cache:
        sim.empty_cache()
    segs = []
    for s in sim.segments():
        segs.append({"device": 0, "address": s["address"], "total_size": s["total_size"], "stream": s["stream"],
                     "segment_type": s["segment_type"], "allocated_size": s["allocated_size"],
                     "active_size": s["allocated_size"], "requested_size": 0, "is_expandable": s["is_expandable"],
                     "segment_pool_id": (0, 0), "blocks": [dict(b, frames=[]) for b in s["blocks"]]})
    trace_entries = [dict(e, time_us=i, frames=[]) for i, e in enumerate(sim.rec)]
    return {"segments": segs, "device_traces": [trace_entries],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf, "expandable_segments": cfg.expandable_segments}}
