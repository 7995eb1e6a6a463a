import json
import math

import pytest

from labkit.core import LabkitError
from labkit.report.record import RESULTS_ENV, read_results, record, recorded


def test_record_appends_to_the_runner_file(tmp_path, monkeypatch):
    f = tmp_path / "r.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(f))
    record("peak", 1.5, "GiB", source="measured here", direction="lower")
    record("peak", 2.5, "GiB", source="measured here", tolerance=0.01, direction="lower", label="Peak memory")
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    assert len(lines) == 2
    assert read_results(str(f))["peak"]["value"] == 2.5 and recorded()["peak"].tolerance == 0.01
    assert read_results(str(f))["peak"]["label"] == "Peak memory"


@pytest.mark.parametrize("args,kw", [(("", 1), {"source": "model"}), (("x", math.nan), {"source": "model"}),
                                     (("x", 1), {"source": "guessed"}), (("x", [1]), {"source": "model"}),
                                     (("x", True), {"source": "model"}),
                                     (("x", 1), {"source": "measured here"})])  # measured here: a direction
def test_record_refuses_bad_input(args, kw):
    with pytest.raises(LabkitError):
        record(*args, **kw)
