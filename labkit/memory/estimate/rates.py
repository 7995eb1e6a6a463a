"""The compute rate behind every planner's step time (``labkit estimate --plan`` and ``labkit advise``):
dense matmul throughput measured on the GPU, one function for both.

The planner's step-time model (``labkit.memory.estimate.planner``) divides a step's training FLOPs
by an achievable rate. Here that rate is not a fitted constant: it is the matmul throughput
measured on the H200 (``benchmarks/gpu/record_matmul.py``: square GEMMs per dtype, median of
CUDA-event-timed repeats), read at the size of the model's largest GEMM (tokens x hidden x
4 hidden), so that a small model's step is charged the lower throughput of its small matmuls.
Without a recording, the planner's stated default (400 TFLOP/s) is used and said to be assumed.
``labkit estimate --plan --tflops X`` replaces the measured rate by X for every layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from labkit.core import paths
from labkit.core.provenance import load_measurement
from labkit.memory.estimate.planner import DEFAULT_ACHIEVABLE_FLOPS

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.

RATE_FILE = "advise/matmul_rates.json"


@dataclass(frozen=True)
class Rate:
    flops_per_s: float
    source: str


@lru_cache(maxsize=1)
def _recorded() -> tuple[dict, str] | None:
    p = paths.DATA_DIR / "measurements" / RATE_FILE
    if not p.exists():
        return None
    doc = load_measurement(p)
    prov = doc["provenance"]
    src = f"recorded on {prov.get('gpu_count')} x {prov.get('gpu_name')}, {str(prov.get('date'))[:10]}"
    return doc["data"], src


def dtype_of(precision: str) -> str:
    return "fp32" if precision == "fp32" else ("fp16" if precision in ("amp-fp16", "fp16-mixed") else "bf16")


def matmul_rate_flops(dtype: str, flops: float) -> float:
    """Measured matmul throughput (FLOP/s) in ``dtype`` (bf16, fp16, fp32) for a GEMM of ``flops``
    FLOPs: log-log interpolation between the recorded square sizes, clamped at both ends."""

    rec = _recorded()
    rows = sorted((r["flops"], r["flops_per_s"]) for r in rec[0]["rows"] if r["dtype"] == dtype) if rec else []
    if not rows:
        return DEFAULT_ACHIEVABLE_FLOPS
    f = max(float(flops), 1.0)
    if f <= rows[0][0]:
        return rows[0][1] * f / rows[0][0]  # below the smallest size: a fixed time per GEMM
    if f >= rows[-1][0]:
        return rows[-1][1]
    for (f0, r0), (f1, r1) in zip(rows, rows[1:]):
        if f0 <= f <= f1:
            w = (math.log(f) - math.log(f0)) / (math.log(f1) - math.log(f0))
            return math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0)))
    return rows[-1][1]


def matmul_rate(precision: str, m: int, n: int, k: int) -> Rate:
    """Measured throughput of an (m x k) @ (k x n) GEMM in the precision's compute dtype."""
    rec = _recorded()
    if rec is None:

        return Rate(DEFAULT_ACHIEVABLE_FLOPS, "model: assumed 400 TFLOP/s (no matmul recording under data/)")
    return Rate(matmul_rate_flops(dtype_of(precision), 2.0 * m * n * k), rec[1])


def achievable_flops(spec, precision: str, micro_batch: int, seq: int, tp: int = 1) -> Rate:
    """The rate for this model's step: the measured rate at its MLP GEMM (tokens x h x ffn/tp)."""
    return matmul_rate(precision, micro_batch * seq, max(1, spec.ffn_size // tp), spec.hidden)


def measured_rates(spec, precision: str, seq: int):
    """``micro_batch -> Rate`` for :func:`labkit.memory.estimate.planner.plan`'s ``rate``: what advise
    charges each micro-batch (:func:`achievable_flops` at tp=1)."""
    return lambda mb: achievable_flops(spec, precision, mb, seq)
