"""A hostile corpus, second round (issue 29): what a careless or hostile user gives each verb. Every case ends
cleanly: exit 2 and one line on stderr naming the input (or, where stated, a correct answer); nothing hangs,
grows without bound, leaks or is lost. In-process (``labkit.cli.main``), each case in well under a second
except the few that import transformers.

Classes: special files through every reader (FIFOs, devices, /proc, folders, paths under a file, 5,000-character
names, links in a capture folder), pickles built to expand, allocator states that are not a GPU's, counts past
their bounds, flags that do not apply, user code that fails, Hugging Face configs of the wrong types.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.cli import main

LONG = "y" * 5000


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def refused(argv: list[str], *fragments: str) -> str:
    rc, out, err = run(argv)
    assert rc == 2 and err.count("\n") == 1 and ": error: " in err, (argv[:4], rc, err[-300:])
    assert "Traceback" not in err and len(err) < 600, err
    for f in fragments:
        assert f in err, (argv[:4], err)
    return err


# ------------------------------------------------------------------ special files through every reader

@pytest.fixture(scope="module")
def specials(tmp_path_factory):
    d = tmp_path_factory.mktemp("specials")
    (d / "afile").write_text("x")
    os.mkfifo(d / "fifo")
    (d / "folder").mkdir()
    os.symlink("/dev/zero", d / "zero-link")
    return {"/dev/zero": ("/dev/zero", "character device"), "/dev/urandom": ("/dev/urandom", "character device"),
            "fifo": (str(d / "fifo"), "FIFO"), "folder": (str(d / "folder"), "folder"),
            "under a file": (str(d / "afile" / "x"), "not a folder"), "long name": (LONG, "too long"),
            "link to /dev/zero": (str(d / "zero-link"), "character device"),
            "/proc/self/mem": ("/proc/self/mem", "/proc/self/mem"), "missing": (str(d / "nope.json"), "no such")}


READERS = {
    "topo --file": lambda p: ["topo", "--file", p],
    "place --file": lambda p: ["place", "--tp", "2", "--file", p],
    "estimate --plan --topology": lambda p: ["estimate", "--plan", "--model", "gpt2", "--global-batch", "8", "--gpus",
                                             "8", "--topology", p],
    "alloc replay": lambda p: ["alloc", "replay", p],
    "alloc doctor --snapshot": lambda p: ["alloc", "doctor", "--snapshot", p],
    "alloc doctor --oom-text": lambda p: ["alloc", "doctor", "--oom-text", p],
    "alloc doctor --stats": lambda p: ["alloc", "doctor", "--stats", p],
    "measure --allocator-state": lambda p: ["measure", "--layers", "1", "--allocator-state", p],
    "measure --hf-config": lambda p: ["measure", "--hf-config", p],
    "advise --hf-config": lambda p: ["advise", "--hf-config", p, "--seq", "128", "--global-batch", "8", "--gpus", "1",
                                     "--gpu-memory", "80GiB"],
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_special_files_are_one_line_through_every_reader(specials, reader):
    for kind, (path, fragment) in specials.items():
        err = refused(READERS[reader](path))
        if kind == "long name" and reader == "estimate --plan --topology":
            fragment = "is neither 'live', a sample"   # a name without a / may be a sample's
        assert fragment in err or (kind == "/proc/self/mem" and "permission denied" in err), (reader, kind, err)


def test_a_capture_folder_with_links_and_fifos_is_read_without_hanging(tmp_path):
    rank = tmp_path / "run" / "rank0"
    rank.mkdir(parents=True)
    (rank / "manifest.json").write_text(json.dumps({"state": "complete", "rank": 0, "oom": True}))
    os.symlink("/dev/zero", rank / "stats.jsonl")
    os.symlink("/dev/urandom", rank / "snapshot.pickle.gz")
    os.mkfifo(rank / "oom_message.txt")
    (rank / "verdict.json").write_text('["not", "a", "verdict"]')
    refused(["alloc", "doctor", "--capture", str(rank)], "nothing to diagnose")
    rc, out, err = run(["watch", "--show", str(tmp_path / "run"), "--json"])
    assert rc == 0 and json.loads(out)["ranks"][0]["verdict"] is None
    os.unlink(rank / "manifest.json")
    os.symlink("/dev/zero", rank / "manifest.json")
    refused(["alloc", "doctor", "--capture", str(rank)], "not a labkit watch capture folder")


# ------------------------------------------------------------------ pickles built to expand; states no GPU has

def _seg(device=0, size=2 << 20, blocks=None):
    return {"device": device, "address": 1 << 30, "total_size": size, "stream": 0, "segment_type": "large",
            "blocks": [{"size": size, "state": "inactive"}] if blocks is None else blocks}


def _pickle(path, doc):
    path.write_bytes(pickle.dumps(doc, protocol=4))
    return str(path)


def test_pickles_built_to_expand_are_refused_before_decoding(tmp_path):
    sets = tmp_path / "sets.pickle.gz"   # 8 MiB of EMPTY_SET opcodes in a few KB of gzip: 216 bytes each decoded
    sets.write_bytes(gzip.compress(b"\x80\x04" + b"\x8f" * (8 << 20) + b".", 9))
    refused(["alloc", "replay", str(sets)], "built to expand", "refused before decoding")
    shared = [{"size": 512, "state": "inactive"} for _ in range(200)]
    p = _pickle(tmp_path / "shared.pickle", {"segments": [dict(_seg(size=512 * 200), blocks=shared)
                                                          for _ in range(2000)], "device_traces": [[]]})
    refused(["alloc", "replay", p], "repeat shared references")
    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0}
    p = _pickle(tmp_path / "events.pickle", {"segments": [], "device_traces": [[entry] * 300_000]})
    refused(["alloc", "replay", p], "repeat shared references")
    shared2 = [{"size": 512, "state": "inactive"}]
    p = _pickle(tmp_path / "two.pickle", {"segments": [dict(_seg(size=512), blocks=shared2)] * 1 +
                                          [dict(_seg(size=512), blocks=shared2)], "device_traces": [[]]})
    refused(["alloc", "replay", p], "shares its block list")


@pytest.mark.parametrize("doc,fragment", [
    ({"segments": [_seg(size=1 << 60)], "device_traces": [[]]}, "more than any GPU's memory"),
    ({"segments": [_seg(blocks=[{"size": -5, "state": "inactive"}])], "device_traces": [[]]}, "negative size"),
    ({"segments": [_seg(blocks=[{"size": 2 << 20, "state": "banana"}])], "device_traces": [[]]}, "'banana'"),
    ({"segments": [_seg(blocks=[{"size": 4 << 20, "state": "inactive"}])], "device_traces": [[]]},
     "more than the segment's total_size"),
    ({"segments": [_seg(device=1)], "device_traces": [[], []]}, "segments only of device(s) 1"),
    ({"segments": [_seg(size=1 << 39) for _ in range(3)], "device_traces": [[]]}, "device 0's segments hold"),
])
def test_allocator_states_no_gpu_has_are_refused(tmp_path, doc, fragment):
    """issue 29: one exabyte segment gave "peak 4194304.00 TiB ... predicted for an H200"."""
    refused(["measure", "--layers", "1", "--allocator-state", _pickle(tmp_path / "s.pickle", doc)], fragment)


# ------------------------------------------------------------------ counts a user controls, flags that do not apply

@pytest.mark.parametrize("argv,fragment", [
    (["measure", "--layers", "200000"], "--layers: must be an integer from 1 to 512"),
    (["measure", "--steps", "1000000000"], "--steps must be from 1 to 50"),
    (["measure", "--reserved-placements", "1000000000"], "--reserved-placements: must be an integer from 0 to 64"),
    (["measure", "--micro-batch", "60000", "--seq", "60000"], "on the host, more than 1.00 GiB"),
    (["measure", "--micro-batch", "60000", "--seq", "60000", "--device", "cpu"], "on the host"),
    (["measure", "--hidden", "10000000"], "--hidden"),
    (["comm", "bench", "--repeats", "1000000000"], "--repeats: must be an integer from 1 to 10000"),
    (["comm", "buckets", "--steps", "1000000000"], "--steps"),
    (["comm", "buckets", "--sizes", ",".join(str(i) for i in range(1, 100))], "99 bucket sizes"),
    (["alloc", "compare", "t.pickle"] + ["--conf", "default"] * 40, "--conf given 40 times"),
    (["estimate", "--model-states-only", "--params", "1e308"], "--params"),
    (["place", "--tp", "2", "--dp", "4", "--dp-bytes", "9e18", "--sample", "h100_nv18_8gpu_dual_numa"], "1 TiB"),
    (["advise", "--model", "gpt2", "--seq", "99999999", "--global-batch", "8", "--gpus", "1"], "--seq"),
    (["watch", "--max-entries", "10", "--", "true"], "--max-entries"),
    (["measure", "--hf-config", ""], "--hf-config: empty"),
    (["measure", "--factory", ""], "--factory: empty"),
    (["measure", "--model", ""], "--model: empty"),
    (["advise", "--model", "gpt2", "--hf-config", "", "--seq", "8", "--global-batch", "8"], "--hf-config: empty"),
    (["measure", "--moe-routing", "balanced"], "a dense model"),
    (["measure", "--process", "warm", "--device", "cpu"], "--process applies to fake mode"),
    (["measure", "--reserved-placements", "2", "--device", "cpu"], "--reserved-placements applies to fake mode"),
    (["measure", "--recompute-via", "hf"], "--recompute-via applies to a Hugging Face model"),
    (["measure", "--image-size", "32"], "--image-size does not apply to the lab's GPT"),
    (["measure", "--task", "causal-lm"], "--task does not apply to the lab's GPT"),
    (["advise", "--factory", "m:f", "--layers", "2", "--seq", "8", "--global-batch", "8"], "--factory model"),
    (["watch", "--json", "--", "true"], "--json goes with --show"),
    (["watch", "--show", "x", "--", "true"], "runs no command"),
    (["watch", "--show", "x", "--detail", "stats"], "--detail applies to a run"),
    (["report", "-p", "tp=-2", "--only", "01_topology"], "tp is a count"),
    (["report", "history", ".", "--only", "01_topology"], "--only applies to a run"),
    (["report", "-p", "sample=nope", "--only", "01_topology"], "not a bundled topology sample"),
    (["report", "-p", "precision=xx", "--only", "06_advise"], "-p precision=xx"),
    (["report", "-p", "gpu_memory=abc", "--only", "06_advise"], "-p gpu_memory=abc"),
    (["report", "-p", "workload=nope", "--only", "05_critical_path"], "unknown workload 'nope'"),
    (["estimate", "--model", ""], "--model: empty"),
    (["estimate", "--list-models", "--model", "gpt2"], "--model does not apply"),
    (["topo", "--list", "--sample", "h100_nv18_8gpu_dual_numa"], "--sample does not apply"),
    (["report", "--out", LONG, "--only", "00_this_server"], "longer than the file system"),
])
def test_counts_and_flags_are_refused_before_any_work(argv, fragment):
    refused(argv, fragment)


def test_a_killed_command_exits_as_a_shell_says():
    """issue 29: `watch -- sh -c 'kill -TERM $$'` exited 241 (256 - 15) instead of 143 (128 + 15)."""
    rc, _, _ = run(["watch", "--", "sh", "-c", "kill -TERM $$"])
    assert rc == 143
    assert run(["watch", "--", "sh", "-c", "exit 3"])[0] == 3


def test_stats_that_are_not_counts_are_refused(tmp_path):
    for i, text in enumerate(['{"allocated_bytes.all.current": -5}', '{"reserved_bytes.all.peak": "x"}',
                              '[{"allocated_bytes.all.peak": 1e400}]', '{"num_alloc_retries": 1.5}',
                              '{"stats": {"allocated_bytes.all.current": true}}']):
        p = tmp_path / f"s{i}.json"
        p.write_text(text)
        refused(["alloc", "doctor", "--stats", str(p)], "expected a non-negative")
    p = tmp_path / "nan.json"
    p.write_text('{"allocated_bytes.all.current": NaN}')
    refused(["alloc", "doctor", "--stats", str(p)], "NaN is not a JSON value")
    refused(["alloc", "doctor", "--stats", "[" * 100_000], "nests more than")


def test_a_deep_nccl_xml_is_read_in_linear_time(tmp_path):
    """issue 29: 50,000 nested <cpu> elements took past 60 s (a walk per <cpu>)."""
    import time

    n = 50_000
    p = tmp_path / "deep.xml"
    p.write_text("<system>" + '<cpu numaid="0">' * n + '<pci busid="a"><gpu dev="0"/></pci>' + "</cpu>" * n
                 + "</system>")
    t = time.monotonic()
    rc, out, err = run(["topo", "--file", str(p)])
    assert rc == 0 and "1 x" in out and time.monotonic() - t < 10
    p.write_text("<system><cpu>" + '<pci busid="b">' * 20_000 + '<gpu dev="0"/>' + "</pci>" * 20_000 + "</cpu></system>")
    refused(["topo", "--file", str(p)], "nested more than 10000 deep")


# ------------------------------------------------------------------ user code that fails, configs of the wrong types

FACTORY_MODULE = '''
import sys
import torch.nn as nn
def text(): return "a string"
def leaves(): sys.exit(0)
def two(a, b): return nn.Linear(2, 2)
def boom(): raise RuntimeError("no weights here")
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)
    def forward(self, input_ids, labels):
        logits = self.head(self.emb(input_ids))
        return {"loss": nn.functional.cross_entropy(logits.view(-1, 16), labels.view(-1))}
def ok(): return LM()
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    (tmp_path / "hostile29_fac.py").write_text(FACTORY_MODULE)
    (tmp_path / "hostile29_raises.py").write_text("raise ValueError('at import')\n")
    (tmp_path / "hostile29_syntax.py").write_text("def f(:\n")
    (tmp_path / "hostile29_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for m in [m for m in sys.modules if m.startswith("hostile29_")]:
        del sys.modules[m]


@pytest.mark.parametrize("spec,fragment", [
    ("hostile29_fac:text", "text() returned a str, not a torch.nn.Module"),
    ("hostile29_fac:leaves", "raised SystemExit(0)"),
    ("hostile29_fac:two", "two needs arguments"),
    ("hostile29_fac:boom", "boom() raised RuntimeError: no weights here"),
    ("hostile29_raises:f", "importing hostile29_raises raised ValueError: at import"),
    ("hostile29_exits:f", "raised SystemExit(3)"),
    ("hostile29_syntax:f", "has a syntax error"),
    (".hostile29_fac:ok", "a relative module name"),
    ("hostile29_fac:ok()", "MODULE is dotted Python names"),
    ("hostile29_fac:nope", "has no function nope"),
])
def test_a_failing_factory_is_one_line(user_code, spec, fragment):
    """issue 29: 13 tracebacks (a string returned, a raising module, wrong arity...); sys.exit(0) gave exit 0."""
    refused(["measure", "--factory", spec, "--micro-batch", "1", "--seq", "8"], fragment)


def test_a_working_factory_still_measures(user_code):
    rc, out, err = run(["measure", "--factory", "hostile29_fac:ok", "--micro-batch", "1", "--seq", "8"])
    assert rc == 0 and "peak" in out, err


BASE = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
        "intermediate_size": 128}


@pytest.mark.parametrize("change,fragment", [
    ({"hidden_size": "64"}, "hidden_size must be an integer, got '64' (str)"),
    ({"vocab_size": 1000.5}, "vocab_size must be an integer"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ({"vocab_size": -5}, "vocab_size must be from 1 to"),
    ({"num_hidden_layers": 200000}, "num_hidden_layers must be from 1 to 512"),
    ({"architectures": [None]}, "'architectures' is [None]"),
    ({"num_key_value_heads": 3}, "not divisible by 3 key/value heads"),
    ({"hidden_size": 65}, "65"),
])
def test_a_config_of_the_wrong_types_is_one_line(tmp_path, change, fragment):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**BASE, **change}))
    refused(["measure", "--hf-config", str(p), "--micro-batch", "1", "--seq", "8"], fragment)


def test_configs_that_are_not_json_objects(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(BASE).replace("1000", "NaN"))
    refused(["measure", "--hf-config", str(p)], "NaN is not a JSON value")
    p.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    refused(["measure", "--hf-config", str(p)], "nests more than 200 levels")
    refused(["measure", "--hf-config", "gpt2", "--hidden", "65", "--heads", "4", "--layers", "1"],
            "hidden size 65 is not divisible by 4 attention heads")


# ------------------------------------------------------------------ property: any path string, any bytes

PATHS = st.one_of(st.text(max_size=300), st.sampled_from(["/dev/zero", "/proc/self/mem", "/etc", "/etc/hostname/x",
                                                          "/dev/null", "\x00", "~", "-", "."]),
                  st.integers(1, 6000).map(lambda n: "z" * n))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(path=PATHS)
def test_any_path_is_read_or_refused_in_one_line(path):
    from labkit.core.errors import LabkitError
    from labkit.core.serialize import read_bytes, read_json

    for reader in (read_bytes, read_json):
        try:
            reader(path, "file", limit=1 << 16)
        except LabkitError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 400
        except ValueError:   # read_json of bytes that are JSON but... never: it raises LabkitError
            raise


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=400).map(lambda b: b"\x80\x04" + b))
def test_any_pickle_bytes_are_read_or_refused_in_one_line(raw):
    from labkit.allocator.snapshot import read_snapshot
    from labkit.core.errors import LabkitError

    try:
        read_snapshot(raw)
    except LabkitError as exc:
        assert "\n" not in str(exc)


def test_advise_bounds_the_traced_batch(user_code):
    """The traced step's batch is built on the host: 60000 x 60000 tokens tried to allocate 28.8 GB."""
    refused(["advise", "--factory", "hostile29_fac:ok", "--micro-batch", "60000", "--seq", "60000", "--global-batch",
             "60000", "--gpus", "1", "--gpu-memory", "80GiB"], "more than 1.00 GiB")


@pytest.mark.parametrize("change,fragment", [({"num_hidden_layers": 200000}, "more than labkit takes (512)"),
                                             ({"vocab_size": 1000.5}, "vocab_size must be a positive integer"),
                                             ({"hidden_size": 65}, "hidden=65 is not divisible by heads=4")])
def test_advise_reads_configs_as_strictly(tmp_path, change, fragment):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**BASE, **change}))
    refused(["advise", "--hf-config", str(p), "--seq", "128", "--global-batch", "8", "--gpus", "1", "--gpu-memory",
             "80GiB"], fragment)
