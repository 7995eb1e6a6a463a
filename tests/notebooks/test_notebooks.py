"""Every notebook executes headless through the report runner with smoke parameters."""

import ast
import json

import nbformat
import pytest

from labkit.core.paths import NOTEBOOKS_DIR
from labkit.report.notebooks import discover, parameters

NOTEBOOKS = sorted(discover(NOTEBOOKS_DIR))


def test_there_are_notebooks():
    assert "00_this_server" in NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_clean_with_smoke_parameter(name):
    path = NOTEBOOKS_DIR / f"{name}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name}: needs exactly one cell tagged 'parameters'"
    params = parameters(path)
    assert "smoke" in params and params["smoke"].type_name == "bool"
    # papermill silently drops a line it cannot parse (e.g. an '=' in a comment): every assignment must be declared
    assigned = {t.id for node in ast.parse(tagged[0].source).body
                for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)}
    assert assigned == set(params), f"{name}: papermill does not see parameter(s) {sorted(assigned - set(params))}"
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name} is committed with outputs"
    assert nb.cells[0].cell_type == "markdown", f"{name}: must open with what the reader will learn"
    assert "on your own server" in nb.cells[-1].source.lower(), f"{name}: must end with what to do on your own server"


@pytest.mark.notebook
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_in_smoke_mode(name, smoke_report):
    run = smoke_report(name)  # the same run feeds tests/browser's offline HTML check (notebook 00)
    nb = run.notebooks[0]
    assert nb.status == "passed", f"{name} failed: {json.dumps(nb.error)}"
    assert nb.results, f"{name} recorded no key result through labkit.report.record"
    for r in nb.results.values():
        assert r["source"], f"{name}: result {r['name']} does not say where it comes from"
