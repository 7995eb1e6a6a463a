"""``labkit report``: execute every notebook (or --only some) into a report folder;
``labkit report history DIR``: rebuild a report folder's history from its run folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labkit.core.errors import LabkitError

# torch (2.5 s to import: python -X importtime, 2-core machine) and the labkit modules that import it are imported
# in the functions that run a verb: `labkit --help` imports this module.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="execute the notebooks headless into an HTML report",
                       description="Execute notebooks with papermill into DIR/<UTC timestamp>-<host>/ with HTML, "
                                   "summary.json and index.html, and append the key results to DIR/history.jsonl. "
                                   "`labkit report history DIR` rebuilds that history from the run folders. "
                                   "Exits 1 if a notebook failed, 3 with --fail-on-regression when a result "
                                   "regressed, 2 on bad input.")
    p.add_argument("action", nargs="?", choices=("run", "history"), default="run",
                   help="run (default): execute the notebooks; history: rebuild DIR/history.jsonl")
    p.add_argument("dir", nargs="?", metavar="DIR", help="with history: the report folder (default: --out)")
    p.add_argument("--profile", choices=("smoke", "full"), default="smoke",
                   help="smoke: small and fast (CI); full: the real sizes (default: smoke; `make report` runs full, "
                        "`make report PROFILE=smoke` smoke)")
    p.add_argument("--out", default="reports", metavar="DIR", help="parent folder of the run folders (default: reports)")
    p.add_argument("--only", nargs="+", action="extend", metavar="NAME",
                   help="notebook names (file names without .ipynb); repeat or list several: --only A B, --only A --only B")
    p.add_argument("-p", dest="params", action="append", default=[], metavar="KEY=VALUE",
                   help="set a notebook parameter (repeatable); unknown names are refused")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 3 (after writing everything) when a result moved beyond its tolerance the bad way "
                        "against the last comparable run")
    p.add_argument("--keep", type=int, default=None, metavar="N",
                   help="after a finished run, delete all but the newest N run folders in DIR (their key results "
                        "stay in DIR/history.jsonl); default: keep every run folder")
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the final summary")
    p.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS",
                   help="fail a notebook whose code cell runs longer than this (default: 900 smoke, 3600 full)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "history":
        from labkit.report.history import DAMAGED_FILE, HISTORY_FILE, rebuild

        run_flags = [f for f, v in (("--only", args.only), ("-p", args.params),
                                    ("--fail-on-regression", args.fail_on_regression),
                                    ("--cell-timeout", args.cell_timeout)) if v]
        if run_flags:
            raise LabkitError(f"report history: {', '.join(run_flags)} applies to a run, not to rebuilding a history")
        folder = Path(args.dir or args.out)
        r = rebuild(folder)
        for s in r.skipped:
            print(f"labkit report history: warning: skipped {s}", file=sys.stderr)
        print(f"labkit report history: {r.runs} finished run(s) written to {folder / HISTORY_FILE} "
              f"({r.from_folders} from their run folders, {r.kept} kept from the history whose folders are gone"
              + (f"; {r.damaged} damaged line(s) moved to {folder / DAMAGED_FILE}" if r.damaged else "") + ")")
        return 0
    if args.dir is not None:
        raise LabkitError(f"report: unexpected argument {args.dir!r} (a folder goes with `report history DIR` or --out)")
    from labkit.report.runner import run_report

    def say(msg: str) -> None:
        if not args.quiet or msg.startswith("labkit report:"):
            print(msg, flush=True)

    result = run_report(profile=args.profile, out_dir=args.out, only=args.only, params=args.params,
                        say=say, progress=not args.quiet and sys.stderr.isatty(), cell_timeout_s=args.cell_timeout,
                        keep=args.keep)
    if result.failed:
        return 1
    return 3 if args.fail_on_regression and result.regressions else 0
