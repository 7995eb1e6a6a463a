import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
