"""The settings beside the layout: the allocator configuration (from a replay of the traced step
under candidate ``PYTORCH_ALLOC_CONF`` values) and DDP's bucket size (from the comm chapter's
bucket simulator on the data-parallel group's link)."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.units import MiB
from labkit.memory.estimate import total_params

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

# The allocator settings worth trying for a training step (labkit.allocator simulates each), among the options of
# PYTORCH_ALLOC_CONF that PyTorch documents in its CUDA semantics notes (memory management):
# https://docs.pytorch.org/docs/stable/notes/cuda.html
ALLOC_CANDIDATES = ("", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4")
BUCKET_SIZES_MB = (1, 5, 10, 25, 50, 100, 200)


@dataclass
class AllocChoice:
    conf: str                             # "" is PyTorch's default
    reason: str
    source: str
    replay: dict[str, dict[str, int]]     # conf -> {reserved_peak, segments, peak_allocated} (empty: no trace)


def choose_alloc_conf(reserved_by_conf: dict[str, dict[str, int]] | None) -> AllocChoice:
    """The candidate with the lowest replayed reserved peak; the default unless another saves more
    than 1% (a setting that changes nothing measurable is not worth a line in the launch command)."""
    if not reserved_by_conf:
        return AllocChoice("", "no allocation stream to replay (the model was not traced): PyTorch's default; "
                           "trace the model (--hf-config or --factory) for evidence", "none", {})
    default = reserved_by_conf.get("", next(iter(reserved_by_conf.values())))
    best_conf, best = min(reserved_by_conf.items(), key=lambda kv: (kv[1]["reserved_peak"], kv[0] != ""))
    base = default["reserved_peak"]
    if best_conf == "" or best["reserved_peak"] >= base * 0.99:
        return AllocChoice("", f"the default reserves {base / 1e9:.2f} GB at the step's peak; no candidate saves "
                           "more than 1% in the replay", "model: fake-mode trace replayed through the allocator "
                           "simulator", reserved_by_conf)
    saved = base - best["reserved_peak"]
    return AllocChoice(best_conf, f"reserves {best['reserved_peak'] / 1e9:.2f} GB vs {base / 1e9:.2f} GB with the "
                       f"default ({saved / 1e9:.2f} GB less) in the replay of the traced step",
                       "model: fake-mode trace replayed through the allocator simulator", reserved_by_conf)


@dataclass
class BucketChoice:
    bucket_cap_mb: float | None           # None: not DDP (ZeRO/FSDP shard gradients instead)
    gradient_as_bucket_view: bool
    exposed_ms: dict[float, float]        # bucket size (MiB) -> exposed communication, simulated
    reason: str
    source: str


def grad_schedule(spec, micro_batch: int, seq: int, backward_s: float, grad_bytes: int, tp: int = 1, pp: int = 1):
    """Gradient-ready events of a decoder LM described by a ModelSpec (this rank's share): the LM head
    first, then the layers from the last to the first, then the embeddings; each after its share of
    backward's FLOPs (a layer's matmuls, the head's)."""
    from labkit.comm.simulate import GradEvent

    h, L = spec.hidden, max(1, spec.layers // pp)
    per_layer = (total_params(spec) - spec.vocab * h * (1 if spec.tied_embeddings else 2)
                 - (spec.seq * h if spec.learned_pos_emb else 0)) // spec.layers
    head = spec.vocab * h
    tokens = micro_batch * seq
    flops = [("lm_head", head, 2 * tokens * head)] + [(f"layer{i}", per_layer, 2 * tokens * per_layer)
                                                       for i in reversed(range(L))]
    flops.append(("embedding", 0 if spec.tied_embeddings else head, tokens * h))
    total = sum(f for _, _, f in flops) or 1
    t, events = 0.0, []
    for name, n, f in flops:
        t += backward_s * f / total
        if n:
            events.append(GradEvent(name, int(n * grad_bytes / tp), t))
    if spec.tied_embeddings:
        events.append(GradEvent("tied embedding", int(head * grad_bytes / tp), t))
    return events


def choose_buckets(spec, layout, job, cluster, backward_s: float) -> BucketChoice:
    from labkit.comm.simulate import LinkModel, best_size, sweep

    if layout.dp == 1:
        return BucketChoice(None, True, {}, "one data-parallel replica: no gradient all-reduce to bucket", "none")
    if layout.zero >= 1:
        return BucketChoice(None, False, {}, f"ZeRO-{layout.zero}/FSDP reduce-scatters gradients per unit: DDP "
                            "buckets do not apply (keep FSDP's default backward prefetch of one unit)", "none")
    lk = cluster.link(layout.dp, layout.tp * layout.dp)
    nodes = max(1, (layout.tp * layout.dp) // cluster.gpus_per_node)
    link = LinkModel(gpus_per_node=layout.dp // nodes if nodes > 1 else layout.dp, nodes=nodes,
                     intra_bw_GBps=lk.bandwidth_Bps / 1e9, intra_latency_us=lk.latency_s * 1e6,
                     inter_bw_GBps=cluster.inter.bandwidth_Bps / 1e9, inter_latency_us=cluster.inter.latency_s * 1e6)
    g = 4 if job.precision in ("fp32", "amp-bf16", "amp-fp16") else 2
    events = grad_schedule(spec, layout.micro_batch, job.seq, backward_s, g, layout.tp, layout.pp)
    pts = sweep(events, BUCKET_SIZES_MB, link)
    best = best_size(pts)
    exposed = {p.bucket_cap_mb: round(p.exposed_ms, 3) for p in pts}
    default = next(p for p in pts if p.bucket_cap_mb == 25)
    why = (f"{best.bucket_cap_mb:g} MiB leaves {best.exposed_ms:.2f} ms of the all-reduce exposed after backward "
           f"({default.exposed_ms:.2f} ms at the default 25 MiB) on {lk.name or 'the DP link'}; "
           f"gradient_as_bucket_view=True saves one gradient-sized copy ({sum(e.bytes for e in events) / MiB:,.0f} MiB)")
    return BucketChoice(float(best.bucket_cap_mb), True, exposed, why,
                        "model: labkit.comm.simulate bucket simulator on the topology's link (alpha-beta)")
