"""History, trends, comparable runs and the exit status for cron, on small throwaway notebooks."""

import json

import nbformat
import pytest

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


def test_a_damaged_history_line_is_skipped_and_said(nbdir, tmp_path, monkeypatch):
    out = tmp_path / "reports"
    _run(out, nbdir, monkeypatch)
    with open(out / history.HISTORY_FILE, "a") as f:
        f.write("{not json\n")
    run = _run(out, nbdir, monkeypatch)
    assert "1 unreadable line(s) skipped" in (run.folder / "index.html").read_text()


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
