"""The notebook section on a captured OOM, from the recorded data (watch recordings when present)."""

import pytest

from labkit.lessons.allocator import watch_section
from labkit.core.errors import LabkitError


@pytest.mark.parametrize("case, kind", [("fragmentation", "fragmentation"), ("too_large", "too_large"),
                                        ("leak", "growth")])
def test_watch_section_shows_the_verdict_its_arithmetic_and_how_to_use_watch(case, kind):
    s = watch_section(case)
    assert s.value(f"alloc.watch.{case}.verdict") == kind
    labels = [r[0] for r in s.rows]
    assert "fix" in labels and any("=" in str(r[1]) for r in s.rows if isinstance(r[0], int))  # the arithmetic
    if "checked" in labels:
        assert "simulator" in s.rows[labels.index("checked")][1]
    assert any("labkit watch -- python train.py" in n for n in s.notes)
    text = str(s)
    assert "recorded on" in text and "model: labkit" in text  # every figure says where it comes from


def test_watch_section_refuses_an_unknown_case(tmp_path):
    with pytest.raises(LabkitError, match="no recorded capture"):
        watch_section("nonsense", meas_dir=tmp_path)
