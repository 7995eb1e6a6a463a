"""Reference workloads: a small GPT and the training-step harness.

Hugging Face models (``HFGPT2Spec``, ``hf_gpt2_factory``, ``hf_lm_batch``) need the optional extra
``transformers`` (a dependency of labkit), imported only when those functions are called.
"""

from labkit.workloads.gpt import GPT, GPTConfig
from labkit.workloads.harness import (
    LOOPS, STEP_OPTIMIZERS, StepPolicy, TrainStep, apply_checkpointing, apply_recompute, call_model, cast_floating,
    default_loss, find_layers, gpt_batch, gpt_call, gpt_loss, make_optimizer, move_batch,
)
from labkit.workloads.hf import HF_GPT2_SIZES, HFGPT2Spec, hf_gpt2_factory, hf_lm_batch
from labkit.workloads.reference import REFERENCE_WORKLOADS, Workload, get_workload

# Modules other chapters may import directly (tests/test_imports.py): the model corpus, a user's own
# model (--hf-config / --factory), and the torchvision import shim.
PUBLIC_MODULES = ("corpus", "user_model", "vision")

__all__ = [
    "GPT", "GPTConfig", "HFGPT2Spec", "HF_GPT2_SIZES", "LOOPS", "REFERENCE_WORKLOADS", "STEP_OPTIMIZERS",
    "StepPolicy", "TrainStep", "Workload", "apply_checkpointing", "apply_recompute", "call_model", "cast_floating",
    "default_loss", "find_layers", "get_workload", "gpt_batch", "gpt_call", "gpt_loss", "hf_gpt2_factory",
    "hf_lm_batch", "make_optimizer", "move_batch",
]
