"""Every old spelling still works and means what it always meant: values (vocab.LEGACY), keywords
(TrainSpec, StepPolicy, measure_step, estimate keys) and flags (estimate, comm buckets, alloc)."""

import json
import warnings

import pytest

from labkit.cli import build_parser, main
from labkit.core.errors import LabkitError
from labkit.core.vocab import (CATEGORIES, LEGACY, OPTIMIZER_IMPLS, OPTIMIZERS, PHASES, PRECISIONS, CategoryBytes,
                               OptimizerSpec, Recompute, canonical)

# the whole legacy table, written out: adding or changing an old spelling has to change this test
PINNED = {
    "precision": {"float32": "fp32", "bfloat16": "amp-bf16", "float16": "amp-fp16", "bf16-amp": "amp-bf16",
                  "fp16-amp": "amp-fp16"},
    "recompute": {"every-1": "full"},
    "optimizer": {"adamw-foreach": "adamw"},
    "category": {"params": "parameters", "grads": "gradients", "optimizer": "optimizer_state",
                 "overhead": "allocator_overhead", "temporary": "temporaries", "input": "inputs",
                 "activation": "activations", "gradient": "gradients", "parameter": "parameters"},
}


def test_the_legacy_table_is_pinned():
    assert LEGACY == PINNED


@pytest.mark.parametrize("kind,old,new", [(k, o, n) for k, m in PINNED.items() if k != "recompute"
                                          for o, n in m.items()])
def test_old_value_maps_with_one_warning(kind, old, new):
    with pytest.warns(DeprecationWarning, match=repr(new)) as rec:
        assert canonical(kind, old) == new
    assert len(rec) == 1


def test_canonical_values_pass_silently_and_others_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind, values in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS), ("optimizer_impl", OPTIMIZER_IMPLS),
                             ("phase", PHASES), ("category", CATEGORIES)):
            for v in values:
                assert canonical(kind, v) == v
    with pytest.raises(LabkitError, match="precision 'fp8' is not one of"):
        canonical("precision", "fp8")


def test_recompute_and_optimizer_spellings():
    assert Recompute.parse("every-1") == Recompute("full") and str(Recompute.parse("every-4")) == "every-4"
    with pytest.warns(DeprecationWarning):
        assert OptimizerSpec.parse("adamw-foreach") == OptimizerSpec("adamw", "foreach")
    assert OptimizerSpec.parse("adamw") == OptimizerSpec("adamw", "foreach")   # PyTorch's default


# ------------------------------------------------------------------ keywords

def test_trainspec_recompute_every():
    from labkit.memory.estimate import TrainSpec

    with pytest.warns(DeprecationWarning, match="every-K"):
        t = TrainSpec(recompute="full", recompute_every=4)
    assert t.recompute == Recompute("every", 4) and t == TrainSpec(recompute="every-4")
    with pytest.warns(DeprecationWarning):
        assert TrainSpec(recompute="full", recompute_every=1).recompute == Recompute("full")
    with pytest.warns(DeprecationWarning), pytest.raises(LabkitError, match="recompute_every=2 needs recompute='full'"):
        TrainSpec(recompute="none", recompute_every=2)
    with pytest.warns(DeprecationWarning):
        assert TrainSpec(precision="bfloat16").precision == "amp-bf16"
    with pytest.warns(DeprecationWarning):
        t = TrainSpec(optimizer="adamw-foreach")
    assert (t.optimizer, t.optimizer_impl) == ("adamw", "foreach")


def test_estimate_old_category_keys_read_the_new_entries():
    from labkit.memory.estimate import ModelSpec, estimate

    e = estimate(ModelSpec(layers=2, hidden=64, heads=2, vocab=128, seq=32))
    for old, new in (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer_state"),
                     ("overhead", "allocator_overhead")):
        with pytest.warns(DeprecationWarning, match=new):
            assert e.per_gpu_bytes[old] == e.per_gpu_bytes[new]
    with pytest.warns(DeprecationWarning):
        assert e.model_states["params"] == e.model_states["parameters"]
    with pytest.raises(KeyError):
        e.per_gpu_bytes["nonsense"]
    assert CategoryBytes(a=1).get("params") is None


def test_steppolicy_and_measure_step_checkpointing():
    import torch

    from labkit.memory.trace.step import measure_step
    from labkit.workloads import StepPolicy, apply_checkpointing, apply_recompute

    with pytest.warns(DeprecationWarning, match="recompute"):
        assert StepPolicy(checkpointing="every-2").recompute == Recompute("every", 2)
    with pytest.warns(DeprecationWarning):
        assert StepPolicy(optimizer="adamw-foreach").optimizer == OptimizerSpec("adamw", "foreach")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.warns(DeprecationWarning, match="apply_recompute"):
        assert apply_checkpointing(model, "none") is apply_recompute(model, "none")
    batch = torch.randn(4, 8)
    with pytest.warns(DeprecationWarning, match="checkpointing"):
        rep = measure_step(lambda: torch.nn.Linear(8, 8), batch, StepPolicy(checkpointing="none"),
                           loss_fn=lambda out, b: out.square().mean(), call=lambda m, b: m(b), device="cpu", steps=1)
    assert rep.policy == {"precision": "fp32", "optimizer": "adamw", "optimizer_impl": "foreach", "recompute": "none",
                          "loop": "plain"}


def test_recorded_cases_keep_what_they_ran():
    from labkit.memory.trace.recorded import load_recorded_peaks, recorded_optimizer

    assert recorded_optimizer("adamw") == OptimizerSpec("adamw", "fused")        # the old harness's adamw
    assert recorded_optimizer("adamw-foreach") == OptimizerSpec("adamw", "foreach")
    assert recorded_optimizer("sgd") == OptimizerSpec("sgd", "foreach")
    assert recorded_optimizer("adamw", "for-loop") == OptimizerSpec("adamw", "for-loop")
    case = next(c for c in load_recorded_peaks() if c.name == "gpt-small-ref-amp-bf16-full")
    with pytest.warns(DeprecationWarning):
        assert case.checkpointing == "full"
    assert case.recompute == Recompute("full")


# ------------------------------------------------------------------ flags

def _estimate_json(capsys, *argv):
    assert main(["estimate", "--model", "gpt2", "--micro-batch", "2", "--json", *argv]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_estimate_recompute_every_flag(capsys):
    new, err = _estimate_json(capsys, "--recompute", "every-3")
    assert err == ""
    old, err = _estimate_json(capsys, "--recompute", "full", "--recompute-every", "3")
    assert old == new
    assert err == "labkit estimate: --recompute-every is deprecated: use --recompute every-K\n"


def test_estimate_old_precision_value(capsys):
    new, _ = _estimate_json(capsys, "--precision", "amp-bf16")
    old, err = _estimate_json(capsys, "--precision", "bfloat16")
    assert old == new and err == "labkit: --precision bfloat16 is deprecated: use --precision amp-bf16\n"


def _parse(*argv):
    from labkit.core.cliargs import flush_notes

    flush_notes(show=False)
    return build_parser().parse_args(list(argv))


def test_comm_buckets_old_flags(capsys):
    from labkit.core.cliargs import flush_notes

    ns = _parse("comm", "buckets", "--batch-size", "3", "--amp", "bfloat16", "--workload", "gpt2-124m")
    assert (ns.micro_batch, ns.precision, ns.model) == (3, "amp-bf16", "gpt2-124m")
    assert _parse("comm", "buckets", "--amp", "float16").precision == "amp-fp16"
    new = _parse("comm", "buckets", "--micro-batch", "3", "--precision", "amp-bf16")
    assert (new.micro_batch, new.precision) == (3, "amp-bf16")
    _parse("comm", "buckets", "--batch-size", "3", "--amp", "bfloat16")
    flush_notes()
    assert capsys.readouterr().err.splitlines() == [
        "labkit comm buckets: --batch-size is deprecated: use --micro-batch",
        "labkit comm buckets: --amp is deprecated: use --precision amp-bf16 (or amp-fp16)"]


@pytest.mark.parametrize("verb", ["replay", "compare"])
def test_alloc_device_flag_is_gpu(verb):
    assert _parse("alloc", verb, "t.pickle", "--device", "1").gpu == 1
    assert _parse("alloc", verb, "t.pickle", "--gpu", "1").gpu == 1


def test_chapters_use_subsets_of_the_one_vocabulary():
    from labkit.memory.estimate import totals
    from labkit.memory.trace import phases, storage
    from labkit.workloads import STEP_OPTIMIZERS

    assert set(totals.CATEGORIES) < set(CATEGORIES) and set(storage.CATEGORIES) < set(CATEGORIES)
    assert set(phases.PROFILER_CATEGORIES) - set(CATEGORIES) == {"autograd_detail", "unknown"}  # torch's own
    assert set(totals.PHASES) < set(PHASES) and set(STEP_OPTIMIZERS) < set(OPTIMIZERS)


def test_measure_model_is_a_named_workload_and_the_old_spellings_still_work(capsys):
    """`--model NAME` names a workload in measure as in estimate; `--workload NAME`, `--model gpt` and
    `--model hf-gpt2` keep working with one deprecation line each. (The CLI's entry point in this
    process: tests/test_cli.py runs it as a command.)"""
    def measure(*argv):
        rc = main(["measure", *argv])
        out = capsys.readouterr()
        return rc, out.out, out.err

    capsys.readouterr()
    new, old = measure("--model", "tiny", "--steps", "1", "--json"), measure("--workload", "tiny", "--steps", "1", "--json")
    assert new[0] == old[0] == 0, new[2] + old[2]
    assert json.loads(new[1])["peak_bytes"] == json.loads(old[1])["peak_bytes"]
    assert "--workload is deprecated: use --model NAME" in old[2] and new[2].strip() == ""
    gpt = measure("--model", "gpt", "--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "16",
                  "--vocab", "64", "--steps", "1", "--json")
    assert gpt[0] == 0 and "--model gpt is deprecated" in gpt[2]
