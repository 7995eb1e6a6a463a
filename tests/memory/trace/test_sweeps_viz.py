import pytest

from labkit.core.errors import LabkitError
from labkit.memory.trace.recorded import load_recorded, recorded_label
from labkit.memory.trace.sweeps import recorded_sweep, run_sweep, segment_lengths
from labkit.workloads import GPT
from labkit.workloads.gpt import GPTConfig
from labkit.workloads.harness import gpt_batch, gpt_call, gpt_loss


def test_segment_lengths():
    assert segment_lengths(12) == [1, 2, 3, 4, 6, 12]
    assert segment_lengths(12, [2, 5, 20]) == [2, 5]
    with pytest.raises(LabkitError):
        segment_lengths(0)
    with pytest.raises(LabkitError):
        segment_lengths(4, [0])


def test_fake_sweep_orders_checkpointing_as_expected():
    cfg = GPTConfig(n_layer=4, n_head=2, n_embd=128, seq_len=256, vocab_size=256)
    pts = run_sweep(lambda: GPT(cfg), gpt_batch(cfg, 4), [("fp32", "none"), ("fp32", "full"), ("fp32", "every-2")],
                    device="fake-cuda", kw={"loss_fn": gpt_loss, "call": gpt_call})
    none, full, every2 = pts
    assert full.beyond_states_bytes < none.beyond_states_bytes
    assert every2.beyond_states_bytes < none.beyond_states_bytes
    assert none.model_state_bytes == full.model_state_bytes > 3 * cfg.num_params * 4 * 0.9   # params + 2 moments
    assert [p.label for p in pts] == ["none", "full", "every-2"]


def _texts(fig) -> str:
    """A figure's title and the source line under it."""
    return " ".join([fig.title.text] + [getattr(b, "text", "") for b in fig.below])


def test_recorded_sweeps_and_figures():
    from labkit.viz import trace as vm

    doc = load_recorded("sweep_checkpointing.json", "measure_sweep")
    src = recorded_label(doc["provenance"])
    assert src.startswith("recorded on 1 x NVIDIA H200")
    pts = recorded_sweep(doc)
    assert pts[0].recompute == "none" and all(p.step_time_s > 0 for p in pts)
    fig = vm.sweep_bars([p.label for p in pts], [p.peak_bytes for p in pts], [p.step_time_s for p in pts],
                        title="t", source=src)
    assert src in _texts(fig.children[0]) and src not in fig.children[0].title.text
    pr = recorded_sweep(load_recorded("sweep_precision.json", "measure_sweep"))
    assert [p.label for p in pr] == ["fp32", "amp-bf16", "amp-fp16", "bf16"]
    # the recorded precision effects: amp keeps fp32 parameters; pure bf16 halves them
    assert pr[1].by_category["parameters"] == pr[0].by_category["parameters"]
    assert pr[3].by_category["parameters"] * 2 == pytest.approx(pr[0].by_category["parameters"], rel=0.01)
    f2 = vm.category_bars([p.label for p in pr], [p.by_category for p in pr], title="t", source=src)
    assert src in _texts(f2)
    case = load_recorded("case_gpt2-124m-amp-bf16-none.json", "measure_step")
    f3 = vm.phase_timeline(case["data"]["by_phase"], title="t", source=src)
    assert len(f3.x_range.factors) == 5
    f4 = vm.prediction_scatter(["a"], [100], [101], title="t", source="model")
    assert "model" in _texts(f4)


def test_segment_fit_recovers_the_model():
    from labkit.memory.trace.sweeps import SweepPoint, fit_segments

    L, base, boundary, layer = 24, 1e8, 3e7, 6e8
    pts = [SweepPoint(f"K={k}", "amp-bf16", f"every-{k}", 0, 0, int(base + L / k * boundary + k * layer), {}, "backward")
           for k in (1, 2, 3, 4, 6, 8, 12, 24)]
    fit = fit_segments(pts, L)
    assert fit.boundary == pytest.approx(boundary, rel=1e-3)
    assert fit.layer == pytest.approx(layer, rel=1e-3)
    assert fit.k_star == pytest.approx((L * boundary / layer) ** 0.5, rel=1e-3)
    with pytest.raises(LabkitError, match=">= 3"):
        fit_segments(pts[:2], L)


def test_sweep_points_keep_the_policy_spelling_given():
    from labkit.memory.trace.sweeps import run_sweep
    from labkit.workloads import GPT, gpt_batch, gpt_call, gpt_loss
    from labkit.workloads.gpt import GPTConfig

    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, seq_len=16, vocab_size=64)
    pts = run_sweep(lambda: GPT(cfg), gpt_batch(cfg, 1), [("fp32", "every-1"), ("fp32", "full")], device="cpu",
                    kw={"loss_fn": gpt_loss, "call": gpt_call})
    assert [p.recompute for p in pts] == ["every-1", "full"]       # every-1 is full: the same peak
    assert pts[0].peak_bytes == pts[1].peak_bytes
