"""History, trends, comparable runs and the exit status for cron, on small throwaway notebooks."""

import json
from dataclasses import asdict

from pathlib import Path

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.cli import main
from labkit.core import LabkitError
from labkit.report import compare, history
from labkit.report.runner import run_report


@pytest.fixture
def nbdir(tmp_path, notebook_writer):
    _notebook = notebook_writer
    d = tmp_path / "notebooks"
    d.mkdir()
    # 'speed' reads an environment variable, so a test can induce a regression without changing parameters
    _notebook(d / "a_speed.ipynb", "import os\nfrom labkit.report import record\n"
              "record('speed', float(os.environ.get('LABKIT_TEST_SPEED', '100')) * scale, 'GB/s', "
              "source='measured here', direction='higher', tolerance=0.05)\n"
              "record('peak', 1000.0, 'bytes', source='model', direction='lower')\n"
              "record('label', 'x', source='model')")
    return d


def _quiet(msg):
    pass


def _run(out, nbdir, monkeypatch, speed="100", **kw):
    monkeypatch.setenv("LABKIT_TEST_SPEED", speed)
    return run_report(out_dir=out, notebooks_dir=nbdir, say=_quiet, **kw)


def test_three_runs_give_a_history_trends_and_a_regression(nbdir, tmp_path, monkeypatch):
    out = tmp_path / "reports"
    _run(out, nbdir, monkeypatch)
    _run(out, nbdir, monkeypatch, speed="102")
    third = _run(out, nbdir, monkeypatch, speed="80")  # -21.6% of a higher-is-better result
    entries, bad = history.read(out)
    assert bad == 0 and len({e.run_id for e in entries}) == 3
    assert {e.name for e in entries} == {"speed", "peak", "label"}
    assert third.regressions == ["a_speed/speed"]
    summary = json.loads((third.folder / "summary.json").read_text())
    assert summary["regressions"] == ["a_speed/speed"]
    index = (third.folder / "index.html").read_text()
    assert "regressed" in index and index.count("bk-root") + index.count("data-root-id") >= 2  # trend figures
    assert "cdn.bokeh.org" not in index and "<script src=\"http" not in index  # offline
    assert "1 result(s) regressed" in index


def test_improvement_and_informational_change(nbdir, tmp_path, monkeypatch):
    out = tmp_path / "reports"
    _run(out, nbdir, monkeypatch)
    run = _run(out, nbdir, monkeypatch, speed="120")
    assert run.regressions == []
    index = (run.folder / "index.html").read_text()
    assert "improved" in index


def test_another_machine_is_not_comparable(nbdir, tmp_path, monkeypatch):
    out = tmp_path / "reports"
    _run(out, nbdir, monkeypatch)
    path = out / history.HISTORY_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for d in lines:  # pretend the first run was on a GPU server
        d["machine"] = {"gpu_name": "NVIDIA H200", "gpu_count": 1, "driver": "580", "torch": "2.11", "cuda": "13.0"}
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    run = _run(out, nbdir, monkeypatch, speed="50")
    assert run.regressions == []
    cmp = compare.compare(json.loads((run.folder / "summary.json").read_text()), history.read(out)[0])
    assert cmp["a_speed"]["speed"].status == "not comparable"
    assert "machine 1 x NVIDIA H200" in cmp["a_speed"]["speed"].reason


def test_history_is_rebuilt_from_the_run_folders(nbdir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "reports"
    _run(out, nbdir, monkeypatch)
    _run(out, nbdir, monkeypatch)
    before = (out / history.HISTORY_FILE).read_text()
    (out / history.HISTORY_FILE).unlink()
    assert main(["report", "history", str(out)]) == 0
    assert "2 finished run(s)" in capsys.readouterr().out
    assert sorted(before.splitlines()) == sorted((out / history.HISTORY_FILE).read_text().splitlines())


def test_a_damaged_history_line_is_skipped_and_said(nbdir, tmp_path, monkeypatch, capsys):
    """issue 29: a line `[]` (or a result with fields of the wrong type) made the next report die at its start
    with an AttributeError, leaving an empty run folder."""
    out = tmp_path / "reports"
    _run(out, nbdir, monkeypatch)
    with open(out / history.HISTORY_FILE, "a") as f:
        f.write("{not json\n[]\n" + json.dumps({**json.loads((out / history.HISTORY_FILE).read_text().splitlines()[0]),
                                                  "machine": "x"}) + "\n")
    run = _run(out, nbdir, monkeypatch)
    assert "3 unreadable line(s) skipped" in (run.folder / "index.html").read_text()
    assert "warning: 3 damaged line(s)" in capsys.readouterr().err
    assert json.loads((run.folder / "summary.json").read_text())["state"] == "finished"


def test_fail_on_regression_exits_3_after_writing_everything(nbdir, tmp_path, monkeypatch):
    out = tmp_path / "reports"
    monkeypatch.setattr("labkit.report.notebooks.NOTEBOOKS_DIR", nbdir, raising=False)
    import labkit.report.runner as runner

    monkeypatch.setattr(runner, "NOTEBOOKS_DIR", nbdir)
    real = runner.run_report
    monkeypatch.setattr(runner, "run_report", lambda **kw: real(notebooks_dir=nbdir, **kw))
    monkeypatch.setenv("LABKIT_TEST_SPEED", "100")
    assert main(["report", "--quiet", "--out", str(out), "--fail-on-regression"]) == 0
    monkeypatch.setenv("LABKIT_TEST_SPEED", "10")
    assert main(["report", "--quiet", "--out", str(out)]) == 0  # without the flag a regression is not a failure
    monkeypatch.setenv("LABKIT_TEST_SPEED", "1")
    assert main(["report", "--quiet", "--out", str(out), "--fail-on-regression"]) == 3
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(runs) == 3 and all((r / "index.html").exists() for r in runs)
    assert len({e.run_id for e in history.read(out)[0]}) == 3


@pytest.mark.parametrize("bad,match", [("", "empty"), ("FILE", "not a directory")])
def test_out_must_be_a_directory(nbdir, tmp_path, bad, match):
    if bad == "FILE":
        bad = str(tmp_path / "afile")
        (tmp_path / "afile").write_text("keep me")
    with pytest.raises(LabkitError, match=match):
        run_report(out_dir=bad, notebooks_dir=nbdir, say=_quiet)
    if bad.endswith("afile"):
        assert (tmp_path / "afile").read_text() == "keep me"


def test_running_cell_is_read_from_papermills_output(tmp_path):
    from labkit.report.runner import running_cell

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a", metadata={"papermill": {"status": "completed"}}),
                nbformat.v4.new_markdown_cell("m"),
                nbformat.v4.new_code_cell("b", metadata={"papermill": {"status": "running"}}),
                nbformat.v4.new_code_cell("c", metadata={"papermill": {"status": "pending"}})]
    p = tmp_path / "x.ipynb"
    nbformat.write(nb, str(p))
    assert running_cell(p) == (2, 3)
    assert running_cell(tmp_path / "missing.ipynb") is None


def test_the_heartbeat_names_the_running_cell_after_papermill_changes_directory(tmp_path, monkeypatch):
    """`make report` writes into reports/ (a relative path) and papermill runs each notebook from its own folder:
    the heartbeat still finds the output notebook (it said "starting" for a whole notebook before)."""
    import time

    from labkit.report.runner import _Heartbeat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a", metadata={"papermill": {"status": "running"}})]
    (tmp_path / "reports").mkdir()
    nbformat.write(nb, str(tmp_path / "reports" / "x.ipynb"))
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path)
    said = []
    with _Heartbeat(said.append, "x", Path("reports") / "x.ipynb", every_s=0.05):
        monkeypatch.chdir(tmp_path / "notebooks")                 # as papermill's execute_notebook(cwd=...) does
        time.sleep(0.3)
    assert said and all("x: code cell 1/1" in m for m in said), said


# ---- issue 29: `report history DIR` never shrinks the history (synthetic run folders: no notebook runs)

def _summary(run_id: str, started: str, value: float = 1.0, **over) -> dict:
    doc = {"run_id": run_id, "started": started, "state": "finished", "profile": "smoke",
           "environment": {"gpu_count": 0, "torch": "2.13", "git_commit": "abc1234", "host": "h"},
           "notebooks": [{"name": "a_speed", "parameters": {"smoke": True},
                          "results": {"speed": {"value": value, "unit": "GB/s", "source": "measured here"}}}]}
    doc.update(over)
    return doc


def _folder(out, doc) -> None:
    (out / doc["run_id"]).mkdir(parents=True)
    (out / doc["run_id"] / "summary.json").write_text(json.dumps(doc))


def _lines(out) -> list[str]:
    return (out / history.HISTORY_FILE).read_text().splitlines()


def test_rebuild_keeps_the_lines_of_pruned_run_folders(tmp_path, capsys):
    out = tmp_path / "reports"
    for i in range(3):
        _folder(out, _summary(f"r{i}", f"2026-12-0{i + 1}T00:00:00", value=i))
    assert main(["report", "history", str(out)]) == 0
    assert len(_lines(out)) == 3
    import shutil

    shutil.rmtree(out / "r0")   # pruned: its night's numbers stay in the history
    shutil.rmtree(out / "r1")
    assert main(["report", "history", str(out)]) == 0
    assert "3 finished run(s)" in capsys.readouterr().out
    assert [json.loads(x)["run_id"] for x in _lines(out)] == ["r0", "r1", "r2"]


def test_rebuild_refuses_to_replace_a_history_with_an_empty_one(tmp_path, capsys):
    out = tmp_path / "reports"
    out.mkdir()
    (out / history.HISTORY_FILE).write_text("[]\n{broken\n")
    before = (out / history.HISTORY_FILE).read_text()
    assert main(["report", "history", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to replace a history of 2 line(s) with an empty one" in err
    assert (out / history.HISTORY_FILE).read_text() == before
    # an empty folder with no history: an empty history is written, nothing was lost
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", "history", str(empty)]) == 0 and _lines(empty) == []


def test_rebuild_with_a_folder_left_keeps_every_other_night(tmp_path, capsys):
    """issue 29: a history and no run folders gave "0 finished run(s) written": every night's numbers gone."""
    out = tmp_path / "reports"
    for i in range(2):
        _folder(out, _summary(f"r{i}", f"2026-12-0{i + 1}T00:00:00"))
    assert main(["report", "history", str(out)]) == 0
    import shutil

    for i in range(2):
        shutil.rmtree(out / f"r{i}")
    with open(out / history.HISTORY_FILE, "a") as f:
        f.write("[]\n")
    assert main(["report", "history", str(out)]) == 0
    captured = capsys.readouterr().out
    assert "2 finished run(s)" in captured and "1 damaged line(s) moved" in captured
    assert len(_lines(out)) == 2
    assert (out / history.DAMAGED_FILE).read_text() == "[]\n"
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize("bad", [[], {"state": "finished", "run_id": 5}, _summary("rx", "t", notebooks="nope"),
                                 _summary("rx", "t", notebooks=[{"name": 3}]),
                                 _summary("rx", "t", notebooks=[{"name": "n", "results": {"speed": 3}}]),
                                 _summary("rx", "t", environment="x")])
def test_a_malformed_summary_is_skipped_with_a_warning(tmp_path, capsys, bad):
    out = tmp_path / "reports"
    _folder(out, _summary("good", "2026-12-01T00:00:00"))
    (out / "bad").mkdir()
    (out / "bad" / "summary.json").write_text(json.dumps(bad))
    assert main(["report", "history", str(out)]) == 0
    captured = capsys.readouterr()
    assert "1 finished run(s)" in captured.out
    if isinstance(bad, dict):   # a finished run's summary of the wrong shape is named; a list is no run's summary
        assert "warning: skipped bad/summary.json" in captured.err


def test_report_history_paths_are_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for folder in (str(tmp_path / "file" / "x"), "y" * 5000, str(tmp_path / "missing")):
        assert main(["report", "history", folder]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a report folder" in err and len(err) < 400
    out = tmp_path / "fifo"
    out.mkdir()
    import os

    os.mkfifo(out / history.HISTORY_FILE)
    assert main(["report", "history", str(out)]) == 2
    assert "FIFO" in capsys.readouterr().err


@pytest.mark.parametrize("out,match", [("{file}/x", "cannot be a folder"), ("y" * 5000, "longer than the file system"),
                                       ("/proc/labkit-x", "cannot create")])
def test_out_paths_are_refused_before_anything_runs(nbdir, tmp_path, out, match):
    (tmp_path / "file").write_text("keep")
    with pytest.raises(LabkitError, match=match):
        run_report(out_dir=out.format(file=tmp_path / "file"), notebooks_dir=nbdir, say=_quiet)


_LINE = st.one_of(st.sampled_from(["[]", "{}", "null", "{broken", '{"run_id": 5}', "3", '"x"']), st.text(max_size=30))


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nights=st.integers(0, 4), junk=st.lists(_LINE, max_size=5), folders=st.integers(0, 2))
def test_rebuild_never_loses_a_readable_night(tmp_path_factory, nights, junk, folders):
    """Whatever the history holds, a rebuild keeps every readable night (folder or not) and every damaged line."""
    out = tmp_path_factory.mktemp("h")
    good = [json.dumps(asdict(e)) for i in range(nights)
            for e in history.entries_from_summary(_summary(f"old{i}", f"2026-11-0{i + 1}T00:00:00"))]
    (out / history.HISTORY_FILE).write_text("\n".join(good + [j.replace("\n", " ") for j in junk]) + "\n")
    for i in range(folders):
        _folder(out, _summary(f"new{i}", f"2026-12-0{i + 1}T00:00:00"))
    damaged_before = len(history._read_lines(out)[1])
    rc = main(["report", "history", str(out)])
    if nights == 0 and folders == 0 and damaged_before:
        assert rc == 2 and len(history._read_lines(out)[1]) == damaged_before   # refused, nothing replaced
        return
    assert rc == 0
    kept = {e.run_id for e in history.read(out)[0]}
    assert kept == {f"old{i}" for i in range(nights)} | {f"new{i}" for i in range(folders)}
    moved = (out / history.DAMAGED_FILE).read_text().splitlines() if (out / history.DAMAGED_FILE).exists() else []
    assert len(moved) == damaged_before
