import os
import sys
from pathlib import Path

import pytest

from labkit.workloads.vision import prepare_torchvision

REPO = Path(__file__).resolve().parents[1]

# Tests import transformers directly too: let torchvision's import (which transformers triggers) go
# through beside a CPU build of torch, as labkit does before it imports either (labkit.workloads.vision).
prepare_torchvision()


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
