"""The report folder's history: one JSON line per key result per run, in ``DIR/history.jsonl``.

Every finished run appends its results (name, value, unit, source, tolerance, direction, the
machine's identity, the notebook's parameters, the profile, the commit, the time). The index reads
it for trends and for the last *comparable* run: the same machine identity (GPU model and count,
driver, torch, CUDA) and the same notebook parameters and profile. ``labkit report history DIR``
rebuilds the file from the run folders' ``summary.json`` when it is missing or damaged.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from labkit.core.cliargs import one_line
from labkit.core.errors import LabkitError
from labkit.core.serialize import path_is, read_json, read_text

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
    if not isinstance(env, dict) or not isinstance(doc.get("notebooks") or [], list):
        raise ValueError("'environment' or 'notebooks' of the wrong type")
    machine = machine_identity(env)
    out = []
    for nb in doc.get("notebooks") or []:
        if not isinstance(nb, dict) or not isinstance(nb.get("name"), str) or not isinstance(
                nb.get("results") or {}, dict) or not isinstance(nb.get("parameters") or {}, dict):
            raise ValueError("a notebook entry of the wrong shape")
        for name, r in (nb.get("results") or {}).items():
            if not isinstance(r, dict):
                raise ValueError(f"result {name!r} is not a dict")
            out.append(Entry(run_id=doc["run_id"], time=str(doc.get("started")), notebook=nb["name"], name=name,
                             value=r.get("value"), unit=r.get("unit", ""), source=r.get("source", ""),
                             tolerance=r.get("tolerance"), direction=r.get("direction"), machine=machine,
                             parameters=nb.get("parameters") or {}, profile=str(doc.get("profile")),
                             commit=env.get("git_commit"), host=env.get("host")))
    return out


#: The largest history read (a result line is ~600 bytes: years of nightly runs of every notebook).
MAX_HISTORY_BYTES = 256 << 20
DAMAGED_FILE = "history.damaged.jsonl"


def _entry(d: Any) -> Entry:
    """One history line's entry; a line of the wrong shape is a ValueError (the reader skips it)."""
    if not isinstance(d, dict):
        raise ValueError(f"a {type(d).__name__}, not a result")
    known = {f for f in Entry.__dataclass_fields__}
    e = Entry(**{k: v for k, v in d.items() if k in known})
    if not (isinstance(e.run_id, str) and isinstance(e.name, str) and isinstance(e.notebook, str)
            and isinstance(e.machine, dict) and isinstance(e.parameters, dict) and isinstance(e.extra, dict)):
        raise ValueError("a field of the wrong type")
    if isinstance(e.value, bool) or not isinstance(e.value, (int, float, str)) and e.value is not None:
        raise ValueError("a value that is not a number or a word")
    return e


def _read_lines(out_dir: Path | str) -> tuple[list[Entry], list[str]]:
    """The entries of ``out_dir``'s history in file order, and its lines that could not be read."""
    path = Path(out_dir) / HISTORY_FILE
    if not path_is(path, "exists") and not path_is(path, "link"):
        return [], []
    text = read_text(path, "report history", limit=MAX_HISTORY_BYTES, errors="replace")
    entries: list[Entry] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entries.append(_entry(json.loads(line)))
        except (ValueError, TypeError, KeyError, RecursionError):
            bad.append(line)
    return entries, bad


def read(out_dir: Path | str) -> tuple[list[Entry], int]:
    """The history of ``out_dir`` in file order, and the number of lines that could not be read (skipped)."""
    entries, bad = _read_lines(out_dir)
    return entries, len(bad)


def _write_lines(path: Path, entries: Iterable[Entry], mode: str) -> None:
    lines = "".join(json.dumps(asdict(e), default=str) + "\n" for e in entries)
    with open(path, mode, encoding="utf-8") as f:
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole through a temporary file beside it and a rename: a crash leaves the old file."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append(out_dir: Path | str, doc: dict) -> int:
    """Append one finished run's results (once: a run already in the history is not added again)."""
    path = Path(out_dir) / HISTORY_FILE
    existing, _ = read(out_dir)
    if any(e.run_id == doc["run_id"] for e in existing):
        return 0
    new = entries_from_summary(doc)
    _write_lines(path, new, "a")
    return len(new)


def finished_runs(out_dir: Path | str, skipped: list[str] | None = None) -> list[dict]:
    """Every finished run's summary document under ``out_dir``, oldest first; a summary that cannot be read
    or has the wrong shape is left out (and named in ``skipped``)."""
    docs = []
    for summary in sorted(Path(out_dir).glob("*/summary.json")):
        try:
            doc = read_json(summary, "run summary", limit=MAX_HISTORY_BYTES)
            if not (isinstance(doc, dict) and doc.get("state") == "finished"):
                continue
            if not isinstance(doc.get("run_id"), str) or not doc["run_id"]:
                raise ValueError("no run_id")
            entries_from_summary(doc)  # its shape, checked here once
        except (LabkitError, ValueError, TypeError, KeyError, AttributeError) as exc:
            if skipped is not None:
                skipped.append(f"{summary.parent.name}/summary.json ({one_line(str(exc))[:120]})")
            continue
        docs.append(doc)
    return sorted(docs, key=lambda d: (str(d.get("started")), d["run_id"]))


@dataclass
class Rebuilt:
    """What ``rebuild`` wrote: runs from their folders, runs kept from the old history, what it skipped."""

    runs: int
    from_folders: int
    kept: int
    damaged: int
    skipped: list[str]


def rebuild(out_dir: Path | str) -> Rebuilt:
    """Rebuild ``history.jsonl`` from the run folders without losing what it held: the lines of runs whose
    folders are gone are kept, a run's folder replaces that run's lines, damaged lines are moved to
    ``history.damaged.jsonl``; the file is written whole through a temporary file and a rename, and a
    non-empty history is never replaced by an empty one."""
    out_dir = Path(out_dir)
    if not path_is(out_dir, "dir"):
        raise LabkitError(f"{str(out_dir)[:200]}: not a report folder (no such directory)")
    skipped: list[str] = []
    docs = finished_runs(out_dir, skipped)
    old, damaged = _read_lines(out_dir)
    rebuilt = {d["run_id"] for d in docs}
    kept = [e for e in old if e.run_id not in rebuilt]
    new = [e for d in docs for e in entries_from_summary(d)]
    merged = sorted(kept + new, key=lambda e: (e.time, e.run_id))
    if not merged and (old or damaged):
        raise LabkitError(f"{out_dir / HISTORY_FILE}: no finished run folder and no readable line; refusing to "
                          f"replace a history of {len(old) + len(damaged)} line(s) with an empty one")
    if damaged:
        with open(out_dir / DAMAGED_FILE, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in damaged))
    _replace(out_dir / HISTORY_FILE, "".join(json.dumps(asdict(e), default=str) + "\n" for e in merged))
    return Rebuilt(runs=len({e.run_id for e in merged}), from_folders=len(docs),
                   kept=len({e.run_id for e in kept}), damaged=len(damaged), skipped=skipped)
