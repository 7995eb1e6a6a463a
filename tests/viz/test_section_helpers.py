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
        return Section("t", source="measured here").claim("bytes", self.value, "bytes", name="test.helpers.bytes")


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
