"""The report folder's history: one JSON line per key result per run, in ``DIR/history.jsonl``.

Every finished run appends its results (name, value, unit, source, tolerance, direction, the
machine's identity, the notebook's parameters, the profile, the commit, the time). The index reads
it for trends and for the last *comparable* run: the same machine identity (GPU model and count,
driver, torch, CUDA) and the same notebook parameters and profile. ``labkit report history DIR``
rebuilds the file from the run folders' ``summary.json`` when it is missing or damaged.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from labkit.core.errors import LabkitError

HISTORY_FILE = "history.jsonl"
IDENTITY_KEYS = ("gpu_name", "gpu_count", "driver", "torch", "cuda")


@dataclass(frozen=True)
class Entry:
    """One key result of one notebook in one run."""

    run_id: str
    time: str
    notebook: str
    name: str
    value: float | int | str
    unit: str
    source: str
    tolerance: float | None
    direction: str | None
    machine: dict[str, Any]
    parameters: dict[str, Any]
    profile: str
    commit: str | None
    host: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def machine_key(self) -> str:
        return identity_key(self.machine)

    @property
    def setup_key(self) -> str:
        """What must be equal for two entries to be compared: machine, parameters, profile."""
        return json.dumps([self.machine_key, self.profile, self.parameters], sort_keys=True, default=str)


def machine_identity(environment: dict) -> dict[str, Any]:
    """The parts of a run's environment header that make two runs' numbers comparable."""
    return {k: environment.get(k) for k in IDENTITY_KEYS}


def identity_key(machine: dict[str, Any]) -> str:
    if not machine.get("gpu_count"):
        return f"no GPU | torch {machine.get('torch')}"
    return (f"{machine.get('gpu_count')} x {machine.get('gpu_name')} | driver {machine.get('driver')} | "
            f"torch {machine.get('torch')} | CUDA {machine.get('cuda')}")


def entries_from_summary(doc: dict) -> list[Entry]:
    """The history lines of one run's ``summary.json`` document."""
    env = doc.get("environment") or {}
    machine = machine_identity(env)
    out = []
    for nb in doc.get("notebooks") or []:
        for name, r in (nb.get("results") or {}).items():
            out.append(Entry(run_id=doc["run_id"], time=str(doc.get("started")), notebook=nb["name"], name=name,
                             value=r.get("value"), unit=r.get("unit", ""), source=r.get("source", ""),
                             tolerance=r.get("tolerance"), direction=r.get("direction"), machine=machine,
                             parameters=nb.get("parameters") or {}, profile=str(doc.get("profile")),
                             commit=env.get("git_commit"), host=env.get("host")))
    return out


def _entry(d: dict) -> Entry:
    known = {f for f in Entry.__dataclass_fields__}
    return Entry(**{k: v for k, v in d.items() if k in known})


def read(out_dir: Path | str) -> tuple[list[Entry], int]:
    """The history of ``out_dir`` in file order, and the number of lines that could not be read."""
    path = Path(out_dir) / HISTORY_FILE
    entries: list[Entry] = []
    bad = 0
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return entries, 0
    except OSError as exc:
        raise LabkitError(f"{path}: cannot read the report history ({exc.strerror})") from None
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entries.append(_entry(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError):
            bad += 1
    return entries, bad


def _write_lines(path: Path, entries: Iterable[Entry], mode: str) -> None:
    lines = "".join(json.dumps(asdict(e), default=str) + "\n" for e in entries)
    with open(path, mode, encoding="utf-8") as f:
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())


def append(out_dir: Path | str, doc: dict) -> int:
    """Append one finished run's results (once: a run already in the history is not added again)."""
    path = Path(out_dir) / HISTORY_FILE
    existing, _ = read(out_dir)
    if any(e.run_id == doc["run_id"] for e in existing):
        return 0
    new = entries_from_summary(doc)
    _write_lines(path, new, "a")
    return len(new)


def finished_runs(out_dir: Path | str) -> list[dict]:
    """Every finished run's summary document under ``out_dir``, oldest first."""
    docs = []
    for summary in Path(out_dir).glob("*/summary.json"):
        try:
            doc = json.loads(summary.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("state") == "finished" and doc.get("run_id"):
            docs.append(doc)
    return sorted(docs, key=lambda d: (str(d.get("started")), d["run_id"]))


def rebuild(out_dir: Path | str) -> int:
    """Write ``history.jsonl`` anew from the run folders; returns the number of runs in it."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise LabkitError(f"{out_dir}: not a report folder (no such directory)")
    docs = finished_runs(out_dir)
    tmp = out_dir / (HISTORY_FILE + ".tmp")
    _write_lines(tmp, [e for d in docs for e in entries_from_summary(d)], "w")
    tmp.replace(out_dir / HISTORY_FILE)
    return len(docs)
