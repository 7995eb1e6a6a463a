"""Which bucket cap is fastest, only where the sweep can tell: p10-p90 ranges that overlap, or sizes that give
the same bucket count, are one answer ("any of them"), in `comm buckets` and in notebook 05."""

from labkit.comm.ddp import BucketRow, BucketSweep
from labkit.lessons.critical_path import bucket_sweep


def _row(mb, buckets, median, p10, p90, gav=False):
    return BucketRow(mb, gav, buckets, median, p10, p90, p10, p90, 5, None, None)


def _sweep(*rows):
    return BucketSweep("gloo", 2, 1, "tiny", 4, 10 << 20, None, [_row(None, None, 5.0, 4.9, 5.1), *rows])


def test_overlapping_ranges_name_no_fastest_size():
    s = _sweep(_row(1, 3, 9.8, 9.0, 11.0), _row(25, 1, 10.1, 9.5, 10.9))
    assert [r.bucket_cap_mb for r in s.tied_with_best()] == [25]
    assert s.best_text().startswith("best: none distinguishable: bucket_cap_mb 1, 25")
    sec = bucket_sweep(s, "measured here (gloo, 2 processes)", title="t")
    pick = next(c for c in sec.claims if "bucket cap" in c.text.lower())
    assert "cannot be told apart" in pick.text and pick.value == "1, 25" and pick.name is None
    assert sec.value("comm.here.best_step_ms") == 9.8
    assert next(c for c in sec.claims if c.name == "comm.here.best_step_ms").direction == "lower"


def test_the_same_bucket_count_is_one_configuration():
    s = _sweep(_row(1, 1, 9.0, 8.9, 9.1), _row(25, 1, 10.0, 9.9, 10.1))  # ranges apart, one bucket each
    assert s.tied_with_best() and "none distinguishable" in s.best_text()


def test_a_size_faster_beyond_the_noise_is_named():
    s = _sweep(_row(1, 30, 20.0, 19.0, 21.0), _row(25, 2, 10.0, 9.5, 10.5), _row(100, 1, 14.0, 13.0, 15.0))
    assert s.tied_with_best() == []
    assert s.best_text().startswith("best: bucket_cap_mb=25 (gradient_as_bucket_view off), 10.00 ms per step")
    pick = next(c for c in bucket_sweep(s, "measured here", title="t").claims if "bucket cap" in c.text.lower())
    assert pick.text.startswith("Fastest bucket cap") and pick.value == 25


def test_an_alpha_beta_fit_that_misses_is_shown_with_its_error():
    from types import SimpleNamespace

    from labkit.lessons.critical_path import FIT_ERROR_NOTED, _fit_table
    from labkit.viz.section import Section

    fit = lambda err: SimpleNamespace(op="all_reduce", alpha_us=20.0, algbw_GBps=1.0, busbw_GBps=1.0,  # noqa: E731
                                      max_rel_error=err, min_bytes=4096, max_bytes=2**30)
    rough, good = Section("t"), Section("t")
    _fit_table(rough, [fit(0.91)])
    _fit_table(good, [fit(FIT_ERROR_NOTED / 2)])
    assert any("misses a measured size by 91%" in n for n in rough.notes) and not good.notes
