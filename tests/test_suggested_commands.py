"""Every `labkit ...` command a notebook's prose or the README tells the reader to run is run here, as typed
(in a folder holding the files it names: saved.txt, run.pickle, err.txt, config.json, train.py).

What it must do without a GPU (CI has none): finish with exit 0; or, for a command that needs a GPU (NCCL,
--device cuda, the live topology), be refused with exit 2 in one line that says what is missing and what
to use instead, which is what a participant on a laptop sees. A synopsis (`labkit report [--out DIR] ...`,
placeholders in capitals) is not a command to run; a verb named alone where it needs arguments (`labkit place`)
refers to the verb: its --help must work.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import shlex
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.core.paths import NOTEBOOKS_DIR, REPO_ROOT, TOPOLOGIES_DIR

sys.path.insert(0, str(Path(__file__).parent / "notebooks"))
from test_cell_rules import labkit_commands  # noqa: E402  (the notebooks' own command reader)

SYNOPSIS = re.compile(r"[\[\]|<>]|\.\.\.|(?<![\w-])[A-Z][A-Z_]*(?![\w-])")   # brackets, ..., PLACEHOLDERS
# verbs named alone in prose where they need arguments: a reference to the verb
REFERENCES = {"labkit place", "labkit estimate", "labkit report", "labkit watch"}
# what needs a GPU (or its driver): refused here, in one line naming what is missing
NEEDS_GPU = re.compile(r"--live\b|--backend nccl\b|--device cuda\b|^labkit topo$|^labkit place --tp")


def suggested() -> dict[str, list[str]]:
    """{command: where it is suggested}, from the notebooks' markdown and the README."""
    found: dict[str, list[str]] = {}
    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for cmd in labkit_commands("\n".join(c.source for c in nb.cells if c.cell_type == "markdown")):
            found.setdefault(cmd, []).append(path.stem)
    for cmd in labkit_commands((REPO_ROOT / "README.md").read_text()):
        found.setdefault(cmd, []).append("README")
    return {c: w for c, w in found.items() if not SYNOPSIS.search(c)}


COMMANDS = sorted(suggested())


@pytest.fixture
def reader_folder(tmp_path, monkeypatch):
    """The files the suggested commands name, in the current folder; `python` on PATH is this interpreter."""
    from labkit.allocator.sim.synthetic import to_snapshot, training_like

    snap = pickle.dumps(to_snapshot(training_like(steps=2), ""))
    (tmp_path / "run.pickle").write_bytes(snap)
    (tmp_path / "run.pickle.gz").write_bytes(gzip.compress(snap))
    (tmp_path / "err.txt").write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.50 GiB is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and "
        "6.00 GiB is reserved by PyTorch but unallocated.")
    (tmp_path / "saved.txt").write_text((TOPOLOGIES_DIR / "dgx1_v100_hybrid_cube_mesh_4nic.txt").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4,
                                                      "vocab_size": 1000, "n_positions": 2048}))
    (tmp_path / "train.py").write_text("print('one training step')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return tmp_path


def test_the_commands_are_found():
    cmds = suggested()
    assert "labkit env" in cmds and "labkit alloc compare run.pickle" in cmds
    assert not any(SYNOPSIS.search(c) for c in cmds)
    assert SYNOPSIS.search("labkit report history DIR") and not SYNOPSIS.search("labkit env --json")


@pytest.mark.parametrize("cmd", COMMANDS, ids=[re.sub(r"[^\w.=-]+", "_", c.removeprefix("labkit ")) for c in COMMANDS])
def test_every_suggested_command_runs(cmd, reader_folder, capfd):
    import torch

    argv = shlex.split(cmd)[1:]
    if cmd in REFERENCES:
        argv.append("--help")
    try:
        rc = main(argv)
    except SystemExit as exc:  # --help
        rc = exc.code or 0
    out, err = capfd.readouterr()  # file descriptors: a command's child process (watch runs train.py) too
    where = ", ".join(suggested()[cmd])
    if NEEDS_GPU.search(cmd) and not torch.cuda.is_available():
        assert rc == 2 and err.count("\n") == 1, f"{cmd} ({where}): {rc}\n{err[-2000:]}"
        assert re.search(r"NVML|NVIDIA|CUDA|GPU", err) and "use " in err, f"{cmd} ({where}): {err}"
        return
    assert rc == 0, f"{cmd} (suggested in {where}) exits {rc}:\n{err[-2000:]}"
    assert out.strip(), f"{cmd} ({where}) printed nothing"
