"""Sources cited in the code are public (a URL, a paper, PyTorch's source file) or files of this repository.

A citation of a file that is not in the repository (the lab's old notes ``FACTS.md``, the helpers'
``../shared`` folder, a path on the machine that wrote the code, a ``*.md`` or a recording under
``data/`` that is not here) sends a reader nowhere: this test finds them in every text file under labkit/, benchmarks/ and tests/.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".sh", ".json", ".yaml", ".yml", ".j2", ".txt", ".toml", ".cfg", ".ipynb"}

# (what it is, pattern). Built from pieces so that this file does not match itself.
OUTSIDE = [
    ("the lab's notes, not in the repository", re.compile(r"\b" + "FACTS" + r"(\.md)?\b")),
    ("the helpers' shared folder", re.compile(r"\.\./" + "shared" + r"\b|\b" + "shared/reference" + r"\b")),
    ("a path on the machine that wrote the code", re.compile(r"(?<![\w.:/-])/" + "work" + r"/")),
]
URL = re.compile(r"https?://\S+")
MARKDOWN = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
RECORDING = re.compile(r"(?<![\w/.-])(data/[\w./-]*\w\.(?:json|txt|xml|csv|yaml|pickle|pkl))\b")


def _files() -> list[Path]:
    out = []
    for top in ("labkit", "benchmarks", "tests"):
        out += [p for p in sorted((ROOT / top).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                and "__pycache__" not in p.parts]
    return out


FILES = _files()


def _findings(path: Path, text: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pat in OUTSIDE:
            if pat.search(line):
                out.append(f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:120]}")
        for m in MARKDOWN.finditer(URL.sub(" ", line)):
            doc = m.group(1)
            if not ((ROOT / doc).exists() or (path.parent / doc).exists()):
                out.append(f"{path.relative_to(ROOT)}:{n}: {doc} is not in the repository")
        for m in RECORDING.finditer(URL.sub(" ", line)):
            if not (ROOT / m.group(1)).exists():
                out.append(f"{path.relative_to(ROOT)}:{n}: {m.group(1)} is not in the repository")
    return out


def test_the_scan_sees_the_code():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"labkit/memory/trace/fake/fake_cuda.py", "benchmarks/gpu/record_plain.py", "tests/test_sources.py"} <= names


def test_no_file_cites_a_file_outside_the_repository():
    found = [f for p in FILES if p.name != "test_sources.py" for f in _findings(p, p.read_text(encoding="utf-8"))]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("line, bad", [
    ("# 25 GB/s per link (" + "FACTS" + " section 1)", True),
    ('SHARED = Path("/' + 'work/shared/topologies")', True),
    ("see ../" + "shared/reference/ARCHITECTURE.md", True),
    ("the notes in docs/NOTES.md", True),
    ("recorded: data/measurements/measure/plain__fresh.json", False),
    ("recorded: data/measurements/measure/plain__nowhere.json", True),
    ('f"data/measurements/allocator/fid__{name}.json"', False),
    ("nccl-tests' (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)", False),
    ("benchmarks/gpu/README.md lists the scripts", False),
    ("PyTorch c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc", False),
])
def test_the_rule_tells_a_citation_outside_from_a_public_one(line, bad):
    assert bool(_findings(ROOT / "labkit" / "x.py", line)) == bad
