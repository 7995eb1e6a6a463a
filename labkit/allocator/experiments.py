"""The allocator chapter's real experiments: workloads whose memory behaviour the lab records.

Each function takes a torch device and runs the same sequence of tensor requests on every call
with the same arguments (seeded sequence lengths, no data-dependent shapes), so that a trace
recorded under one allocator configuration is the program's request stream under every other
configuration too. ``benchmarks/gpu/record_allocator.py`` runs them on a GPU, each configuration
in a fresh process; on a CPU they run too (``smoke`` sizes), without memory statistics.

torch is imported lazily: the CLI and the simulator never need it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from labkit.core.errors import LabkitError
from labkit.workloads import GPT, GPTConfig

#: Allocator configurations the lab records and replays (name -> ``PYTORCH_ALLOC_CONF`` value).
RECORDED_CONFIGS: dict[str, str] = {
    "default": "",
    "expandable": "expandable_segments:True",
    "max_split_128": "max_split_size_mb:128",
    "roundup_4": "roundup_power2_divisions:4",
    "roundup_list": "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "expandable+roundup_4": "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_128+roundup_4": "max_split_size_mb:128,roundup_power2_divisions:4",
}


GiB = 1024**3

#: Runs under a memory cap (``set_per_process_memory_fraction``), to check the retry, release and
#: garbage-collection paths against the real allocator: name -> (PYTORCH_ALLOC_CONF, {workload: cap bytes}).
CAPPED_CONFIGS: dict[str, tuple[str, dict[str, int]]] = {
    "cap": ("", {"varlen_train": 10 * GiB, "train_then_eval": 7 * GiB}),
    "cap+gc_0.6": ("garbage_collection_threshold:0.6", {"varlen_train": 10 * GiB, "train_then_eval": 8 * GiB}),
    "cap+expandable": ("expandable_segments:True", {"varlen_train": 10 * GiB}),
    "cap+max_split_128": ("max_split_size_mb:128", {"varlen_train": 10 * GiB}),
}


@dataclass
class StepSample:
    """Allocator state after one step of a workload (bytes)."""

    step: int
    phase: str
    tokens: int
    allocated_bytes: int
    reserved_bytes: int


@dataclass
class WorkloadRun:
    name: str
    description: str
    steps: list[StepSample] = field(default_factory=list)


def _gpt_config(smoke: bool):
    if smoke:
        return GPTConfig(n_layer=2, n_head=2, n_embd=64, seq_len=64, vocab_size=512)
    return GPTConfig(n_layer=4, n_head=12, n_embd=768, seq_len=1024, vocab_size=50304)


def _sample(run: WorkloadRun, device, step: int, phase: str, tokens: int) -> None:
    if device.type == "cuda":
        a, r = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    else:
        a = r = 0
    run.steps.append(StepSample(step, phase, tokens, int(a), int(r)))


def _model_and_optimizer(device, smoke: bool, seed: int):
    torch.manual_seed(seed)
    model = GPT(_gpt_config(smoke)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def _train_step(model, opt, batch: int, seq: int, device, gen) -> float:
    V = model.config.vocab_size
    idx = torch.randint(0, V, (batch, seq), device=device, generator=gen)
    tgt = torch.randint(0, V, (batch, seq), device=device, generator=gen)
    _, loss = model(idx, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.item())


def varlen_train(device, *, steps: int = 20, batch: int = 8, smoke: bool = False, seed: int = 0) -> WorkloadRun:
    """A GPT training loop whose sequence length changes every step (seeded, so reproducible)."""
    model, opt = _model_and_optimizer(device, smoke, seed)
    max_len = model.config.seq_len
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    lengths = list(range(max_len // 8, max_len + 1, max_len // 16))
    run = WorkloadRun("varlen_train", f"GPT {sum(p.numel() for p in model.parameters())/1e6:.0f}M params, "
                      f"batch {batch}, sequence length drawn each step from {lengths[0]}..{lengths[-1]}")
    for step in range(steps):
        seq = rng.choice(lengths)
        _train_step(model, opt, batch, seq, device, gen)
        _sample(run, device, step, "train", batch * seq)
    return run


def train_then_eval(device, *, train_steps: int = 8, eval_batches: int = 4, batch: int = 8,
                    eval_batch: int = 24, smoke: bool = False, seed: int = 1) -> WorkloadRun:
    """Train at a short sequence length, then evaluate with larger, longer batches (no grad)."""
    model, opt = _model_and_optimizer(device, smoke, seed)
    T = model.config.seq_len
    gen = torch.Generator(device=device).manual_seed(seed)
    run = WorkloadRun("train_then_eval", f"GPT training at batch {batch} x {T // 2} tokens for {train_steps} steps, "
                      f"then evaluation at batch {eval_batch} x {T} tokens under no_grad")
    for step in range(train_steps):
        _train_step(model, opt, batch, T // 2, device, gen)
        _sample(run, device, step, "train", batch * (T // 2))
    model.eval()
    correct = torch.zeros((), device=device)
    with torch.no_grad():
        for i in range(eval_batches):
            idx = torch.randint(0, model.config.vocab_size, (eval_batch, T), device=device, generator=gen)
            logits, _ = model(idx)
            correct += (logits.argmax(-1) == idx).float().mean()
            del logits
            _sample(run, device, train_steps + i, "eval", eval_batch * T)
    float(correct.item())
    return run


WORKLOADS: dict[str, Callable[..., WorkloadRun]] = {
    "varlen_train": varlen_train,
    "train_then_eval": train_then_eval,
}


def get_workload(name: str) -> Callable[..., WorkloadRun]:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise LabkitError(f"unknown allocator workload {name!r}; choose one of {', '.join(WORKLOADS)}") from None


def leak_loop(device, *, max_steps: int = 200, batch: int = 8, smoke: bool = False, seed: int = 2,
              on_step: Callable[[int], Any] | None = None) -> list[Any]:
    """The classic leak: losses kept *with their graph* across steps (``losses.append(loss)``).

    Every step keeps its activations alive through the autograd graph, so allocated memory grows
    step after step until the device (or the memory fraction) runs out.
    """
    model, _ = _model_and_optimizer(device, smoke, seed)
    T = model.config.seq_len // 2
    gen = torch.Generator(device=device).manual_seed(seed)
    losses = []
    for step in range(max_steps):
        idx = torch.randint(0, model.config.vocab_size, (batch, T), device=device, generator=gen)
        _, loss = model(idx, idx)
        losses.append(loss)  # the bug: should be loss.item() or loss.detach()
        if on_step:
            on_step(step)
    return losses
