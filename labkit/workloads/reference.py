"""The lab's named reference workloads, shared by the tracer, the estimator and the benchmarks.

Each is a GPT configuration plus a micro-batch size. Analytical estimates are validated
against measured peaks of exactly these workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.errors import LabkitError
from labkit.workloads.gpt import GPTConfig


@dataclass(frozen=True)
class Workload:
    name: str
    config: GPTConfig
    batch_size: int
    description: str


REFERENCE_WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("tiny", GPTConfig(n_layer=2, n_head=2, n_embd=64, seq_len=64, vocab_size=512), 2,
                 "seconds on a CPU; for smoke runs and tests"),
        Workload("gpt-small-ref", GPTConfig(n_layer=6, n_head=8, n_embd=512, seq_len=512, vocab_size=8192), 8,
                 "the lab's reference: 25M parameters, runs on a CPU in smoke mode and fills a GPU step quickly"),
        Workload("gpt2-124m", GPTConfig(n_layer=12, n_head=12, n_embd=768, seq_len=1024, vocab_size=50304), 8,
                 "GPT-2 small dimensions (vocab padded to 50304)"),
        Workload("gpt2-350m", GPTConfig(n_layer=24, n_head=16, n_embd=1024, seq_len=1024, vocab_size=50304), 8,
                 "GPT-2 medium dimensions"),
    )
}


def get_workload(name: str) -> Workload:
    try:
        return REFERENCE_WORKLOADS[name]
    except KeyError:
        raise LabkitError(f"unknown workload {name!r}; choose one of {', '.join(REFERENCE_WORKLOADS)}") from None
