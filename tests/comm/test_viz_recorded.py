"""Figures build from the chapter's dataclasses; the recorded-data loader finds and refuses files."""

from __future__ import annotations

import pytest

from labkit.comm import simulate
from labkit.comm.bench import row_from_time
from labkit.comm.recorded import available, recorded
from labkit.core.errors import LabkitError
from labkit.core.provenance import write_measurement
from labkit.viz import comm as vc
from labkit.workloads import get_workload


def test_figures_build(gloo2):
    rows = [row_from_time("all_reduce", s, 2, 1e-5 + s / 1e9) for s in (4096, 65536, 1 << 20)]
    assert vc.busbw_figure({"all_reduce": rows}, title="t", nominal_GBps=450, published={"x": 370}).renderers
    assert vc.time_vs_model_figure(rows, [10.0, 20.0, 30.0], title="t", fit_us=[1.0, 2.0, 3.0]).renderers
    assert vc.bucket_sweep_figure(gloo2["sweep"].rows, title="t").renderers
    assert vc.timeline_figure(gloo2["timeline"], title="t").renderers
    ev = simulate.gpt_grad_schedule(get_workload("tiny").config, 2, 0.01)
    pts = simulate.sweep(ev, [0.05, 0.2], simulate.LinkModel(2, 1))
    assert vc.simulator_figure({"m": pts}, title="t", measured={"x": [dict(bucket_cap_mb=1, exposed_ms=1.0)]}).renderers
    assert vc.bars_figure(["a", "b"], [1.0, 2.0], title="t", y_label="ms").renderers
    run = dict(mode="DDP", peak_allocated_bytes=[2**30, 2**30])
    assert vc.per_gpu_memory_figure([run], title="t").renderers


def test_recorded_loader(tmp_path):
    assert recorded("buckets", tmp_path) is None and available(tmp_path) == []
    write_measurement(tmp_path / "comm_buckets.json", "comm.buckets", {"rows": []}, command="test")
    assert recorded("buckets", tmp_path)["data"] == {"rows": []}
    assert available(tmp_path) == ["buckets"]
    write_measurement(tmp_path / "comm_collectives.json", "comm.buckets", {}, command="test")
    with pytest.raises(LabkitError, match="expected 'comm.collectives'"):
        recorded("collectives", tmp_path)
    with pytest.raises(LabkitError, match="unknown comm recording"):
        recorded("nope", tmp_path)
