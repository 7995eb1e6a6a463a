import enum
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from labkit.core import LabkitError, to_jsonable
from labkit.core.provenance import REQUIRED, describe, format_header, header, load_measurement, write_measurement


class Color(enum.Enum):
    RED = "red"


@dataclass
class Inner:
    x: float
    p: Path


@dataclass
class Outer:
    name: str
    inner: Inner
    items: tuple = (1, 2)
    extra: dict = field(default_factory=dict)


def test_to_jsonable_recurses_and_drops_nonfinite():
    doc = to_jsonable(Outer("a", Inner(math.inf, Path("/x")), extra={1: Color.RED}))
    assert doc == {"name": "a", "inner": {"x": None, "p": "/x"}, "items": [1, 2], "extra": {"1": "red"}}
    json.dumps(doc)


def test_to_jsonable_refuses_unknown_types():
    with pytest.raises(TypeError):
        to_jsonable(object())


def test_header_has_every_required_field():
    h = header("labkit test")
    assert all(k in h for k in REQUIRED)
    assert h["command"] == "labkit test"
    assert "labkit test" in format_header(h)


def test_measurement_roundtrip_and_refusals(tmp_path):
    p = write_measurement(tmp_path / "m" / "x.json", "demo", {"value": 3}, command="cmd")
    doc = load_measurement(p, kind="demo")
    assert doc["data"] == {"value": 3} and doc["provenance"]["command"] == "cmd"
    assert "command: cmd" in describe(doc["provenance"])
    with pytest.raises(LabkitError, match="holds a 'demo' measurement"):
        load_measurement(p, kind="other")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": 1}))
    with pytest.raises(LabkitError, match="lacks provenance"):
        load_measurement(bad)
    bad.write_text("{not json")
    with pytest.raises(LabkitError, match="not valid JSON"):
        load_measurement(bad)
    with pytest.raises(LabkitError, match="no such"):
        load_measurement(tmp_path / "missing.json")


def test_every_recorded_measurement_has_provenance():
    root = Path(__file__).resolve().parents[2] / "data" / "measurements"
    files = list(root.rglob("*.json"))
    assert files, "data/measurements holds no recorded measurement"
    for f in files:
        load_measurement(f)


def test_a_large_measurement_is_written_on_one_line_and_reads_back(tmp_path):
    """A recording with allocator block lists would pass the repository's 5 MiB limit indented: written compact."""
    import labkit.core.provenance as prov

    data = {"blocks": [{"addr": i, "size": 512} for i in range(120_000)]}
    p = write_measurement(tmp_path / "big.json", "demo", data, command="cmd")
    assert len(json.dumps({"x": data}, indent=1)) > prov.COMPACT_ABOVE_BYTES
    assert p.read_text().count("\n") == 1 and load_measurement(p, kind="demo")["data"] == data
    small = write_measurement(tmp_path / "small.json", "demo", {"value": 3}, command="cmd")
    assert small.read_text().count("\n") > 1
