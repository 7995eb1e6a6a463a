"""Where the lab's bundled data lives (the repository's data/ folder)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("LABKIT_DATA", REPO_ROOT / "data"))
MEASUREMENTS_DIR = DATA_DIR / "measurements"
TOPOLOGIES_DIR = DATA_DIR / "topologies"
TRACES_DIR = DATA_DIR / "traces"
NOTEBOOKS_DIR = Path(os.environ.get("LABKIT_NOTEBOOKS", REPO_ROOT / "notebooks"))
