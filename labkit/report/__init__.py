"""Running the notebooks into a report, and the one call notebooks use to put results in it."""

from labkit.report.record import record, recorded

__all__ = ["record", "recorded"]
