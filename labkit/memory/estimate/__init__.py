"""The analytical per-GPU memory model of decoder-only transformer training (estimate)."""

from labkit.memory.estimate.buffers import DEFAULTS_SOURCE, Overheads
from labkit.memory.estimate.spec import ModelSpec, ParallelSpec, TrainSpec, micro_batches, validate
from labkit.memory.estimate.states import ModelStates, model_states, precision_bytes, stage_params, total_params
from labkit.memory.estimate.totals import CATEGORIES, Estimate, StageEstimate, estimate, model_states_only

__all__ = [
    "CATEGORIES", "DEFAULTS_SOURCE", "Estimate", "ModelSpec", "ModelStates", "Overheads", "ParallelSpec",
    "StageEstimate", "TrainSpec", "estimate", "micro_batches", "model_states", "model_states_only",
    "precision_bytes", "stage_params", "total_params", "validate",
]
