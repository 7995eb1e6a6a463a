"""``labkit measure --script PATH [--steps N] [--nproc-per-node N [--nnodes M] [--ranks R,...]] [--json] -- ARGS``:
the CLI of :mod:`labkit.memory.script`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from typing import Any

from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps, to_jsonable
from labkit.memory.script.ranks import Launch
from labkit.memory.script.run import check_script, run_script
from labkit.memory.script.script_report import render_ranks, render_text

# measure's flags that describe a model or a step of the lab's own loop: a script brings its own
_NOT_FOR_SCRIPT = ("model", "workload", "hf_config", "factory", "task", "layers", "hidden", "heads", "vocab",
                   "micro_batch", "seq", "image_size", "batch", "recompute", "checkpointing", "moe_routing",
                   "allocator_state", "optimizer_impl")
_DEFAULTS = {"precision": "fp32", "optimizer": "adamw", "loop": "plain", "recompute_via": "torch",
             "reserved_placements": 0, "process": "fresh", "device": "fake-cuda", "lora": False,
             "no_kv_cache": False}


def _refuse_step_flags(args: argparse.Namespace) -> None:
    given = [n for n in _NOT_FOR_SCRIPT if getattr(args, n, None) is not None]
    given += [n for n, d in _DEFAULTS.items() if getattr(args, n, d) != d]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise LabkitError(f"{flags} do not apply with --script: the script builds its own model, batch and step "
                          "(give --steps, --nproc-per-node, --nnodes, --ranks, --json and the script's arguments "
                          "after --)")


def _launch(args: argparse.Namespace) -> Any:
    if args.nproc_per_node is None and args.nnodes is None:
        if args.ranks is not None:
            raise LabkitError("--ranks needs a launch: give --nproc-per-node N")
        return None

    return Launch(nproc_per_node=args.nproc_per_node or 1, nnodes=args.nnodes or 1)


def _rank_in_subprocess(args: argparse.Namespace, launch: Any, rank: int, script_args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "labkit", "measure", "--script", args.script, "--nproc-per-node",
           str(launch.nproc_per_node), "--nnodes", str(launch.nnodes), "--ranks", str(rank), "--json"]
    if args.steps is not None:
        cmd += ["--steps", str(args.steps)]
    cmd += ["--", *script_args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise LabkitError(f"rank {rank}: {last.split('error: ', 1)[-1]}")
    return json.loads(proc.stdout)["ranks"][0]


def run_script_cli(args: argparse.Namespace) -> int:
    _refuse_step_flags(args)
    if args.steps is not None and args.steps < 1:
        raise LabkitError(f"--steps must be >= 1, got {args.steps}")
    check_script(args.script)
    launch = _launch(args)
    script_args = list(args.script_args or [])
    if script_args and script_args[0] == "--":
        script_args = script_args[1:]
    if launch is None:
        rep = run_script(args.script, script_args, max_steps=args.steps, stdout_to_stderr=args.json)
        print(dumps(rep) if args.json else render_text(rep))
        sys.stdout.flush()
        return 0
    ranks = launch.parse_ranks(args.ranks)
    rows = []
    if len(ranks) == 1:
        rep = run_script(args.script, script_args, max_steps=args.steps, stdout_to_stderr=args.json,
                         launch=launch, rank=ranks[0])
        rows.append(dict(to_jsonable(rep), rank=ranks[0]))
    else:
        for r in ranks:
            rows.append(_rank_in_subprocess(args, launch, r, script_args))
    doc = {"launch": dataclasses.asdict(launch) | {"world_size": launch.world_size}, "ranks": rows,
           "peak_bytes": max(r["peak_bytes"] for r in rows), "reserved_bytes": max(r["reserved_bytes"] for r in rows)}
    print(dumps(doc) if args.json else render_ranks(doc))
    sys.stdout.flush()
    return 0
