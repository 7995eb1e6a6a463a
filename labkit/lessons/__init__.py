"""Notebook sections: one function per section, each returning a self-displaying value.

A layer above the chapters, ``labkit.viz`` and ``labkit.report`` (imports point down): a lesson
takes what a chapter computed, writes the claims beside their numbers (sentences computed from those
numbers), picks the figure from ``labkit.viz`` and states any gap (a recording that is not there) as
a note. One module per notebook, named after it: ``this_server`` (00), ``topology`` (01), ``parallel_memory``
(02) ...

Every notebook starts with :func:`setup`.
"""

from __future__ import annotations

import logging
import os
import warnings

from labkit.viz.display import setup as viz_setup

# Third-party messages that say nothing about the lesson, filtered by their text or module only.
_QUIET_MESSAGES = (
    r".*Kernel is running over TCP.*",
    r".*USDT.*",
)
_QUIET_MODULES = (r"transformers(\..*)?$", r"huggingface_hub(\..*)?$")


def quiet_third_party() -> None:
    """Hide the third-party warnings that would otherwise fill cells and reports (transformers'
    advisories, the profiler's USDT notice, ipykernel's TCP notice); nothing of labkit's is hidden."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # kineto's USDT/STAGE lines on fd 2, not Python warnings
    for text in _QUIET_MESSAGES:
        warnings.filterwarnings("ignore", message=text)
    # labkit's own note that the installed torch differs from fake mode's rules: the sections that predict say
    # which torch they ran (emulation's torch); a warning on stderr would read as an error in a report
    warnings.filterwarnings("ignore", message="fake mode's rules are for torch")
    for module in _QUIET_MODULES:
        warnings.filterwarnings("ignore", module=module)

    for name in ("transformers", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)


def setup() -> None:
    """What every notebook calls first: Bokeh inline (offline reports) and the third-party filters."""
    quiet_third_party()
    viz_setup()
