"""The report runner on small throwaway notebooks: passing, failing, bad input, comparison."""

import json

import pytest

from labkit.core import LabkitError
from labkit.report import runner
from labkit.report.runner import run_report


@pytest.fixture
def nbdir(tmp_path, notebook_writer):
    _notebook = notebook_writer
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "a_ok.ipynb", "from labkit.report import record\n"
                                "record('answer', 42.0 * scale, 'widgets', source='model')\n"
                                "record('label', 'smoke' if smoke else 'full', source='model')")
    _notebook(d / "b_fails.ipynb", "x = 1\nraise ValueError('planted failure')")
    _notebook(d / "c_after.ipynb", "from labkit.report import record\nrecord('ran', 1, 'flag', source='measured here', direction='higher')")
    return d


def _quiet(msg):
    pass


def test_failure_is_recorded_and_the_others_still_run(nbdir, tmp_path):
    out = tmp_path / "reports"
    run = run_report(out_dir=out, notebooks_dir=nbdir, params=["scale=2"], say=_quiet)
    assert [n.status for n in run.notebooks] == ["passed", "failed", "passed"]
    assert run.failed == ["b_fails"] and run.state == "finished" and run.status == "failed"
    summary = json.loads((run.folder / "summary.json").read_text())
    a, b, c = summary["notebooks"]
    assert a["results"]["answer"]["value"] == 84.0 and a["results"]["answer"]["unit"] == "widgets"
    assert a["results"]["label"]["value"] == "smoke" and a["parameters"] == {"smoke": True, "scale": 2.0}
    assert b["error"]["ename"] == "ValueError" and "planted failure" in b["error"]["evalue"]
    assert b["error"]["cell"] is not None
    assert c["results"]["ran"]["value"] == 1
    for nb in (a, b, c):  # every notebook is rendered, the failed one too
        assert (run.folder / nb["html"]).exists() and (run.folder / nb["ipynb"]).exists()
    index = (run.folder / "index.html").read_text()
    assert "b_fails" in index and "planted failure" in index and "failed" in index
    assert summary["environment"]["labkit"]


def test_runs_never_overwrite_and_a_parameter_change_is_not_comparable(nbdir, tmp_path):
    out = tmp_path / "reports"
    first = run_report(out_dir=out, notebooks_dir=nbdir, only=["a_ok"], say=_quiet)
    second = run_report(out_dir=out, notebooks_dir=nbdir, only=["a_ok"], params=["scale=1.5"], say=_quiet)
    assert first.folder != second.folder and first.folder.exists()
    index = (second.folder / "index.html").read_text()
    assert "not comparable" in index and "scale default -&gt; 1.5" in index  # the reason says what differed
    assert "+50.0%" not in index and second.regressions == []


@pytest.mark.parametrize("kwargs,match", [
    ({"only": ["nope"]}, "unknown notebook"),
    ({"params": ["colour=red"]}, "unknown parameter"),
    ({"params": ["scale=big"]}, "scale is a float"),
    ({"params": ["smoke"]}, "expected key=value"),
    ({"profile": "huge"}, "smoke or full"),
])
def test_bad_input_is_refused_before_anything_runs(nbdir, tmp_path, kwargs, match):
    out = tmp_path / "reports"
    with pytest.raises(LabkitError, match=match):
        run_report(out_dir=out, notebooks_dir=nbdir, say=_quiet, **kwargs)
    assert not out.exists() or not any(out.iterdir())


def test_interrupted_run_is_marked_incomplete(nbdir, tmp_path, monkeypatch):
    calls = []
    real = runner._execute

    def flaky(src, dst, params, results_file, progress=False, **kw):
        calls.append(src.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst, params, results_file, progress, **kw)

    monkeypatch.setattr(runner, "_execute", flaky)
    out = tmp_path / "reports"
    with pytest.raises(KeyboardInterrupt):
        run_report(out_dir=out, notebooks_dir=nbdir, say=_quiet)
    folder = next(out.iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["state"] == "interrupted"
    assert [n["status"] for n in summary["notebooks"]] == ["passed", "interrupted", "not run"]
    assert "incomplete" in (folder / "index.html").read_text()
    assert not (out / "history.jsonl").exists()  # an interrupted run is not history


def test_a_hanging_cell_fails_its_notebook_and_the_run_goes_on(tmp_path, notebook_writer):
    d = tmp_path / "notebooks"
    d.mkdir()
    notebook_writer(d / "a_hangs.ipynb", "import time\ntime.sleep(600)")
    notebook_writer(d / "b_after.ipynb", "from labkit.report import record\nrecord('ran', 1, 'flag', source='measured here', direction='higher')")
    run = run_report(out_dir=tmp_path / "r", notebooks_dir=d, say=_quiet, cell_timeout_s=3)
    hung, after = run.notebooks
    assert hung.status == "failed" and "timed out" in hung.error["evalue"].lower()
    assert hung.duration_s < 120
    assert after.status == "passed" and after.results["ran"]["value"] == 1
    assert run.status == "failed"


@pytest.mark.parametrize("bad", [0, -1, "soon", float("nan")])
def test_a_bad_cell_timeout_is_refused(nbdir, tmp_path, bad):
    with pytest.raises(LabkitError, match="--cell-timeout"):
        run_report(out_dir=tmp_path / "r", notebooks_dir=nbdir, say=_quiet, cell_timeout_s=bad)


def test_html_report_loads_nothing_from_the_network(nbdir, tmp_path):
    import re

    run = run_report(out_dir=tmp_path / "r", notebooks_dir=nbdir, only=["a_ok"], say=_quiet)
    html = (run.folder / "a_ok.html").read_text()
    assert not re.findall(r"<(?:script|link|img)[^>]+(?:src|href)=[\"']?https?:", html)


def test_keep_deletes_the_oldest_run_folders_and_keeps_their_history(nbdir, tmp_path):
    out = tmp_path / "reports"
    said = []
    runs = [run_report(out_dir=out, notebooks_dir=nbdir, only=["a_ok"], say=said.append, keep=2) for _ in range(3)]
    assert [r.folder.exists() for r in runs] == [False, True, True]
    assert any("--keep 2: deleted 1 older run folder(s)" in m for m in said)
    from labkit.report import history

    entries, _ = history.read(out)
    assert {e.run_id for e in entries} == {r.run_id for r in runs}   # the numbers of a deleted folder stay
    (out / "notes").mkdir()                                         # a folder that is not a run is never touched
    runner.prune(out, 1)
    assert (out / "notes").exists() and [p.name for p in runner.run_folders(out)] == [runs[2].folder.name]
    with pytest.raises(LabkitError, match="--keep 0"):
        run_report(out_dir=out, notebooks_dir=nbdir, only=["a_ok"], say=_quiet, keep=0)


def test_a_run_folder_holds_one_bokehjs_that_its_pages_load(tmp_path, notebook_writer):
    """BokehJS once per run folder (it is 4 MB): the notebook and its HTML carry only their figures."""
    d = tmp_path / "nb"
    d.mkdir()
    notebook_writer(d / "a_fig.ipynb", "from bokeh.plotting import figure\nfrom labkit.viz.display import show\n"
                                       "f = figure(width=200, height=200)\nf.line([0, 1], [0, 1])\nshow(f)")
    run = run_report(out_dir=tmp_path / "reports", notebooks_dir=d, say=_quiet)
    assert run.notebooks[0].status == "passed", run.notebooks[0].error
    from labkit.report.render import bokeh_js_name

    js = run.folder / bokeh_js_name()
    assert js.stat().st_size > 1_000_000
    html = (run.folder / "a_fig.html").read_text()
    assert f'<script src="{bokeh_js_name()}"></script>' in html and "embed_items_notebook" in html
    for f in ("a_fig.html", "a_fig.ipynb", "index.html"):
        assert (run.folder / f).stat().st_size < 300_000, f
