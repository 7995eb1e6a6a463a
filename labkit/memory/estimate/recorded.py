"""The model beside recorded GPU peaks: the 2-GPU tensor-parallel and FSDP2 runs
(``data/measurements/parallel_memory/``, written by ``benchmarks/gpu/record_parallel_memory.py``) and
the tracer's single-GPU reference cases (``data/measurements/measure/reference_peaks.json``).

Each recorded case goes into the estimator's inputs exactly as it ran (the lab's GPT: LayerNorm with
biases, learned positions, tied embeddings, GELU MLP; PyTorch layout); its precision, recompute
policy and optimizer (with the implementation it really ran) are already in the lab's vocabulary
(:mod:`labkit.core.vocab`), so they go straight into :class:`TrainSpec`. The comparison is on the
steady step's ``max_memory_allocated``.
The allocator-overhead and CUDA-context defaults of :mod:`labkit.memory.estimate.buffers` are
derived here from the same files.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.paths import MEASUREMENTS_DIR
from labkit.core.provenance import load_measurement
from labkit.memory.estimate.buffers import Overheads
from labkit.memory.estimate.spec import ModelSpec, ParallelSpec, TrainSpec
from labkit.memory.estimate.totals import PHASES, estimate
from labkit.memory.trace.recorded import load_recorded_peaks


@dataclass
class Comparison:
    """One recorded case: the model's peak beside the measured one (bytes allocated)."""

    name: str
    source: str                     # "recorded on <GPU>, <date>"
    measured_peak: int              # max over ranks of the steady step's max_memory_allocated
    model_peak: int
    error_pct: float                # (model - measured) / measured * 100
    measured_phase: str | None
    model_phase: str
    measured_reserved: int | None
    per_rank_peaks: list[int]
    model_phases: dict[str, int]
    measured_phases: dict[str, int]
    tracer_peak: int | None = None       # the tracer's tensor-only peak of the same step (single-GPU cases)
    tracer_error_pct: float | None = None  # model's tensors (peak minus workspace) vs the tracer's peak
    baseline_subtracted: int = 0         # bytes held before the configuration started (see compare_parallel)


def gpt_model_spec(cfg: dict[str, Any], name: str = "gpt") -> ModelSpec:
    """The lab's GPT (``labkit.workloads.gpt.GPTConfig`` fields) as a ModelSpec."""
    try:
        return ModelSpec(layers=int(cfg["n_layer"]), hidden=int(cfg["n_embd"]), heads=int(cfg["n_head"]),
                         vocab=int(cfg["vocab_size"]), seq=int(cfg["seq_len"]), bias=bool(cfg.get("bias", True)),
                         tied_embeddings=bool(cfg.get("tie_weights", True)), norm="layernorm", learned_pos_emb=True,
                         name=name)
    except KeyError as exc:
        raise LabkitError(f"recorded config lacks {exc}") from None


def _source(prov: dict[str, Any]) -> str:
    gpu = f"{prov.get('gpu_count')} x {prov.get('gpu_name')}" if prov.get("gpu_count") else "no GPU"
    return f"recorded on {gpu}, {str(prov.get('date'))[:10]}"


# ------------------------------------------------------------------ 2-GPU TP / FSDP2 recordings

def parallel_dir() -> Path:
    return MEASUREMENTS_DIR / "parallel_memory"


def parallel_specs(data: dict[str, Any]) -> tuple[ModelSpec, ParallelSpec, TrainSpec]:
    """Estimator inputs for one recorded 2-rank configuration."""
    r0 = data["ranks"][0]
    m = gpt_model_spec(r0["config"], data["workload"])
    par_name, prec = data["parallel"], data["precision"]
    world = int(data.get("world_size", 2))
    if par_name == "single":
        par = ParallelSpec()
    elif par_name in ("tp", "tp-sp"):
        par = ParallelSpec(tp=world, sp=par_name == "tp-sp", vocab_parallel=False)
    elif par_name in ("fsdp", "fsdp-noreshard"):
        par = ParallelSpec(dp=world, zero=3, reshard_after_forward=par_name == "fsdp")
    else:
        raise LabkitError(f"unknown recorded parallel layout {par_name!r}")
    precision = prec
    if par_name.startswith("fsdp") and prec == "amp-bf16":
        precision = "bf16-mixed"  # FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce): fp32 shards are the master
    train = TrainSpec(micro_batch=int(r0["micro_batch"]), precision=precision, optimizer="adamw",
                      optimizer_impl="foreach", dropout=float(r0["config"].get("dropout", 0.0)), framework="pytorch")
    return m, par, train


def compare_parallel(path: str | Path) -> Comparison:
    doc = load_measurement(path, kind="parallel_memory")
    data = doc["data"]
    if data.get("device") != "cuda":
        raise LabkitError(f"{path}: recorded on {data.get('device')}, not a GPU: no memory figures")
    m, par, train = parallel_specs(data)
    oh = Overheads()
    est = estimate(m, par, train, oh)
    # Bytes a rank held before the configuration was built (library workspaces created by earlier
    # configurations of the same process; in run 2 also tensors leaked by failed ones) are not this
    # configuration's: subtract them from the measurement, and the workspaces from the model.
    bases = [int((r.get("baseline") or {}).get("allocated") or 0) for r in data["ranks"]]
    peaks, phases_all, reserved = [], [], []
    for r, base in zip(data["ranks"], bases):
        last = r["step_records"][-1]
        ph = {p: int(last[p]["peak_allocated"]) - base for p in PHASES}
        phases_all.append(ph)
        peaks.append(max(ph.values()))
        reserved.append(max(int(last[p]["peak_reserved"]) for p in PHASES) - base)
    i = max(range(len(peaks)), key=lambda k: peaks[k])
    measured = peaks[i]
    ws = min(bases[i], oh.workspace)
    model = est.peak_allocated - ws
    model_phases = {p: v - ws for p, v in est.by_stage[0].phases.items()}
    name = f"{data['workload']} {data['parallel']} {data['precision']}"
    if data.get("shared_gpu"):
        name += " (2 ranks on 1 GPU)"
    return Comparison(name=name, source=_source(doc["provenance"]), measured_peak=measured, model_peak=model,
                      error_pct=(model - measured) / measured * 100,
                      measured_phase=max(PHASES, key=lambda p: phases_all[i][p]), model_phase=est.peak_phase,
                      measured_reserved=reserved[i], per_rank_peaks=peaks, model_phases=model_phases,
                      measured_phases=phases_all[i], baseline_subtracted=bases[i])


def compare_parallel_dir(directory: str | Path | None = None) -> list[Comparison]:
    d = Path(directory) if directory is not None else parallel_dir()
    files = sorted(p for p in d.glob("*.json") if p.name != "summary.json")
    if not files:
        raise LabkitError(f"{d}: no recorded parallel-memory runs")
    return [compare_parallel(p) for p in files]


# ------------------------------------------------------------------ the tracer's single-GPU cases

def tracer_specs(case: Any) -> tuple[ModelSpec, ParallelSpec, TrainSpec]:
    """Estimator inputs for a tracer RecordedCase of the lab's GPT."""
    if case.model != "labkit-gpt":
        raise LabkitError(f"case {case.name}: only the lab's GPT is modelled exactly, not {case.model}")
    m = gpt_model_spec(case.config, case.name)
    train = TrainSpec(micro_batch=case.batch, seq=case.seq, precision=case.precision, optimizer=case.optimizer,
                      recompute=case.recompute, dropout=float(case.config.get("dropout", 0.0)), framework="pytorch")
    return m, ParallelSpec(), train


def compare_tracer_case(case: Any) -> Comparison:
    m, par, train = tracer_specs(case)
    oh = Overheads()
    est = estimate(m, par, train, oh)
    tracer = int(case.tracker_peak) or None
    tensors = est.peak_allocated - oh.workspace
    measured = int(case.peak_allocated)
    ph = dict(case.phase_peaks_allocated or {})
    merged = {"forward": max(ph.get("forward", 0), ph.get("loss", 0)), "backward": ph.get("backward", 0),
              "optimizer": max(ph.get("optimizer", 0), ph.get("zero_grad", 0))}
    return Comparison(name=case.name, source=_source(case.provenance), measured_peak=measured,
                      model_peak=est.peak_allocated, error_pct=(est.peak_allocated - measured) / measured * 100,
                      measured_phase=max(merged, key=merged.get) if ph else None, model_phase=est.peak_phase,
                      measured_reserved=case.peak_reserved, per_rank_peaks=[measured],
                      model_phases=est.by_stage[0].phases, measured_phases=merged, tracer_peak=tracer,
                      tracer_error_pct=(tensors - tracer) / tracer * 100 if tracer else None)


def compare_tracer(path: str | Path | None = None) -> list[Comparison]:
    return [compare_tracer_case(c) for c in load_recorded_peaks(path) if c.model == "labkit-gpt"]


# ------------------------------------------------------------------ measured defaults

def allocator_overhead_from(comparisons: list[Comparison]) -> float:
    """Median of reserved / allocated - 1 at the steady step's peak."""
    ratios = [c.measured_reserved / c.measured_peak - 1 for c in comparisons if c.measured_reserved and c.measured_peak]
    if not ratios:
        raise LabkitError("no recorded reserved/allocated pairs")
    return statistics.median(ratios)


def context_from_parallel(directory: str | Path | None = None) -> dict[str, int]:
    """CUDA context and NCCL bytes per rank from the 2-GPU run's summary: device memory used after
    creating the context (minus what the allocator reserved then) and the growth after the first
    NCCL collective (minus the allocator's part)."""
    d = Path(directory) if directory is not None else parallel_dir()
    doc = load_measurement(d / "summary.json", kind="parallel_memory_summary")
    ctx, nccl = [], []
    for r in doc["data"]["context"]:
        if r.get("context_only_device_used") is None:
            continue
        c = r["context_only_device_used"] - r["context_only_reserved"]
        ctx.append(c)
        if r.get("after_nccl_init_device_used") is not None:  # not in the one-GPU (gloo) mode
            nccl.append((r["after_nccl_init_device_used"] - r["after_nccl_init_reserved"]) - c)
    if not ctx:
        raise LabkitError(f"{d}/summary.json: no GPU context figures")
    out = {"cuda_context": int(statistics.median(ctx))}
    if nccl:
        out["nccl_per_communicator"] = int(statistics.median(nccl))
    return out


def workspace_from_tracer(path: str | Path | None = None) -> int:
    """Bytes the allocator hands out beyond the tensors the tracer sees (cuBLAS/cuBLASLt workspaces,
    kernel scratch): the median over the lab GPT's recorded cases of CUDA peak - tracked peak."""
    diffs = [c.peak_allocated - c.tracker_peak for c in load_recorded_peaks(path)
             if c.model == "labkit-gpt" and c.tracker_peak]
    if not diffs:
        raise LabkitError("no recorded cases with both a CUDA and a tracked peak")
    return int(statistics.median(diffs))
