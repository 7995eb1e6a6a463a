"""``labkit report``: execute notebooks headless with papermill into a new report folder.

The folder ``DIR/<UTC timestamp>-<host>/`` gets each executed notebook, its offline HTML,
``summary.json`` (rewritten after every notebook, so an interrupted run is visibly incomplete)
and ``index.html``. A finished run appends its key results to ``DIR/history.jsonl``, which the
index reads for trends and for the last comparable run. A failing notebook is recorded and the
run goes on; the caller exits non-zero.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import signal
import socket
import stat as stat_mod
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labkit.core.errors import LabkitError
from labkit.core.paths import NOTEBOOKS_DIR
from labkit.core.provenance import header
from labkit.core.serialize import to_jsonable
from labkit.report import compare as cmp
from labkit.report import history
from labkit.report import notebooks as nbs
from labkit.report.record import RESULTS_ENV, read_results
from labkit.report.render import index_html, notebook_html, write_bokeh_js

# papermill (11 s to import: python -X importtime, 2-core machine) is imported where a notebook runs.

KERNEL = "python3"
START_TIMEOUT_S = 180
# The longest one code cell may run before the notebook is failed (nbclient's ``timeout``): a cell
# that hangs (a deadlocked kernel, a widget waiting for a browser that is not there) becomes a
# failure naming the cell instead of a run that never ends. Per profile; ``--cell-timeout`` sets it.
CELL_TIMEOUT_S = {"smoke": 900.0, "full": 3600.0}


@dataclass
class NotebookRun:
    name: str
    status: str = "pending"  # pending | running | passed | failed
    duration_s: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    results: dict[str, dict] = field(default_factory=dict)
    error: dict | None = None
    ipynb: str | None = None
    html: str | None = None


@dataclass
class ReportRun:
    run_id: str
    folder: Path
    profile: str
    command: str
    started: str
    state: str = "running"  # running | finished | interrupted
    status: str = "running"  # passed | failed once finished
    finished: str | None = None
    environment: dict = field(default_factory=dict)
    notebooks: list[NotebookRun] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)  # "notebook/result" beyond tolerance, the bad way

    @property
    def failed(self) -> list[str]:
        return [n.name for n in self.notebooks if n.status == "failed"]


def _utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_run_folder(out_dir: Path) -> Path:
    """A fresh folder ``<UTC timestamp>-<host>``; never reuses an existing one."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LabkitError(f"--out {str(out_dir)[:160]}: cannot create the folder ({exc.strerror})") from None
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname()) or "host"
    base = f"{_utc():%Y%m%dT%H%M%SZ}-{host}"
    for i in range(1000):
        folder = out_dir / (base if i == 0 else f"{base}-{i + 1}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
        except OSError as exc:
            raise LabkitError(f"--out {str(out_dir)[:160]}: cannot create a run folder in it ({exc.strerror})") from None
    raise LabkitError(f"{out_dir}: could not create a new run folder")


def _write_summary(run: ReportRun) -> None:
    """summary.json and index.html as the run stands; a finished run also goes into the history."""
    doc = to_jsonable(run)
    doc.pop("folder", None)
    out_dir = run.folder.parent
    past, bad = history.read(out_dir)
    comparison = cmp.compare(doc, past)
    run.regressions = cmp.regressions(comparison) if run.state == "finished" else []
    doc["regressions"] = run.regressions
    tmp = run.folder / "summary.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(run.folder / "summary.json")
    if run.state == "finished":
        history.append(out_dir, doc)
    runs = len({e.run_id for e in past})
    note = (f"{runs} earlier run(s) in {out_dir / history.HISTORY_FILE}" if runs else "no earlier run in this folder")
    if bad:
        note += f"; {bad} unreadable line(s) skipped (labkit report history {out_dir} rebuilds it)"
    (run.folder / "index.html").write_text(index_html(doc, comparison, note), encoding="utf-8")


def running_cell(ipynb: Path) -> tuple[int, int] | None:
    """(1-based index, count) of the code cell papermill marks as running in the output notebook
    it saves after every cell, or None when that cannot be read yet."""
    try:
        cells = [c for c in json.loads(ipynb.read_text()).get("cells", []) if c.get("cell_type") == "code"]
    except (OSError, ValueError, AttributeError):
        return None
    for i, c in enumerate(cells, 1):
        if (c.get("metadata", {}).get("papermill") or {}).get("status") == "running":
            return i, len(cells)
    return None


class _Heartbeat:
    """Prints, every ``every_s`` seconds while a notebook runs, the elapsed time and the cell being run. The
    output notebook's path is made absolute here: papermill changes the process's working directory to the
    notebook's folder while it executes (``execute_notebook``'s ``cwd``), where a relative path finds nothing."""

    def __init__(self, say: Callable[[str], None], name: str, ipynb: Path, every_s: float = 15.0) -> None:
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, args=(say, name, Path(ipynb).absolute(), every_s),
                                   daemon=True)

    def _loop(self, say, name, ipynb, every_s) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(every_s):
            cell = running_cell(ipynb)
            where = f"code cell {cell[0]}/{cell[1]}" if cell else "starting"
            say(f"      ... {name}: {where}, {time.monotonic() - t0:.0f} s")

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


# The kernel application's own start-up notices (ipykernel's "Kernel is running over TCP without
# encryption" on a local loopback kernel) say nothing about the notebook: only its errors are shown.
# What the notebook's code writes to stderr is not affected.
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]


def _execute(src: Path, dst: Path, params: dict[str, Any], results_file: Path, progress: bool = False,
             cell_timeout_s: float | None = None) -> None:
    import papermill

    old = os.environ.get(RESULTS_ENV)
    os.environ[RESULTS_ENV] = str(results_file)
    try:
        papermill.execute_notebook(str(src), str(dst), parameters=params, kernel_name=KERNEL,
                                   start_timeout=START_TIMEOUT_S, cwd=str(src.parent),
                                   progress_bar=progress, log_output=False, report_mode=False,
                                   extra_arguments=KERNEL_ARGS, execution_timeout=cell_timeout_s,
                                   kernel_manager_class="labkit.report.kernel.SlicedPollKernelManager")
    finally:
        if old is None:
            os.environ.pop(RESULTS_ENV, None)
        else:
            os.environ[RESULTS_ENV] = old


def _error_info(exc: BaseException) -> dict:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        return {"cell": exc.cell_index, "exec_count": exc.exec_count, "ename": exc.ename, "evalue": exc.evalue}
    return {"cell": None, "ename": type(exc).__name__, "evalue": str(exc)}


def run_report(*, profile: str = "smoke", out_dir: Path | str = "reports", only: list[str] | None = None,
               params: list[str] | None = None, notebooks_dir: Path = NOTEBOOKS_DIR,
               say: Callable[[str], None] = print, progress: bool = False,
               cell_timeout_s: float | None = None, keep: int | None = None) -> ReportRun:
    """Run the selected notebooks. Bad names/parameters raise LabkitError before anything runs.
    ``progress``: papermill's per-cell progress bar on stderr (cells done, elapsed time).
    ``cell_timeout_s``: the longest a code cell may run before its notebook fails (default: the
    profile's, :data:`CELL_TIMEOUT_S`). ``keep``: after a finished run, delete all but the newest
    ``keep`` run folders of ``out_dir`` (:func:`prune`; the history keeps their numbers)."""
    out_dir = _check_out_dir(out_dir)
    keep = _check_keep(keep)
    cell_timeout_s = _cell_timeout(cell_timeout_s, profile)
    selected = nbs.select(only, notebooks_dir)
    per_nb = nbs.resolve(selected, nbs.parse_assignments(params or []), profile)

    _, bad = history.read(out_dir)   # an unreadable history is refused here, before a run folder exists
    if bad:
        print(f"labkit report: warning: {bad} damaged line(s) in {out_dir / history.HISTORY_FILE} skipped "
              f"(`labkit report history {out_dir}` moves them aside)", file=sys.stderr, flush=True)
    folder = new_run_folder(out_dir)
    write_bokeh_js(folder)  # the one BokehJS every page of the run loads (offline: a file beside them)
    command = " ".join(shlex.quote(a) for a in sys.argv)
    run = ReportRun(run_id=folder.name, folder=folder, profile=profile, command=command,
                    started=_utc().isoformat(timespec="seconds"), environment=header(command))
    run.notebooks = [NotebookRun(name=n, parameters=per_nb[n]) for n in selected]
    _write_summary(run)
    say(f"labkit report: {len(selected)} notebook(s), profile {profile}, into {folder}")

    def _on_term(signum, frame):  # make SIGTERM behave like Ctrl-C so the run is marked interrupted
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, _on_term) if threading.current_thread() is threading.main_thread() else None
    t_run = time.monotonic()
    try:
        for i, nbr in enumerate(run.notebooks, 1):
            src = selected[nbr.name]
            dst = folder / src.name
            say(f"[{i}/{len(run.notebooks)}] {nbr.name} ... (elapsed {time.monotonic() - t_run:.0f} s)")
            nbr.status = "running"
            _write_summary(run)
            fd, results_file = tempfile.mkstemp(prefix=f"{nbr.name}-", suffix=".jsonl", dir=folder)
            os.close(fd)
            t0 = time.monotonic()
            try:
                with _Heartbeat(say, nbr.name, dst):
                    _execute(src, dst, nbr.parameters, Path(results_file), progress, cell_timeout_s=cell_timeout_s)
                nbr.status = "passed"
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # a notebook's failure is recorded; the run goes on
                nbr.status = "failed"
                nbr.error = _error_info(exc)
            nbr.duration_s = round(time.monotonic() - t0, 2)
            nbr.results = read_results(results_file)
            os.unlink(results_file)
            if dst.exists():
                nbr.ipynb = dst.name
                try:
                    nbr.html = notebook_html(dst, folder / f"{nbr.name}.html").name
                except Exception as exc:  # rendering must not hide the execution result
                    nbr.error = nbr.error or {"cell": None, "ename": "RenderError", "evalue": str(exc)}
                    if nbr.status == "passed":
                        nbr.status = "failed"
            mark = "passed" if nbr.status == "passed" else f"FAILED ({nbr.error.get('ename')}: {str(nbr.error.get('evalue'))[:200]})"
            say(f"      {nbr.name}: {mark} in {nbr.duration_s:.1f} s")
            _write_summary(run)
        run.state = "finished"
        run.status = "failed" if run.failed else "passed"
    except KeyboardInterrupt:
        run.state = "interrupted"
        run.status = "failed"
        for nbr in run.notebooks:
            if nbr.status in ("pending", "running"):
                nbr.status = "not run" if nbr.status == "pending" else "interrupted"
        raise
    finally:
        run.finished = _utc().isoformat(timespec="seconds")
        _write_summary(run)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if keep is not None and run.state == "finished":
            gone = prune(out_dir, keep, current=folder)
            if gone:
                say(f"labkit report: --keep {keep}: deleted {len(gone)} older run folder(s) ({', '.join(gone)}); "
                    f"their key results stay in {out_dir / history.HISTORY_FILE}")
        say(f"labkit report: {run.state}, {run.status}; index: {folder / 'index.html'}")
        if run.regressions:
            say(f"labkit report: {len(run.regressions)} result(s) regressed: {', '.join(run.regressions)}")
    return run


def _cell_timeout(value: float | None, profile: str) -> float:
    if value is None:
        return CELL_TIMEOUT_S.get(profile, CELL_TIMEOUT_S["full"])
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise LabkitError(f"--cell-timeout {value!r}: expected a number of seconds") from None
    if not v > 0 or v != v or v == float("inf"):
        raise LabkitError(f"--cell-timeout {value!r}: must be a positive, finite number of seconds")
    return v


def _check_keep(keep) -> int | None:
    if keep is None:
        return None
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise LabkitError(f"--keep {keep!r}: the number of run folders to keep must be an integer >= 1")
    return keep


def run_folders(out_dir: Path | str) -> list[Path]:
    """The run folders of ``out_dir`` (those with a summary.json), oldest first by their start time."""
    found = []
    for summary in Path(out_dir).glob("*/summary.json"):
        try:
            started = str(json.loads(summary.read_text()).get("started"))
        except (OSError, ValueError, AttributeError):
            started = ""
        found.append((started, summary.parent.name, summary.parent))
    return [p for _, _, p in sorted(found)]


def prune(out_dir: Path | str, keep: int, current: Path | None = None) -> list[str]:
    """Delete all but the newest ``keep`` run folders under ``out_dir`` (``current``, the run just made, is
    always one of those kept); returns the names deleted. Only folders holding a summary.json are touched;
    history.jsonl keeps every run's key results."""
    keep = _check_keep(keep)
    others = [f for f in run_folders(out_dir) if current is None or f.resolve() != Path(current).resolve()]
    kept_others = keep - (current is not None)
    gone = others[:max(0, len(others) - kept_others)]
    for f in gone:
        shutil.rmtree(f)
    return [f.name for f in gone]


def _check_out_dir(out_dir: Path | str) -> Path:
    """The parent folder of the runs: refused if empty or an existing file, before anything runs."""
    if not str(out_dir).strip():
        raise LabkitError("--out: the report folder is empty; give a directory such as reports")
    out = Path(out_dir)
    shown = str(out) if len(str(out)) <= 160 else str(out)[:80] + f"...({len(str(out))} characters)"
    if any(len(part.encode()) > 255 for part in out.parts):
        raise LabkitError(f"--out {shown}: a folder name longer than the file system allows (255 bytes)")
    probe = out
    while True:   # the nearest existing folder on the way must be a folder, and one we may write in
        try:
            st = probe.stat()
        except FileNotFoundError:
            probe = probe.parent
            continue
        except OSError as exc:
            raise LabkitError(f"--out {shown}: cannot be a folder ({exc.strerror})") from None
        break

    if not stat_mod.S_ISDIR(st.st_mode):
        raise LabkitError(f"--out {shown}: {'exists and is not a directory' if probe == out else f'{probe} is a file'}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise LabkitError(f"--out {shown}: cannot create folders in {probe} (permission denied)")
    return out
