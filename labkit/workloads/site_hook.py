"""A start-up hook in the lab's virtual environment: ``import torchvision`` (and every ``transformers`` model
class, since transformers imports torchvision whenever it is installed) works in a notebook cell or a user's
own script, not only on labkit's own paths.

``make setup`` installs a CPU build of torch and PyPI's torchvision, whose compiled ops cannot load beside it
(:mod:`labkit.workloads.vision` explains why and what :func:`~labkit.workloads.vision.prepare_torchvision`
does). labkit calls ``prepare_torchvision`` before it imports either package; a user's
``from transformers import GPT2LMHeadModel`` did not, and failed. This module installs, into the
environment's ``site-packages``, a ``.pth`` file (Python's ``site`` module runs its ``import`` line at every
start: https://docs.python.org/3/library/site.html) and a small module it imports, which puts a finder on
``sys.meta_path``: at the first import of ``torchvision`` it removes itself and calls ``prepare_torchvision``,
then lets the import go on as usual. Nothing else is imported at start-up (no torch), and the hook does
nothing where torchvision's ops load (a GPU machine, a CPU build of torchvision) or labkit is not importable.

    python -m labkit.workloads.site_hook            # install into this interpreter's site-packages (make setup)
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

HOOK_MODULE = "labkit_torchvision_hook"
HOOK_SOURCE = '''"""Installed by labkit (python -m labkit.workloads.site_hook, run by make setup): before torchvision's first
import, labkit.workloads.vision.prepare_torchvision() lets it import beside a CPU build of torch."""
import sys


class LabkitTorchvisionFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "torchvision" or FINDER not in sys.meta_path:
            return None
        sys.meta_path.remove(FINDER)           # once, and not while prepare_torchvision looks torchvision up
        try:
            from labkit.workloads.vision import prepare_torchvision

            prepare_torchvision()
        except Exception:                      # no labkit here, or it cannot help: the import goes on as it would
            pass
        return None


FINDER = LabkitTorchvisionFinder()
if not any(type(f).__name__ == "LabkitTorchvisionFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, FINDER)
'''
PTH_NAME = f"{HOOK_MODULE}.pth"
PTH_LINE = f"import {HOOK_MODULE}\n"


def site_packages() -> Path:
    """This interpreter's ``site-packages`` (the virtual environment's, run from it)."""
    return Path(sysconfig.get_paths()["purelib"])


def install(target: Path | None = None) -> list[Path]:
    """Write the hook module and its ``.pth`` into ``target`` (default :func:`site_packages`); files already
    current are left as they are. Returns the paths written."""
    target = Path(target) if target is not None else site_packages()
    written = []
    for name, text in ((f"{HOOK_MODULE}.py", HOOK_SOURCE), (PTH_NAME, PTH_LINE)):
        path = target / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def installed(target: Path | None = None) -> bool:
    target = Path(target) if target is not None else site_packages()
    return ((target / PTH_NAME).is_file() and (target / PTH_NAME).read_text() == PTH_LINE
            and (target / f"{HOOK_MODULE}.py").is_file() and (target / f"{HOOK_MODULE}.py").read_text() == HOOK_SOURCE)


if __name__ == "__main__":
    paths = install()
    print(f"site hook: {'installed ' + ', '.join(p.name for p in paths) if paths else 'already current'} in "
          f"{site_packages()}")
    sys.exit(0)
