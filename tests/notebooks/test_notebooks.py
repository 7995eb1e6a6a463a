"""Every notebook executes headless through the report runner with smoke parameters."""

import ast
import json
import re

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


MAX_RUN_FOLDER_BYTES = 30 * 10**6  # a whole smoke run's folder


def _outputs_text(path):
    """(stderr texts, every output's text) of an executed notebook."""
    nb = nbformat.read(str(path), as_version=4)
    stderr, texts = [], []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                (stderr if o.get("name") == "stderr" else texts).append(o.get("text", ""))
            elif o.get("output_type") == "error":
                stderr.append("\n".join(o.get("traceback", [])))
            else:
                texts += [v for k, v in (o.get("data") or {}).items() if k.startswith("text/") and isinstance(v, str)]
    return stderr, texts


@pytest.mark.notebook
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_in_smoke_mode(name, smoke_report):
    run = smoke_report(name)  # the same run feeds tests/browser's report pages check
    nb = run.notebooks[0]
    assert nb.status == "passed", f"{name} failed: {json.dumps(nb.error)}"
    assert nb.results, f"{name} recorded no key result through labkit.report.record"
    for r in nb.results.values():
        assert r["source"], f"{name}: result {r['name']} does not say where it comes from"
        if r["source"].startswith("measured here"):  # what a nightly run can catch moving
            assert r["direction"] in ("higher", "lower"), f"{name}: {r['name']} is measured here without a direction"
    # a participant reads stderr as an error (a pink box); progress is a plain line on stdout
    stderr, texts = _outputs_text(run.folder / f"{name}.ipynb")
    assert not stderr, f"{name} wrote to stderr:\n" + "\n".join(t[-300:] for t in stderr)
    deprecated = [t for t in texts if "deprecat" in t.lower()]
    assert not deprecated, f"{name} printed a deprecation: {deprecated[0][:300]}"
    if name != "00_this_server":  # 00 teaches GiB against GB; after it, sizes are in GiB (rates stay GB/s)
        decimal = [m for t in texts for m in re.findall(r".{0,50}\bGB\b(?!/s).{0,20}", re.sub(r"<[^>]+>", " ", t))]
        assert not decimal, f"{name} mixes GB into its GiB sizes: {decimal[:3]}"


@pytest.mark.notebook
def test_the_scripts_notebook_predicts_its_h200_recordings_within_targets(smoke_report):
    """07's smoke run predicts a held-out script (nanogpt_sdpa, unmodified, in its own process) and rank 0 of a
    DTensor TP launch (tp-mlp-w2) recorded on the H200 (benchmarks/gpu/record_scripts.py): peak within 3%, reserved
    within 10% (issue "your script"'s targets; benchmarks/bench_script.py --validate runs them all). The same runs
    through `labkit measure --script ... --json`: tests/memory/script/test_script_cli.py."""
    results = smoke_report("07_your_script").notebooks[0].results
    assert abs(results["script_example_peak_error"]["value"]) < 3
    assert abs(results["script_example_reserved_error"]["value"]) < 10
    assert 0 <= results["script_rank0_worst_peak_error"]["value"] < 3


@pytest.mark.notebook
def test_a_smoke_run_folder_is_at_most_30_mb(smoke_report):
    """The notebooks' files of a whole smoke run, and the one BokehJS file they share (the session runs each
    notebook into a folder of its own, each with its own copy of that file: counted once here)."""
    from labkit.report.render import bokeh_js_name

    js = bokeh_js_name()
    sizes = {}
    for name in NOTEBOOKS:
        folder = smoke_report(name).folder
        sizes.update({f"{name}/{f.name}": f.stat().st_size for f in folder.iterdir() if f.name != js})
    total = sum(sizes.values()) + (folder / js).stat().st_size
    big = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert total <= MAX_RUN_FOLDER_BYTES, f"a smoke run would be {total / 1e6:.1f} MB; largest files: {big}"
