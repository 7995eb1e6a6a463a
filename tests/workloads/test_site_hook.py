"""The lab's environment works for users' own code (issue 27): `from transformers import GPT2LMHeadModel` in a
fresh interpreter of the environment `make setup` builds, not only on labkit's paths."""

import subprocess
import sys
from pathlib import Path

from labkit.workloads import site_hook

REPO = Path(__file__).resolve().parents[2]


def test_install_writes_the_hook_once(tmp_path):
    written = site_hook.install(tmp_path)
    assert sorted(p.name for p in written) == ["labkit_torchvision_hook.pth", "labkit_torchvision_hook.py"]
    assert site_hook.installed(tmp_path) and site_hook.install(tmp_path) == []      # already current: untouched
    assert (tmp_path / "labkit_torchvision_hook.pth").read_text() == "import labkit_torchvision_hook\n"


def test_make_setup_installs_the_hook():
    """Both of the Makefile's install steps run the installer (a fresh machine's `make setup` and `make test`)."""
    text = (REPO / "Makefile").read_text()
    assert text.count("$(PY) -m labkit.workloads.site_hook") == 2


def test_a_users_script_imports_transformers_models_and_torchvision(tmp_path):
    """In a fresh process of this interpreter, from a folder that is not the repository, with nothing of labkit
    imported first: the environment itself makes the imports work."""
    assert site_hook.installed(), ("the site hook is not installed in this environment: run `make setup` (or "
                                   f"{sys.executable} -m labkit.workloads.site_hook)")
    code = ("from transformers import GPT2LMHeadModel\n"
            "import torchvision.models as m\n"
            "import sys\n"
            "assert 'labkit.workloads.vision' in sys.modules  # the hook ran, not labkit's own path\n"
            "print(GPT2LMHeadModel.__name__, m.resnet18.__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["GPT2LMHeadModel", "resnet18"], r.stderr[-2000:]
