"""`mlops demo --continue` picks the day after the feed already landed, and says what to do when none is."""

from __future__ import annotations

from datetime import date

import pytest

from core.settings import Settings
from mlops.demo import DemoError, next_arrival


def test_the_next_arrival_is_the_day_after_the_last_landed_one(tmp_path):
    settings = Settings(home=tmp_path)
    for name in ("2026-01-03", "2026-01-01", "2026-01-02", "_tmp", "notes"):
        (settings.landing / name).mkdir(parents=True)
    assert next_arrival(settings) == (date(2026, 1, 1), date(2026, 1, 4))


def test_continuing_an_empty_home_names_the_landing_zone_and_what_to_run(tmp_path):
    settings = Settings(home=tmp_path)
    with pytest.raises(DemoError, match=r"nothing landed under .*landing.*run `mlops demo`"):
        next_arrival(settings)
    settings.landing.mkdir(parents=True)
    with pytest.raises(DemoError, match="nothing landed"):
        next_arrival(settings)
