"""A real browser opens every notebook's report page (the HTML of a smoke run, offline), as a workshop
participant reads it: BokehJS comes from the run folder's one file, nothing is fetched from the network,
no output is a stderr box, and each explorer (a widget, which a report without a kernel shows as a note)
has its static result beside it, a table or a figure, not a placeholder alone.

Debian's chromium is driven by Playwright through its executable path, as tests/browser/test_jupyterlab.py
does; the smoke runs are the session's (tests/conftest.py: smoke_report), shared with tests/notebooks.
"""

import os
from pathlib import Path

import pytest

from labkit.core.paths import NOTEBOOKS_DIR
from labkit.report.notebooks import discover

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
        "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
NOTEBOOKS = sorted(discover(NOTEBOOKS_DIR))

pytestmark = pytest.mark.browser

# Per widget note: does the cell that shows it also show a table or a drawn Bokeh figure?
EXPLORERS = """() => [...document.querySelectorAll('.labkit-widget-note')].map(note => {
    const cell = note.closest('.jp-Cell') || document.body;
    const title = cell.querySelector('h4.labkit-section');
    return {title: title ? title.innerText : '(no section title)',
            tables: cell.querySelectorAll('table.labkit-table tbody tr').length,
            figures: cell.querySelectorAll('.bk-Canvas, div.bk-Figure').length};
})"""


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make test` (it installs Debian's chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_report_page_renders_offline_and_each_explorer_shows_a_table_or_figure(browser, smoke_report, name):
    run = smoke_report(name)
    assert run.notebooks[0].status == "passed", run.notebooks[0].error
    ctx = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    requests, console = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: console.append(m.text))
    try:
        page.goto((run.folder / f"{name}.html").as_uri())
        page.wait_for_load_state("load")
        expected = page.evaluate("document.querySelectorAll('.bk-root, [data-root-id]').length")
        if expected:  # every figure the page embeds is drawn (BokehJS loaded from the file beside it)
            page.wait_for_function("document.querySelectorAll('.bk-Canvas, div.bk-Figure').length > 0", timeout=60_000)
        explorers = page.evaluate(EXPLORERS)
        titles = page.locator("h4.labkit-section").all_inner_texts()
        sources_per_cell = page.evaluate("""() => [...document.querySelectorAll('.jp-Cell')].map(
            c => c.querySelectorAll('p.labkit-source').length)""")
        stderr_boxes = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").count()
        body = page.inner_text("body")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"report_page_{name}.png"), full_page=True)
    finally:
        ctx.close()
    assert not [u for u in requests if u.startswith("http")], f"{name}: the page fetched from the network: {requests}"
    assert not [m for m in console if "BokehJS library is missing" in m], f"{name}: BokehJS did not load"
    assert stderr_boxes == 0, f"{name}: {stderr_boxes} stderr output(s) on the page"
    assert "VBox(children" not in body
    assert len(titles) == len(set(titles)), f"{name}: a section title appears twice: {titles}"
    assert max(sources_per_cell, default=0) <= 1, f"{name}: a cell states its source line more than once"
    empty = [e["title"] for e in explorers if not e["tables"] and not e["figures"]]
    assert not empty, f"{name}: explorer(s) with only a placeholder in the report: {empty}"
