"""When does the token routing of a mixture-of-experts model change its peak? Fake mode answers
for each way Hugging Face runs the experts (``experts_implementation``), under several assumed
routings (:class:`labkit.core.vocab.MoeRouting`), and :func:`routing_section` shows it (notebook 04).

* ``grouped_mm`` (transformers' default) and ``batched_mm`` run every token's top-k rows at once:
  the same tensors, hence the same peak, whatever the routing.
* ``eager`` loops over the experts hit and runs each on its own rows: what backward keeps sums to
  tokens x top-k rows, but the transients of one expert's backward grow with that expert's rows. The
  autograd engine runs the ready node of the highest sequence number first (``engine.cpp``, its
  ready queue), so the experts' backward runs in reverse loop order, and the expert last in the loop
  adds its transients on top of everything the layer saved; by the turn of the first one, the others'
  saved tensors are freed. The peak moves with the routing, most with the share of the last expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core.vocab import MoeRouting

IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")
ROUTINGS = ("balanced", "0.5,0.2,0.15,0.15", "0.15,0.15,0.2,0.5")   # a hot expert first, then last
SMOKE = dict(micro_batch=2, seq=128, hidden=32, intermediate=1024)    # the CI size (seconds)


@dataclass(frozen=True)
class RoutingPoint:
    """One fake-mode step of the MoE model under one implementation and one assumed routing."""

    implementation: str
    routing: str
    rows: tuple[int, ...]          # rows (token-expert pairs) per expert under the routing
    peak_bytes: int
    peak_phase: str
    assumptions: tuple[str, ...]


def moe_case(implementation: str, *, micro_batch: int = 4, seq: int = 256, hidden: int = 64,
             intermediate: int = 1024, experts: int = 4, top_k: int = 2, layers: int = 1) -> Any:
    """A small Mixtral whose experts dominate the step (wide experts, small vocabulary)."""
    from labkit.workloads.corpus import Case

    overrides = dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=experts,
                     num_experts_per_tok=top_k, vocab_size=128, max_position_embeddings=max(seq, 128),
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, experts_implementation=implementation)
    return Case(f"moe-routing-{implementation}", "transformers", "mixtral", "causal-lm", overrides, micro_batch,
                seq, "fp32")


def routing_sweep(*, implementations: tuple[str, ...] = IMPLEMENTATIONS, routings: tuple[str, ...] = ROUTINGS,
                  **size: Any) -> list[RoutingPoint]:
    """Fake-mode peaks of :func:`moe_case` for every implementation and routing (one step each)."""
    from labkit.memory.trace.moe import expert_rows
    from labkit.memory.trace.step import FakeCuda
    from labkit.workloads.corpus import predict

    points = []
    for impl in implementations:
        case = moe_case(impl, **size)
        o = case.overrides
        for text in routings:
            routing = MoeRouting.parse(text)
            rows, _ = expert_rows(routing, case.micro_batch * case.seq, o["num_experts_per_tok"],
                                  o["num_local_experts"])
            rep = predict(case, steps=1, fake=FakeCuda(moe_routing=routing))
            points.append(RoutingPoint(impl, routing.text(), tuple(rows), rep.peak_bytes, rep.peak_phase,
                                       tuple(a for a in rep.emulation["assumptions"] if a.startswith("MoE routing"))))
    return points


def spread(points: list[RoutingPoint], implementation: str) -> int:
    """Largest minus smallest peak of one implementation over the routings."""
    peaks = [p.peak_bytes for p in points if p.implementation == implementation]
    return max(peaks) - min(peaks) if peaks else 0


def routing_section(points: list[RoutingPoint] | None = None, *, smoke: bool = False) -> Any:
    """Notebook 04: the peak of each experts implementation under balanced and skewed routings."""
    from labkit.core.units import fmt_bytes
    from labkit.viz.section import Section

    size: dict[str, Any] = dict(SMOKE) if smoke else {}
    pts = points if points is not None else routing_sweep(**size)
    base = {p.implementation: p.peak_bytes for p in pts if p.routing == "balanced"}
    src = "model: fake mode computed here (the routing is an assumption, not a measurement)"
    sec = Section("MoE routing: when the token distribution changes the peak", source=src)
    if "grouped_mm" in base:
        sec.claim("grouped_mm (transformers' default): peak spread over the routings", spread(pts, "grouped_mm"),
                  "bytes", name="moe_grouped_mm_peak_spread_bytes")
    if "eager" in base:
        sec.claim("eager per-expert loop: peak spread over the routings", spread(pts, "eager"), "bytes",
                  name="moe_eager_peak_spread_bytes")
    rows = []
    for p in pts:
        ref = base.get(p.implementation)
        change = "" if ref is None or p.routing == "balanced" else f"{(p.peak_bytes - ref) / ref * 100:+.2f}%"
        rows.append([p.implementation, p.routing, ", ".join(str(r) for r in p.rows), fmt_bytes(p.peak_bytes),
                     p.peak_phase, change])
    case = moe_case("eager", **size)
    o = case.overrides
    sec.table(["experts implementation", "routing (shares by expert)", "rows per expert", "peak", "phase",
               "vs balanced"], rows,
              caption=f"Mixtral, {o['num_hidden_layers']} layer, {o['num_local_experts']} experts, top-"
                      f"{o['num_experts_per_tok']}, hidden {o['hidden_size']}, experts' width "
                      f"{o['intermediate_size']}, {case.micro_batch} x {case.seq} tokens, fp32; {src}")
    sec.note("grouped_mm and batched_mm run all tokens x top-k rows at once: the routing decides which rows go "
             "where, not how large the tensors are. The eager loop runs each expert on its own rows; autograd "
             "runs the experts' backward in reverse loop order, so the expert last in the loop adds its "
             "transients on top of everything the layer saved: its share moves the peak most, the same share "
             "on the first expert much less.")
    sec.note("Give your own distribution with labkit measure --moe-routing SHARES (measure_step(moe_routing=...)); "
             "the report names the routing it assumed and the modules that used it.")
    return sec
