"""The analytical per-GPU memory model of decoder-only transformer training (estimate)."""

from labkit.memory.model_buffers import DEFAULTS_SOURCE, Overheads
from labkit.memory.model_spec import ModelSpec, ParallelSpec, TrainSpec, micro_batches, validate
from labkit.memory.model_bytes import ModelStates, model_states, precision_bytes, stage_params, total_params
from labkit.memory.model_totals import CATEGORIES, Estimate, StageEstimate, estimate, model_states_only

__all__ = [
    "CATEGORIES", "DEFAULTS_SOURCE", "Estimate", "ModelSpec", "ModelStates", "Overheads", "ParallelSpec",
    "StageEstimate", "TrainSpec", "estimate", "micro_batches", "model_states", "model_states_only",
    "precision_bytes", "stage_params", "total_params", "validate",
]
