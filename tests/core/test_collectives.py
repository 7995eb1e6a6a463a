import pytest

from labkit.core import LabkitError
from labkit.core.collectives import alpha_beta_time, bus_factor, busbw


@pytest.mark.parametrize("op,n,f", [("all_reduce", 8, 2 * 7 / 8), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
                                    ("reduce_scatter", 8, 7 / 8), ("broadcast", 8, 1.0), ("all_reduce", 1, 0.0)])
def test_nccl_tests_bus_factors(op, n, f):
    assert bus_factor(op, n) == pytest.approx(f)


def test_busbw_is_algbw_times_factor():
    assert busbw("all_reduce", 10**9, 0.01, 8) == pytest.approx(1e11 * 1.75)


def test_alpha_beta_ring():
    # 8 GPUs, 1 GB all-reduce at 100 GB/s and 10 us latency: 14 steps + 1.75 GB / 100 GB/s
    t = alpha_beta_time("all_reduce", 10**9, 8, 100e9, 10e-6)
    assert t == pytest.approx(14 * 10e-6 + 0.0175)
    assert alpha_beta_time("all_reduce", 10**9, 1, 100e9, 1e-5) == 0.0
    with pytest.raises(LabkitError):
        bus_factor("gossip", 4)
