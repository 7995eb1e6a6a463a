"""``labkit``: one entry point; each chapter adds its verbs through ``register(subparsers)``.

The error contract, for every verb: bad input (argparse's own errors included, through
:class:`labkit.core.cliargs.Parser`, and every :class:`~labkit.core.errors.LabkitError`) is exit
status 2 and one line on stderr naming the input and what is wrong; exit 1 only for a run that
failed (a notebook, a rank).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from labkit import __version__
from labkit.core.cliargs import Parser, flush_notes, one_line
from labkit.core.errors import LabkitError

# Each module here defines ``register(subparsers)``; its parsers set ``func(args) -> int``.
CHAPTER_CLIS = (
    "labkit.env.cli",
    "labkit.memory.trace.cli",
    "labkit.memory.estimate.cli",
    "labkit.topology.cli",
    "labkit.report.cli",
    "labkit.comm.cli",
    "labkit.allocator.cli",
    "labkit.allocator.watch_cli",
    "labkit.advise.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="labkit",
        description="GPU Memory Lab: how GPU memory is spent and moved on this server.",
    )
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in CHAPTER_CLIS:
        importlib.import_module(name).register(sub)
    return parser


def _bad_environment() -> str | None:
    """An environment variable that makes ``import torch.distributed`` raise (any verb may import it):
    torch accepts TORCH_DISTRIBUTED_DEBUG = OFF, INFO or DETAIL in any case (torch/distributed/__init__.py
    calls set_debug_level_from_env, which raises ValueError on anything else, the empty string too)."""
    v = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    if v is not None and v.upper() not in ("OFF", "INFO", "DETAIL"):
        return (f"TORCH_DISTRIBUTED_DEBUG={v[:40]!r} in the environment: torch accepts OFF, INFO or DETAIL "
                "(unset it or pick one)")
    return None


def main(argv: list[str] | None = None) -> int:
    # fake mode's note that the installed torch is not its rules' torch is part of each report (emulation's
    # torch, a note line), not a warning on stderr beside a one-line error
    warnings.filterwarnings("ignore", message="fake mode's rules are for torch")
    parser = build_parser()
    flush_notes(show=False)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error already printed (2)
        flush_notes(show=False)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    args.argv = list(sys.argv[1:] if argv is None else argv)     # what the user typed (suggestions repeat it)
    verb = args.command
    bad = _bad_environment()
    if bad:
        print(f"labkit {verb}: error: {bad}", file=sys.stderr)
        return 2
    sub = getattr(args, f"{verb}_command", None)   # a chapter's own sub-verbs (comm bench, alloc replay)
    label = f"labkit {verb} {sub}" if isinstance(sub, str) else f"labkit {verb}"
    try:
        rc = int(args.func(args) or 0)
    except LabkitError as exc:
        flush_notes(show=False)
        print(f"{label}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        flush_notes(show=False)
        print(f"{label}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (| head): nothing more to say
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    flush_notes()
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
