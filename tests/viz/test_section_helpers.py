"""The shared display helpers notebooks 03-05 use: ShowsSection, the source shown once, bytes, busy()."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.report import recorded
from labkit.viz.display import busy
from labkit.viz.section import Section, ShowsSection


@dataclass
class _Result(ShowsSection):
    value: int
    built: int = 0

    def section(self) -> Section:
        self.built += 1
        return Section("t", source="measured here").claim("bytes", self.value, "bytes", name="test.helpers.bytes",
                                                           direction="lower")


def test_shows_section_builds_once_and_records_once(capsys):
    r = _Result(3 * 2**30)
    r._ipython_display_()
    r._ipython_display_()
    assert r.built == 1
    assert recorded()["test.helpers.bytes"].value == 3 * 2**30
    assert "bytes: 3.00 GiB" in str(r)


def test_a_shared_source_is_shown_once_and_a_different_one_beside_its_claim():
    sec = Section("s", source="recorded on 1 x NVIDIA H200, 2026-11-29")
    sec.claim("a", 1.5, "ms").claim("b", 2, "ms").claim("c", 3, "", source="model")
    html = sec.html()
    assert html.count("recorded on 1 x NVIDIA H200") == 1 and "Source: recorded on" in html
    assert "(model)" in html and str(sec).count("recorded on") == 1


def test_busy_shows_elapsed_time_and_stops_its_ticker():
    import threading
    import time

    def tickers() -> int:
        return sum(t.name == "labkit-busy" for t in threading.enumerate())

    with busy("work", tick_s=0.01) as bar:
        assert tickers() == 1
        time.sleep(0.05)
    assert tickers() == 0 and "elapsed" in bar.bar_format


def test_progress_yields_every_item_and_counts_them():
    from labkit.viz.display import progress

    assert list(progress(range(4), "four")) == [0, 1, 2, 3]


def test_progress_is_a_line_on_stdout_that_counts_finished_work(capsys, monkeypatch):
    """Nothing on stderr (a notebook shows stderr as an error box); the count is of items whose work is done,
    so a bar reads 100% only when the last item's work has finished."""
    from labkit.viz import display

    bars = []
    real = display.bar
    monkeypatch.setattr(display, "bar", lambda *a, **kw: bars.append(real(*a, **kw)) or bars[-1])
    seen = []
    for x in display.progress(["a", "b", "c"], "work"):
        seen.append((x, bars[0].n))  # while item x is worked on, only the items before it count
    assert seen == [("a", 0), ("b", 1), ("c", 2)] and bars[0].n == 3
    out = capsys.readouterr()
    assert "work: 100%" in out.out and out.err == ""


def test_the_support_table_counts_cases_as_they_run(monkeypatch):
    """Notebook 04's support table: each corpus case runs while the bar counts the cases before it (the list was
    once consumed first, leaving a bar at 100% over minutes of silence)."""
    from labkit.lessons import recompute_precision as lesson
    from labkit.memory.trace import corpus_check
    from labkit.viz import display

    bars = []
    real = display.bar
    monkeypatch.setattr(display, "bar", lambda *a, **kw: bars.append(real(*a, **kw)) or bars[-1])
    counts = []
    monkeypatch.setattr(corpus_check, "check_case", lambda c: counts.append(bars[-1].n) or
                        corpus_check.Support(c.name, "predicted", ""))
    lesson.supported_models(smoke=True)
    assert counts == list(range(lesson.SMOKE_SUPPORT))


def test_a_long_table_shows_its_failures_first_and_the_whole_table_one_click_away():
    from labkit.viz.section import LONG_TABLE_ROWS

    n = LONG_TABLE_ROWS + 5
    rows = [[f"case{i}", "refused" if i in (3, 17) else "predicted"] for i in range(n)]
    sec = Section("corpus", source="model").table(["case", "status"], rows, failed=[r[1] == "refused" for r in rows])
    assert [r[0] for r in sec.rows[:2]] == ["case3", "case17"] and sec.rows[2][0] == "case0"
    page = sec.html()
    assert f"2 of {n} rows fail" in page
    shown, full = page.split("<details", 1)
    assert shown.count("<tr>") == 1 + 2 and "case3" in shown and "case0" not in shown  # header + the failures
    assert f"All {n} rows (failures first)" in full and full.count("<tr>") == 1 + n
    assert full.index("case17") < full.index("case0")
    clean = Section("c").table(["case", "status"], [[f"c{i}", "ok"] for i in range(n)], failed=[False] * n).html()
    assert f"None of the {n} rows fails" in clean and "<details" in clean
    short = Section("s").table(["a"], [[1], [2]]).html()
    assert "<details" not in short and short.count("<tr>") == 3
