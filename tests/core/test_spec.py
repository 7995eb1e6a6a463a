"""labkit.core.spec: each shared flag declared once, generated from its spec field, with one default for the
CLI and the Python API."""

from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

import pytest

from labkit.cli import build_parser
from labkit.core.errors import LabkitError
from labkit.core.spec import RunSpec, StepSpec, add_flags, default, field_help, filled
from labkit.core.vocab import Recompute

PKG = Path(__file__).resolve().parents[2] / "labkit"
SHARED = ("precision", "recompute", "optimizer", "optimizer_impl", "micro_batch", "seq", "device", "process")


def _literal_flag_declarations() -> dict[str, list[str]]:
    """Every ``add_argument("--flag", ...)`` with a literal flag in labkit, by flag: where it is declared (an
    old spelling kept as an alias, ``action=Deprecated``, is not a declaration: ``alloc replay --device N`` is
    ``--gpu N``)."""
    out: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant)
                    and not any(k.arg == "action" and getattr(k.value, "id", "") == "Deprecated"
                                for k in node.keywords)):
                out.setdefault(node.args[0].value, []).append(f"{path.relative_to(PKG)}:{node.lineno}")
    return out


def _verbs() -> dict[str, argparse.ArgumentParser]:
    """Every (sub-)verb's parser, by its path (``comm buckets``)."""
    out = {}
    todo = [("", build_parser())]
    while todo:
        name, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {k}".strip(), p) for k, p in action.choices.items()]
        out[name] = parser
    return out


def test_no_verb_declares_a_shared_flag_by_hand():
    decls = _literal_flag_declarations()
    assert "--workers" not in decls and "--json" in decls      # the scan sees the declarations it should
    by_hand = {f"--{n.replace('_', '-')}": decls.get(f"--{n.replace('_', '-')}") for n in SHARED}
    assert {k: v for k, v in by_hand.items() if v} == {}, "generate the flag with labkit.core.spec.add_flags"


def test_every_verb_that_takes_a_shared_flag_has_the_generated_one():
    seen: dict[str, list[str]] = {}
    for verb, parser in _verbs().items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:     # an old spelling kept as an alias
                continue
            for name in SHARED:
                if f"--{name.replace('_', '-')}" in action.option_strings:
                    seen.setdefault(name, []).append(verb)
                    assert action.default is None, (verb, name)          # not given: the spec's default applies
                    assert field_help(name) in action.help, (verb, name)  # the field's docstring
    assert sorted(seen["precision"]) == ["advise", "comm buckets", "estimate", "measure"]
    assert sorted(seen["micro_batch"]) == ["advise", "comm buckets", "estimate", "measure"]
    assert sorted(seen["recompute"]) == ["advise", "estimate", "measure"]
    assert sorted(seen["seq"]) == ["advise", "estimate", "measure"]


def test_one_default_for_the_cli_and_the_api():
    from labkit.advise import Job
    from labkit.memory import measure_step
    from labkit.memory.estimate import TrainSpec
    from labkit.memory.estimate.planner import plan
    from labkit.workloads import StepPolicy

    assert default("precision") == "fp32" and default("optimizer") == "adamw" and default("process") == "fresh"
    step = StepPolicy()                                  # measure_step's step when none is given
    assert step.precision == default("precision") == TrainSpec().precision == Job(1, 1).precision
    assert inspect.signature(plan).parameters["precision"].default == default("precision")
    assert step.optimizer.name == default("optimizer") == TrainSpec().optimizer == Job(1, 1).optimizer
    assert step.recompute == default("recompute") == TrainSpec().recompute
    assert inspect.signature(measure_step).parameters["device"].default == default("device")
    assert TrainSpec().optimizer_impl == default("optimizer_impl")


def test_the_help_says_the_default_or_that_the_verb_searches():
    verbs = _verbs()
    text = {v: {a.dest: a.help for a in verbs[v]._actions} for v in ("measure", "advise", "estimate")}
    assert text["measure"]["precision"].endswith("(default fp32)")
    assert text["estimate"]["precision"].endswith("(default fp32)")
    assert text["advise"]["recompute"].endswith("(default: searched)")
    assert text["advise"]["seq"].endswith("(required)")


def test_generated_flags_parse_and_validate_as_the_vocabulary_says():
    p = argparse.ArgumentParser()
    add_flags(p, "precision", "recompute", "micro_batch", "process", choices={"precision": ("fp32", "amp-bf16")})
    args = p.parse_args(["--recompute", "every-2", "--micro-batch", "3"])
    assert args.recompute == Recompute("every", 2) and args.micro_batch == 3 and args.precision is None
    filled(args, "precision", "process")
    assert (args.precision, args.process) == ("fp32", "fresh")
    for bad in (["--precision", "bf16"], ["--micro-batch", "0"], ["--recompute", "every-0"], ["--process", "hot"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_the_specs_refuse_what_the_vocabulary_does_not_know():
    with pytest.warns(DeprecationWarning, match="'bfloat16' is deprecated"):
        assert StepSpec(precision="bfloat16").precision == "amp-bf16"
    assert str(StepSpec(recompute="every-1").recompute) == "full"
    for bad in ({"precision": "fp8"}, {"micro_batch": 0}, {"seq": True}, {"optimizer": "lion"}):
        with pytest.raises(LabkitError):
            StepSpec(**bad)
    for bad in ({"device": "tpu"}, {"process": "hot"}):
        with pytest.raises(LabkitError):
            RunSpec(**bad)


def test_the_api_predicts_the_process_the_cli_does():
    from labkit.memory.trace.fake.fake_cuda import CudaTarget

    from labkit.memory.trace.backends import FakeCuda, FakeCudaBackend
    from labkit.workloads import StepPolicy

    assert CudaTarget().warm_process == (default("process") == "warm") == (RunSpec().process == "warm")
    # measure_step's fake GPU, given no target, is that default
    assert FakeCudaBackend(StepPolicy(), FakeCuda()).emulator.target == CudaTarget()
