"""What the Makefile's recipes run under."""

import os
import subprocess

from labkit.core.paths import REPO_ROOT


def test_recipes_cache_bytecode_even_where_the_environment_says_not_to():
    """An environment with PYTHONDONTWRITEBYTECODE set (some container images do) would make every process the tests
    start compile torch, transformers and labkit from source again; the Makefile's recipes run without it."""
    probe = "probe:\n\t@echo \"[$${PYTHONDONTWRITEBYTECODE}]\"\n"
    r = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "probe"], input=probe,
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
