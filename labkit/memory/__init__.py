"""Where GPU memory goes: the analytical per-GPU model and planner (estimate), and the
phase-by-phase tracer that measures real or fake-GPU steps (measure).

Two engineers own parts of this package; each adds its public names below.
"""

# Lazily imported public names (name -> module), so that importing labkit.memory does not import
# torch. One __getattr__ serves the whole package: add lazy names to this dict, don't define another.
_LAZY_NAMES = {
    # measure (the tracer)
    "measure_step": "labkit.memory.tracer_measure",
    "MeasureReport": "labkit.memory.tracer_measure",
    "PhaseStats": "labkit.memory.tracer_measure",
    "StorageTracker": "labkit.memory.tracer",
    "CudaTarget": "labkit.memory.fake_cuda",
    "phase_snapshots": "labkit.memory.phases",
    "PhaseSnapshots": "labkit.memory.phases",
    "profiler_memory_timeline": "labkit.memory.phases",
    "load_recorded_peaks": "labkit.memory.tracer_recorded",
    "RecordedCase": "labkit.memory.tracer_recorded",
    "Prediction": "labkit.memory.tracer_recorded",
    "predict_case": "labkit.memory.tracer_recorded",
    "recorded_label": "labkit.memory.tracer_recorded",
    "SweepPoint": "labkit.memory.tracer_sweeps",
    "run_sweep": "labkit.memory.tracer_sweeps",
    "fit_segments": "labkit.memory.tracer_sweeps",
    "read_profiler_timeline": "labkit.memory.phases",
    # estimate (the analytical model, presets, planner)
    "ModelSpec": "labkit.memory.model",
    "ParallelSpec": "labkit.memory.model",
    "TrainSpec": "labkit.memory.model",
    "Overheads": "labkit.memory.model",
    "Estimate": "labkit.memory.model",
    "StageEstimate": "labkit.memory.model",
    "ModelStates": "labkit.memory.model",
    "estimate": "labkit.memory.model",
    "model_states": "labkit.memory.model",
    "model_states_only": "labkit.memory.model",
    "total_params": "labkit.memory.model",
    "CATEGORIES": "labkit.memory.model",
    "get_preset": "labkit.memory.presets",
    "presets": "labkit.memory.presets",
    "Preset": "labkit.memory.presets",
    "plan": "labkit.memory.planner",
    "explain": "labkit.memory.planner",
    "Plan": "labkit.memory.planner",
    "Candidate": "labkit.memory.planner",
    "Cluster": "labkit.memory.planner",
    "LinkSpec": "labkit.memory.planner",
    "cluster_from_topology": "labkit.memory.planner",
    "uniform_cluster": "labkit.memory.planner",
}


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy attribute access (PEP 562)
    mod = _LAZY_NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module 'labkit.memory' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
