"""Every verb: its ``--help``, one real call, and the error contract (exit 2, one line on stderr)."""

import gzip
import json
import sys
import pickle

import pytest

from labkit.cli import build_parser, main

# every verb and sub-verb the CLI has (the test below checks this list against the parser)
VERBS = [("env",), ("measure",), ("estimate",), ("topo",), ("place",), ("report",), ("comm",), ("comm", "bench"),
         ("comm", "buckets"), ("alloc",), ("alloc", "replay"), ("alloc", "compare"), ("alloc", "doctor"), ("watch",),
         ("advise",)]


def call(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _verbs_of(parser, prefix=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from _verbs_of(sub, prefix + (name,))


def test_the_verb_list_is_complete():
    assert sorted(_verbs_of(build_parser())) == sorted(VERBS)


def test_help_lists_commands(run_cli):
    r = run_cli("--help")
    assert r.returncode == 0
    for verb in {v[0] for v in VERBS}:
        assert verb in r.stdout


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_every_verb_has_help(capsys, verb):
    rc, out, err = call(capsys, *verb, "--help")
    assert rc == 0 and err == ""
    assert out.startswith("usage: labkit " + " ".join(verb))


# ------------------------------------------------------------------ one real call each

def test_env_json_is_one_document(run_cli):
    r = run_cli("env", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"gpus", "torch_version", "cpu_logical_cores", "numa_nodes", "ram_bytes", "env"} <= set(doc)


def test_env_table_redacts(run_cli):
    r = run_cli("env", env={"NCCL_SECRET_TOKEN": "abc"})
    assert r.returncode == 0, r.stderr
    assert "NCCL_SECRET_TOKEN" in r.stdout and "abc" not in r.stdout.split("NCCL_SECRET_TOKEN", 1)[1].splitlines()[0]


def test_measure_predicts_a_tiny_step_in_fake_mode(capsys):
    rc, out, err = call(capsys, "measure", "--layers", "1", "--hidden", "64", "--heads", "2", "--seq", "32",
                        "--vocab", "128", "--batch", "1", "--device", "fake-cuda", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["device"] == "fake-cuda" and doc["peak_bytes"] > doc["init_bytes"] > 0


def test_estimate_prints_what_the_model_computes(capsys):
    from labkit.memory.estimate import ParallelSpec, TrainSpec, estimate
    from labkit.memory.estimate.presets import get_preset

    rc, out, err = call(capsys, "estimate", "--model", "gpt2", "--dp", "2", "--zero", "1", "--micro-batch", "2",
                        "--recompute", "every-3", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    e = estimate(get_preset("gpt2"), ParallelSpec(dp=2, zero=1), TrainSpec(micro_batch=2, recompute="every-3"))
    assert doc["per_gpu_bytes"] == e.per_gpu_bytes and doc["train"]["recompute"] == "every-3"


def test_topo_and_place_on_a_sample(capsys):
    rc, out, err = call(capsys, "topo", "--sample", "dgx1_v100_hybrid_cube_mesh_4nic", "--json")
    assert rc == 0, err
    assert len(json.loads(out)["gpus"]) == 8
    rc, out, err = call(capsys, "place", "--tp", "2", "--dp", "4", "--sample", "dgx1_v100_hybrid_cube_mesh_4nic")
    assert rc == 0, err
    assert "CUDA_VISIBLE_DEVICES" in out


def test_report_refuses_an_unknown_notebook_before_running_any(capsys, tmp_path):
    rc, _, err = call(capsys, "report", "--only", "no_such_notebook", "--out", str(tmp_path / "reports"))
    assert rc == 2
    assert err.strip().count("\n") == 0 and "unknown notebook" in err
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def test_comm_bench_on_two_gloo_ranks(capsys):
    rc, out, err = call(capsys, "comm", "bench", "--world", "2", "--op", "all_reduce", "--min-bytes", "4KiB",
                        "--max-bytes", "16KiB", "--repeats", "2", "--warmup", "1", "--json")
    assert rc == 0, err
    rows = json.loads(out)["bench"]["rows"]
    assert [r["bytes"] for r in rows] == [4096, 16384] and all(r["time_us"] > 0 for r in rows)


def test_comm_buckets_one_rank(capsys):
    rc, out, err = call(capsys, "comm", "buckets", "--world", "1", "--sizes", "25", "--steps", "1",
                        "--gradient-as-bucket-view", "off", "--micro-batch", "1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["batch_size"] == 1 and any(r["bucket_cap_mb"] == 25 for r in doc["rows"])


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory):
    from labkit.allocator.sim.synthetic import to_snapshot, training_like

    p = tmp_path_factory.mktemp("cli") / "train.pickle.gz"
    p.write_bytes(gzip.compress(pickle.dumps(to_snapshot(training_like(steps=2), ""))))
    return p


def test_advise_plans_a_preset_on_a_sample(capsys):
    rc, out, err = call(capsys, "advise", "--model", "gpt2", "--seq", "1024", "--global-batch", "16",
                        "--sample", "h100_nv18_8gpu_dual_numa", "--gpu-memory", "80GiB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["fits"] and doc["layout"]["tp"] * doc["layout"]["pp"] * doc["layout"]["dp"] == 8
    assert doc["command"].startswith("CUDA_VISIBLE_DEVICES=")


def test_watch_without_a_gpu_runs_the_command_and_says_so(capsys, tmp_path):
    rc, out, err = call(capsys, "watch", "--out", str(tmp_path / "w"), "--", sys.executable, "-c", "print('hi')")
    assert rc == 0, err
    assert "no GPU" in (out + err) or "no-op" in (out + err)


def test_alloc_replay_compare_doctor(capsys, snapshot_file, tmp_path):
    rc, out, err = call(capsys, "alloc", "replay", str(snapshot_file), "--gpu", "0", "--json")
    assert rc == 0, err
    assert json.loads(out)["reserved_peak_bytes"] >= json.loads(out)["allocated_peak_bytes"] > 0
    rc, out, err = call(capsys, "alloc", "compare", str(snapshot_file), "--conf", "default",
                        "--conf", "expandable_segments:True", "--json")
    assert rc == 0, err
    assert [r["config"] for r in json.loads(out)][1] == "expandable_segments:True"
    oom = tmp_path / "oom.txt"
    oom.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                   "capacity of 79.10 GiB of which 1.50 GiB is free. Of the allocated memory 70.00 GiB is allocated "
                   "by PyTorch, and 6.00 GiB is reserved by PyTorch but unallocated.")
    rc, out, err = call(capsys, "alloc", "doctor", "--oom-text", str(oom), "--json")
    assert rc == 0, err
    assert json.loads(out)


# ------------------------------------------------------------------ the error contract

@pytest.mark.parametrize("argv", [
    ["estimate", "--precision", "xx"],             # a choice
    ["estimate", "--tp", "two"],                   # a type
    ["estimate", "--no-such-flag"],                # an unknown flag
    ["alloc", "replay"],                           # a missing argument
    ["no-such-verb"],
    ["comm", "bench", "--world"],                  # a flag without its value
    ["alloc", "replay", "x.pickle", "--gpu", "-1"],
])
def test_argparse_errors_are_one_line_and_exit_2(capsys, argv):
    rc, out, err = call(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and ": error: " in err and "usage:" not in err


def test_user_error_is_exit_2_and_one_line(capsys):
    rc, _, err = call(capsys, "estimate", "--model", "no-such-model")
    assert rc == 2 and err.count("\n") == 1 and err.startswith("labkit estimate: error: ")


def test_sub_verb_errors_name_the_sub_verb(capsys):
    rc, _, err = call(capsys, "comm", "buckets", "--sizes", "inf")
    assert rc == 2 and err.startswith("labkit comm buckets: error: --sizes")
