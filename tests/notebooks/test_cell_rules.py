"""The notebooks are thin (issue 16): per section one labkit call, no logic or prose built in code cells.

The parameters cell aside: at most 6 code lines per cell and 60 per notebook (comments and blank lines
not counted); no loops, branches, try, def or class (comprehensions and conditional expressions are
loops and branches too); no f-strings and no sentences in string literals. Each notebook opens with
what the reader learns and what to run it on, ends with "What to do on your own server", and every
`labkit ...` command its prose gives is one the CLI accepts.
"""

import ast
import re
import shlex

import nbformat
import pytest

from labkit.core.paths import NOTEBOOKS_DIR
from labkit.report.notebooks import discover

NOTEBOOKS = sorted(discover(NOTEBOOKS_DIR))
MAX_CELL_LINES = 6
MAX_NOTEBOOK_LINES = 60
FORBIDDEN = {ast.For: "a for loop", ast.AsyncFor: "a for loop", ast.While: "a while loop", ast.Try: "a try",
             ast.FunctionDef: "a def", ast.AsyncFunctionDef: "a def", ast.ClassDef: "a class", ast.If: "an if",
             ast.IfExp: "a conditional expression", ast.comprehension: "a comprehension (a loop)",
             ast.JoinedStr: "an f-string", ast.Lambda: "a lambda", ast.With: "a with block"}
if hasattr(ast, "TryStar"):
    FORBIDDEN[ast.TryStar] = "a try"
PROSE = re.compile(r"\b[A-Za-z]+\b(\s+\b[A-Za-z',;:]+\b){3,}")   # four words in a row: a sentence


def _nb(name):
    return nbformat.read(str(NOTEBOOKS_DIR / f"{name}.ipynb"), as_version=4)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]


def _lines(src: str) -> list[str]:
    return [ln for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def cell_problems(src: str) -> list[str]:
    """What makes one code cell not thin (empty when it is)."""
    out = []
    n = len(_lines(src))
    if n > MAX_CELL_LINES:
        out.append(f"{n} code lines (at most {MAX_CELL_LINES})")
    tree = ast.parse(src)
    for node in ast.walk(tree):
        for kind, what in FORBIDDEN.items():
            if isinstance(node, kind):
                out.append(f"{what} at line {getattr(node, 'lineno', '?')}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and PROSE.search(node.value):
            out.append(f"prose in a string at line {node.lineno}: {node.value[:40]!r}")
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_code_cells_are_thin(name):
    nb = _nb(name)
    problems = [f"cell {nb.cells.index(c)}: {p}" for c in _code_cells(nb) for p in cell_problems(c.source)]
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)
    total = sum(len(_lines(c.source)) for c in _code_cells(nb))
    assert total <= MAX_NOTEBOOK_LINES, f"{name}: {total} code lines outside the parameters cell (at most {MAX_NOTEBOOK_LINES})"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_opens_with_what_you_learn_and_ends_with_your_own_server(name):
    nb = _nb(name)
    first, last = nb.cells[0], nb.cells[-1]
    assert first.cell_type == "markdown" and "what you will learn" in first.source.lower(), \
        f"{name}: the first cell must say what the reader will learn"
    assert "run it on" in first.source.lower(), f"{name}: the first cell must say what to run it on"
    assert last.cell_type == "markdown" and re.search(r"^#+\s*What to do on your own server", last.source, re.M), \
        f"{name}: must end with a section 'What to do on your own server'"


def labkit_commands(markdown: str) -> list[str]:
    """`labkit ...` commands in inline code (an inline span may wrap over lines), and the labkit commands of
    fenced code blocks (a line starting with labkit, or a launcher's `-m labkit ...`; backslash continuations
    joined), each as `labkit ARGS`."""
    out = [" ".join(m.split()) for m in re.findall(r"`(labkit [^`]+)`", markdown)]
    for block in re.findall(r"```[^\n]*\n(.*?)```", markdown, re.S):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            line = " ".join(line.split("#", 1)[0].split())
            if line.startswith("labkit "):
                out.append(line)
            elif " -m labkit " in line:
                out.append("labkit " + line.split(" -m labkit ", 1)[1])
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_labkit_command_in_the_prose_exists(name, capsys):
    from labkit.cli import build_parser

    from labkit.core import cliargs

    parser = build_parser()
    text = "\n".join(c.source for c in _nb(name).cells if c.cell_type == "markdown")
    bad = []
    for cmd in labkit_commands(text):
        cliargs.flush_notes(show=False)
        try:
            parser.parse_args(shlex.split(cmd)[1:])
        except SystemExit as exc:
            if exc.code:
                bad.append(f"{cmd}: {capsys.readouterr().err.strip().splitlines()[-1]}")
        cliargs.flush_notes()  # an old spelling: its deprecation line
        err = capsys.readouterr().err
        if "deprecated" in err:
            bad.append(f"{cmd}: {err.strip()}")
    assert not bad, f"{name}: commands the CLI refuses or calls deprecated:\n  " + "\n  ".join(bad)


def test_the_rules_catch_what_they_forbid():
    assert cell_problems("lesson.rings(view, sizes)") == []
    assert cell_problems("x = lesson.load(source)\nx") == []
    assert any("for loop" in p for p in cell_problems("for g in gs:\n    show(g)"))
    assert any("try" in p for p in cell_problems("try:\n    a()\nexcept Exception:\n    pass"))
    assert any("f-string" in p for p in cell_problems("print(f'{n} GPUs')"))
    assert any("prose" in p for p in cell_problems("print('This machine has no GPU here')"))
    assert any("comprehension" in p for p in cell_problems("[r for r in rows]"))
    assert any("7 code lines" in p for p in cell_problems("\n".join(f"a{i} = {i}" for i in range(7))))
    assert labkit_commands("run `labkit topo --file\n saved.txt` or `nvidia-smi`") == ["labkit topo --file saved.txt"]
    assert labkit_commands("```\ntorchrun --nnodes 2 \\\n    -m labkit comm buckets --model gpt2\nlabkit env  # here\n```") == \
        ["labkit comm buckets --model gpt2", "labkit env"]
