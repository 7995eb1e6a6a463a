"""Reference workloads: a small GPT and the training-step harness."""

from labkit.workloads.gpt import GPT, GPTConfig
from labkit.workloads.reference import REFERENCE_WORKLOADS, Workload, get_workload

__all__ = ["GPT", "GPTConfig", "REFERENCE_WORKLOADS", "Workload", "get_workload"]
