"""What a training step and a run are, defined once: typed specs with a docstring per field and one default
each, from which every verb's shared flags are generated (:func:`add_flags`).

* :class:`StepSpec`: one training step of a model, in the lab's vocabulary (:mod:`labkit.core.vocab`): its
  batch (``micro_batch``, ``seq``), ``precision``, ``recompute``, ``optimizer`` and ``optimizer_impl``.
* :class:`RunSpec`: where the step runs: ``device`` and ``process`` (the process fake mode predicts: fresh
  or warm).

A field's default is the one default of that concept: the CLI flag generated from it says it, a verb fills
what the user did not give from it (:func:`filled`), and the Python API's keyword of the same name defaults
to it (``StepPolicy``, the step ``measure_step`` runs; ``TrainSpec``, ``plan(precision=)``, ``advise.Job``;
``tests/core/test_spec.py`` checks them). A verb may narrow a field's choices (``measure`` traces only what
a PyTorch loop can run) or search it (``advise`` searches the recomputation), never give it another default.
Generated flags are stored as ``None`` when not given, so a verb can tell a flag the user gave from its
default. Not one yet: ``micro_batch`` where the model names none is each verb's own (its help says which:
measure 4, estimate 1, advise searches it). ``process`` is one: ``labkit measure --process`` and the API's
``CudaTarget.warm_process`` (so ``measure_step``'s fake GPU) both default to a fresh process.

The flags' help is each field's docstring (read from this file once, when the parser is built).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

from labkit.core.cliargs import choices_metavar, int_between, recompute_value, vocab_value
from labkit.core.errors import LabkitError
from labkit.core.vocab import OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, OptimizerSpec, Recompute, canonical

# Bounds on the counts a user gives, so that the work is bounded: a step of 2^20 tokens per sample is past any
# trained context; 2^16 samples per micro-batch past any GPU's memory at any sequence length.
MAX_MICRO_BATCH = 1 << 16
MAX_SEQ = 1 << 20
DEVICES = ("fake-cuda", "cuda", "cpu")
PROCESSES = ("fresh", "warm")


@dataclass(frozen=True)
class StepSpec:
    """One training step: the batch, the arithmetic, the recomputation and the optimizer."""

    micro_batch: int | None = None
    """samples (sequences or images) per micro-batch on one GPU"""

    seq: int | None = None
    """tokens per sample (sequence length)"""

    precision: str = "fp32"
    """fp32 (what a PyTorch loop runs when it sets nothing), amp-bf16 / amp-fp16 (torch.autocast over fp32
    weights; fp16 with a GradScaler), bf16 (the model cast to bfloat16); the model also bf16-mixed and
    fp16-mixed (16-bit weights and gradients, fp32 master weights: Megatron, DeepSpeed)"""

    recompute: Recompute = Recompute()
    """activation recomputation: none, selective (the attention core), full (every layer a checkpoint
    segment) or every-K (segments of K layers)"""

    optimizer: str = "adamw"
    """adamw, adam, sgd; the model also adam8bit"""

    optimizer_impl: str = "foreach"
    """PyTorch's optimizer implementation: foreach (PyTorch's default on CUDA), fused or for-loop"""

    def __post_init__(self) -> None:
        for name in ("micro_batch", "seq"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise LabkitError(f"{name} must be an integer >= 1, got {v!r}")
        object.__setattr__(self, "precision", canonical("precision", self.precision))
        object.__setattr__(self, "recompute", Recompute.parse(self.recompute))
        opt = OptimizerSpec.parse(self.optimizer, self.optimizer_impl)
        object.__setattr__(self, "optimizer", opt.name)
        object.__setattr__(self, "optimizer_impl", opt.impl)


@dataclass(frozen=True)
class RunSpec:
    """Where the step runs."""

    device: str = "fake-cuda"
    """fake-cuda (an H200's allocations predicted on fake tensors, no GPU used), cuda (this GPU) or cpu"""

    process: str = "fresh"
    """fake-cuda: the process the step runs in: fresh (a new training script; the cuBLAS workspaces are
    allocated at its first matmuls) or warm (one that ran matmuls before, e.g. a notebook)"""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise LabkitError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.process not in PROCESSES:
            raise LabkitError(f"process {self.process!r} is not one of {', '.join(PROCESSES)}")


_FIELDS = {f.name: f for spec in (StepSpec, RunSpec) for f in dataclasses.fields(spec)}


def default(name: str) -> Any:
    """The one default of field ``name`` of :class:`StepSpec` or :class:`RunSpec`."""
    return _FIELDS[name].default


def _choices(values: tuple[str, ...]) -> dict[str, Any]:
    return {"metavar": choices_metavar(values)}


# How each field reads from the command line: (argparse type for the verb's choices, extra keywords).
def _parse(name: str, choices: tuple[str, ...] | None) -> tuple[Callable[[str], Any], dict[str, Any]]:
    if name == "micro_batch":
        return int_between(1, MAX_MICRO_BATCH), {"metavar": "N"}
    if name == "seq":
        return int_between(1, MAX_SEQ), {"metavar": "TOKENS"}
    if name == "precision":
        return vocab_value("precision", choices), _choices(choices or PRECISIONS)
    if name == "optimizer":
        return vocab_value("optimizer", choices), _choices(choices or OPTIMIZERS)
    if name == "optimizer_impl":
        return vocab_value("optimizer_impl", choices), _choices(choices or OPTIMIZER_IMPLS)
    if name == "recompute":
        return recompute_value, {"metavar": "{none,selective,full,every-K}"}
    if name in ("device", "process"):
        values = choices or (DEVICES if name == "device" else PROCESSES)
        return _one_of(name, values), _choices(values)
    raise LabkitError(f"no flag is generated for {name!r}")


def _one_of(name: str, values: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"{name} {text!r} is not one of {', '.join(values)}")
        return text
    parse.__name__ = name
    return parse


@cache
def field_help(name: str) -> str:
    """The docstring of field ``name`` of :class:`StepSpec` or :class:`RunSpec`, on one line."""
    for spec in (StepSpec, RunSpec):
        body = ast.parse(inspect.getsource(spec)).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                return " ".join(str(nxt.value.value).split())
    raise LabkitError(f"no documented field {name!r}")


def flag(name: str) -> str:
    """The command-line flag of field ``name`` (``micro_batch`` -> ``--micro-batch``)."""
    return "--" + name.replace("_", "-")


def add_flags(parser: Any, *names: str, choices: dict[str, tuple[str, ...]] | None = None,
              searched: tuple[str, ...] = (), required: tuple[str, ...] = (),
              notes: dict[str, str] | None = None) -> None:
    """Add the flags of the spec fields ``names`` to ``parser`` (an ArgumentParser or argument group).

    ``choices`` narrows a field's values for this verb; a field in ``searched`` is searched by the verb when
    not given (its help says so instead of the default); ``required`` fields must be given; ``notes`` adds
    the verb's own words to a field's help. Every flag is stored as ``None`` when not given; the spec's
    default (:func:`default`, :func:`filled`) applies then."""
    choices, notes = choices or {}, notes or {}
    for name in names:
        kind, kw = _parse(name, choices.get(name))
        value = default(name)
        if name in searched:
            tail = "default: searched"
        elif name in required:
            tail = "required"
        else:
            tail = "" if value is None else f"default {value}"
        text = field_help(name) + (f"; {notes[name]}" if name in notes else "") + (f" ({tail})" if tail else "")
        parser.add_argument(flag(name), type=kind, default=None, required=name in required,
                            help=text.replace("%", "%%"), **kw)


def filled(args: argparse.Namespace, *names: str) -> None:
    """Set each field of ``names`` that ``args`` holds as ``None`` (not given) to its one default."""
    for name in names:
        if getattr(args, name, None) is None:
            setattr(args, name, default(name))
