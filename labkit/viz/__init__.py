"""Bokeh figures and small display helpers for the notebooks (no computation of their own)."""

from labkit.viz.display import html_table, setup, show, source_note

__all__ = ["html_table", "setup", "show", "source_note"]
