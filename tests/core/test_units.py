import pytest

from labkit.core import LabkitError, fmt_bytes, parse_bytes
from labkit.core.units import GB, GiB, MiB


def test_fmt_names_the_unit_binary_and_decimal():
    assert fmt_bytes(3 * GiB) == "3.00 GiB"
    assert fmt_bytes(3 * GiB, binary=False) == "3.22 GB"
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(-2 * MiB) == "-2.00 MiB"


@pytest.mark.parametrize("text,expected", [("4096", 4096), ("64KiB", 64 * 1024), ("1.5 GB", int(1.5 * GB)),
                                           ("25M", 25 * MiB), ("2GiB", 2 * GiB), ("1e3", 1000)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_parse_bytes_names_input_on_error():
    with pytest.raises(LabkitError, match="bucket.*'12 parsecs'"):
        parse_bytes("12 parsecs", what="bucket")
