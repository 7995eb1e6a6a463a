"""Reference workloads: a small GPT and the training-step harness."""

from labkit.workloads.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
