"""Advise's compute rate: :mod:`labkit.memory.estimate.rates` (one rate for every planner)."""

from labkit.memory.estimate.rates import (RATE_FILE, Rate, achievable_flops, dtype_of, matmul_rate,  # noqa: F401
                                          matmul_rate_flops, measured_rates)
