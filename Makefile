# GPU Memory Lab: two commands do all the set-up.
#   make report   set up .venv, then execute every notebook into reports/<UTC time>-<host>/
#   make test     set up .venv (+ test tools and Chromium), then run the whole test suite
# Both are idempotent: a second run reinstalls nothing that is current.

PYTHON ?= python3
VENV ?= .venv
PROFILE ?= full
REPORT_ARGS ?=
# CPU machines get this torch unless one is already installed. On a machine elsewhere, a CPU
# build comes from PyTorch's index: make TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
CHROMIUM ?= /usr/bin/chromium

PY := $(VENV)/bin/python
# Python caches each module's bytecode (__pycache__) on first import. Some images set PYTHONDONTWRITEBYTECODE
# (this machine's does), and then every process compiles torch, transformers and labkit from source again, each
# notebook kernel, CLI run and rank the tests start among them. The recipes here run without it: the first
# import writes the venv's caches (and WARM_IMPORTS below writes the heavy ones before the tests start).
unexport PYTHONDONTWRITEBYTECODE
# --no-compile: pip does not byte-compile every file it installs (about 40 s of one core for torch,
# transformers and the rest); Python compiles what is imported, once, on first use.
PIP_INSTALL := $(PY) -m pip --disable-pip-version-check -q install --no-compile
STAMP := $(VENV)/.labkit-installed
TEST_STAMP := $(VENV)/.labkit-test-installed

.PHONY: setup report test lab clean-venv browser-deps

setup: $(STAMP)

# A GPU server's own CUDA build of torch is kept: when the system Python already has a CUDA torch,
# the venv sees the system site-packages and pip finds torch satisfied instead of replacing it.
$(VENV)/bin/python:
	@if $(PYTHON) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then \
	  echo "setup: using this machine's CUDA build of torch (venv with system site-packages)"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV); \
	fi

define install_torch
@$(PY) -c "import torch" 2>/dev/null || { echo "setup: installing $(TORCH_SPEC)"; \
  $(PIP_INSTALL) $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)"; }
endef

# labkit needs torchvision, whose newest release asks for a newer torch: the installed torch is pinned
# (a constraints file), so pip takes the torchvision built for it instead of replacing torch.
# (Beside a CPU torch, PyPI's torchvision loads no compiled ops; labkit.workloads.vision handles that.)
define pin_torch
@$(PY) -W ignore -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-pin.txt
endef

# The site hook (labkit/workloads/site_hook.py): torchvision, and transformers' model classes, import in users'
# own code and notebook cells too, beside a CPU torch.
$(STAMP): pyproject.toml labkit/workloads/site_hook.py | $(VENV)/bin/python
	$(install_torch)
	$(pin_torch)
	$(PIP_INSTALL) -c $(VENV)/torch-pin.txt -e .
	$(PY) -m labkit.workloads.site_hook
	@touch $@

# One pip run installs labkit with its test extra (one resolver pass, one editable build), so the
# runtime install of `setup` is done too: its stamp is touched with this one.
$(TEST_STAMP): pyproject.toml labkit/workloads/site_hook.py | $(VENV)/bin/python
	$(install_torch)
	$(pin_torch)
	$(PIP_INSTALL) -c $(VENV)/torch-pin.txt -e ".[test]"
	$(PY) -m labkit.workloads.site_hook
	@touch $(STAMP) $@

browser-deps:
	@test -x $(CHROMIUM) || { echo "setup: installing Debian's chromium for the browser test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

report: $(STAMP)
	$(VENV)/bin/labkit report --profile $(PROFILE) $(REPORT_ARGS)

# Two pytest-xdist workers on CI's two cores (TEST_WORKERS=0: one process). Tests sharing an expensive
# fixture, and every test that starts a Jupyter kernel, run on one worker (tests/conftest.py: XDIST_GROUPS),
# long ones first (LONG_FIRST). The papermill stalls earlier two-worker runs met were a missed socket
# edge in the kernel client, fixed in labkit/report/kernel.py.
TEST_WORKERS ?= 2
# One process imports the heavy packages first, so that their bytecode is written once before the workers,
# kernels and subprocesses start importing them at the same moment (pip installs with --no-compile).
WARM_IMPORTS := from labkit.workloads.vision import prepare_torchvision; prepare_torchvision(); \
  import torch, transformers, torchvision, bokeh.plotting, papermill, nbclient, ipykernel.kernelapp, ipywidgets, \
  jupyterlab.labapp, labkit.cli
test: $(TEST_STAMP) browser-deps
	@$(PY) -c "$(WARM_IMPORTS)"
	$(PY) -m pytest -q -p no:cacheprovider $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder) $(PYTEST_ARGS)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean-venv:
	rm -rf $(VENV)
