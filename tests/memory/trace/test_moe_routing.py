"""MoE routing in fake mode: the data-dependent shapes of expert dispatch come from a stated routing
(balanced by default, or the user's shares), exactly as a real run routed that way allocates; where the
memory does not depend on the routing (grouped_mm), it says so and the peak does not move."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn as nn
import torch.nn.functional as F
import transformers

from labkit.core.errors import LabkitError
from labkit.core.vocab import MoeRouting, OptimizerSpec
from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.fake.moe import expert_rows, rows_text
from labkit.lessons.recompute_precision import routing_section
from labkit.memory.trace.moe_sweep import ROUTINGS, SMOKE, routing_sweep, spread
from labkit.memory.trace.step import FakeCuda, Probes, measure_step
from labkit.workloads import StepPolicy
from labkit.workloads.hf import hf_lm_batch

V, B, S, E, K = 128, 2, 16, 4, 2
T = B * S
# fused AdamW: its step counters are device tensors (foreach's are host scalars a real CPU run's tracker misses)
FUSED = OptimizerSpec("adamw", "fused")


# -- the arithmetic -------------------------------------------------------------------------------

def test_balanced_rows_with_the_remainder_on_the_first_experts():
    assert expert_rows(MoeRouting(), 64, 2, 4) == ([32, 32, 32, 32], [])
    rows, notes = expert_rows(MoeRouting(), 10, 2, 3)
    assert rows == [7, 7, 6] and sum(rows) == 20 and notes == []
    assert rows_text(rows) == "6 each, 7 for experts 0-1" and rows_text([32] * 4) == "32 each"


def test_shares_round_by_largest_remainder_and_cap_at_one_row_per_token():
    rows, notes = expert_rows(MoeRouting((0.4, 0.3, 0.2, 0.1)), 64, 2, 4)
    assert rows == [51, 38, 26, 13] and sum(rows) == 128 and notes == []
    # top-2: an expert takes each token at most once, so 0.7 of 128 rows (89.6) is capped at the 64 tokens
    rows, notes = expert_rows(MoeRouting((0.7, 0.1, 0.1, 0.1)), 64, 2, 4)
    assert rows[0] == 64 and sum(rows) == 128 and max(rows[1:]) - min(rows[1:]) <= 1
    assert len(notes) == 1 and "expert 0" in notes[0] and "capped at 64 rows" in notes[0]
    rows, notes = expert_rows(MoeRouting((1.0, 0.0, 0.0, 0.0)), 8, 2, 4)
    assert rows[0] == 8 and sum(rows) == 16 and any("share is 0" in n for n in notes)


@pytest.mark.parametrize("text, shares", [("balanced", None), (" balanced ", None), ("0.5,0.5", (0.5, 0.5)),
                                          ("1,1,1,1", None), ("0.333,0.333,0.333", (1 / 3,) * 3)])
def test_routing_spellings(text, shares):
    if text == "1,1,1,1":
        with pytest.raises(LabkitError, match="sum to 4"):
            MoeRouting.parse(text)
        return
    r = MoeRouting.parse(text)
    assert r.shares is None if shares is None else all(math.isclose(a, b) for a, b in zip(r.shares, shares))


@pytest.mark.parametrize("value, msg", [
    ("", "share 0 ('') is not a number"), ("0.5,abc", "share 1 ('abc') is not a number"),
    ("-0.2,1.2", "share 0 (-0.2) is negative"), ("nan,1", "is not a finite number"),
    ("1e400,0", "is not a finite number"), ("0.5,0.4", "sum to 0.9, not 1"), ("balance", "is not a number"),
    ([], "give one share per expert"), ([0.5, "x"], "share 1 ('x') is not a finite number"),
    ([True, False], "share 0 (True)"), (7, "must be balanced or shares"), (("0.5", "0.5"), "is not a finite"),
])
def test_malformed_routing_is_one_line_naming_the_input(value, msg):
    with pytest.raises(LabkitError) as e:
        MoeRouting.parse(value)
    text = str(e.value)
    assert msg in text and text.startswith("moe routing") and "\n" not in text


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.one_of(st.text(alphabet="0123456789.,-+eEinfa balced\n", max_size=30),
                 st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6)))
def test_any_routing_input_is_a_valid_distribution_or_one_line(value):
    try:
        r = MoeRouting.parse(value)
    except LabkitError as e:
        assert str(e).startswith("moe routing") and "\n" not in str(e)
        return
    if r.shares is not None:
        assert all(x >= 0 and math.isfinite(x) for x in r.shares) and math.isclose(sum(r.shares), 1.0)
        k = min(2, len(r.shares))        # top-k routing: every token to k distinct experts
        rows, _ = expert_rows(r, 7, k, len(r.shares))
        assert sum(rows) == 7 * k and 0 <= min(rows) and max(rows) <= 7


# -- a model whose real routing is known ----------------------------------------------------------------

def assignment(rows: list[int], tokens: int, top_k: int) -> list[list[int]]:
    """Each token's top-k experts such that expert e receives rows[e] rows (distinct experts per token)."""
    left = list(rows)
    out = []
    for _ in range(tokens):
        pick = sorted(range(len(left)), key=lambda e: (-left[e], e))[:top_k]
        for e in pick:
            left[e] -= 1
        out.append(pick)
    assert all(x == 0 for x in left)
    return out


class FixedRouter(nn.Module):
    """Mixtral's router with a fixed per-token preference added to its logits: on real tensors it
    routes exactly as ``choice`` says; in fake mode its ``topk`` is a routing decision like any other."""

    def __init__(self, gate: nn.Module, choice: list[list[int]]) -> None:
        super().__init__()
        self.top_k, self.hidden_dim, self.weight = gate.top_k, gate.hidden_dim, gate.weight
        prefs = torch.zeros(len(choice), gate.num_experts)
        for t, experts in enumerate(choice):
            for e in experts:
                prefs[t, e] = 100.0
        self.register_buffer("prefs", prefs)

    def forward(self, hidden_states):
        h = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(h, self.weight) + self.prefs
        probs = F.softmax(logits.float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        return logits, top / top.sum(dim=-1, keepdim=True), idx


def mixtral(impl: str, choice: list[list[int]] | None = None, layers: int = 1):
    def build():
        cfg = transformers.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=256, num_hidden_layers=layers,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=E,
                                         num_experts_per_tok=K, use_cache=False, max_position_embeddings=64)
        cfg._attn_implementation = "sdpa"
        cfg._experts_implementation = impl
        m = transformers.MixtralForCausalLM(cfg)
        if choice is not None:
            for layer in m.model.layers:
                layer.mlp.gate = FixedRouter(layer.mlp.gate, choice)
        return m
    return build


def _batch():
    b = hf_lm_batch(V, B, S)
    return {k: v for k, v in b.items() if k != "attention_mask"}


@pytest.mark.parametrize("routing", ["balanced", "0.375,0.25,0.25,0.125", "0.5,0,0.25,0.25"])
def test_eager_experts_allocate_exactly_as_a_real_run_routed_that_way(routing):
    """Fake mode (plain CPU kernels) under the assumed routing counts what a real CPU run whose router
    routes exactly so allocates, op for op: the per-expert loop's shapes come from the routing (an
    expert with share 0 is not hit and its loop iteration does not run)."""
    r = MoeRouting.parse(routing)
    rows, _ = expert_rows(r, T, K, E)
    choice = assignment(rows, T, K)
    real = measure_step(mixtral("eager", choice), _batch(), StepPolicy(optimizer=FUSED), device="cpu", steps=1,
                        probes=Probes(rounding=512))
    fake = measure_step(mixtral("eager", choice), _batch(), StepPolicy(optimizer=FUSED), device="fake-cuda", steps=1,
                        fake=FakeCuda(target=CudaTarget.plain(), moe_routing=r))
    assert fake.phase_peaks == real.phase_peaks
    assert fake.by_category == real.by_category
    (text,) = [a for a in fake.emulation["assumptions"] if a.startswith("MoE routing")]
    assert f"{T} tokens x top-{K} = {T * K} rows over {E} experts, {rows_text(rows)}" in text
    assert fake.emulation["moe_routing"]["assumed"] == r.text()


def test_grouped_mm_peak_ignores_the_routing_while_the_eager_loop_peak_moves():
    """The notebook section at its smoke size: grouped_mm and batched_mm have one peak whatever the
    routing; the eager loop's moves, most with the share of the expert the loop runs last."""
    pts = routing_sweep(**SMOKE)
    balanced, hot_first, hot_last = ROUTINGS
    assert spread(pts, "grouped_mm") == 0 and spread(pts, "batched_mm") == 0
    for p in pts:
        if p.implementation != "eager":
            assert len(p.assumptions) == 1 and "does not depend on how tokens are routed" in p.assumptions[0]
    eager = {p.routing: p.peak_bytes for p in pts if p.implementation == "eager"}
    # autograd runs the experts' backward in reverse loop order: the last expert's transients come on
    # top of everything the layer saved, so its share (0.5 > 0.25) raises the peak; first, it costs less
    assert eager[hot_last] > eager[balanced] and eager[hot_last] > eager[hot_first]
    sec = routing_section(pts, smoke=True)
    claims = {c.name: c.value for c in sec.claims}
    assert claims["moe_grouped_mm_peak_spread_bytes"] == 0
    assert claims["moe_eager_peak_spread_bytes"] == spread(pts, "eager") > 0
    assert len(sec.rows) == 9 and sec.rows[0][:2] == ["grouped_mm", "balanced"]
    assert sec.rows[1][2] == "256, 102, 77, 77" and sec.rows[-1][5].startswith("+")


def test_batched_mm_is_routing_independent_and_says_so():
    rep = measure_step(mixtral("batched_mm"), _batch(), steps=1, fake=FakeCuda(moe_routing="0.7,0.1,0.1,0.1"))
    rep2 = measure_step(mixtral("batched_mm"), _batch(), steps=1)
    assert rep.peak_bytes == rep2.peak_bytes
    (text,) = [a for a in rep.emulation["assumptions"] if a.startswith("MoE routing")]
    assert "as given (0.7,0.1,0.1,0.1)" in text and "batched_mm" in text and "does not depend" in text


@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
def test_a_wrong_number_of_shares_is_one_line_naming_the_input(impl):
    with pytest.raises(LabkitError) as e:
        measure_step(mixtral(impl), _batch(), steps=1, fake=FakeCuda(moe_routing="0.5,0.3,0.2"))
    msg = str(e.value)
    assert "moe routing '0.5,0.3,0.2'" in msg and "3 shares given" in msg and "4 experts" in msg and "\n" not in msg


def test_routing_is_refused_where_the_real_routing_decides():
    with pytest.raises(LabkitError, match="moe_routing applies to device 'fake-cuda'"):
        measure_step(mixtral("eager"), _batch(), device="cpu", fake=FakeCuda(moe_routing="balanced"))


# -- a user's own MoE: bincount counts, .tolist() splits ------------------------------------------------

class CountedMoe(nn.Module):
    """A hand-written top-k MoE as people write it: tokens sorted by expert, ``bincount`` counts,
    ``torch.split`` by ``counts.tolist()``, one Linear per expert, ``repeat_interleave`` by the counts."""

    def __init__(self, choice: list[list[int]], dim: int = 32, experts: int = E, top_k: int = K):
        super().__init__()
        self.top_k, self.experts = top_k, experts
        self.emb = nn.Embedding(V, dim)
        self.router = nn.Linear(dim, experts)
        self.ffn = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(experts))
        self.head = nn.Linear(4 * dim, V)
        prefs = torch.zeros(len(choice), experts)
        for t, chosen in enumerate(choice):
            for e in chosen:
                prefs[t, e] = 100.0
        self.register_buffer("prefs", prefs)     # a fixed preference: the real run routes as ``choice``

    def forward(self, input_ids, labels):
        h = self.emb(input_ids).reshape(-1, self.emb.embedding_dim)
        w, idx = torch.topk(self.router(h) + self.prefs, self.top_k, dim=-1)
        flat = idx.reshape(-1)
        order = torch.sort(flat).indices
        counts = torch.bincount(flat, minlength=self.experts)
        chunks = torch.split(h[order // self.top_k], counts.tolist())
        expert_of_row = torch.repeat_interleave(torch.arange(self.experts), counts)
        out = torch.cat([self.ffn[e](x) for e, x in enumerate(chunks)]) * (expert_of_row.unsqueeze(-1) + 1)
        logits = self.head(out)
        return {"loss": F.cross_entropy(logits, labels.reshape(-1).repeat_interleave(self.top_k))}


@pytest.mark.parametrize("routing", ["balanced", "0.5,0.25,0.125,0.125"])
def test_bincount_split_and_item_counts_follow_the_routing(routing):
    r = MoeRouting.parse(routing)
    rows, _ = expert_rows(r, T, K, E)
    choice = assignment(rows, T, K)
    batch = {"input_ids": torch.randint(0, V, (B, S)), "labels": torch.randint(0, V, (B, S))}
    real = measure_step(lambda: CountedMoe(choice), batch, StepPolicy(optimizer=FUSED), device="cpu", steps=1,
                        probes=Probes(rounding=512))
    fake = measure_step(lambda: CountedMoe(choice), batch, StepPolicy(optimizer=FUSED), steps=1,
                        fake=FakeCuda(target=CudaTarget.plain(), moe_routing=r))
    assert fake.phase_peaks == real.phase_peaks
    assert any("bincount" in a for a in fake.emulation["assumptions"])


class Prefer(nn.Module):
    """A router's linear layer plus a fixed per-token preference (real runs route as ``choice``)."""

    def __init__(self, layer: nn.Linear, choice: list[list[int]]) -> None:
        super().__init__()
        self.layer = layer
        prefs = torch.zeros(len(choice), layer.out_features)
        for t, chosen in enumerate(choice):
            for e in chosen:
                prefs[t, e] = 100.0
        self.register_buffer("prefs", prefs)

    def forward(self, x):
        return self.layer(x) + self.prefs


def test_jetmoe_counts_from_a_scattered_mask_and_tolist_follow_the_routing():
    """JetMoE's gating: ``zeros.scatter(1, topk indices, 1).long().sum(0).tolist()`` gives the rows per
    expert, which ``split`` then uses (in its MLP experts and its mixture of attention heads)."""
    r = MoeRouting.parse("0.375,0.25,0.25,0.125")
    rows, _ = expert_rows(r, T, K, E)
    choice = assignment(rows, T, K)

    def build():
        cfg = transformers.AutoConfig.for_model("jetmoe", hidden_size=32, num_hidden_layers=1, num_key_value_heads=2,
                                                kv_channels=8, intermediate_size=64, num_local_experts=E,
                                                num_experts_per_tok=K, vocab_size=V, use_cache=False)
        m = transformers.AutoModelForCausalLM.from_config(cfg)
        for mod in list(m.modules()):
            if type(mod).__name__ == "JetMoeTopKGating":
                mod.layer = Prefer(mod.layer, choice)
        return m

    real = measure_step(build, _batch(), StepPolicy(optimizer=FUSED), device="cpu", steps=1,
                        probes=Probes(rounding=512))
    fake = measure_step(build, _batch(), StepPolicy(optimizer=FUSED), steps=1,
                        fake=FakeCuda(target=CudaTarget.plain(), moe_routing=r))
    assert fake.phase_peaks == real.phase_peaks
    assert any("JetMoeTopKGating" in a and "24, 16, 16, 8" in a for a in fake.emulation["assumptions"])


def test_data_dependent_ops_outside_an_expert_dispatch_are_still_refused():
    class Picky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x[torch.bincount(x.argmax(-1)) > 0]).sum()

    with pytest.raises(LabkitError) as e:
        measure_step(Picky, torch.randn(8, 8), loss_fn=lambda out, b: out)
    assert "aten.bincount" in str(e.value) and "module Picky" in str(e.value)
