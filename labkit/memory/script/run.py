"""Run a user's training script, unmodified, on the fake GPU: :func:`run_script` in this process,
:func:`trace_script` in a fresh one (the default: a training script is a new process, and a fresh process
allocates its cuBLAS workspaces at its first matmuls; nothing of the caller's state leaks in).

``labkit measure --script train.py [--steps N] [--json] -- ARGS`` is :func:`run_script` in the CLI's own
new process. The script runs as ``python train.py ARGS`` would (``__main__``, ``sys.argv``, its folder first
on ``sys.path``); its own output goes to stdout, or to stderr with ``--json`` so that stdout holds only the
report. ``labkit watch -- python train.py ARGS`` is the same run on a real GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import subprocess
import sys
import traceback
from typing import Any

import torch

from labkit.core.errors import LabkitError
from labkit.memory.script.ranks import fake_launch
from labkit.memory.script.runtime import fake_gpu
from labkit.memory.script.script_report import report_from_json
from labkit.memory.trace.refusals import locate
from labkit.workloads.vision import prepare_torchvision

OUTPUT_KEPT = 8000          # characters of a script's own output kept in its report (trace_script)
BANNER = ("labkit: {path} runs on a fake {gpu} (no GPU is used); torch.cuda answers with predicted figures, so "
          "the script's own memory prints are predictions too")


def check_script(path: str) -> str:
    """The script's absolute path, or one clear error naming it."""
    if not path:
        raise LabkitError("--script: give the path of a Python script")
    p = os.path.abspath(path)
    if not os.path.exists(p):
        raise LabkitError(f"--script {path}: no such file")
    if not os.path.isfile(p):
        raise LabkitError(f"--script {path}: not a regular file")
    if not os.access(p, os.R_OK):
        raise LabkitError(f"--script {path}: not readable")
    return p


def _user_frame(tb: Any, sites: Any) -> str:
    """The innermost frame of the user's own code in a traceback, as ``file:line``."""
    found = ""
    for frame, line in traceback.walk_tb(tb):
        if sites._kind(frame.f_code.co_filename) == 2:
            found = f"{os.path.relpath(frame.f_code.co_filename)}:{line}"
    return found


def _refusal(exc: BaseException, gpu: Any, path: str) -> LabkitError:
    """One line for a script the fake GPU could not run: the op, the user's line, the module, what to do."""
    where = _user_frame(exc.__traceback__, gpu.tracker.sites) or os.path.relpath(path)
    op, _ = locate(exc, {})
    module = gpu.emulator.modules.where()
    first = (str(exc).strip().splitlines() or [""])[0][:240]
    cause = f"{type(exc).__name__}: {first}"
    script = os.path.relpath(path)
    todo = (f"on a GPU, run it under `labkit watch -- python {script}`; without one, measure the model's step with "
            "`labkit measure --factory MODULE:FUNCTION` or size it with `labkit estimate`")
    if op:
        return LabkitError(f"fake GPU cannot run op {op} at {where} ({module}): {cause}; {todo}")
    return LabkitError(f"{script} raised {cause} at {where} on the fake GPU ({module}); if it runs on a GPU, the "
                       f"fake GPU lacks something it uses: {todo}")


def run_script(path: str, argv: list[str] | None = None, *, max_steps: int | None = None,
               stdout_to_stderr: bool = False, banner: bool = True, gpu: Any = None, launch: Any = None,
               rank: int = 0) -> Any:
    """Run ``path`` with ``argv`` on a fake GPU in this process; returns its
    :class:`~labkit.memory.script.script_report.ScriptReport`. ``max_steps``: stop after that many optimizer steps.
    ``launch`` (a :class:`~labkit.memory.script.ranks.Launch`): run it as ``rank`` of that torchrun launch."""
    path = check_script(path)
    argv = list(argv or [])
    folder = os.path.dirname(path)
    if gpu is None:
        gpu = fake_gpu(max_steps=max_steps, user_roots=(folder,), launch=launch, rank=rank)
    if banner:
        print(BANNER.format(path=os.path.relpath(path), gpu=gpu.facts.name), file=sys.stderr)

    prepare_torchvision()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    outcome = None
    out = contextlib.redirect_stdout(sys.stderr) if stdout_to_stderr else contextlib.nullcontext()
    try:
        with out:
            try:
                with gpu, fake_launch(launch, rank, gpu):
                    runpy.run_path(path, run_name="__main__")
            except SystemExit as exc:
                code = exc.code
                if code not in (None, 0):
                    outcome = f"failed: the script exited with status {code}"
            except torch.OutOfMemoryError:
                if gpu.live.oom is None:
                    raise
            except LabkitError:
                raise
            except Exception as exc:  # noqa: BLE001 - the script's failure becomes one clear line
                raise _refusal(exc, gpu, path) from exc
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return gpu.report(what=os.path.relpath(path) + (" " + " ".join(argv) if argv else ""), outcome=outcome)


def trace_script(path: str, argv: list[str] | None = None, *, max_steps: int | None = None,
                 fresh: bool = True, timeout: float | None = None, echo: bool = False) -> Any:
    """Predict what ``python path argv`` allocates on the target GPU, without a GPU.

    ``fresh`` (default): in a new Python process, as the real script runs (``labkit measure --script``); the
    script's own output is kept in the report's ``output`` (and written to this process's stderr with
    ``echo``). Otherwise in this process (:func:`run_script`)."""
    if not fresh:
        return run_script(path, argv, max_steps=max_steps, banner=False)
    path = check_script(path)
    cmd = [sys.executable, "-m", "labkit", "measure", "--script", path, "--json"]
    if max_steps is not None:
        cmd += ["--steps", str(max_steps)]
    cmd += ["--", *(argv or [])]
    proc = _measure(cmd, timeout, echo)

    rep = report_from_json(json.loads(proc.stdout))
    rep.output = proc.stderr[-OUTPUT_KEPT:]
    return rep


def trace_launch(path: str, argv: list[str] | None = None, *, nproc_per_node: int, nnodes: int = 1,
                 ranks: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """``labkit measure --script path --nproc-per-node N [--nnodes M] [--ranks R,...] --json -- argv`` in a new
    process: the launch's JSON document (``launch``, ``ranks``: one ScriptReport dict per traced rank with its
    ``rank``, ``peak_bytes``, ``reserved_bytes``)."""
    path = check_script(path)
    cmd = [sys.executable, "-m", "labkit", "measure", "--script", path, "--nproc-per-node", str(nproc_per_node),
           "--nnodes", str(nnodes), "--json"]
    if ranks is not None:
        cmd += ["--ranks", ranks]
    cmd += ["--", *(argv or [])]
    return json.loads(_measure(cmd, timeout, False).stdout)


def _measure(cmd: list[str], timeout: float | None, echo: bool) -> subprocess.CompletedProcess:
    """Run a ``labkit measure --script`` command line; its last error line as a LabkitError if it fails."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if echo:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise LabkitError(last.split("error: ", 1)[-1] if "error: " in last else last)
    return proc
