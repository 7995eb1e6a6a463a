"""Alpha-beta fit: recovers a known line, reports busbw with nccl-tests' factor."""

from __future__ import annotations

import pytest

from labkit.comm.bench import row_from_time
from labkit.comm.fit import fit_all, fit_alpha_beta, fit_line
from labkit.core import collectives
from labkit.core.errors import LabkitError


def _rows(op, world, alpha_s, bw_Bps):
    return [row_from_time(op, s, world, alpha_s + s / bw_Bps) for s in (4096 * 4**k for k in range(10))]


def test_recovers_alpha_and_bandwidth():
    f = fit_alpha_beta(_rows("all_reduce", 8, 20e-6, 100e9), link_class="nvlink")
    assert f.alpha_us == pytest.approx(20.0, rel=1e-6)
    assert f.algbw_GBps == pytest.approx(100.0, rel=1e-6)
    assert f.busbw_GBps == pytest.approx(175.0, rel=1e-6)  # 2(n-1)/n = 1.75
    assert f.max_rel_error < 1e-9 and f.points == 10 and f.link_class == "nvlink"
    assert f.predict_us(10**9) == pytest.approx(20.0 + 1e4)


def test_link_params_reproduce_fit_through_core_model():
    f = fit_alpha_beta(_rows("all_reduce", 4, 30e-6, 50e9))
    bw, lat = f.link_params()
    s = 256 * 2**20
    assert collectives.alpha_beta_time("all_reduce", s, 4, bw, lat) == pytest.approx(f.predict_us(s) * 1e-6)


def test_fit_all_one_per_op():
    rows = _rows("all_gather", 2, 5e-6, 20e9) + _rows("broadcast", 2, 8e-6, 30e9)
    fits = fit_all(rows)
    assert [f.op for f in fits] == ["all_gather", "broadcast"]
    assert fits[1].busbw_GBps == pytest.approx(30.0, rel=1e-6)


def test_fit_errors():
    with pytest.raises(LabkitError, match="several collectives"):
        fit_alpha_beta(_rows("all_gather", 2, 5e-6, 2e10) + _rows("broadcast", 2, 5e-6, 2e10))
    with pytest.raises(LabkitError, match="at least 2"):
        fit_line([1.0], [1.0])
    with pytest.raises(LabkitError, match="does not grow"):
        fit_alpha_beta([row_from_time("all_reduce", s, 2, 1e-3) for s in (1000, 2000, 4000)])
