"""The shape of ``labkit``'s imports, read statically (``ast``, nothing is imported).

Four rules:

1. **No import cycle** among labkit modules: none through module-level imports (those that run when
   a module is imported: the top level, including ``if``/``try`` blocks), and none either once the
   imports deferred into functions are counted (a deferred import that closes a circle, as
   ``topology.measure`` and ``topology.recorded`` once did, hides the same tangle). Importing
   ``labkit.a.b`` also runs ``labkit.a``'s ``__init__``, so it counts as an import of ``labkit.a``
   too (unless the importer lives inside ``labkit.a``).
2. **Chapters meet through their public names.** The chapters are ``topology``, ``memory``,
   ``allocator``, ``comm``, ``workloads``, ``env`` and ``report``; ``viz`` (the figures) follows the
   same rule as an importer. A module outside chapter C may import from C only
   * a package of C (its ``__init__``, or the ``__init__`` of one of its sub-packages, such as
     ``labkit.memory.estimate`` or ``labkit.topology.measure``): a package states its public names;
   * a module C declares public in its ``__init__``: ``PUBLIC_MODULES = ("name", ...)``.
   ``labkit.core`` is the base every chapter builds on: all of it is public. Every import counts
   here, deferred ones included (a deferred import of an internal module couples as much).
3. **One meaning per module name.** A file or package name used in two places of labkit must mean
   the same in each: ``SAME_MEANING`` lists those names and what they mean.
4. **Imports point down the layers**, core < chapters < advise < viz < lessons (``LAYERS``), with no
   exception: a chapter imports nothing from ``advise``, ``viz`` or ``lessons`` (a notebook section is
   built in ``lessons/`` from what the chapter returns), ``advise`` nothing from ``viz`` or ``lessons``,
   ``viz`` nothing from ``lessons``. Chapters are one layer: they may import each other (rule 2 says
   how). ``labkit.cli`` (the entry point) sits above all and only ``labkit.__main__`` imports it; the
   root package ``labkit`` (lazy names) may be imported from anywhere. Deferred imports count.

Today's exceptions are listed in ``KNOWN_CROSSINGS`` and ``KNOWN_NAME_CLASHES``, each exactly (a test
fails when one is fixed, so the list only shrinks); they are in chapters whose owners were editing them
when the rule was written.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "labkit"
CHAPTERS = ("topology", "memory", "allocator", "comm", "workloads", "env", "report")
IMPORTERS_UNDER_RULE_2 = CHAPTERS + ("viz",)
# rule 4: the layer of each top-level part of labkit (imports point to the same layer or below)
LAYERS = {"core": 0, **{c: 1 for c in CHAPTERS}, "advise": 2, "viz": 3, "lessons": 4}

SAME_MEANING = {
    "__init__": "a package's public names",
    "__main__": "python -m entry point",
    "cli": "a chapter's verbs: register(subparsers) for labkit.cli",
    "recorded": "a chapter's recorded measurements under data/, read back with provenance",
    # viz/<chapter>.py: the figures of that chapter
    "topology": "the topology chapter (labkit.viz.topology: its figures)",
    "memory": "the memory chapter (labkit.viz.memory: its figures)",
    "comm": "the comm chapter (labkit.viz.comm: its figures)",
    "allocator": "the allocator chapter (labkit.viz.allocator: its figures)",
    "env": "the env chapter (labkit.viz.env: its figures)",
    "advise": "the advise chapter (labkit.viz.advise: its figures; labkit.lessons.advise: notebook 06's sections)",
    # lessons/<notebook>.py: the sections of that notebook, named after the notebook
    "trace": "the training-step tracer (labkit.memory.trace; labkit.viz.trace: its figures)",
    "spec": "typed dataclasses describing a training configuration, one default per field (labkit.core.spec: a "
            "step and a run, whence every verb's shared flags; labkit.memory.estimate.spec: the analytical model's "
            "model, layout and recipe)",
}

# (importer, imported) pairs that break rule 2 today.
KNOWN_CROSSINGS = {
    ("labkit.viz.memory", "labkit.memory.estimate.presets"),  # memory: export the presets from labkit.memory.estimate
    ("labkit.viz.section", "labkit.report.record"),           # report: export record() or declare it public
    ("labkit.viz.topology", "labkit.topology.links"),          # viz: LEGEND is exported by labkit.topology
}

# Names used twice with two meanings today: name -> the modules.
KNOWN_NAME_CLASHES: dict[str, set[str]] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _module_level(tree: ast.Module):
    """Import nodes that run at import time: the top level and inside top-level if/try/with blocks."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)) or type(node).__name__ == "TryStar":
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


def _targets(mod: str, node) -> list[str]:
    """The labkit modules an import node names (the deepest existing module of each)."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if _is_package(mod) else mod.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [origin] + [f"{origin}.{a.name}" for a in node.names if f"{origin}.{a.name}" in MODULES]
    out = []
    for n in names:
        while n and n not in MODULES and "." in n:
            n = n.rsplit(".", 1)[0]
        if n in MODULES and n != mod:
            out.append(n)
    return out


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        nodes = _module_level(tree) if module_level_only else (n for n in ast.walk(tree)
                                                                 if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in nodes:
            for t in _targets(mod, node):
                g[mod].add(t)
                parts = t.split(".")
                for k in range(2, len(parts)):  # importing a.b.c runs a.b's __init__
                    pkg = ".".join(parts[:k])
                    if pkg in MODULES and pkg != mod and not mod.startswith(pkg + "."):
                        g[mod].add(pkg)
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(MODULES):
        if start in index:
            continue
        work = [(start, iter(sorted(g.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _chapter(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else None


def _public_modules(chapter: str) -> set[str]:
    """``PUBLIC_MODULES`` of the chapter's ``__init__``, as full module names."""
    tree = ast.parse((PKG / chapter / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PUBLIC_MODULES" for t in node.targets):
            return {f"labkit.{chapter}.{name}" for name in ast.literal_eval(node.value)}
    return set()


def _crossings() -> set[tuple[str, str]]:
    bad = set()
    public = {c: _public_modules(c) for c in CHAPTERS}
    for mod, targets in _graph(module_level_only=False).items():
        here = _chapter(mod)
        if here not in IMPORTERS_UNDER_RULE_2:
            continue
        for t in targets:
            there = _chapter(t)
            if there in CHAPTERS and there != here and not _is_package(t) and t not in public[there]:
                bad.add((mod, t))
    return bad


def _layer(mod: str) -> int | None:
    return LAYERS.get(_chapter(mod) or "")


def _upward_imports(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs that point up the layers, and any import of ``labkit.cli`` but ``__main__``'s."""
    bad = set()
    for mod, targets in g.items():
        for t in targets:
            if t == "labkit.cli" and mod != "labkit.__main__":
                bad.add((mod, t))
            here, there = _layer(mod), _layer(t)
            if here is not None and there is not None and there > here:
                bad.add((mod, t))
    return bad


def test_the_graph_sees_the_imports_it_should():
    g = _graph(module_level_only=True)
    assert "labkit.topology.group_links" in g["labkit.topology.placement"]
    assert "labkit.memory.estimate" in g["labkit.memory.estimate.planner"]
    assert "labkit.topology.measure" in g["labkit.topology.recorded"]  # via labkit.topology.measure.results
    # a deferred import is not module-level
    assert "labkit.workloads" not in g["labkit.memory.trace.cli"]
    assert "labkit.workloads" in _graph(module_level_only=False)["labkit.memory.trace.cli"]


def test_no_import_cycle_among_labkit_modules():
    assert _cycles(_graph(module_level_only=True)) == []


def test_no_import_cycle_even_through_deferred_imports():
    assert _cycles(_graph(module_level_only=False)) == []


def test_chapters_import_each_other_through_public_names_only():
    bad = _crossings()
    assert bad - KNOWN_CROSSINGS == set(), "import the package or a module it lists in PUBLIC_MODULES"
    assert KNOWN_CROSSINGS - bad == set(), "fixed: remove it from KNOWN_CROSSINGS"


def test_declared_public_modules_exist():
    for c in CHAPTERS:
        for m in _public_modules(c):
            assert m in MODULES, m


def test_one_meaning_per_module_name():
    where: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES:
        if mod != "labkit":
            where[mod.rsplit(".", 1)[-1]].add(mod)
    for mod, path in MODULES.items():
        if path.name == "__init__.py":
            where["__init__"].add(mod)
    clashes = {name: mods for name, mods in where.items() if len(mods) > 1 and name not in SAME_MEANING}
    assert {n: m for n, m in clashes.items() if KNOWN_NAME_CLASHES.get(n) != m} == {}, \
        "two modules share a name with two meanings: rename one, or add the name to SAME_MEANING with its meaning"
    assert {n for n in KNOWN_NAME_CLASHES if n not in clashes} == set(), "fixed: remove it from KNOWN_NAME_CLASHES"


def test_every_module_has_a_layer():
    assert {m for m in MODULES if _layer(m) is None} == {"labkit", "labkit.__main__", "labkit.cli"}, \
        "a new top-level part of labkit: give it its place in LAYERS"


def test_the_layer_rule_sees_an_upward_import():
    g = {"labkit.memory.trace.x": {"labkit.viz.section", "labkit.core.units"}, "labkit.viz.y": {"labkit.lessons.z"},
         "labkit.advise.a": {"labkit.memory.b"}, "labkit.lessons.c": {"labkit.cli"}, "labkit.topology.d": {"labkit"}}
    assert _upward_imports(g) == {("labkit.memory.trace.x", "labkit.viz.section"), ("labkit.viz.y", "labkit.lessons.z"),
                                  ("labkit.lessons.c", "labkit.cli")}


def test_imports_point_down_the_layers():
    """core < chapters < advise < viz < lessons, deferred imports included, no exception."""
    assert sorted(_upward_imports(_graph(module_level_only=False))) == []


def test_no_folder_holds_more_than_fifteen_modules():
    """A folder that grows past 15 modules (its ``__init__`` counted) is split by concern into sub-packages, as
    ``memory/trace/fake/`` and ``allocator/sim/`` were."""
    sizes = {d.relative_to(ROOT).as_posix(): len(list(d.glob("*.py"))) for d in [PKG, *PKG.rglob("*")]
             if d.is_dir() and d.name != "__pycache__"}
    assert {d: n for d, n in sizes.items() if n > 15} == {}
    assert sizes["labkit/core"] >= 10      # the count sees the folders it should
