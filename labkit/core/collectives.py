"""Collective-communication arithmetic shared by the topology, comm and memory chapters.

Bus-bandwidth factors are nccl-tests'
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): ``busbw = algbw * factor`` with
AllReduce ``2(n-1)/n``, ReduceScatter/AllGather/AlltoAll ``(n-1)/n``, Broadcast/Reduce ``1``.
``bytes`` is the size nccl-tests reports: for all_gather and reduce_scatter, the *total* (gathered)
size S, so that each rank contributes S/n.
"""

from __future__ import annotations

from labkit.core.errors import LabkitError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def bus_factor(op: str, n: int) -> float:
    if n < 1:
        raise LabkitError(f"group size must be >= 1, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise LabkitError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s."""
    return nbytes / seconds


def busbw(op: str, nbytes: int, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s: comparable to the link's peak whatever the rank count."""
    return algbw(nbytes, seconds) * bus_factor(op, n)


def alpha_beta_time(op: str, nbytes: int, n: int, link_bw_Bps: float, latency_s: float) -> float:
    """Ring estimate: ``steps * alpha + bytes * factor / bw``, steps = 2(n-1) for all-reduce, n-1 else.

    ``link_bw_Bps`` is the per-direction bandwidth of the slowest link in the ring.
    """
    if n <= 1:
        return 0.0
    if link_bw_Bps <= 0:
        raise LabkitError(f"link bandwidth must be positive, got {link_bw_Bps}")
    steps = 2 * (n - 1) if op == "all_reduce" else (1 if op in ("broadcast", "reduce") else n - 1)
    return steps * latency_s + nbytes * bus_factor(op, n) / link_bw_Bps
