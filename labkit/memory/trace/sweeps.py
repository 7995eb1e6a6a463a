"""Sweeps for notebook 04: memory (and step time) against checkpointing granularity and precision.

Each point runs :func:`~labkit.memory.trace.step.measure_step` on a device (``cuda``, ``cpu`` or
``fake-cuda``); step times come from separate untraced steps (``cuda``/``cpu`` only).
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from labkit.core.errors import LabkitError
from labkit.core.vocab import Recompute
from labkit.memory.trace.step import measure_step
from labkit.workloads import StepPolicy, TrainStep, move_batch


@dataclass
class SweepPoint:
    """One policy: the steady step's peak, what of it is not model state, and the step time."""

    label: str
    precision: str
    recompute: str                  # the policy as the sweep spelled it: none, selective, full, every-K
    peak_bytes: int
    model_state_bytes: int          # parameters + optimizer state live at the peak
    beyond_states_bytes: int        # peak minus model states: activations, gradients, temporaries, workspaces
    by_category: dict[str, int]
    peak_phase: str
    step_time_s: float | None = None

    @property
    def checkpointing(self) -> str:
        """Deprecated name of ``recompute``."""
        warnings.warn("SweepPoint.checkpointing is deprecated: use .recompute", DeprecationWarning, stacklevel=2)
        return self.recompute


def segment_lengths(n_layers: int, ks: list[int] | None = None) -> list[int]:
    """Segment lengths K for every-K checkpointing: the given ones below L, or the divisors of L."""
    if n_layers < 1:
        raise LabkitError(f"a model needs >= 1 layer, got {n_layers}")
    if ks:
        bad = [k for k in ks if k < 1]
        if bad:
            raise LabkitError(f"segment lengths must be >= 1, got {bad}")
        return sorted({k for k in ks if k <= n_layers})
    return [k for k in range(1, n_layers + 1) if n_layers % k == 0]


def _time_steps(factory: Callable, batch: Any, kw: dict[str, Any], precision: str, recompute: str,
                device: str, n: int) -> float:
    with torch.device(device):
        model = factory()
    b = move_batch(batch, lambda x: x.to(device))
    step = TrainStep(model, b, policy=StepPolicy(precision=precision, recompute=recompute),
                     device_type=device, loss_fn=kw.get("loss_fn"), call=kw.get("call"))
    step.run()
    times = []
    for _ in range(n):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step.run()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_sweep(factory: Callable, batch: Any, policies: list[tuple[str, str]], *, device: str = "fake-cuda",
              kw: dict[str, Any] | None = None, time_steps: int = 0) -> list[SweepPoint]:
    """Measure (or, in fake mode, predict) each ``(precision, recompute)`` policy."""
    kw = kw or {}
    out = []
    for precision, ck in policies:
        Recompute.parse(ck)                          # validates; the caller's spelling is kept
        ck = ck if isinstance(ck, str) else str(ck)
        rep = measure_step(factory, batch, StepPolicy(precision=precision, recompute=ck), device=device, steps=2,
                           **kw)
        cats = rep.by_category
        states = cats.get("parameters", 0) + cats.get("optimizer_state", 0)
        t = None
        if time_steps and device in ("cuda", "cpu"):
            t = _time_steps(factory, batch, kw, precision, ck, device, time_steps)
        out.append(SweepPoint(label=ck if len({p for p, _ in policies}) == 1 else precision, precision=precision,
                              recompute=ck, peak_bytes=rep.peak_bytes, model_state_bytes=states,
                              beyond_states_bytes=rep.peak_bytes - states, by_category=cats,
                              peak_phase=rep.peak_phase, step_time_s=t))
    return out


def recorded_sweep(doc: dict[str, Any]) -> list[SweepPoint]:
    """SweepPoints from a recorded ``sweep_*.json`` document (``load_measurement``)."""
    pts = []
    single_precision = len({p["precision"] for p in doc["data"]["points"]}) == 1
    for p in doc["data"]["points"]:
        cats = {k: int(v) for k, v in (p.get("by_category") or {}).items()}
        states = cats.get("parameters", 0) + cats.get("optimizer_state", 0)
        peak = int(p["peak_allocated"])
        rc = p["recompute"] if "recompute" in p else p["checkpointing"]   # recordings so far say checkpointing
        pts.append(SweepPoint(label=rc if single_precision else p["precision"],
                              precision=p["precision"], recompute=rc, peak_bytes=peak,
                              model_state_bytes=states, beyond_states_bytes=peak - states, by_category=cats,
                              peak_phase=max(p["phase_peaks_allocated"], key=p["phase_peaks_allocated"].get),
                              step_time_s=p.get("step_time_s")))
    return pts


@dataclass
class SegmentFit:
    """``memory(K) = base + (L / K) * boundary + K * layer``, fitted to an every-K sweep."""

    base: float
    boundary: float          # bytes kept per checkpoint boundary (a layer's input)
    layer: float             # bytes one layer holds while it is recomputed in backward
    k_star: float            # sqrt(L * boundary / layer): the K that minimises the fit

    def predict(self, n_layers: int, k: int) -> float:
        return self.base + n_layers / k * self.boundary + k * self.layer


def fit_segments(points: list[SweepPoint], n_layers: int) -> SegmentFit:
    """Least-squares fit of the segment model to every-K points (``beyond_states_bytes``)."""
    rows, ys = [], []
    for p in points:
        k = Recompute.parse(p.recompute).segment
        if k is not None:
            rows.append([1.0, n_layers / k, float(k)])
            ys.append(float(p.beyond_states_bytes))
    if len(rows) < 3:
        raise LabkitError(f"fitting the segment model needs >= 3 every-K points, got {len(rows)}")
    (base, boundary, layer), *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    k_star = (n_layers * boundary / layer) ** 0.5 if boundary > 0 and layer > 0 else float("nan")
    return SegmentFit(float(base), float(boundary), float(layer), float(k_star))
