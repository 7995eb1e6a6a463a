"""Alpha-beta fit of measured collective times: ``t(S) = alpha + S / bw``, per collective and link class.

``alpha`` is the fixed cost of one collective (launch and per-step latencies), ``bw`` the algorithm
bandwidth it approaches at large sizes; ``busbw = bw * factor`` (nccl-tests' factor) is comparable to
the link's per-direction rate. The fit is a weighted least-squares line with weights ``1 / t**2`` so
that 4 KiB and 4 GiB points count alike (it minimises relative, not absolute, error).
The link class ("nvlink", "pcie", "network", "cpu-shm", ...) is a label the caller gives: one fit per
class, since one line cannot describe two different links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from labkit.core import collectives
from labkit.core.errors import LabkitError


@dataclass
class AlphaBetaFit:
    op: str
    link_class: str
    world: int
    alpha_us: float
    algbw_GBps: float  # GB = 1e9 B per second
    busbw_GBps: float
    points: int
    max_rel_error: float  # over the fitted points
    min_bytes: int
    max_bytes: int

    def predict_us(self, nbytes: int) -> float:
        return self.alpha_us + nbytes / (self.algbw_GBps * 1e9) * 1e6

    def link_params(self) -> tuple[float, float]:
        """``(link_bw_Bps, latency_s)`` for :func:`labkit.core.collectives.alpha_beta_time` (ring steps)."""
        steps = 2 * (self.world - 1) if self.op == "all_reduce" else (1 if self.op in ("broadcast", "reduce") else self.world - 1)
        return self.busbw_GBps * 1e9, self.alpha_us * 1e-6 / max(1, steps)


def fit_line(sizes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Weighted least squares ``t = a + b * s`` with weights ``1 / t**2``; returns ``(a, b)``."""
    if len(sizes) != len(times_s):
        raise LabkitError("alpha-beta fit: sizes and times differ in length")
    if len(sizes) < 2:
        raise LabkitError(f"alpha-beta fit needs at least 2 sizes, got {len(sizes)}")
    if any(t <= 0 for t in times_s):
        raise LabkitError("alpha-beta fit: every time must be positive")
    w = [1.0 / (t * t) for t in times_s]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, sizes))
    sy = sum(wi * y for wi, y in zip(w, times_s))
    sxx = sum(wi * x * x for wi, x in zip(w, sizes))
    sxy = sum(wi * x * y for wi, x, y in zip(w, sizes, times_s))
    den = sw * sxx - sx * sx
    if den <= 0:
        raise LabkitError("alpha-beta fit: all sizes are equal, no slope can be fitted")
    b = (sw * sxy - sx * sy) / den
    a = (sy - b * sx) / sw
    return a, b


def fit_alpha_beta(rows: Iterable, *, op: str | None = None, link_class: str = "unknown") -> AlphaBetaFit:
    """Fit rows (objects or dicts with ``op``, ``bytes``, ``time_us``, ``world``) of one collective."""
    rs = [r if isinstance(r, dict) else r.__dict__ for r in rows]
    ops = {r["op"] for r in rs} if op is None else {op}
    if len(ops) != 1:
        raise LabkitError(f"alpha-beta fit: rows hold several collectives {sorted(ops)}; pass op=")
    the_op = ops.pop()
    rs = [r for r in rs if r["op"] == the_op]
    worlds = {r["world"] for r in rs}
    if len(worlds) != 1:
        raise LabkitError(f"alpha-beta fit: rows mix group sizes {sorted(worlds)}")
    world = worlds.pop()
    sizes = [float(r["bytes"]) for r in rs]
    times = [float(r["time_us"]) * 1e-6 for r in rs]
    a, b = fit_line(sizes, times)
    if b <= 0:
        raise LabkitError(f"alpha-beta fit of {the_op}: time does not grow with size (slope {b:.3g} s/B); "
                          "measure larger sizes")
    a = max(a, 0.0)
    errs = [abs(a + b * s - t) / t for s, t in zip(sizes, times)]
    alg = 1.0 / b
    return AlphaBetaFit(op=the_op, link_class=link_class, world=world, alpha_us=a * 1e6, algbw_GBps=alg / 1e9,
                        busbw_GBps=alg * collectives.bus_factor(the_op, world) / 1e9, points=len(rs),
                        max_rel_error=max(errs), min_bytes=int(min(sizes)), max_bytes=int(max(sizes)))


def fit_all(rows: Iterable, link_class: str = "unknown") -> list[AlphaBetaFit]:
    """One fit per collective found in ``rows``."""
    rs = [r if isinstance(r, dict) else r.__dict__ for r in rows]
    out = []
    for op in dict.fromkeys(r["op"] for r in rs):
        out.append(fit_alpha_beta([r for r in rs if r["op"] == op], op=op, link_class=link_class))
    return out
