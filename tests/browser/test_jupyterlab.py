"""A real browser: JupyterLab runs the cells of every notebook that has an explorer (smoke parameters) that its
explorers need, its Bokeh figures render, and each explorer (an ipywidgets box with the class ``labkit-explorer``)
redraws when one of its controls moves; the offline HTML report renders its Bokeh plot with no network.

A live kernel is what only this file checks: an explorer redrawing when a control moves. The notebooks without a
widget (LIVE below says which have one; a test keeps it true), and the cells of the others that no explorer needs,
are executed by tests/notebooks (papermill, a real kernel) and their figures rendered in a browser by
tests/browser/test_report_pages.py; running them here again would re-run their computation for nothing this file
sees (``_explorer_copy``).

Debian's chromium is driven by Playwright through its executable path (Playwright cannot download
its own browser here); `make test` installs both. One JupyterLab serves all notebooks; each test shuts
its kernel down. Screenshots go to test-artifacts/.
"""

import ast
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from labkit.core.paths import NOTEBOOKS_DIR
from labkit.report.notebooks import discover

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
        "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
NOTEBOOKS = sorted(discover(NOTEBOOKS_DIR))
# the notebooks with an explorer (a widget): the ones run live in JupyterLab here
LIVE = ("00_this_server", "01_topology", "02_parallel_memory", "05_critical_path", "06_advise")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RUN_TIMEOUT_MS = 240_000
# Every control kind an explorer may start with, in the order they are tried.
CONTROLS = "select, .widget-toggle-button:not(.mod-active), .widget-slider .noUi-handle, .widget-checkbox input"

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make test` (it installs Debian's chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _names(source: str) -> tuple[set[str], set[str]]:
    """The names a cell's code defines (assignments, imports, functions, classes) and the names it reads."""
    tree = ast.parse(source)
    defined, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
    return defined, read


def _explorer_copy(name: str, executed: Path, root: Path) -> None:
    """The notebook as its smoke run executed it (papermill injected ``smoke = True`` after the parameters cell),
    outputs cleared, keeping the cells JupyterLab must run for the explorers: the parameters, every cell whose smoke
    run showed a widget, and, back to the first cell, each cell that defines a name a kept cell reads. The other
    cells' outputs (the lesson's tables and figures) are checked by tests/notebooks and, rendered in a browser, by
    tests/browser/test_report_pages.py. A copy: autosave must not touch the repo."""
    nb = nbformat.read(str(executed), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    keep = [any(t in c.metadata.get("tags", []) for t in ("parameters", "injected-parameters"))
            or any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", [])) for c in code]
    names = [_names(c.source) for c in code]
    needed = set().union(*(names[i][1] for i, k in enumerate(keep) if k))
    for i in reversed(range(len(code))):
        if not keep[i] and names[i][0] & needed:
            keep[i] = True
            needed |= names[i][1]
    nb.cells = [c for c, k in zip(code, keep) if k]
    for c in nb.cells:
        c.outputs, c.execution_count = [], None
    nbformat.write(nb, str(root / f"{name}.ipynb"))


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory, smoke_report):
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "nb"
    root.mkdir()
    for name in LIVE:
        _explorer_copy(name, smoke_report(name).folder / f"{name}.ipynb", root)
    # every cell rendered (no windowing), so that outputs far down the notebook exist in the DOM
    settings = tmp / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), PYTHONPATH=str(NOTEBOOKS_DIR.parent))
    log = tmp / "lab.log"
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
                             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
                             f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={tmp / 'ws'}",
                             "--ServerApp.port_retries=0"] + (["--allow-root"] if os.geteuid() == 0 else []),
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("JupyterLab did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.5)
    yield base, token
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _shutdown_kernel_of(base: str, token: str, name: str) -> None:
    """Shut down the kernel of the notebook ``name`` (its session), leaving the others running."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as r:
        sessions = json.load(r)
    for sess in sessions:
        if sess.get("path", "").endswith(f"{name}.ipynb") and sess.get("kernel"):
            req = urllib.request.Request(f"{base}/api/kernels/{sess['kernel']['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(req, timeout=20)


def _run_all(page) -> None:
    # the kernel is up when the status bar says so; running cells before that can be lost
    page.wait_for_function("document.body.innerText.includes('(ipykernel) | Idle')", timeout=120_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


@pytest.fixture(scope="module")
def running(request, browser, jupyterlab):
    """Every selected notebook opened in its own page and started at once (the runs overlap; each test
    then waits for its own), so the whole test takes about the slowest notebook plus the checks."""
    base, token = jupyterlab
    selected = [it.callspec.params["name"] for it in request.session.items
                if it.originalname == "test_jupyterlab_runs_the_notebook_renders_figures_and_explorers_redraw"]
    pages = {}
    for name in selected:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/lab/tree/{name}.ipynb?reset&token={token}")  # reset: no tabs of other notebooks
        pages[name] = page
    for name, page in pages.items():
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        _run_all(page)
    yield pages
    for page in pages.values():
        if not page.is_closed():
            page.close()


def _move_first_control(page, explorer) -> str:
    """Change the explorer's first control; returns what was done."""
    control = explorer.locator(CONTROLS).first
    control.wait_for(state="attached", timeout=30_000)
    tag = control.evaluate("e => e.tagName.toLowerCase() + ' ' + (e.type || '') + ' ' + e.className")
    if tag.startswith("select"):
        options = control.locator("option").all_inner_texts()
        current = control.evaluate("e => e.options[e.selectedIndex].text")
        choice = next(o for o in options if o != current)
        control.select_option(label=choice)
        return f"dropdown -> {choice}"
    if "noUi-handle" in tag:
        control.focus()
        page.keyboard.press("ArrowRight")
        return "slider +1"
    control.click()
    return f"clicked {tag.split()[0]}"


def _figure_shot(explorer) -> bytes | None:
    """A screenshot of what the explorer draws (its Bokeh canvas, else its output area), not of its
    controls: a control that changes its own look is not a redraw. None while it is being replaced."""
    target = explorer.locator(".bk-Canvas")
    if not target.count():
        target = explorer.locator(".widget-output")
    try:
        return target.last.screenshot(timeout=2_000)
    except Exception:  # noqa: BLE001 - the old figure was removed, the new one not drawn yet
        return None


@pytest.mark.parametrize("name", LIVE)
def test_jupyterlab_runs_the_notebook_renders_figures_and_explorers_redraw(jupyterlab, running, name):
    base, token = jupyterlab
    page = running[name]
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        # done when every code cell has an execution count (none waiting '[ ]' or running '[*]'), or a cell failed
        page.wait_for_function(
            """() => { const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
                       if (!nb) return false;
                       const ps = [...nb.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                       const failed = [...nb.querySelectorAll(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
                                      .some(e => /Traceback|^\\w*Error\\b/m.test(e.innerText));
                       return failed || (ps.length > 0 && ps.every(p => /\\[\\d+\\]/.test(p.innerText))); }""",
            timeout=RUN_TIMEOUT_MS)
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        text = " ".join(errors)
        assert not re.search(r"Traceback|^\w*Error\b", text, re.M), f"{name}: {text[:2000]}"
        for noise in ("Kernel is running over TCP", "USDT"):
            assert noise not in page.inner_text("body"), f"{name}: third-party message {noise!r} in the output"
        canvases = page.locator(".bk-Canvas")  # Bokeh drew (Playwright pierces its shadow DOM)
        canvases.first.wait_for(state="attached", timeout=60_000)
        canvases.first.scroll_into_view_if_needed()
        box = canvases.first.bounding_box()
        assert box and box["width"] > 100 and box["height"] > 100, f"{name}: a Bokeh figure did not render"
        # every widget on the page belongs to an explorer; each explorer redraws when a control moves
        stray = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output .jupyter-widgets')]
                                    .filter(e => !e.closest('.labkit-explorer')).length""")
        assert stray == 0, f"{name}: {stray} widget(s) outside a labkit-explorer box"
        explorers = page.locator(".labkit-explorer")
        for i in range(explorers.count()):
            ex = explorers.nth(i)
            ex.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            before = _figure_shot(ex)
            done = _move_first_control(page, ex)
            changed, last = False, before
            for _ in range(40):  # the kernel redraws; give it up to 20 s
                page.wait_for_timeout(500)
                shot = _figure_shot(ex)
                idle = "(ipykernel) | Idle" in page.inner_text(".jp-StatusBar-Widget, #jp-main-statusbar")
                if idle and shot is not None and shot == last and shot != before:  # redrawn, and drawing is done
                    changed = True
                    break
                last = shot
            page.screenshot(path=str(ARTIFACTS / f"jupyterlab_{name}_explorer{i}.png"))
            assert changed, f"{name}: explorer {i}'s figure did not change after {done}"
    finally:
        page.screenshot(path=str(ARTIFACTS / f"jupyterlab_{name}.png"), full_page=True)
        page.close()
        _shutdown_kernel_of(base, token, name)


def test_the_notebooks_run_live_are_the_ones_with_a_widget(smoke_report):
    """LIVE is every notebook whose smoke run shows a widget, and only those (papermill's runs: the same ones
    tests/notebooks checks). A notebook that gains an explorer joins LIVE, or this fails."""
    with_widget = {name for name in NOTEBOOKS
                   if WIDGET_VIEW in (smoke_report(name).folder / f"{name}.ipynb").read_text()}
    assert with_widget == set(LIVE), f"notebooks with a widget: {sorted(with_widget)}; LIVE: {sorted(LIVE)}"


def test_report_html_renders_bokeh_offline(browser, smoke_report):
    run = smoke_report("00_this_server")  # the papermill run tests/notebooks checks (tests/conftest.py: XDIST_GROUPS)
    assert run.notebooks[0].status == "passed"
    ctx = browser.new_context(offline=True)
    page = ctx.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto((run.folder / "00_this_server.html").as_uri())
    page.wait_for_selector(".bk-Canvas", timeout=60_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report_00_this_server.png"), full_page=True)
    assert not [u for u in requests if u.startswith("http")], f"the report fetched from the network: {requests}"
    body = page.inner_text("body")
    assert "VBox(children" not in body and "interactive explorer" in body   # a widget is a note, not its repr
    assert "Kernel is running over TCP" not in body
    page.goto((run.folder / "index.html").as_uri())
    assert "00_this_server" in page.inner_text("body") and "passed" in page.inner_text("body")
    ctx.close()
