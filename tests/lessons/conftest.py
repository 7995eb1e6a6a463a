import pytest


@pytest.fixture
def recorded_results():
    """What Section.record() put into the report, in this session (cleared before and after)."""
    import importlib

    rec = importlib.import_module("labkit.report.record")

    rec._session.clear()
    yield rec.recorded
    rec._session.clear()


def claim_text(sec) -> str:
    return " | ".join(f"{c.text}: {c.value_text()}" for c in sec.claims)
