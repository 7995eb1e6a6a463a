"""One rank's capture folder, as ``labkit.allocator.watch`` writes it and the doctor reads it (no torch here).

Layout (one run folder shared by the ranks of a job, one folder per rank inside it)::

    RUN/                          e.g. labkit-watch/20261201T081500Z-host-4242/ or the torchrun run id
      rank0/
        manifest.json             state, settings, files written; rewritten at start, at the OOM and at the end
        stats.jsonl               one line per step: a few memory_stats() figures (appended, flushed)
        stats_at_oom.json         the full memory_stats() when the OOM happened
        snapshot.pickle.gz        torch.cuda.memory._snapshot() taken at the OOM (history ring buffer)
        oom_message.txt           the exception's message
        verdict.txt, verdict.json the doctor's diagnosis, checked by the simulator on the snapshot
      rank1/ ...

A rank only ever writes inside its own folder, created with an exclusive ``mkdir`` (a restarted rank gets
``rank0.1``). Every file but ``stats.jsonl`` is written to a temporary name and renamed, so a file that
exists is whole. ``manifest.json`` says ``running`` until the rank has finished writing; a run that was
killed, or whose disk filled up, keeps what was written and reads as incomplete, with the reason.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.allocator.doctor import diagnose
from labkit.allocator.snapshot import read_snapshot
from labkit.core.errors import LabkitError
from labkit.core.serialize import parse_json, path_is, read_text

MANIFEST = "manifest.json"
STATS = "stats.jsonl"
STATS_AT_OOM = "stats_at_oom.json"
SNAPSHOT = "snapshot.pickle.gz"
MESSAGE = "oom_message.txt"
VERDICT_TXT = "verdict.txt"
VERDICT_JSON = "verdict.json"

#: memory_stats() figures kept per step (the full dict is saved once, at the OOM)
STEP_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
             "reserved_bytes.all.peak", "active_bytes.all.current", "inactive_split_bytes.all.current",
             "segment.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc")


def utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def run_folder(root: str | Path, run_id: str | None = None) -> Path:
    """The run folder under ``root``: the launcher's run id when all ranks share one (torchrun), else a new name."""
    env = os.environ.get("LABKIT_WATCH_RUN_DIR")
    if env:
        return Path(env)
    rid = run_id or os.environ.get("TORCHELASTIC_RUN_ID")
    if rid and rid != "none":
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in rid)[:80]
        return Path(root) / f"torchrun-{safe}"
    return Path(root) / f"{utc_stamp()}-{socket.gethostname()}-{os.getpid()}"


def make_rank_folder(run: Path, rank: int) -> Path:
    """Create this rank's folder exclusively: never one another rank (or an earlier attempt) already owns."""
    run.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        p = run / (f"rank{rank}" if attempt == 0 else f"rank{rank}.{attempt}")
        try:
            p.mkdir()
            return p
        except FileExistsError:
            continue
    raise LabkitError(f"{run}: more than 1000 capture folders for rank {rank}")


class CaptureWriter:
    """Writes one rank's folder. Every write is guarded: an OSError (disk full, folder removed) is recorded as the
    reason the capture is incomplete and never raised into the user's program."""

    def __init__(self, folder: Path, meta: dict[str, Any]):
        self.folder = folder
        self.meta = {"state": "running", "started": utc_stamp(), "host": socket.gethostname(), "pid": os.getpid(),
                     **meta, "files": {}, "problems": [], "steps": 0, "oom": False}
        self._stats = None
        self.write_manifest()

    # -- guarded writes ----------------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> None:
        self.meta["problems"].append(f"{what}: {type(exc).__name__}: {exc}")

    def _atomic(self, name: str, data: bytes) -> bool:
        tmp = self.folder / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.folder / name)
        except OSError as exc:
            self._fail(f"writing {name}", exc)
            try:
                tmp.unlink()
            except OSError:
                pass
            return False
        if name != MANIFEST:
            self.meta["files"][name] = len(data)
        return True

    def write_manifest(self) -> bool:
        return self._atomic(MANIFEST, (json.dumps(self.meta, indent=1, default=str) + "\n").encode())

    def write_json(self, name: str, obj: Any) -> bool:
        return self._atomic(name, (json.dumps(obj, indent=1, default=str) + "\n").encode())

    def write_text(self, name: str, text: str) -> bool:
        return self._atomic(name, text.encode("utf-8", "replace"))

    def write_gzip(self, name: str, raw: bytes) -> bool:
        return self._atomic(name, gzip.compress(raw, compresslevel=6))

    def append_step(self, row: dict[str, Any]) -> None:
        """One line of stats.jsonl, flushed (a killed run keeps every finished line)."""
        try:
            if self._stats is None:
                self._stats = open(self.folder / STATS, "a", encoding="utf-8")
            self._stats.write(json.dumps(row, separators=(",", ":")) + "\n")
            self._stats.flush()
            self.meta["steps"] += 1
        except OSError as exc:
            if not any(p.startswith(f"writing {STATS}") for p in self.meta["problems"]):
                self._fail(f"writing {STATS}", exc)

    def finish(self, *, reason: str | None = None) -> str:
        """Close, and mark the folder complete (or incomplete with the reasons)."""
        if self._stats is not None:
            try:
                self._stats.close()
            except OSError as exc:
                self._fail(f"closing {STATS}", exc)
            self._stats = None
        if (self.folder / STATS).exists():
            self.meta["files"][STATS] = (self.folder / STATS).stat().st_size
        problems = list(self.meta["problems"]) + ([reason] if reason else [])
        self.meta["state"] = "incomplete" if problems else "complete"
        self.meta["incomplete_reason"] = "; ".join(problems) or None
        self.meta["ended"] = utc_stamp()
        self.write_manifest()
        return self.meta["state"]


@dataclass
class Capture:
    """What a rank's folder holds, read back; ``complete`` is False for a killed run or a failed write."""

    folder: Path
    state: str
    complete: bool
    reason: str | None
    manifest: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    stats_at_oom: dict[str, Any] | None = None
    oom_message: str | None = None
    verdict: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def snapshot_path(self) -> Path | None:
        p = self.folder / SNAPSHOT
        return p if p.is_file() and not p.is_symlink() else None

    @property
    def rank(self) -> int | None:
        return self.manifest.get("rank")


#: The largest file of a capture folder read (a statistics series of many steps; the snapshot has its own limit).
MAX_CAPTURE_FILE_BYTES = 64 << 20


def _read_text(p: Path, what: str) -> str:
    """A capture file's text: a regular file (never a link: watch writes none) of bounded size."""
    return read_text(p, what, limit=MAX_CAPTURE_FILE_BYTES, follow_links=False, errors="replace")


def _read_json_file(p: Path, notes: list[str]) -> Any:
    try:
        return parse_json(_read_text(p, "capture file"), str(p), "capture file")
    except LabkitError as exc:
        notes.append(f"{p.name}: unreadable ({exc})")
        return None


def read_capture(folder: str | Path) -> Capture:
    """Read one rank's folder; whatever was written is returned, and what is missing is said."""
    folder = Path(folder)

    if not path_is(folder, "dir"):
        raise LabkitError(f"{str(folder)[:200]}: no such capture folder")
    notes: list[str] = []
    man = _read_json_file(folder / MANIFEST, notes) if (folder / MANIFEST).exists() else None
    if not isinstance(man, dict):
        raise LabkitError(f"{folder}: not a labkit watch capture folder (no readable {MANIFEST})")
    state = man.get("state")
    reason = man.get("incomplete_reason")
    if state == "running":
        state, reason = "incomplete", ("the run stopped before watch finished writing (killed, or the disk filled "
                                       "up)" + (f"; {'; '.join(man['problems'])}" if man.get("problems") else ""))
    elif state not in ("complete", "incomplete"):
        state, reason = "incomplete", f"unknown state {state!r} in {MANIFEST}"
    steps: list[dict[str, Any]] = []
    if (folder / STATS).exists():
        try:
            lines = _read_text(folder / STATS, "statistics file").split("\n")
        except LabkitError as exc:
            notes.append(f"{STATS}: unreadable ({exc})")
            lines = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                notes.append(f"{STATS}: line {i + 1} is cut short (dropped)")
                continue
            if isinstance(row, dict):
                steps.append(row)
    cap = Capture(folder, state, state == "complete", reason, man, steps, notes=notes)
    if (folder / STATS_AT_OOM).exists():
        st = _read_json_file(folder / STATS_AT_OOM, notes)
        cap.stats_at_oom = st if isinstance(st, dict) else None
    if (folder / MESSAGE).exists():
        try:
            cap.oom_message = _read_text(folder / MESSAGE, "OOM message file")
        except LabkitError as exc:
            notes.append(f"{MESSAGE}: unreadable ({exc})")
    if (folder / VERDICT_JSON).exists():
        v = _read_json_file(folder / VERDICT_JSON, notes)
        cap.verdict = v if isinstance(v, dict) else None
        if v is not None and cap.verdict is None:
            notes.append(f"{VERDICT_JSON}: a {type(v).__name__}, not a verdict (left out)")
    if man.get("oom"):
        missing = [n for n in (STATS_AT_OOM, MESSAGE, VERDICT_JSON) if not (folder / n).exists()]
        if man.get("settings", {}).get("history", True) and not (folder / SNAPSHOT).exists():
            missing.insert(0, SNAPSHOT)
        if missing:
            notes.append(f"missing after the OOM: {', '.join(missing)}")
            if cap.complete:
                cap.state, cap.complete, cap.reason = "incomplete", False, f"missing {', '.join(missing)}"
    return cap


def rank_folders(run: str | Path) -> list[Path]:
    """The rank folders of a run folder (rank0, rank1, rank0.1 ...), in rank order."""
    run = Path(run)
    if not path_is(run, "dir"):
        raise LabkitError(f"{str(run)[:200]}: no such run folder")

    def key(p: Path):
        r, _, a = p.name[4:].partition(".")
        return (int(r) if r.isdigit() else 1 << 30, int(a) if a.isdigit() else 0)

    return sorted((p for p in run.iterdir() if p.is_dir() and p.name.startswith("rank")), key=key)


def diagnose_capture(folder: str | Path, *, check_with_simulator: bool = True, while_writing: bool = False):
    """The doctor on a capture folder: message, stats series (+ the stats at the OOM) and snapshot.
    ``while_writing``: called by the watch itself, before it marks the folder finished."""
    cap = read_capture(folder)
    series = [{k: v for k, v in row.items() if k in STEP_KEYS} for row in cap.steps]
    stats: Any = series + ([cap.stats_at_oom] if cap.stats_at_oom else [])
    if not stats:
        stats = None
    elif len(stats) == 1:
        stats = stats[0]
    if cap.oom_message is None and stats is None and cap.snapshot_path is None:
        raise LabkitError(f"{cap.folder}: nothing to diagnose (no OOM message, statistics or snapshot)")
    notes = []
    snap = None
    if cap.snapshot_path is not None:
        try:
            snap = read_snapshot(cap.snapshot_path)
        except LabkitError as exc:  # judge from the rest, and say why the snapshot was left out
            notes.append(f"the snapshot was not used: {exc}")
    text = cap.oom_message if cap.oom_message and "out of memory" in cap.oom_message else None
    try:
        d = diagnose(oom_text=text, stats=stats, snapshot=snap, check_with_simulator=check_with_simulator)
    except LabkitError as exc:
        if text is None:
            raise
        notes.append(f"the OOM message was not used: {exc}")
        d = diagnose(stats=stats, snapshot=snap, check_with_simulator=check_with_simulator)
    d.notes[:0] = notes
    if not cap.complete and not (while_writing and cap.manifest.get("state") == "running"):
        d.notes.insert(0, f"this capture is incomplete ({cap.reason}): the verdict uses what was written")
    return d


def pack(folder: str | Path) -> dict[str, Any]:
    """One rank's folder as one JSON-able dict (everything but the snapshot): how recordings are committed."""
    folder = Path(folder)
    c = read_capture(folder)
    vt = folder / VERDICT_TXT
    return {"folder": folder.name, "state": c.state, "complete": c.complete, "reason": c.reason,
            "manifest": c.manifest, "steps": c.steps, "stats_at_oom": c.stats_at_oom, "oom_message": c.oom_message,
            "verdict": c.verdict, "verdict_text": vt.read_text(encoding="utf-8", errors="replace") if vt.exists() else None,
            "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}, "notes": c.notes}


def unpack(doc: dict[str, Any], dest: str | Path, snapshot: str | Path | None = None) -> Path:
    """Lay a packed capture out as a rank folder again (with the snapshot file, if given), for the doctor."""
    if not isinstance(doc, dict) or not isinstance(doc.get("manifest"), dict):
        raise LabkitError("a packed capture is a dict with a 'manifest'")
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps(doc["manifest"], indent=1) + "\n")
    (folder / STATS).write_text("".join(json.dumps(r) + "\n" for r in doc.get("steps") or []))
    if doc.get("stats_at_oom") is not None:
        (folder / STATS_AT_OOM).write_text(json.dumps(doc["stats_at_oom"]))
    if doc.get("oom_message") is not None:
        (folder / MESSAGE).write_text(doc["oom_message"])
    if doc.get("verdict") is not None:
        (folder / VERDICT_JSON).write_text(json.dumps(doc["verdict"]))
    if doc.get("verdict_text") is not None:
        (folder / VERDICT_TXT).write_text(doc["verdict_text"])
    if snapshot is not None:
        (folder / SNAPSHOT).write_bytes(Path(snapshot).read_bytes())
    return folder
