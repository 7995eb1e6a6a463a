"""Overlap levers on gloo CPU ranks; CUDA-only levers refuse cleanly without a GPU."""

from __future__ import annotations

import pytest

from labkit.comm import levers
from labkit.comm.dp import run_data_parallel
from labkit.core.errors import LabkitError


def test_overlap_fraction():
    assert levers.overlap_fraction(10, 4, 10) == 1.0  # the shorter one fully hidden
    assert levers.overlap_fraction(10, 4, 14) == 0.0  # serialised
    assert levers.overlap_fraction(10, 4, 12) == pytest.approx(0.5)
    with pytest.raises(LabkitError):
        levers.overlap_fraction(0, 4, 4)


def test_async_overlap_on_gloo(gloo2):
    a = gloo2["async"]
    assert (a.backend, a.world, a.op, a.bytes) == ("gloo", 2, "all_reduce", 1 << 20)
    assert min(a.comm_ms, a.compute_ms, a.sequential_ms, a.overlapped_ms) > 0
    assert 0.0 <= a.hidden_fraction <= 1.0


def test_buffer_reuse_on_gloo(gloo2):
    b = gloo2["buffers"]
    assert [r.mode for r in b.rows] == ["persistent", "in_loop"]  # empty_cache mode is CUDA only
    assert b.bytes == 1 << 20 and b.n_tensors == 16
    for r in b.rows:
        assert r.step_ms_p10 <= r.step_ms_median <= r.step_ms_p90
        assert r.allocator_requests_per_step is None  # no CUDA allocator on CPU ranks


def test_cuda_levers_refuse_without_gpu():
    import torch

    if torch.cuda.is_available():  # the GPU recording script exercises these for real
        return
    with pytest.raises(LabkitError, match="needs a CUDA GPU"):
        levers.pinned_vs_pageable(1 << 20)
    with pytest.raises(LabkitError, match="needs 2 CUDA devices"):
        run_data_parallel(2)
