"""``labkit env [--json]``: what this machine is."""

from __future__ import annotations

import argparse

from labkit.core.envvars import redact_values
from labkit.core.machine import probe
from labkit.core.serialize import dumps, to_jsonable
from labkit.core.table import render
from labkit.env.summary import machine_rows


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="what this machine is: GPUs, driver, torch/CUDA, CPU, NUMA, RAM",
                       description="Describe this machine through NVML, torch and /proc. Works without a GPU.")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    m = probe()
    if args.json:   # every output format passes through the same value-based redaction
        print(dumps(redact_values(to_jsonable(m))))
        return 0
    print(render(["field", "value"], [(k, redact_values(v)) for k, v in machine_rows(m)]))
    for w in m.warnings:
        print(f"warning: {w}")
    for n in m.notes:
        print(f"note: {n}")
    if m.env:
        print("\nenvironment (the variables that matter for GPUs and training; credentials redacted):")
        print(render(["variable", "value"], sorted(redact_values(m.env).items())))
    return 0
