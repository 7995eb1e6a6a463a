"""Provenance for every recorded measurement, and the reproducibility header of every run.

A recorded file (``data/measurements/**.json``) is ``{"provenance": {...}, "kind": ..., "data": ...}``.
``write_measurement`` is the one writer; ``load_measurement`` refuses files without provenance.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from labkit.core.envvars import REDACTED, secret_value
from labkit.core.errors import LabkitError
from labkit.core.machine import probe
from labkit.core.serialize import read_json, to_jsonable

REQUIRED = ("date", "host", "command", "gpu_name", "gpu_count", "driver", "cuda", "torch", "labkit")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def header(command: str | None = None, machine=None) -> dict[str, Any]:
    """Hardware, versions, date and command of this run (the benchmarks print it first)."""
    m = machine or probe()
    command = command if command is not None else " ".join(shlex.quote(a) for a in sys.argv)
    return {
        "date": utc_now(),
        "host": m.hostname,
        # a credential given on the command line (a URL with a password) is not written into a report
        "command": " ".join(REDACTED if secret_value(w) else w for w in command.split(" ")),
        "gpu_name": m.gpu_name,
        "gpu_count": len(m.gpus),
        "gpu_memory_bytes": [g.memory_total_bytes for g in m.gpus],
        "driver": m.driver_version,
        "cuda": m.cuda_version,
        "torch": m.torch_version,
        "nccl": m.nccl_version,
        "python": m.python,
        "cpu": m.cpu_model,
        "labkit": m.labkit_version,
        "git_commit": m.git_commit,
    }


def format_header(h: dict[str, Any]) -> str:
    gpu = f"{h['gpu_count']} x {h['gpu_name']}" if h.get("gpu_count") else "no GPU"
    return (f"# {h['date']} on {h['host']}: {gpu}, driver {h.get('driver')}, CUDA {h.get('cuda')}, "
            f"torch {h.get('torch')}, NCCL {h.get('nccl')}, python {h.get('python')}, labkit {h.get('labkit')}"
            f" ({h.get('git_commit')})\n# cpu: {h.get('cpu')}\n# command: {h.get('command')}")


#: An indented measurement longer than this is written without indentation (the repository's files stay under 5 MiB).
COMPACT_ABOVE_BYTES = 4 << 20


def write_measurement(path: str | Path, kind: str, data: Any, *, command: str | None = None,
                      provenance: dict[str, Any] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"provenance": provenance or header(command), "kind": kind, "data": to_jsonable(data)}
    text = json.dumps(doc, indent=1)
    if len(text) > COMPACT_ABOVE_BYTES:      # a recording with allocator block lists: one line, as the repo keeps
        text = json.dumps(doc, separators=(",", ":"))    # tracked files under 5 MiB
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return path


def load_measurement(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    path = Path(path)
    doc = read_json(path, "recorded measurement")
    prov = doc.get("provenance") if isinstance(doc, dict) else None
    if not isinstance(prov, dict) or any(k not in prov for k in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(prov, dict) or k not in prov]
        raise LabkitError(f"{path}: recorded measurement lacks provenance fields {missing}")
    if kind is not None and doc.get("kind") != kind:
        raise LabkitError(f"{path}: holds a {doc.get('kind')!r} measurement, expected {kind!r}")
    return doc


def describe(prov: dict[str, Any]) -> str:
    """One line for a notebook: where a recorded figure comes from."""
    gpu = f"{prov.get('gpu_count')} x {prov.get('gpu_name')}" if prov.get("gpu_count") else "no GPU"
    return (f"recorded on {gpu}, {str(prov.get('date'))[:10]} (driver {prov.get('driver')}, "
            f"torch {prov.get('torch')}, CUDA {prov.get('cuda')}); command: {prov.get('command')}")
