"""``labkit report``: execute every notebook (or --only some) into a report folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="execute the notebooks headless into an HTML report",
                       description="Execute notebooks with papermill into DIR/<UTC timestamp>-<host>/ with HTML, "
                                   "summary.json and index.html. Exits 1 if a notebook failed, 2 on bad input.")
    p.add_argument("--profile", choices=("smoke", "full"), default="smoke",
                   help="smoke: small and fast (CI); full: the real sizes (default: smoke)")
    p.add_argument("--out", default="reports", metavar="DIR", help="parent folder of the run folders (default: reports)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="notebook names (file names without .ipynb)")
    p.add_argument("-p", dest="params", action="append", default=[], metavar="KEY=VALUE",
                   help="set a notebook parameter (repeatable); unknown names are refused")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from labkit.report.runner import run_report

    result = run_report(profile=args.profile, out_dir=Path(args.out), only=args.only, params=args.params)
    return 1 if result.failed else 0
