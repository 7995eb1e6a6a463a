"""Overlap simulator: exposed communication of DDP's bucketed all-reduces vs bucket size.

A model, not a measurement. Inputs:

* when each gradient becomes final during backward (:func:`gpt_grad_schedule` spreads a backward
  time, measured or assumed, over the reference GPT's layers in proportion to their FLOPs; a tied
  embedding's gradient is final only after the embedding's backward, at the very end);
* a link model (:class:`LinkModel`): GPUs per node, nodes, per-direction bandwidth and per-step latency
  inside a node and between nodes.

Buckets are filled in gradient-ready order, as DDP does after its first iteration, each closed once it
reaches the cap (the first one at ``first_bucket_bytes``). A bucket's all-reduce starts when its last
gradient is ready and the previous all-reduce has finished (one communication stream); its time is the
ring estimate :func:`labkit.core.collectives.alpha_beta_time`, across nodes limited by the slower
inter-node link. Exposed communication is what runs past the end of backward compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from labkit.core import collectives
from labkit.core.errors import LabkitError
from labkit.core.interconnect import NIC_400G_Bps, NVLINK4_NODE_Bps
from labkit.core.units import MiB


@dataclass(frozen=True)
class GradEvent:
    name: str
    bytes: int
    ready_s: float  # since the start of backward


@dataclass(frozen=True)
class LinkModel:
    gpus_per_node: int = 8
    nodes: int = 1
    intra_bw_GBps: float = NVLINK4_NODE_Bps / 1e9  # per direction, GB = 1e9 B/s (NVLink4 through NVSwitch)
    intra_latency_us: float = 5.0  # per ring step
    inter_bw_GBps: float = NIC_400G_Bps / 1e9  # per GPU per direction (a 400 Gb/s NIC per GPU)
    inter_latency_us: float = 10.0

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise LabkitError(f"LinkModel: need >= 1 GPU per node and >= 1 node, got {self.gpus_per_node} x {self.nodes}")
        if min(self.intra_bw_GBps, self.inter_bw_GBps) <= 0:
            raise LabkitError("LinkModel: bandwidths must be positive")
        if min(self.intra_latency_us, self.inter_latency_us) < 0:
            raise LabkitError("LinkModel: latencies must be >= 0")

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    def allreduce_s(self, nbytes: int) -> float:
        n = self.world
        if self.nodes == 1:
            return collectives.alpha_beta_time("all_reduce", nbytes, n, self.intra_bw_GBps * 1e9, self.intra_latency_us * 1e-6)
        bw = min(self.intra_bw_GBps, self.inter_bw_GBps) * 1e9
        return collectives.alpha_beta_time("all_reduce", nbytes, n, bw, self.inter_latency_us * 1e-6)


@dataclass
class SimPoint:
    bucket_cap_mb: float  # MiB, as DDP's bucket_cap_mb
    n_buckets: int
    backward_ms: float
    comm_ms: float  # sum of all-reduce times
    exposed_ms: float  # communication past the end of backward
    exposed_fraction: float  # exposed / (backward + exposed)
    world: int
    nodes: int


def gpt_grad_schedule(config, batch_size: int, backward_s: float, *, grad_bytes: int = 4) -> list[GradEvent]:
    """Gradient-ready times of the reference GPT's parameters for a backward lasting ``backward_s``."""
    if backward_s <= 0:
        raise LabkitError(f"backward time must be positive, got {backward_s}")
    c = config
    h, V, T, L = c.n_embd, c.vocab_size, c.seq_len, c.n_layer
    N = batch_size * T
    b = 1 if c.bias else 0
    # (segment name, [(param name, numel)] in the order autograd finishes them (a Linear's bias before
    # its weight), forward FLOPs); backward is ~2x forward, so the shares are the same
    segs: list[tuple[str, list[tuple[str, int]], float]] = [
        ("wpe", [("wpe.weight", T * h)], N * h),
        ("wte", [] if c.tie_weights else [("wte.weight", V * h)], N * h),
    ]
    for i in range(L):
        p = f"blocks.{i}."
        segs += [
            (p + "ln1", [(p + "ln1.weight", h), (p + "ln1.bias", h * b)], 5 * N * h),
            (p + "attn.qkv", [(p + "attn.qkv.bias", 3 * h * b), (p + "attn.qkv.weight", 3 * h * h)], 2 * N * 3 * h * h),
            (p + "attn.core", [], 2 * batch_size * T * T * h),
            (p + "attn.proj", [(p + "attn.proj.bias", h * b), (p + "attn.proj.weight", h * h)], 2 * N * h * h),
            (p + "ln2", [(p + "ln2.weight", h), (p + "ln2.bias", h * b)], 5 * N * h),
            (p + "mlp.fc", [(p + "mlp.fc.bias", 4 * h * b), (p + "mlp.fc.weight", 4 * h * h)], 2 * N * 4 * h * h),
            (p + "mlp.proj", [(p + "mlp.proj.bias", h * b), (p + "mlp.proj.weight", 4 * h * h)], 2 * N * 4 * h * h),
        ]
    segs += [("ln_f", [("ln_f.weight", h), ("ln_f.bias", h * b)], 5 * N * h),
             ("lm_head", [] if c.tie_weights else [("lm_head.weight", V * h)], 2 * N * h * V)]
    total_flops = sum(f for _, _, f in segs)
    events: list[GradEvent] = []
    t = 0.0
    for _, params, flops in reversed(segs):  # backward runs the forward order backwards
        t += backward_s * flops / total_flops
        events += [GradEvent(n, k * grad_bytes, t) for n, k in params if k > 0]
    if c.tie_weights:  # the shared embedding/lm_head weight is final after the embedding's backward
        events.append(GradEvent("wte.weight", V * h * grad_bytes, t))
    return events  # already in ready order


def buckets(events: Sequence[GradEvent], cap_bytes: int, first_bucket_bytes: int | None = None) -> list[tuple[int, float]]:
    """``(bytes, ready_s)`` of each bucket, filled in ready order until it reaches its cap."""
    if cap_bytes <= 0:
        raise LabkitError(f"bucket cap must be positive, got {cap_bytes} B")
    out: list[tuple[int, float]] = []
    cur, ready = 0, 0.0
    cap = first_bucket_bytes or cap_bytes
    for e in sorted(events, key=lambda e: e.ready_s):  # stable: equal times keep their order
        cur += e.bytes
        ready = max(ready, e.ready_s)
        if cur >= cap:
            out.append((cur, ready))
            cur, ready, cap = 0, 0.0, cap_bytes
    if cur:
        out.append((cur, ready))
    return out


def simulate(events: Sequence[GradEvent], bucket_cap_mb: float, link: LinkModel,
             first_bucket_mb: float | None = None) -> SimPoint:
    """Exposed communication of one bucket size (MiB) on one link model."""
    bs = buckets(events, int(bucket_cap_mb * MiB), int(first_bucket_mb * MiB) if first_bucket_mb else None)
    backward = max(e.ready_s for e in events)
    end = 0.0
    comm = 0.0
    for nbytes, ready in bs:
        d = link.allreduce_s(nbytes)
        end = max(end, ready) + d
        comm += d
    exposed = max(0.0, end - backward)
    return SimPoint(bucket_cap_mb=bucket_cap_mb, n_buckets=len(bs), backward_ms=backward * 1e3, comm_ms=comm * 1e3,
                    exposed_ms=exposed * 1e3, exposed_fraction=exposed / (backward + exposed) if backward + exposed > 0 else 0.0,
                    world=link.world, nodes=link.nodes)


def sweep(events: Sequence[GradEvent], sizes_mb: Iterable[float], link: LinkModel) -> list[SimPoint]:
    return [simulate(events, mb, link) for mb in sizes_mb]


def best_size(points: Sequence[SimPoint]) -> SimPoint:
    """The bucket size with the least exposed communication (the smallest such size on ties)."""
    if not points:
        raise LabkitError("no simulated bucket sizes")
    return min(points, key=lambda p: (round(p.exposed_ms, 9), p.bucket_cap_mb))


@dataclass
class SweepCheck:
    bucket_cap_mb: float
    gradient_as_bucket_view: bool
    measured_exposed_ms: float
    predicted_exposed_ms: float
    measured_buckets: int | None
    predicted_buckets: int


def check_against_sweep(sweep_rows: Iterable, events: Sequence[GradEvent], link: LinkModel) -> list[SweepCheck]:
    """Predicted vs measured exposed communication (step minus the no_sync step) per swept bucket size."""
    out = []
    for r in sweep_rows:
        r = r if isinstance(r, dict) else r.__dict__
        if r.get("bucket_cap_mb") is None or r.get("exposed_ms") is None:
            continue
        p = simulate(events, float(r["bucket_cap_mb"]), link)
        out.append(SweepCheck(bucket_cap_mb=float(r["bucket_cap_mb"]), gradient_as_bucket_view=bool(r["gradient_as_bucket_view"]),
                              measured_exposed_ms=float(r["exposed_ms"]), predicted_exposed_ms=p.exposed_ms,
                              measured_buckets=r.get("num_buckets"), predicted_buckets=p.n_buckets))
    return out
