"""Throwaway notebooks for the report runner's tests."""

from pathlib import Path

import nbformat
import pytest


def write_notebook(path: Path, body: str, params: str = "smoke: bool = False\nscale: float = 1.0") -> None:
    """A two-cell notebook: a parameters cell (tagged) and ``body``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


@pytest.fixture
def notebook_writer():
    return write_notebook
