"""``labkit watch -- CMD ARGS``: run a training script unedited, capture its OOM (snapshot, statistics, message,
verdict) into one folder per rank, and print the folder at the end.

    labkit watch [--out DIR] [--detail trace|stacks|stats] [--max-entries N] [--no-sim] -- python train.py ARGS
    labkit watch -- torchrun --standalone --nproc-per-node 2 train.py ARGS
    labkit watch --show RUN_FOLDER [--json]

The command's processes get ``labkit/allocator/_watch_boot`` first on PYTHONPATH: its ``sitecustomize``
starts :mod:`labkit.allocator.watcher` in every process that imports torch and initialises CUDA (the torchrun
launcher itself does not). The exit status is the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from labkit.allocator.capture import rank_folders, read_capture, run_folder
from labkit.core.cliargs import int_between
from labkit.core.errors import LabkitError

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


#: The history ring buffer's largest size: each entry costs ~1 KB in the process (more with stacks).
MAX_ENTRIES = 10_000_000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("watch", help="run a training command and capture its out-of-memory error per rank",
                       description="Run CMD with the allocator's history on; on an OOM each rank writes the snapshot, "
                                   "per-step memory_stats(), the message and the doctor's verdict into its own folder.")
    p.add_argument("--out", default="labkit-watch", help="folder for the run folders (default: ./labkit-watch)")
    p.add_argument("--detail", choices=("trace", "stacks", "stats"), default=None,
                   help="trace: history without stacks (default); stacks: with Python stacks (slower); "
                        "stats: per-step statistics only (no snapshot, no simulator check)")
    p.add_argument("--max-entries", type=int_between(1000, MAX_ENTRIES), default=None,
                   help=f"history ring buffer size (default 200000, at most {MAX_ENTRIES})")
    p.add_argument("--no-sim", action="store_true", help="do not check the verdict with the simulator")
    p.add_argument("--reduce", action="store_true", help="keep only what the doctor needs in the snapshot")
    p.add_argument("--show", metavar="RUN", help="print the verdicts of an earlier run folder instead")
    p.add_argument("--json", action="store_true", help="with --show: one JSON document")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run")
    p.set_defaults(func=run_watch)


def boot_dir() -> Path:
    return Path(__file__).resolve().parent / "_watch_boot"


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def summarize(run: Path) -> list[dict]:
    """One row per rank folder: state, whether it saw an OOM, the verdict."""
    rows = []
    for f in rank_folders(run):
        try:
            c = read_capture(f)
        except LabkitError as exc:
            rows.append({"folder": str(f), "state": "unreadable", "reason": str(exc)})
            continue
        findings = (c.verdict or {}).get("findings")
        first = findings[0] if isinstance(findings, list) and findings and isinstance(findings[0], dict) else {}
        if c.verdict is not None and not first:
            c.notes.append("verdict.json: no findings of the expected shape (left out)")
        rows.append({"folder": str(f), "rank": c.rank, "state": c.state, "reason": c.reason,
                     "steps": len(c.steps), "oom": bool(c.manifest.get("oom")), "verdict": first.get("kind"),
                     "title": first.get("title"), "fix": first.get("fix"), "verified": first.get("verified")})
    return rows


def _print_rows(run: Path, rows: list[dict]) -> None:
    print(f"labkit watch: captures in {run}")
    if not rows:
        print("  (no rank folder: no process initialised CUDA under the hook; python -I or -S ignores PYTHONPATH)")
    for r in rows:
        line = f"  {Path(r['folder']).name}: {r['state']}"
        if r.get("steps") is not None:
            line += f", {r['steps']} steps"
        if r.get("oom"):
            line += f", OOM: [{r.get('verdict')}] {r.get('title') or ''}"
            if r.get("verified"):
                line += " (checked by the simulator)"
        if r["state"] != "complete" and r.get("reason"):
            line += f" ({r['reason']})"
        print(line)


def run_watch(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    run_flags = [f for f, v in (("--detail", args.detail), ("--max-entries", args.max_entries),
                                ("--no-sim", args.no_sim), ("--reduce", args.reduce)) if v not in (None, False)]
    if args.show is not None:
        if cmd:
            raise LabkitError("watch: --show prints an earlier run; it runs no command (drop -- CMD, or --show)")
        if run_flags:
            raise LabkitError(f"watch: {', '.join(run_flags)} applies to a run, not to --show")
        if not str(args.show).strip():
            raise LabkitError("--show is empty: give a run folder written by labkit watch")
        run = Path(args.show)
        rows = summarize(run)
        if args.json:
            print(json.dumps({"run": str(run), "ranks": rows}, indent=1))
        else:
            _print_rows(run, rows)
        return 0
    if args.json:
        raise LabkitError("watch: --json goes with --show RUN (a watched command prints its own output)")
    args.detail = args.detail or "trace"
    if not cmd:
        raise LabkitError("watch: give the command to run after --, e.g. labkit watch -- python train.py")
    if shutil.which(cmd[0]) is None:
        raise LabkitError(f"watch: command {cmd[0]!r} not found or not executable")
    if not str(args.out).strip():
        raise LabkitError("--out is empty: give the folder for the run folders (default ./labkit-watch)")
    if not _gpu_available():
        print("labkit watch: no CUDA GPU here: running the command without watching (watch is a no-op)",
              file=sys.stderr, flush=True)
        return exit_status(subprocess.call(cmd))
    run = run_folder(args.out)
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LabkitError(f"--out {args.out}: cannot create {run} ({exc})") from None
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([str(boot_dir()), pkg_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                        else []))
    env["LABKIT_WATCH_RUN_DIR"] = str(run.resolve())
    opts = {"detail": args.detail, "check_with_simulator": not args.no_sim, "reduce": args.reduce}
    if args.max_entries is not None:
        opts["max_entries"] = args.max_entries
    env["LABKIT_WATCH_OPTS"] = json.dumps(opts)
    try:
        rc = subprocess.call(cmd, env=env)
    except FileNotFoundError:
        raise LabkitError(f"watch: no such command {cmd[0]!r}") from None
    _print_rows(run, summarize(run))
    return exit_status(rc)


def exit_status(rc: int) -> int:
    """The command's exit status as a shell gives it: killed by signal N is 128 + N (subprocess says -N)."""
    return 128 - rc if rc < 0 else rc
