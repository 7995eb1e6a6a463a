"""labkit.lessons.setup(): third-party noise is filtered by message or module, labkit's own warnings are not."""

import logging
import warnings

from labkit.lessons import quiet_third_party


def test_third_party_messages_are_filtered_and_labkit_warnings_are_not(monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn("Kernel is running over TCP without encryption.")
        warnings.warn("STAGE:2026 ActivityProfilerController.cpp: USDT probes unavailable", RuntimeWarning)
        warnings.warn_explicit("`torch_dtype` is deprecated", FutureWarning, "modeling_utils.py", 1,
                               module="transformers.modeling_utils")
        warnings.warn("labkit: a stated gap", UserWarning)
    assert [str(w.message) for w in caught] == ["labkit: a stated gap"]


def test_transformers_logging_is_quiet_below_errors():
    root = logging.getLogger("transformers")
    level = root.level
    try:
        quiet_third_party()
        log = logging.getLogger("transformers.modeling_utils")
        assert root.level == logging.ERROR
        assert not log.isEnabledFor(logging.WARNING) and log.isEnabledFor(logging.ERROR)
    finally:
        root.setLevel(level)
