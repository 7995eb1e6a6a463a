"""Facts kept in data files, each with the public source it comes from.

A facts file is JSON: ``{"about": "...", "facts": {name: {"value": ..., "source": "...", "note": "..."}}}``.
Every fact has a value and a non-empty source (a URL, PyTorch's source file and function, a vendor's
document, or a recording under ``data/`` with its provenance); ``note`` is optional. The code reads a
fact by name (``facts["sm_count"]``: its value) and can say where it comes from
(``facts.source("sm_count")``). A malformed file raises one :class:`LabkitError` naming the file and
the fact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from labkit.core.errors import LabkitError


@dataclass(frozen=True)
class Fact:
    name: str
    value: Any
    source: str
    note: str = ""


class Facts:
    """The facts of one file: ``facts[name]`` is a value, :meth:`fact` the value with its source."""

    def __init__(self, path: Path, about: str, facts: dict[str, Fact]) -> None:
        self.path = path
        self.about = about
        self._facts = facts

    def __getitem__(self, name: str) -> Any:
        return self.fact(name).value

    def __iter__(self) -> Iterator[str]:
        return iter(self._facts)

    def __len__(self) -> int:
        return len(self._facts)

    def __contains__(self, name: object) -> bool:
        return name in self._facts

    def fact(self, name: str) -> Fact:
        try:
            return self._facts[name]
        except KeyError:
            raise LabkitError(f"{self.path.name}: no fact {name!r} (known: {', '.join(self._facts)})") from None

    def source(self, name: str) -> str:
        return self.fact(name).source


@lru_cache(maxsize=None)
def load_facts(path: str | Path) -> Facts:
    """The facts of a JSON file (read once per process)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LabkitError(f"{p}: cannot read the facts file ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("facts"), dict):
        raise LabkitError(f"{p}: a facts file is an object with a 'facts' object")
    facts: dict[str, Fact] = {}
    for name, entry in doc["facts"].items():
        if not isinstance(entry, dict) or "value" not in entry:
            raise LabkitError(f"{p}: fact {name!r} has no value")
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise LabkitError(f"{p}: fact {name!r} does not say its source")
        extra = set(entry) - {"value", "source", "note"}
        if extra:
            raise LabkitError(f"{p}: fact {name!r} has unknown keys {sorted(extra)} (value, source, note)")
        facts[name] = Fact(name, entry["value"], source, entry.get("note", ""))
    return Facts(p, str(doc.get("about", "")), facts)
