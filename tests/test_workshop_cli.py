"""What a workshop participant types: a GPU's memory without a unit is refused with the units to use."""

import json

import pytest

from labkit.cli import main


def call(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv", [
    ["advise", "--model", "gpt2-124m", "--seq", "1024", "--global-batch", "8", "--gpus", "1", "--gpu-memory", "141"],
    ["estimate", "--plan", "--model", "gpt2-124m", "--seq", "1024", "--global-batch", "8", "--gpus", "1",
     "--gpu-memory", "141"],
])
def test_a_bare_gpu_memory_is_refused_naming_the_units(capsys, argv):
    rc, out, err = call(capsys, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "--gpu-memory 141: give a unit" in err and "141GB" in err and "141GiB" in err


def test_a_gpu_memory_with_its_unit_is_taken(capsys):
    rc, out, err = call(capsys, "estimate", "--plan", "--model", "gpt2-124m", "--seq", "1024", "--global-batch", "8",
                        "--gpus", "1", "--gpu-memory", "141GB", "--json")
    assert rc == 0, err
    assert json.loads(out)


def test_transformers_own_messages_stay_out_of_measure(run_cli):
    """transformers resets its logger's level when it is imported: its notices (here `loss_type=None` ...) must
    not reach measure's output (a fresh process, as a user runs it)."""
    r = run_cli("measure", "--hf-config", "gpt2", "--layers", "2", "--seq", "64", "--recompute", "full")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "[transformers]" not in r.stdout


def test_advise_help_says_what_the_micro_batch_search_needs(capsys):
    """The help says the micro-batch is searched when a global batch is given; giving neither is refused,
    naming both."""
    from labkit.cli import build_parser

    helptext = " ".join(next(a for a in build_parser()._subparsers._group_actions[0].choices["advise"]._actions
                             if "--micro-batch" in a.option_strings).help.split())
    assert "searched, when --global-batch is given" in helptext
    rc, out, err = call(capsys, "advise", "--model", "gpt2-124m", "--seq", "1024", "--gpus", "1", "--gpu-memory",
                        "80GiB")
    assert rc == 2 and "--global-batch" in err and "--micro-batch" in err
