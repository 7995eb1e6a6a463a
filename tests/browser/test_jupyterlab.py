"""A real browser: JupyterLab runs 00_this_server and shows a Bokeh plot and a widget; the offline
HTML report renders its Bokeh plot with no network.

Debian's chromium is driven by Playwright through its executable path (Playwright cannot download
its own browser here); `make test` installs both.
"""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labkit.core.paths import NOTEBOOKS_DIR
from labkit.report.runner import run_report

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
        "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

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


@pytest.fixture
def jupyterlab(tmp_path):
    root = tmp_path / "nb"
    root.mkdir()
    shutil.copy(NOTEBOOKS_DIR / "00_this_server.ipynb", root)  # a copy: autosave must not touch the repo
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
                             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
                             f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={tmp_path / 'ws'}",
                             "--ServerApp.port_retries=0"] + (["--allow-root"] if os.geteuid() == 0 else []),
                            stdout=open(tmp_path / "lab.log", "w"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
    yield base, token
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_jupyterlab_runs_notebook_and_shows_bokeh_and_widget(browser, jupyterlab):
    base, token = jupyterlab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"{base}/lab/tree/00_this_server.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook", timeout=90_000)
    # the kernel is up when the status bar says so; running cells before that can be lost
    page.wait_for_function("document.body.innerText.includes('(ipykernel) | Idle')", timeout=90_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    # JupyterLab renders only the cells in view: wait for the outputs to exist, then scroll to them.
    canvas = page.locator(".bk-Canvas").first  # Bokeh drew a plot (Playwright pierces its shadow DOM)
    canvas.wait_for(state="attached", timeout=120_000)
    canvas.scroll_into_view_if_needed()
    canvas.wait_for(state="visible", timeout=30_000)
    box = canvas.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 100
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_00_bokeh.png"))
    toggle = page.locator(".widget-toggle-buttons").first  # the ipywidgets unit toggle is shown
    toggle.wait_for(state="attached", timeout=60_000)
    toggle.scroll_into_view_if_needed()
    toggle.wait_for(state="visible", timeout=30_000)
    page.locator(".widget-toggle-button", has_text="GB (10^9)").first.click()
    page.wait_for_function("document.body.innerText.includes('150.75 GB') || document.body.innerText.includes(' GB')", timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_00_this_server.png"), full_page=True)
    assert page.locator(".jp-OutputArea-output .labkit-table").count() >= 2
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert "Traceback" not in (errors.all_inner_texts() and " ".join(errors.all_inner_texts()))


def test_report_html_renders_bokeh_offline(browser, tmp_path):
    run = run_report(profile="smoke", out_dir=tmp_path, only=["00_this_server"], say=lambda m: None)
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
    page.goto((run.folder / "index.html").as_uri())
    assert "00_this_server" in page.inner_text("body") and "passed" in page.inner_text("body")
    ctx.close()
