"""``labkit estimate``: JSON shape, invalid combinations exit 2 with the reason, presets."""

from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.memory.estimate import ModelSpec, ParallelSpec, TrainSpec, estimate
from labkit.memory.estimate.presets import get_preset, presets

KEYS = {"parameters", "gradients", "optimizer_state", "activations", "logits", "comm_buffers", "context",
        "allocator_overhead", "total"}


def run(capsys, *args):
    rc = main(["estimate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_document(capsys):
    rc, out, _ = run(capsys, "--layers", "12", "--hidden", "768", "--heads", "12", "--seq", "1024", "--vocab", "50257",
                     "--micro-batch", "4", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "32", "--sp",
                     "--recompute", "selective", "--precision", "bf16-mixed", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert set(doc["per_gpu_bytes"]) == KEYS
    assert doc["per_gpu_bytes"]["total"] == sum(v for k, v in doc["per_gpu_bytes"].items() if k != "total")
    assert [s["stage"] for s in doc["by_stage"]] == [0, 1]
    assert doc["micro_batches"] == 32 // (4 * 2)
    # the CLI prints what the API computes
    e = estimate(ModelSpec(layers=12, hidden=768, heads=12, seq=1024, vocab=50257),
                 ParallelSpec(tp=2, pp=2, dp=2, sp=True),
                 TrainSpec(micro_batch=4, global_batch=32, recompute="selective", precision="bf16-mixed"))
    assert doc["per_gpu_bytes"] == e.per_gpu_bytes


@pytest.mark.parametrize("args,reason", [
    (["--heads", "12", "--tp", "5"], "--heads 12 is not divisible by --tp 5"),
    (["--layers", "12", "--pp", "5"], "--layers 12 is not divisible by --pp 5"),
    (["--pp", "2", "--vpp", "4"], "--pp 2 x --vpp 4"),
    (["--dp", "3", "--global-batch", "16"], "--global-batch 16 is not divisible"),
    (["--sp"], "--sp needs --tp > 1"),
    (["--precision", "fp8"], None),
])
def test_invalid_combinations_exit_2(capsys, args, reason):
    base = {"--layers": "12", "--hidden": "768", "--heads": "12", "--vocab": "50257", "--micro-batch": "2"}
    flags = []
    it = iter(args)
    for a in it:
        if a == "--sp":
            flags.append(a)
        else:
            base[a] = next(it)
    argv = [x for kv in base.items() for x in kv] + flags
    try:
        rc, _, err = run(capsys, *argv)
    except SystemExit as exc:  # argparse rejects an unknown choice
        rc, err = exc.code, capsys.readouterr().err
    assert rc == 2
    if reason:
        assert reason in err


def test_model_states_only(capsys):
    rc, out, _ = run(capsys, "--params", "7.5e9", "--dp", "64", "--zero", "3", "--model-states-only", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["per_gpu_bytes"]["total"] == pytest.approx(1.875e9, rel=1e-6)
    rc, _, err = run(capsys, "--params", "7.5e9")
    assert rc == 2 and "--model-states-only" in err


def test_human_output_and_presets(capsys):
    rc, out, _ = run(capsys, "--model", "llama2-7b", "--tp", "2", "--pp", "2", "--global-batch", "8")
    assert rc == 0 and "most loaded GPU" in out and "GiB" in out and "GB" in out
    rc, out, _ = run(capsys, "--list-models")
    assert rc == 0 and "llama3-70b" in out
    rc, _, err = run(capsys, "--model", "no-such-model")
    assert rc == 2 and "unknown model preset" in err


def test_presets_match_published_counts():
    from labkit.memory.estimate import total_params

    checked = 0
    for p in presets().values():
        if p.params:
            assert total_params(p.model) == p.params, p.name
            checked += 1
    assert checked >= 6
    assert get_preset("gpt3-175b").layers == 96
    assert abs(total_params(get_preset("gpt3-175b")) / 1e9 - 175) < 1


def test_plan_verb(capsys):
    rc, out, _ = run(capsys, "--plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                     "--topology", "h100_nv18_8gpu_dual_numa", "--gpu-memory", "80GiB")
    lines = out.splitlines()
    assert rc == 0 and lines[1].startswith("best layout tp=") and lines[3].startswith("1. tp=") and "rejected" in out
    rc, out, _ = run(capsys, "--plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--json")
    doc = json.loads(out)
    assert doc["fitting"] >= len(doc["ranked"]) > 0
    assert doc["ranked"][0]["fits"] is True
    rc, _, err = run(capsys, "--plan", "--model", "llama3-8b", "--gpus", "12", "--global-batch", "64",
                     "--topology", "h100_nv18_8gpu_dual_numa")
    assert rc == 2 and "--gpus-per-node" in err
    rc, _, err = run(capsys, "--plan", "--model", "gpt2", "--gpu-memory", "lots", "--global-batch", "8")
    assert rc == 2 and "--gpu-memory" in err


PLAN = ["--plan", "--model", "gpt2", "--global-batch", "8"]


@pytest.mark.parametrize("args,needle", [
    (PLAN + ["--tflops=-5"], "argument --tflops: must be > 0"),
    (PLAN + ["--tflops", "0"], "argument --tflops: must be > 0"),
    (PLAN + ["--tflops", "inf"], "argument --tflops: must be a finite number"),
    (PLAN + ["--tflops", "nan"], "argument --tflops: must be a finite number"),
    (PLAN + ["--tp", "2"], "--tp does not apply to --plan"),
    (PLAN + ["--recompute", "full", "--zero", "1"], "--zero, --recompute does not apply to --plan"),
    (PLAN + ["--gpus-per-node", "16", "--gpus", "8"], "--gpus-per-node 16 is more than --gpus 8"),
    (PLAN + ["--gpus", "12"], "--gpus 12 is not a multiple of --gpus-per-node 8"),
    (PLAN + ["--margin", "1"], "argument --margin: must be >= 0 and < 1"),
    (PLAN + ["--gpu-memory", "1e400GB"], "--gpu-memory: '1e400GB' is not a finite size"),
    (PLAN + ["--gpu-memory", "0GB"], "--gpu-memory must be positive"),
    (PLAN + ["--gpu-memory", "80"], "--gpu-memory 80: give a unit"),
    (["--model", "gpt2", "--gpus", "16"], "--gpus only applies to --plan"),
    (["--model", "gpt2", "--recompute-every", "4"], "--recompute-every 4 needs --recompute full"),
    (["--model", "gpt2", "--recompute", "selective", "--recompute-every", "4"], "needs --recompute full"),
    (["--model", "gpt2", "--recompute", "every-2", "--recompute-every", "4"], "contradicts --recompute-every 4"),
    (["--model", "gpt2", "--recompute", "every-0"], "argument --recompute: recompute 'every-0' is not one of"),
    (["--model", "gpt2", "--micro-batch", "0"], "argument --micro-batch: must be an integer from 1 to 65536"),
    (["--model", "gpt2", "--dropout", "1.5"], "argument --dropout: must be >= 0 and < 1"),
    (["--params", "1e400", "--model-states-only"], "argument --params: must be a finite number"),
    (["--model", "gpt2", "--layers", "-3"], "argument --layers: must be an integer >= 1"),
])
def test_refusals_name_the_flag(capsys, args, needle):
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_plan_without_the_estimate_flags_still_runs(capsys):
    rc, out, err = run(capsys, *PLAN, "--gpus", "4", "--tflops", "300", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["considered"] > 0 and "300 TFLOP/s" in " ".join(doc["assumptions"])


def test_one_answer_to_will_it_fit_and_the_sequence_length_named(capsys):
    """The header's "needs" figure is the table's total, and its parts add up to it; the header names the
    sequence length it used (the model's own when --seq is not given)."""
    import re

    from labkit.core.units import fmt_bytes
    from labkit.memory.estimate import ParallelSpec, TrainSpec, estimate
    from labkit.memory.estimate.presets import get_preset

    rc, out, _ = run(capsys, "--model", "llama2-7b", "--micro-batch", "4", "--seq", "4096", "--recompute", "full")
    assert rc == 0
    e = estimate(get_preset("llama2-7b"), ParallelSpec(), TrainSpec(micro_batch=4, seq=4096, recompute="full"))
    total = e.per_gpu_bytes["total"]
    head = out.splitlines()[:2]
    assert "sequence length 4096" in head[0]
    assert f"needs {fmt_bytes(total)} of GPU memory (the table's total)" in head[1]
    table_total = next(line for line in out.splitlines() if line.startswith("total "))
    assert str(total) in table_total.split()
    assert e.peak_allocated + (e.peak_reserved - e.peak_allocated) + (total - e.peak_reserved) == total
    rc, out, _ = run(capsys, "--model", "llama2-7b")
    assert re.search(rf"sequence length {get_preset('llama2-7b').seq}\b", out.splitlines()[0])
