"""When does the token routing of a mixture-of-experts model change its peak? Fake mode answers
for each way Hugging Face runs the experts (``experts_implementation``), under several assumed
routings (:class:`labkit.core.vocab.MoeRouting`): :func:`routing_sweep` (notebook 04 shows it:
:func:`labkit.lessons.recompute_precision.routing_section`).

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
from labkit.memory.trace.fake.moe import expert_rows
from labkit.memory.trace.step import FakeCuda
from labkit.workloads.corpus import Case, predict


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
    overrides = dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=experts,
                     num_experts_per_tok=top_k, vocab_size=128, max_position_embeddings=max(seq, 128),
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, experts_implementation=implementation)
    return Case(f"moe-routing-{implementation}", "transformers", "mixtral", "causal-lm", overrides, micro_batch,
                seq, "fp32")


def routing_sweep(*, implementations: tuple[str, ...] = IMPLEMENTATIONS, routings: tuple[str, ...] = ROUTINGS,
                  **size: Any) -> list[RoutingPoint]:
    """Fake-mode peaks of :func:`moe_case` for every implementation and routing (one step each)."""
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
