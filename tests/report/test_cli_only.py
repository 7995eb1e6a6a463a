"""``labkit report --only A --only B`` runs both notebooks (argparse's nargs="+" alone keeps the last)."""

import json

from labkit.cli import main


def test_repeated_only_runs_each_notebook(tmp_path, monkeypatch, capsys, notebook_writer):
    from labkit.report import runner

    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    for name in ("a_first", "b_second", "c_not_asked"):
        notebook_writer(nbdir / f"{name}.ipynb", f"print({name!r})")
    real = runner.run_report
    monkeypatch.setattr(runner, "run_report", lambda **kw: real(notebooks_dir=nbdir, **kw))
    rc = main(["report", "--only", "a_first", "--only", "b_second", "--out", str(tmp_path / "r"), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    summary = json.loads(next((tmp_path / "r").glob("*/summary.json")).read_text())
    assert [(n["name"], n["status"]) for n in summary["notebooks"]] == [("a_first", "passed"), ("b_second", "passed")]
