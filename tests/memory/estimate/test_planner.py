"""The planner: valid layouts only, memory margin honoured, ranking by the stated time model,
explanations, topology-derived links, and the speed target."""

from __future__ import annotations


import pytest

from labkit.core.errors import LabkitError
from labkit.core.units import GiB
from labkit.memory.estimate import ParallelSpec, TrainSpec, estimate
from labkit.memory.estimate.planner import (Cluster, LinkSpec, cluster_from_topology, explain, h100_cluster, plan, step_time,
                                   training_flops_per_token, uniform_cluster)
from labkit.memory.estimate.presets import get_preset


def test_every_ranked_layout_fits_and_is_valid():
    m = get_preset("llama3-8b")
    cl = h100_cluster(16)
    p = plan(m, cl, 64, margin=0.1)
    assert p.fitting > 0 and p.best is not None
    for c in p.ranked:
        assert c.tp * c.pp * c.dp == 16
        assert m.heads % c.tp == 0 and m.layers % c.pp == 0 and 64 % (c.micro_batch * c.dp) == 0
        assert c.total_bytes <= p.usable_bytes == int(cl.gpu_memory_bytes * 0.9)
        # the memory figure is the estimator's
        e = estimate(m, ParallelSpec(tp=c.tp, pp=c.pp, dp=c.dp, zero=c.zero, sp=c.sp),
                     TrainSpec(micro_batch=c.micro_batch, global_batch=64, recompute=c.recompute, framework="megatron"))
        assert e.total == c.total_bytes
    times = [c.step_time_s for c in p.ranked]
    assert times == sorted(times)
    assert p.considered == p.fitting + sum(p.rejected.values())


def test_margin_and_memory_rejections():
    m = get_preset("llama2-70b")
    small = uniform_cluster("8 x 24 GiB", 8, 8, 24 * GiB, LinkSpec(25e9, 5e-6), LinkSpec(12e9, 10e-6))
    p = plan(m, small, 32)
    assert p.fitting == 0 and p.best is None
    assert p.rejected["does not fit in memory"] > 0
    text = "\n".join(explain(p))
    assert "No layout" in text and "does not fit in memory" in text and "usable" in text
    # a tighter margin never admits more layouts
    m8 = get_preset("llama3-8b")
    cl = h100_cluster(8)
    assert plan(m8, cl, 32, margin=0.3).fitting <= plan(m8, cl, 32, margin=0.05).fitting


def test_slow_links_push_tensor_parallelism_inside_fast_groups():
    """On a PCIe box with NVLink pairs, TP beyond 2 pays the PCIe price."""
    m = get_preset("llama3-8b")
    fast = uniform_cluster("nvswitch", 8, 8, 80 * GiB, LinkSpec(450e9, 3e-6), LinkSpec(50e9, 5e-6))
    pairs = Cluster("pairs", 8, 8, 80 * GiB, {2: LinkSpec(100e9, 3e-6), 4: LinkSpec(16e9, 8e-6), 8: LinkSpec(16e9, 8e-6)},
                    LinkSpec(12e9, 10e-6))
    par = ParallelSpec(tp=8, dp=1, sp=True)
    train = TrainSpec(micro_batch=1, global_batch=8, recompute="selective")
    assert step_time(m, par, train, pairs, 8).tp_s > 5 * step_time(m, par, train, fast, 8).tp_s
    best = plan(m, pairs, 64).best
    assert best is not None and best.tp <= 2


def test_cluster_from_topology_sample():
    cl = cluster_from_topology("h100_nv18_8gpu_dual_numa", nodes=8, gpu_memory_bytes=80 * GiB)
    assert cl.gpus == 64 and cl.gpus_per_node == 8
    assert cl.link(8, 8).bandwidth_Bps == pytest.approx(450e9)
    assert cl.link(8, 16) is cl.inter
    with pytest.raises(LabkitError):
        cluster_from_topology("h100_nv18_8gpu_dual_numa")  # the sample does not say the memory


def test_flops_per_token_matches_6N_plus_attention():
    m = get_preset("gpt3-175b")
    f = training_flops_per_token(m, 2048, "none")
    six_n = 6 * 174.6e9
    assert six_n < f < six_n * 1.1
    assert training_flops_per_token(m, 2048, "full") == pytest.approx(f * 4 / 3, rel=1e-9)


def test_explain_lists_top_choices_and_rejections():
    p = plan(get_preset("llama3-8b"), h100_cluster(16), 64)
    lines = explain(p, top=3)
    assert lines[0].startswith("1. ") and "ms/step" in lines[0] and "GiB" in lines[0]
    assert any(l.startswith("rejected") for l in lines)
    assert "slower than the best" in lines[1]


def test_invalid_inputs():
    with pytest.raises(LabkitError):
        plan(get_preset("gpt2"), h100_cluster(8), 0)
    with pytest.raises(LabkitError):
        plan(get_preset("gpt2"), h100_cluster(8), 8, margin=1.5)
    with pytest.raises(LabkitError):
        uniform_cluster("bad", 12, 8, GiB, LinkSpec(1e9, 1e-6), LinkSpec(1e9, 1e-6))


def test_70b_on_64_gpus_considers_the_whole_space():
    """The search covers the layouts (its speed target, < 1 s, is benchmarks/bench_estimate.py's)."""
    p = plan(get_preset("llama2-70b"), h100_cluster(64), 512)
    assert p.considered > 500 and p.fitting > 0


def _divisors_by_scan(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def test_search_is_bounded_and_absurd_cluster_sizes_are_refused():
    from labkit.memory.estimate import planner

    for n in (1, 2, 12, 64, 97, 360, 1024, 5040):
        assert planner._divisors(n) == _divisors_by_scan(n)
    m = get_preset("llama2-70b")
    with pytest.raises(LabkitError, match=r"1000000000 GPUs is more than the planner searches \(up to 1048576\)"):
        plan(m, h100_cluster(gpus=1_000_000_000), 512)
    # the largest accepted size still plans: shapes refused by heads/layers are counted, not built
    p = plan(m, h100_cluster(gpus=planner.PLAN_MAX_GPUS), planner.PLAN_MAX_GPUS)
    assert p.best is not None and p.considered == p.fitting + sum(p.rejected.values())
    assert p.rejected.get("layers not divisible by pp", 0) > 0


def test_shape_rejections_counted_in_bulk_match_one_by_one():
    """tp=3 does not divide 64 heads, pp=3 does not divide 80 layers: every (ZeRO, micro-batch, recompute)
    of such a shape is one rejection, as when each was built."""
    m = get_preset("llama2-70b")
    p = plan(m, h100_cluster(gpus=48, gpus_per_node=8), 48)
    per_layout = 4 * 3  # micro-batches x recompute policies (defaults)
    shapes = [(tp, pp) for tp in (1, 2, 3, 4, 6, 8) for pp in _divisors_by_scan(48 // tp)]
    def zeros(tp, pp):
        return 1 if 48 // (tp * pp) == 1 else 4
    bad_heads = sum(zeros(tp, pp) * per_layout for tp, pp in shapes if 64 % tp)
    bad_layers = sum(zeros(tp, pp) * per_layout for tp, pp in shapes if 80 % pp and not 64 % tp)
    assert p.rejected["heads not divisible by tp"] == bad_heads
    assert p.rejected["layers not divisible by pp"] == bad_layers
    assert p.considered == sum(zeros(tp, pp) * per_layout for tp, pp in shapes)
    ex = p.examples["layers not divisible by pp"]
    assert 80 % ex.pp and ex.reason == f"layers 80 not divisible by pp {ex.pp}"
