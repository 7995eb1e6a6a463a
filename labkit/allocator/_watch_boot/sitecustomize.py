"""Loaded by Python at start-up in processes started by ``labkit watch -- CMD`` (this folder is first on PYTHONPATH).

It imports nothing heavy: it registers a finder that, once ``torch`` has been imported by the user's script,
calls :func:`labkit.allocator.watcher.install_from_env`. Then it runs the ``sitecustomize`` that this one
shadows, if the environment has one.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AfterTorch:
    """A one-shot meta path finder: lets the normal machinery find ``torch``, wraps its loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                from labkit.allocator.watcher import install_from_env

                install_from_env()
            except Exception as exc:  # the user's script runs on without the watch
                print(f"labkit watch: not installed ({type(exc).__name__}: {exc})", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("LABKIT_WATCH_RUN_DIR"):
    sys.meta_path.insert(0, _AfterTorch())


def _chain():
    """Run the sitecustomize this file shadows (a conda or distro one), if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.dirname(os.path.abspath(spec.origin or "")) == _HERE:
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)


_chain()
