import pytest

from labkit.core import LabkitError
from labkit.report.notebooks import coerce, parse_assignments


def test_parse_assignments():
    assert parse_assignments(["a=1", "b = x=y"]) == {"a": "1", "b": " x=y"}
    with pytest.raises(LabkitError):
        parse_assignments(["1a=3"])


@pytest.mark.parametrize("text,type_name,value", [("true", "bool", True), ("0", "bool", False), ("3", "int", 3),
                                                  ("2.5", "float", 2.5), ("x", "str", "x"), ("[1, 2]", "None", [1, 2]),
                                                  ("hello", "None", "hello")])
def test_coerce(text, type_name, value):
    assert coerce("p", text, type_name) == value


def test_coerce_refuses_wrong_type():
    with pytest.raises(LabkitError, match="p is a bool"):
        coerce("p", "maybe", "bool")


@pytest.mark.parametrize("name,text,type_name,match", [("tp", "-2", "int", "tp is a count from 1 to 1024"),
                                                       ("world", "100000", "int", "world is a count from 1 to 64"),
                                                       ("seq", "0", "int", "seq is a count"),
                                                       ("gpu_memory_gib", "nan", "float", "finite number >= 0"),
                                                       ("cap_gib", "-1", "float", "finite number >= 0")])
def test_counts_are_refused_before_anything_runs(name, text, type_name, match):
    """issue 29: `report -p tp=-2` ran the notebook and exited 1 instead of refusing."""
    with pytest.raises(LabkitError, match=match):
        coerce(name, text, type_name)
