"""The model against per-rank peaks of real tensor-parallel training steps of the lab's GPT
(``torch.distributed.tensor.parallel``: column-wise QKV and MLP-up, row-wise projections; 2 ranks),
recorded on an H200 by ``benchmarks/gpu/record_parallel_memory.py`` with both ranks sharing the one
lent GPU over gloo (per-rank peaks are per process), beside the single-rank baselines."""

from __future__ import annotations

import pytest

from labkit.memory.estimate.buffers import CUDA_CONTEXT_BYTES
from labkit.memory.estimate.recorded import compare_parallel_dir, context_from_parallel


@pytest.fixture(scope="module")
def comps():
    return {c.name.split(" (")[0]: c for c in compare_parallel_dir()}


def test_tensor_parallel_runs_are_recorded(comps):
    for wl in ("gpt2-124m", "gpt-small-ref"):
        for prec in ("fp32", "amp-bf16"):
            assert f"{wl} tp {prec}" in comps and f"{wl} single {prec}" in comps
    assert all(c.source.startswith("recorded on") and "H200" in c.source for c in comps.values())


def test_model_within_10_percent_of_every_rank_peak(comps):
    for name, c in comps.items():
        assert abs(c.error_pct) <= 10.0, (name, c.error_pct)
        assert c.model_phase == c.measured_phase, name
        for p in c.per_rank_peaks:  # the most loaded rank is not special here: both ranks agree
            assert abs(c.model_peak - p) / p <= 0.10, (name, p)


def test_tensor_parallel_saving_is_predicted(comps):
    """What TP saves per rank (measured: single minus tp) matches the model's saving within 10%."""
    for wl in ("gpt2-124m", "gpt-small-ref"):
        for prec in ("fp32", "amp-bf16"):
            s, t = comps[f"{wl} single {prec}"], comps[f"{wl} tp {prec}"]
            measured, model = s.measured_peak - t.measured_peak, s.model_peak - t.model_peak
            assert measured > 0
            assert model == pytest.approx(measured, rel=0.10), (wl, prec, model, measured)


def test_cuda_context_default_is_measured():
    assert CUDA_CONTEXT_BYTES == pytest.approx(context_from_parallel()["cuda_context"], rel=0.01)
