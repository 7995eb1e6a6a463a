"""Imports sit at the top of a module, so that its header says what it depends on (issue 30).

An import inside a function body is kept only where the top would cost what the module's users should not
pay, each kind named here:

* ``labkit --help`` builds every verb's parser, so the chapter CLIs and what they import at the top (the
  help path, read from a real ``build_parser()`` below) import neither torch nor anything heavier: there,
  torch, numpy, pynvml, transformers and the labkit modules off the help path (which import torch) stay in
  the functions that run a verb;
* :data:`LAZY_PACKAGES`: packages whose import costs seconds, imported where used in every module;
* :data:`LAZY_LABKIT`: the modules off the help path that keep a labkit import in a function, each with
  its reason (the list only shrinks: a test fails when an entry is no longer needed);
* an import under a ``try`` in a function (an optional dependency, or one whose failure is handled there).
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "labkit"

# Import cost of each (python -X importtime, the 2-core machine under load, torch 2.13 CPU, with what each
# imports itself): transformers 10 s, peft 19 s, torchvision 4.6 s, papermill 11 s, nbformat 6 s, nbconvert
# 5 s, jupyter_bokeh 3.3 s, bokeh 2.6 s (torch alone 2.5 s). bokeh, IPython and ipywidgets are at the top of
# the figure modules (labkit.viz), which exist to draw them.
LAZY_PACKAGES = {"transformers", "peft", "torchvision", "timm", "papermill", "nbconvert", "nbformat", "nbclient",
                 "jupyter_bokeh", "bokeh", "IPython", "ipywidgets"}
# torch.distributed.pipelining: 7 s on top of torch
LAZY_SUBMODULES = ("torch.distributed.pipelining",)
# kept lazy on the help path (torch 2.5 s; numpy and pynvml are imported where a verb measures)
HELP_PATH_LAZY = {"torch", "numpy", "pynvml"}
# never hoisted: labkit/__init__ loads its names lazily by design, sitecustomize boots a watched process
NOT_CHECKED = {"labkit", "labkit.allocator._watch_boot.sitecustomize"}

LAZY_LABKIT = {
    # tests/lessons/test_topology.py replaces measure_links and cuda_unavailable_reason there (a GPU's links)
    "labkit.lessons.topology": "the live measurement is looked up in labkit.topology.measure when it runs",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _body_imports() -> dict[str, list[tuple[int, str, bool]]]:
    """module -> (line, imported module, under a ``try``) of each import inside a function."""
    out: dict[str, list[tuple[int, str, bool]]] = {}

    def visit(mod: str, stmts: list[ast.stmt], in_try: bool) -> None:
        for node in stmts:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else ["." * node.level + (node.module or "")])
                out.setdefault(mod, []).extend((node.lineno, name, in_try) for name in names)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue        # a nested function is visited as a function of its own
            tried = in_try or isinstance(node, ast.Try) or type(node).__name__ == "TryStar"
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    visit(mod, child.body if isinstance(child, (ast.ExceptHandler, ast.match_case)) else [child],
                          tried)

    for path in sorted(PKG.rglob("*.py")):
        mod = _module(path)
        if mod in NOT_CHECKED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(mod, f.body, False)
    return out


@functools.cache
def _help_path() -> set[str]:
    code = ("import json, sys, labkit.cli; labkit.cli.build_parser(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('labkit', 'torch', 'numpy'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout))


def test_labkit_help_imports_no_torch():
    HELP = _help_path()
    assert {m for m in HELP if not m.startswith("labkit")} == set()
    assert "labkit.memory.trace.cli" in HELP and "labkit.memory.trace.step" not in HELP


def test_function_body_imports_are_the_named_exceptions():
    HELP, bad, lazy_labkit = _help_path(), [], set()
    for mod, rows in _body_imports().items():
        on_help = mod in HELP
        for line, name, in_try in rows:
            root = name.split(".")[0]
            where = f"{mod}:{line} imports {name}"
            if root in LAZY_PACKAGES or name.startswith(LAZY_SUBMODULES) or in_try:
                continue
            if root == "labkit":
                if on_help and name not in HELP:
                    continue        # off the help path: it would bring torch to `labkit --help`
                if mod in LAZY_LABKIT:
                    lazy_labkit.add(mod)
                    continue
                bad.append(where)
            elif on_help and root in HELP_PATH_LAZY:
                continue
            else:
                bad.append(where)
    assert bad == [], "move these imports to the top of their modules (or say here why one cannot be)"
    assert set(LAZY_LABKIT) - lazy_labkit == set(), "no longer lazy: remove it from LAZY_LABKIT"


def test_the_check_sees_a_function_body_import():
    rows = _body_imports()
    assert any(name == "transformers" for _, name, _ in rows["labkit.memory.trace.corpus_check"])
    assert "labkit.core.units" not in {name for _, name, _ in rows.get("labkit.core.serialize", [])}
