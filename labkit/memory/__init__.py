"""Where GPU memory goes, two ways:

* ``labkit.memory.estimate``: the analytical per-GPU model (DP/ZeRO/FSDP, TP+SP, PP, CP,
  recomputation, precision), the model presets and the layout planner. Plain Python, no torch.
* ``labkit.memory.trace``: the tracer that runs a real training step (on a GPU, the CPU, or fake
  tensors standing in for a CUDA GPU) and reports its peaks per phase and category.

Both speak the vocabulary of ``labkit.core.vocab``. The names below are the chapter's public API;
the estimator's function is ``labkit.memory.estimate.estimate`` (``labkit.memory.estimate`` is the
subpackage, so the function is not re-exported here under the same name).
"""

import importlib

# Modules other chapters may import directly (tests/test_imports.py): the tracer's measure_step.
PUBLIC_MODULES = ("trace.step",)

# Lazily imported public names (name -> module), so that importing labkit.memory does not import
# torch. One __getattr__ serves the whole package: add lazy names to this dict, don't define another.
_LAZY_NAMES = {
    # trace (the tracer)
    "measure_step": "labkit.memory.trace.step",
    "MeasureReport": "labkit.memory.trace.step",
    "PhaseStats": "labkit.memory.trace.step",
    "FakeCuda": "labkit.memory.trace.step",
    "Probes": "labkit.memory.trace.step",
    "StepPolicy": "labkit.workloads",
    "StorageTracker": "labkit.memory.trace.storage",
    "CudaTarget": "labkit.memory.trace.fake.fake_cuda",
    "phase_snapshots": "labkit.memory.trace.phases",
    "PhaseSnapshots": "labkit.memory.trace.phases",
    "profiler_memory_timeline": "labkit.memory.trace.phases",
    "load_recorded_peaks": "labkit.memory.trace.recorded",
    "RecordedCase": "labkit.memory.trace.recorded",
    "Prediction": "labkit.memory.trace.recorded",
    "predict_case": "labkit.memory.trace.recorded",
    "recorded_label": "labkit.memory.trace.recorded",
    "SweepPoint": "labkit.memory.trace.sweeps",
    "run_sweep": "labkit.memory.trace.sweeps",
    "fit_segments": "labkit.memory.trace.sweeps",
    "read_profiler_timeline": "labkit.memory.trace.phases",
    # script (a user's whole program on the fake GPU)
    "trace_script": "labkit.memory.script.run",
    "fake_gpu": "labkit.memory.script.runtime",
    "ScriptReport": "labkit.memory.script.script_report",
    # estimate (the analytical model, presets, planner)
    "ModelSpec": "labkit.memory.estimate",
    "ParallelSpec": "labkit.memory.estimate",
    "TrainSpec": "labkit.memory.estimate",
    "Overheads": "labkit.memory.estimate",
    "Estimate": "labkit.memory.estimate",
    "StageEstimate": "labkit.memory.estimate",
    "ModelStates": "labkit.memory.estimate",
    "model_states": "labkit.memory.estimate",
    "model_states_only": "labkit.memory.estimate",
    "total_params": "labkit.memory.estimate",
    "CATEGORIES": "labkit.memory.estimate",
    "get_preset": "labkit.memory.estimate.presets",
    "presets": "labkit.memory.estimate.presets",
    "Preset": "labkit.memory.estimate.presets",
    "plan": "labkit.memory.estimate.planner",
    "explain": "labkit.memory.estimate.planner",
    "Plan": "labkit.memory.estimate.planner",
    "Candidate": "labkit.memory.estimate.planner",
    "Cluster": "labkit.memory.estimate.planner",
    "LinkSpec": "labkit.memory.estimate.planner",
    "cluster_from_topology": "labkit.memory.estimate.planner",
    "uniform_cluster": "labkit.memory.estimate.planner",
}


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy attribute access (PEP 562)
    mod = _LAZY_NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module 'labkit.memory' has no attribute {name!r}")

    return getattr(importlib.import_module(mod), name)
