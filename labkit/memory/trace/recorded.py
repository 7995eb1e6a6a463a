"""Recorded GPU peaks (``data/measurements/measure/``) and the fake-mode predictions made for them.

``reference_peaks.json`` holds one row per case (written by ``benchmarks/gpu/record_measure.py``):
workload name, model kind, config, batch, sequence, precision, recompute policy (``checkpointing`` in
the files recorded so far), optimizer (and ``optimizer_impl``; files without it were recorded when the
harness's ``adamw`` meant the fused kernel and ``adamw-foreach`` the multi-tensor one), the steady
step's ``peak_allocated`` (``torch.cuda.max_memory_allocated``) and ``peak_reserved``, per-phase
peaks, by-category bytes, and ``fake_inputs``: what :func:`predict_case` needs to rerun the case in
fake mode on a machine without a GPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.paths import MEASUREMENTS_DIR
from labkit.core.provenance import load_measurement
from labkit.core.vocab import OptimizerSpec, Recompute, canonical
from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.step import FakeCuda, measure_step
from labkit.workloads import (
    GPT, GPTConfig, HFGPT2Spec, StepPolicy, gpt_batch, gpt_call, gpt_loss, hf_gpt2_factory, hf_lm_batch,
)

# What the recording harness ran for each optimizer name before recordings stated the implementation
# (its ``adamw`` was fused AdamW; SGD with momentum took PyTorch's default, foreach on CUDA).
RECORDED_OPTIMIZER = {"adamw": OptimizerSpec("adamw", "fused"), "adamw-foreach": OptimizerSpec("adamw", "foreach"),
                      "sgd": OptimizerSpec("sgd", "foreach")}


def recorded_optimizer(name: str, impl: str | None = None) -> OptimizerSpec:
    """The optimizer a recorded case really ran: ``impl`` when the recording states it, else what the
    recording harness's name meant (:data:`RECORDED_OPTIMIZER`)."""
    if impl is not None:
        return OptimizerSpec(canonical("optimizer", name), canonical("optimizer_impl", impl))
    spec = RECORDED_OPTIMIZER.get(name)
    if spec is None:
        raise LabkitError(f"recorded optimizer {name!r} is not one of {', '.join(RECORDED_OPTIMIZER)}")
    return spec


def measure_dir() -> Path:
    return MEASUREMENTS_DIR / "measure"


@dataclass
class RecordedCase:
    """One recorded GPU step (bytes as recorded on the GPU)."""

    name: str
    model: str                      # "labkit-gpt" or "hf-gpt2"
    config: dict[str, Any]
    batch: int
    seq: int
    precision: str
    recompute: Recompute
    optimizer: OptimizerSpec                # with the implementation the case really ran
    peak_allocated: int
    peak_reserved: int | None
    phase_peaks_allocated: dict[str, int]
    by_category: dict[str, int]
    tracker_peak: int
    num_params: int
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpointing(self) -> str:
        """Deprecated: the recompute policy's spelling (use ``recompute``)."""
        warnings.warn("RecordedCase.checkpointing is deprecated: use .recompute", DeprecationWarning, stacklevel=2)
        return str(self.recompute)


@dataclass
class Prediction:
    """A fake-mode prediction beside the recorded peak."""

    name: str
    recorded_peak: int
    predicted_peak: int
    error_pct: float                # (predicted - recorded) / recorded * 100
    predicted_phase: str
    phase_errors_pct: dict[str, float]
    recorded_reserved: int | None = None
    predicted_reserved: int | None = None
    reserved_error_pct: float | None = None


def load_recorded_peaks(path: str | Path | None = None) -> list[RecordedCase]:
    """The recorded cases of ``reference_peaks.json`` (default: the lab's recorded H200 run)."""
    path = Path(path) if path is not None else measure_dir() / "reference_peaks.json"
    doc = load_measurement(path, kind="measure_peaks")
    out = []
    for r in doc["data"]["cases"]:
        try:
            out.append(RecordedCase(
                name=r["name"], model=r["model"], config=dict(r["config"]), batch=int(r["batch"]), seq=int(r["seq"]),
                precision=canonical("precision", r["precision"]),
                recompute=Recompute.parse(r["recompute"] if "recompute" in r else r["checkpointing"]),
                optimizer=recorded_optimizer(r["optimizer"], r.get("optimizer_impl")),
                peak_allocated=int(r["peak_allocated"]),
                peak_reserved=None if r.get("peak_reserved") is None else int(r["peak_reserved"]),
                phase_peaks_allocated={k: int(v) for k, v in (r.get("phase_peaks_allocated") or {}).items()},
                by_category={k: int(v) for k, v in (r.get("by_category") or {}).items()},
                tracker_peak=int(r.get("tracker_peak", 0)), num_params=int(r.get("num_params", 0)),
                provenance=doc["provenance"]))
        except (KeyError, TypeError, ValueError, LabkitError) as exc:
            raise LabkitError(f"{path}: case {r.get('name', '?')!r} is malformed ({exc})") from None
    return out


def case_inputs(case: RecordedCase) -> tuple[Any, Any, dict[str, Any]]:
    """(model factory, CPU batch, extra measure_step kwargs) that rebuild a recorded case."""
    if case.model == "labkit-gpt":
        cfg = GPTConfig(**case.config)
        return (lambda: GPT(cfg)), gpt_batch(cfg, case.batch), {"loss_fn": gpt_loss, "call": gpt_call}
    if case.model == "hf-gpt2":
        spec = HFGPT2Spec(**case.config)
        return hf_gpt2_factory(spec), hf_lm_batch(spec.vocab_size, case.batch, case.seq), {}
    raise LabkitError(f"recorded case {case.name!r}: unknown model kind {case.model!r}")


def predict_case(case: RecordedCase, *, target: Any = None) -> Prediction:
    """Rerun a recorded case in fake mode (no GPU) and compare with its recorded peak. ``target``: default an
    H200 in a warm process, as the reference cases ran (one after another in one process, ``record_measure.py``)."""
    target = target or CudaTarget(warm_process=True)

    factory, batch, kw = case_inputs(case)
    rep = measure_step(factory, batch,
                       StepPolicy(precision=case.precision, optimizer=case.optimizer, recompute=case.recompute),
                       device="fake-cuda", steps=2, fake=FakeCuda(target=target), **kw)
    err = 100.0 * (rep.peak_bytes - case.peak_allocated) / case.peak_allocated
    phase_err = {}
    for p in rep.by_phase:
        real = case.phase_peaks_allocated.get(p.phase)
        if real:
            phase_err[p.phase] = 100.0 * (p.peak_bytes - real) / real
    pred = Prediction(case.name, case.peak_allocated, rep.peak_bytes, err, rep.peak_phase, phase_err)
    if case.peak_reserved and rep.reserved_bytes is not None:
        pred.recorded_reserved = case.peak_reserved
        pred.predicted_reserved = rep.reserved_bytes
        pred.reserved_error_pct = 100.0 * (rep.reserved_bytes - case.peak_reserved) / case.peak_reserved
    return pred


def recorded_label(prov: dict[str, Any]) -> str:
    """Short source label for a figure: 'recorded on 1 x NVIDIA H200, 2026-11-29'."""
    gpu = f"{prov.get('gpu_count')} x {prov.get('gpu_name')}" if prov.get("gpu_count") else "a machine without GPU"
    return f"recorded on {gpu}, {str(prov.get('date'))[:10]}"


def load_recorded(name: str, kind: str) -> dict[str, Any]:
    """One recorded document of this chapter (``case_*.json``, ``sweep_*.json``, ``tracer_overhead.json``)."""
    return load_measurement(measure_dir() / name, kind=kind)


def predict_all(cases: list[RecordedCase], *, target: Any = None) -> list[Prediction]:
    """Fake-mode predictions for every case (seconds each on a CPU)."""
    return [predict_case(c, target=target) for c in cases]
