"""orchestration/scheduler.py: the libraries the scheduler preloads for its task processes; one that is not
installed is skipped and named in the log, not fatal."""

from __future__ import annotations

import logging
import sys

from orchestration.scheduler import PRELOAD, preload


def test_preload_imports_what_is_there_and_names_what_is_not(caplog, monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    with caplog.at_level(logging.WARNING):
        loaded = preload(("colorsys", "no_such_library_for_the_scheduler"))
    assert loaded == ["colorsys"] and "colorsys" in sys.modules
    assert "no_such_library_for_the_scheduler is not installed" in caplog.text


def test_only_third_party_libraries_are_preloaded():
    """The project's own modules stay out: a task must import its code fresh, edits included."""
    first_party = ("core", "pipelines", "features", "training", "serving", "monitoring", "orchestration")
    assert not [m for m in PRELOAD if m.split(".")[0] in first_party]
