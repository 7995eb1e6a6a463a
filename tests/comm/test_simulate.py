"""Overlap simulator: gradient schedule, bucketing and exposed communication (a model)."""

from __future__ import annotations

import pytest

from labkit.comm import simulate
from labkit.core import collectives
from labkit.core.errors import LabkitError
from labkit.workloads import GPT, get_workload


def test_schedule_covers_every_parameter_once():
    cfg = get_workload("tiny").config
    ev = simulate.gpt_grad_schedule(cfg, 2, 0.5)
    names = {n: p.numel() * 4 for n, p in GPT(cfg).named_parameters()}
    assert {e.name: e.bytes for e in ev} == names
    assert [e.ready_s for e in ev] == sorted(e.ready_s for e in ev)
    assert ev[-1].name == "wte.weight" and ev[-1].ready_s == pytest.approx(0.5)  # tied: final last
    assert ev[0].name.startswith("ln_f")  # backward starts at the top


def test_one_big_bucket_is_fully_exposed():
    cfg = get_workload("gpt2-124m").config
    ev = simulate.gpt_grad_schedule(cfg, 4, 0.05)
    link = simulate.LinkModel(gpus_per_node=8, nodes=1, intra_bw_GBps=450, intra_latency_us=3.4)
    p = simulate.simulate(ev, 10_000, link)
    total = sum(e.bytes for e in ev)
    assert p.n_buckets == 1
    assert p.exposed_ms == pytest.approx(collectives.alpha_beta_time("all_reduce", total, 8, 450e9, 3.4e-6) * 1e3)


def test_small_buckets_hide_communication_until_latency_dominates():
    cfg = get_workload("gpt2-124m").config
    ev = simulate.gpt_grad_schedule(cfg, 4, 0.05)
    link = simulate.LinkModel(gpus_per_node=8, nodes=4, inter_bw_GBps=25, inter_latency_us=20)
    pts = simulate.sweep(ev, [0.25, 1, 5, 25, 100, 1000], link)
    assert [p.n_buckets for p in pts] == sorted((p.n_buckets for p in pts), reverse=True)
    best = simulate.best_size(pts)
    assert best.exposed_ms < pts[-1].exposed_ms  # better than one bucket
    assert best.exposed_ms < pts[0].exposed_ms  # and better than the tiniest buckets (latency)
    assert 1 < best.bucket_cap_mb < 1000


def test_more_nodes_expose_more():
    cfg = get_workload("gpt2-124m").config
    ev = simulate.gpt_grad_schedule(cfg, 4, 0.05)
    one = simulate.simulate(ev, 25, simulate.LinkModel(8, 1))
    four = simulate.simulate(ev, 25, simulate.LinkModel(8, 4))
    assert four.exposed_ms > one.exposed_ms and four.world == 32


def test_check_against_sweep_rows():
    ev = simulate.gpt_grad_schedule(get_workload("tiny").config, 2, 0.01)
    rows = [{"bucket_cap_mb": None, "gradient_as_bucket_view": False, "exposed_ms": None, "num_buckets": None},
            {"bucket_cap_mb": 0.05, "gradient_as_bucket_view": True, "exposed_ms": 1.5, "num_buckets": 7}]
    (c,) = simulate.check_against_sweep(rows, ev, simulate.LinkModel(2, 1))
    assert (c.measured_buckets, c.predicted_buckets, c.measured_exposed_ms) == (7, 7, 1.5)


def test_errors():
    with pytest.raises(LabkitError):
        simulate.LinkModel(gpus_per_node=0)
    with pytest.raises(LabkitError):
        simulate.gpt_grad_schedule(get_workload("tiny").config, 2, 0.0)
    with pytest.raises(LabkitError):
        simulate.buckets([], 0)
