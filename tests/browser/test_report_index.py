"""A real browser opens the report's index after three runs: the trend figures render offline and
the page fits a 1400-pixel window."""

import os
from pathlib import Path

import nbformat
import pytest

from labkit.report.runner import run_report

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
        "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.browser


def _notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("smoke: bool = False", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(
                    "import os\nfrom labkit.report import record\n"
                    "v = float(os.environ['LABKIT_TEST_SPEED'])\n"
                    "record('host_to_device_pinned_bandwidth_with_a_long_result_name', v, 'GB/s', "
                    "source='measured here', direction='higher')\n"
                    "record('peak_allocated', int(v * 1e9), 'bytes', source='recorded on 1 x NVIDIA H200, 2026-11-29 "
                    "(driver 580.159.04, torch 2.11.0+cu130, CUDA 13.0); command: python benchmarks/gpu/x.py --out y',"
                    " direction='lower')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_index_trends_render_offline_and_fit_1400_pixels(tmp_path, monkeypatch):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make test` (it installs Debian's chromium)"
    from playwright.sync_api import sync_playwright

    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    _notebook(nbdir / "a_trend.ipynb")
    out = tmp_path / "reports"
    for speed in ("50", "52", "30"):
        monkeypatch.setenv("LABKIT_TEST_SPEED", speed)
        run = run_report(out_dir=out, notebooks_dir=nbdir, say=lambda m: None)
    assert run.regressions == ["a_trend/host_to_device_pinned_bandwidth_with_a_long_result_name"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        ctx = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
        page = ctx.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto((run.folder / "index.html").as_uri())
        page.wait_for_function("document.querySelectorAll('.bk-Canvas, div.bk-Figure').length >= 2", timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report_index_trends.png"), full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth")
        body = page.inner_text("body")
        ctx.close()
        browser.close()
    assert not [u for u in requests if u.startswith("http")], f"the index fetched from the network: {requests}"
    assert overflow <= 1400, f"the index is {overflow} px wide in a 1400 px window"
    assert "regressed" in body and "1 result(s) regressed" in body
