import os
import sys
from pathlib import Path

import pytest

from labkit.workloads.vision import prepare_torchvision

REPO = Path(__file__).resolve().parents[1]

# Tests import transformers directly too: let torchvision's import (which transformers triggers) go
# through beside a CPU build of torch, as labkit does before it imports either (labkit.workloads.vision).
prepare_torchvision()

# Under pytest-xdist (`make test`: 2 workers on CI's 2 cores) each worker, and each process it starts
# (recording scripts, notebook kernels, ranks), computes on one thread unless told otherwise: two
# workers with two OpenMP threads each on two cores spin against each other and run several times
# slower. What the tests check does not depend on the thread count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def run_cli():
    """Run ``python -m labkit ARGS`` in a subprocess; returns CompletedProcess."""
    import subprocess

    def _run(*args, env=None, timeout=300):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                              cwd=REPO, env=e, timeout=timeout)

    return _run


@pytest.fixture
def bench_script(monkeypatch):
    """``bench_script(name)``: a script of benchmarks/ or benchmarks/gpu/ as a module, for ``main(argv)`` in
    this process: a recorder's smoke run without a new interpreter and a second import of torch and
    transformers (3-4 s of CPU each on CI's cores). Its prints go to capsys; an argparse refusal is a
    SystemExit(2)."""
    import importlib

    for folder in ("benchmarks", "benchmarks/gpu"):
        monkeypatch.syspath_prepend(str(REPO / folder))

    def _load(name: str):
        return importlib.import_module(name)

    return _load


# ---- shared across test files, and the order under pytest-xdist -------------------------------------

@pytest.fixture(scope="session")
def record_comm_smoke(tmp_path_factory):
    """``benchmarks/gpu/record_comm.py --smoke`` run once (2 gloo ranks; the CUDA-only parts are absent):
    (output folder, CompletedProcess). Read-only for its users: tests/comm/test_record_script.py checks
    the run, tests/lessons/test_critical_path.py reads the recordings (XDIST_GROUPS below keeps them on
    one worker)."""
    import subprocess

    out = tmp_path_factory.mktemp("comm-smoke")
    r = subprocess.run([sys.executable, "benchmarks/gpu/record_comm.py", "--out", str(out), "--smoke"],
                       capture_output=True, text=True, timeout=240, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return out, r


@pytest.fixture(scope="session")
def smoke_report(tmp_path_factory):
    """``smoke_report(name)``: notebook ``name`` executed once for the session by the report runner
    (papermill, smoke profile) into its own folder; the ReportRun. tests/notebooks checks the run,
    tests/browser opens its HTML offline (XDIST_GROUPS below keeps them on one worker)."""
    from labkit.report.runner import run_report

    runs = {}

    def _run(name: str):
        if name not in runs:
            runs[name] = run_report(profile="smoke", out_dir=tmp_path_factory.mktemp(f"report-{name}"), only=[name],
                                    say=lambda m: None)
        return runs[name]

    return _run


# Tests that share an expensive session fixture or must not overlap, by node-id prefix -> the group they
# run in. Under `-n N --dist loadgroup` (make test TEST_WORKERS=2) a group is one unit of work on one
# worker, so a shared fixture is made once. (pytest-xdist's own xdist_group mark does not reach its
# scheduler under pytest 9, whose nodes keep their id elsewhere; this table is read by the scheduler below.)
XDIST_GROUPS = (
    # every test that starts a Jupyter kernel, on one worker, one kernel at a time: one JupyterLab and one
    # Chromium serve every notebook (tests/browser/test_jupyterlab.py: `running`), smoke_report's papermill
    # runs feed tests/browser's offline HTML check, and two kernels at once on two cores are where the
    # kernel client's missed-edge stall showed (labkit/report/kernel.py)
    ("tests/browser/", "kernels"),
    ("tests/notebooks/test_notebooks.py::test_notebook_executes_in_smoke_mode", "kernels"),
    ("tests/notebooks/test_notebooks.py::test_a_smoke_run_folder_is_at_most_30_mb", "kernels"),  # reads those runs
    ("tests/notebooks/test_notebooks.py::test_the_scripts_notebook_predicts", "kernels"),
    ("tests/report/test_runner.py", "kernels"),
    ("tests/report/test_history.py", "kernels"),
    # record_comm_smoke: the recording script run once, checked and read
    ("tests/comm/test_record_script.py::test_record_comm_smoke", "record_comm"),
    ("tests/lessons/test_critical_path.py::", "record_comm"),
)

# Tests that take long on a 2-core CI machine, longest first (the groups above included). Work is
# handed out in collection order (make test passes --no-loadscope-reorder), so these go first: a long
# one never starts last on one worker while the other sits idle. The order of the rest is pytest's.
LONG_FIRST = (
    "tests/browser/test_jupyterlab.py::test_jupyterlab_runs_the_notebook",
    "tests/memory/trace/test_corpus_support.py::test_every_case_is_predicted_or_refused_in_one_line",
    "tests/memory/trace/test_phases_cli.py::test_gpu_recording_script_dry_runs_on_cpu",
    "tests/comm/test_record_script.py",
    "tests/lessons/test_critical_path.py",
    "tests/notebooks/test_notebooks.py::test_notebook_executes_in_smoke_mode",
    "tests/browser/test_jupyterlab.py::test_report_html_renders_bokeh_offline",
    "tests/comm/test_launch_teardown.py::test_the_bucket_sweep_runs_without_an_abort",
    "tests/memory/estimate/test_gpu_script.py",
    # the suggested commands as typed: GPT-2 XL in fake mode (~50 s), two DDP bucket sweeps (~30 s each)
    "tests/test_suggested_commands.py::test_every_suggested_command_runs[measure_--hf-config_gpt2_--layers_48",
    "tests/test_suggested_commands.py::test_every_suggested_command_runs[comm_buckets",
)


# session fixtures made once per worker: every test that uses one runs in its group, or the fixture is made
# again on the other worker (a whole smoke run of the notebooks, minutes on CI)
SHARED_FIXTURES = {"smoke_report": "kernels", "record_comm_smoke": "record_comm"}


def _group(nodeid: str) -> str | None:
    return next((g for prefix, g in XDIST_GROUPS if nodeid.startswith(prefix)), None)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and _group(item.nodeid) != group:
                raise pytest.UsageError(f"{item.nodeid} uses the session fixture {fixture}: add it to XDIST_GROUPS "
                                        f"(tests/conftest.py) in group {group!r}")

    def rank(item):
        return next((i for i, p in enumerate(LONG_FIRST) if item.nodeid.startswith(p)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the order within each rank is pytest's


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup with XDIST_GROUPS: each group one unit of work, every other test a unit of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class TableGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid) or super()._split_scope(nodeid)

    return TableGroups(config, log)
