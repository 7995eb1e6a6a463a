"""Property tests over every verb's argument space (issue 12): whatever the arguments, ``labkit``
never shows a traceback; it exits 0, or 2 with exactly one line on stderr.

Calls are in-process (``labkit.cli.main``). Verbs that would start work which is not argument
handling stop at that point through a stand-in: ``comm`` where it would spawn ranks, ``report``
where it would create its run folder and run notebooks, ``measure`` where it would trace a step;
``watch`` only reads run folders (--show),
``advise`` sizes a sample node without tracing. Examples are derandomized (the same
every run) so that CI is repeatable; raise ``max_examples`` locally to explore further.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import pickle
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.cli import main

FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class _Stopped(Exception):
    """Raised by a stand-in where a verb would start real work: its arguments were accepted."""


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except _Stopped:
            rc = 0
    return rc, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> int:
    """The contract; returns the exit status."""
    rc, _, err = run(argv)   # an exception other than _Stopped fails the test with its traceback
    assert rc in (0, 2), (argv, rc, err)
    if rc == 2:
        assert err.count("\n") == 1 and err.endswith("\n") and ": error: " in err, (argv, err)
    return rc


# ------------------------------------------------------------------ values

JUNK = st.sampled_from(["", " ", "x", "-", "--", "nan", "inf", "-inf", "1e400", "-1e400", "0x10", "1_000", "\u0661",
                        "1.5", "-0", "+3", "1e3", "None", "true", "{}", "[1]", "a b", "é", "\t", "\n", "9" * 40])
# mostly plausible values, so that calls get past the parser as often as they are stopped there
SMALL = st.sampled_from(["1", "2", "4", "8"])
INTS = st.one_of(SMALL, SMALL, SMALL, st.integers(-5, 70).map(str), st.integers(-(10**30), 10**30).map(str), JUNK)
FLOATS = st.one_of(st.sampled_from(["0", "0.1", "0.5", "100"]), st.sampled_from(["0.1", "300"]),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.floats(-1e6, 1e6).map(lambda v: f"{v:g}"),
                   JUNK)
WORDS = st.one_of(st.text(string.ascii_letters + string.digits + "-_.,:/", max_size=12), JUNK)
SIZES = st.one_of(st.sampled_from(["4KiB", "1MiB", "64MiB", "1GB", "0", "-1", "1e400GB", "3 PB", "12", "1.5KiB"]),
                  WORDS)


def value(choices, extra=WORDS):
    pick = st.sampled_from(list(choices))
    return st.one_of(pick, pick, pick, extra)


def argv_of(flags: dict[str, st.SearchStrategy | None], *, prefix: tuple[str, ...] = (), max_flags: int = 6,
            strays: bool = True):
    """Lists of ``flag [value]`` drawn from ``flags`` (None: a switch), plus now and then a stray token."""
    names = sorted(flags)

    def one(name: str):
        s = flags[name]
        return st.just([name]) if s is None else s.map(lambda v: [name, v])

    pair = st.sampled_from(names).flatmap(one)
    stray = st.one_of(JUNK, st.sampled_from(["--no-such-flag", "--json=1", "-h2"])).map(lambda t: [t])
    parts = st.one_of(pair, pair, pair, pair, pair, pair, stray) if strays else pair
    return st.lists(parts, max_size=max_flags).map(
        lambda parts: list(prefix) + [t for p in parts for t in p])


# ------------------------------------------------------------------ estimate (and --plan)

PRESETS = ["gpt2", "llama2-7b", "llama3-8b", "no-such-model"]
ESTIMATE = {
    "--model": value(PRESETS), "--layers": INTS, "--hidden": INTS, "--heads": INTS, "--seq": INTS, "--vocab": INTS,
    "--kv-heads": INTS, "--ffn": INTS, "--gated": None, "--untied": None, "--params": FLOATS,
    "--model-states-only": None, "--micro-batch": INTS, "--global-batch": INTS, "--dropout": FLOATS,
    "--precision": value(["fp32", "amp-bf16", "bf16-mixed", "bfloat16", "fp8"]), "--fp32-grads": None,
    "--optimizer": value(["adamw", "sgd", "adam8bit", "adamw-foreach", "lion"]),
    "--optimizer-impl": value(["foreach", "fused", "for-loop", "apex"]),
    "--recompute": value(["none", "selective", "full", "every-2", "every-0", "every-x"]),
    "--recompute-every": INTS, "--no-flash": None, "--keep-logits": None,
    "--framework": value(["pytorch", "megatron"]), "--tp": INTS, "--pp": INTS, "--dp": INTS, "--cp": INTS,
    "--zero": INTS, "--sp": None, "--vpp": INTS, "--schedule": value(["1f1b", "gpipe", "interleaved"]),
    "--no-vocab-parallel": None, "--shard-size": INTS, "--no-reshard": None, "--json": None,
    "--gpu-memory": SIZES, "--margin": FLOATS, "--tflops": FLOATS, "--list-models": None,
    "--hf-config": value(["gpt2", "llama", "no_such_type", "/no/such/config.json"]),
}
# the planner's search is bounded by the cluster: small clusters here (its speed is benchmarks/' business)
PLANNER = {"--model": value(PRESETS[:2]), "--global-batch": st.sampled_from(["8", "16", "8", "0", "-4", "x", "1e400"]),
           "--gpus": st.sampled_from(["1", "2", "4", "8", "16", "0", "-8", "3", "x"]),
           "--gpus-per-node": st.sampled_from(["1", "2", "8", "16", "0", "x"]),
           "--gpu-memory": SIZES, "--margin": FLOATS, "--tflops": FLOATS,
           "--precision": value(["bf16-mixed", "fp32", "xx"]), "--optimizer": value(["adamw", "sgd"]),
           "--framework": value(["pytorch", "megatron"]), "--json": None,
           "--tp": INTS, "--recompute": value(["full", "every-2"]), "--micro-batch": INTS,
           "--topology": value(["h100_nv18_8gpu_dual_numa", "no_such_sample"])}


@FUZZ
@given(argv_of(ESTIMATE, prefix=("estimate",), max_flags=8))
def test_estimate(argv):
    check(argv)


@FUZZ
@given(argv_of(ESTIMATE, prefix=("estimate", "--model", "gpt2"), max_flags=3))
def test_estimate_of_a_preset(argv):
    check(argv)


@settings(FUZZ, max_examples=25)
@given(argv_of(PLANNER, prefix=("estimate", "--plan", "--model", "gpt2", "--global-batch", "8"), max_flags=4))
def test_estimate_plan(argv):
    check(argv)


ADVISE = {"--model": value(["gpt2", "llama3-8b", "nope"]), "--seq": INTS, "--global-batch": INTS, "--micro-batch": INTS,
          "--precision": value(["bf16-mixed", "amp-bf16", "fp32", "bfloat16"]), "--optimizer": value(["adamw", "sgd"]),
          "--recompute": value(["none", "full", "every-2", "every-0"]), "--trace": value(["off"], JUNK),
          "--gpus": st.sampled_from(["1", "2", "4", "8", "0", "x", "3"]), "--gpu-memory": SIZES,
          "--nodes": st.sampled_from(["1", "2", "0", "x"]), "--margin": FLOATS, "--layers": INTS, "--hidden": INTS,
          "--json": None}


@settings(FUZZ, max_examples=25)
@given(argv_of(ADVISE, prefix=("advise", "--model", "gpt2", "--seq", "1024", "--global-batch", "16", "--trace", "off",
                               "--sample", "h100_nv18_8gpu_dual_numa", "--gpu-memory", "80GiB"), max_flags=4))
def test_advise(argv):
    check(argv)


# ------------------------------------------------------------------ measure (stopped before any step is traced)

@pytest.fixture
def no_trace(monkeypatch):
    import labkit.memory.trace.step as step
    import labkit.workloads.corpus as corpus

    def stop(*a, **k):
        raise _Stopped

    monkeypatch.setattr(step, "measure_step", stop)
    monkeypatch.setattr(corpus, "predict", stop)


# user code is given only as names that cannot do harm when called (a factory is called to read its vocabulary)
MEASURE = {"--model": value(["tiny", "gpt2-124m", "gpt", "", "nope"]), "--hf-config": value(["gpt2", "llama", "", "lama",
           "/dev/zero", "/etc/hostname/x", "missing/config.json"]),
           "--factory": value(["nomodule:f", "collections:OrderedDict", "json:dumps", ".rel:f", "", "a:b:c"]),
           "--task": value(["causal-lm", "masked-lm", "image-classification", "x"]), "--lora": None,
           "--no-kv-cache": None, "--layers": INTS, "--hidden": INTS, "--heads": INTS, "--vocab": INTS,
           "--micro-batch": INTS, "--seq": INTS, "--image-size": INTS, "--precision": value(["fp32", "amp-bf16", "bf16"]),
           "--recompute": value(["none", "full", "every-2", "every-0"]), "--recompute-via": value(["torch", "hf"]),
           "--optimizer": value(["adamw", "sgd"]), "--loop": value(["plain", "keep-output"]),
           "--moe-routing": value(["balanced", "0.5,0.5", "1,0", "-1,2"]),
           "--allocator-state": value(["/dev/zero", "", "missing.pickle"]), "--reserved-placements": INTS,
           "--process": value(["fresh", "warm"]), "--device": value(["fake-cuda", "cpu", "cuda", "tpu"]),
           "--steps": INTS, "--json": None}


@FUZZ
@given(argv=argv_of(MEASURE, prefix=("measure",), max_flags=5))
def test_measure_arguments(no_trace, argv):
    check(argv)


# ------------------------------------------------------------------ comm (stopped before any rank starts)

@pytest.fixture
def no_spawn(monkeypatch):
    import labkit.comm.launch as launch

    def stop(*a, **k):
        raise _Stopped

    monkeypatch.setattr(launch, "run_ranks", stop)


COMM_BENCH = {"--backend": value(["gloo", "nccl"]), "--world": INTS, "--op": value(["all", "all_reduce",
              "all_gather,broadcast", "reduce_scatter", "all_to_all", ","]), "--min-bytes": SIZES, "--max-bytes": SIZES,
              "--factor": INTS, "--warmup": INTS, "--repeats": INTS, "--link-class": WORDS, "--json": None}
COMM_BUCKETS = {"--backend": value(["gloo", "nccl"]), "--world": INTS,
                "--sizes": st.one_of(st.sampled_from(["1,25,100", "inf", "0", "1,,2", "1e9", "nan", "-1", "25"]), WORDS),
                "--model": value(["tiny", "gpt2-124m", "nope"]), "--workload": value(["tiny", "nope"]),
                "--micro-batch": INTS, "--batch-size": INTS,
                "--steps": INTS, "--warmup": INTS, "--gradient-as-bucket-view": value(["off", "on", "both"]),
                "--precision": value(["fp32", "amp-bf16", "amp-fp16", "bf16", "float99"]),
                "--amp": value(["bfloat16", "float16", "float99", "amp-bf16"]), "--json": None}


@FUZZ
@given(argv=argv_of(COMM_BENCH, prefix=("comm", "bench")))
def test_comm_bench_arguments(no_spawn, argv):
    check(argv)


@FUZZ
@given(argv=argv_of(COMM_BUCKETS, prefix=("comm", "buckets")))
def test_comm_buckets_arguments(no_spawn, argv):
    check(argv)


# ------------------------------------------------------------------ report (stopped before its run folder)

@pytest.fixture
def no_run(monkeypatch):
    import labkit.report.runner as runner

    def stop(*a, **k):
        raise _Stopped

    monkeypatch.setattr(runner, "new_run_folder", stop)


@FUZZ
@given(argv=argv_of({"--profile": value(["smoke", "full", "fast"]),
                     "--only": value(["00_environment", "02_parallel_memory", "no_such_notebook"]),
                     "-p": st.one_of(st.sampled_from(["smoke=True", "smoke=1", "nope=3", "=", "smoke", "a=b=c"]), WORDS)},
                    prefix=("report",), max_flags=4))
def test_report_arguments(no_run, argv):
    check(argv)


# ------------------------------------------------------------------ env, topo, place

@settings(FUZZ, max_examples=10)
@given(argv_of({"--json": None}, prefix=("env",), max_flags=2))
def test_env(argv):
    check(argv)


SAMPLES = ["dgx1_v100_hybrid_cube_mesh_4nic", "h100_nv18_8gpu_dual_numa", "no_such_sample"]


@FUZZ
@given(argv_of({"--sample": value(SAMPLES), "--gpu-name": value(["A100", "H100", "H200"]), "--json": None,
                "--list": None, "--p2p": None}, prefix=("topo",), max_flags=3))
def test_topo(argv):
    if not any(a in ("--sample", "--file", "--list") for a in argv):
        argv = argv + ["--sample", SAMPLES[0]]   # without a source, topo reads this machine's GPUs
    check(argv)


PLACE = {"--sample": st.sampled_from(SAMPLES), "--tp": st.sampled_from(["1", "2", "4", "8", "0", "-2", "3", "x"]),
         "--pp": st.sampled_from(["1", "2", "4", "0", "x"]), "--dp": st.sampled_from(["1", "2", "4", "0", "x"]),
         "--tp-bytes": st.sampled_from(["64MiB", "1GB", "0", "x", "-1"]),
         "--pp-bytes": st.sampled_from(["64MiB", "1KiB", "x"]), "--dp-bytes": st.sampled_from(["1GiB", "x"]),
         "--json": None}


@FUZZ
@given(argv_of(PLACE, prefix=("place", "--sample", SAMPLES[1]), max_flags=4))
def test_place(argv):
    check(argv)


@FUZZ
@given(argv=argv_of({"--show": st.one_of(st.sampled_from(["/nonexistent", "/etc/passwd", ""]), WORDS),
                     "--detail": value(["trace", "stacks", "stats"]), "--max-entries": INTS, "--json": None,
                     "--no-sim": None, "--reduce": None}, prefix=("watch",), max_flags=4, strays=False))
def test_watch_arguments(tmp_path, argv):
    # No stray tokens: watch runs them as the command (a command that does not exist still ends in a
    # traceback, issue 12). Without --show it would run the command after --: give it a run folder.
    if "--show" not in argv:
        argv = argv + ["--show", str(tmp_path / "no_such_run")]
    check(argv)


# ------------------------------------------------------------------ alloc on malformed files

def _leaf():
    return st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                     st.text(max_size=6))


JSONISH = st.recursive(_leaf(), lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                       max_leaves=12)
# snapshot-shaped documents: the keys a snapshot has, with values of any shape
ENTRY = st.fixed_dictionaries({}, optional={"action": st.one_of(st.sampled_from(["alloc", "free_requested",
                                                                                "free_completed", "segment_alloc",
                                                                                "segment_free", "oom", "x"]), JSONISH),
                                            "addr": st.integers(-1, 2**40), "size": st.integers(-1, 2**33),
                                            "stream": st.one_of(st.integers(0, 3), JSONISH), "frames": st.just([])})
SEGMENT = st.dictionaries(st.sampled_from(["address", "total_size", "stream", "blocks", "device", "segment_type"]),
                          _leaf(), max_size=5)
# Trace entries whose action or stream is a list, a dict or a string, and --stats documents whose
# "ranks" is anything at all: the readers name the entry they cannot read (issue 12).
SNAPSHOTS = st.one_of(
    JSONISH,
    st.fixed_dictionaries({"segments": st.one_of(st.just([]), _leaf(), st.lists(SEGMENT, max_size=3)),
                           "device_traces": st.one_of(st.lists(st.lists(ENTRY, max_size=6), max_size=2), _leaf())}),
)
STATS = st.one_of(JSONISH, st.fixed_dictionaries({"ranks": JSONISH}))


def _write(tmp_path: Path, doc, how: str) -> Path:
    p = tmp_path / f"snap.{how}"
    raw = pickle.dumps(doc)
    p.write_bytes({"pickle": raw, "gz": gzip.compress(raw), "json": json.dumps(doc, default=str).encode(),
                   "bytes": raw[: len(raw) // 2]}[how])
    return p


@FUZZ
@given(doc=SNAPSHOTS, how=st.sampled_from(["pickle", "gz", "bytes"]),
       extra=argv_of({"--conf": value(["", "expandable_segments:True", "max_split_size_mb:x", "garbage"]),
                      "--cap-bytes": SIZES, "--gpu": INTS, "--json": None}, max_flags=3))
def test_alloc_replay_on_malformed_snapshots(tmp_path, doc, how, extra):
    check(["alloc", "replay", str(_write(tmp_path, doc, how)), *extra])


@FUZZ
@given(doc=STATS, text=st.one_of(st.text(max_size=200), st.binary(max_size=64)))
def test_alloc_doctor_on_malformed_files(tmp_path, doc, text):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(doc, default=str))
    oom = tmp_path / "oom.txt"
    if isinstance(text, bytes):
        oom.write_bytes(text)   # a binary file as --oom-text
    else:
        oom.write_text(text)
    check(["alloc", "doctor", "--stats", str(stats), "--no-sim"])
    check(["alloc", "doctor", "--oom-text", str(oom), "--no-sim"])
