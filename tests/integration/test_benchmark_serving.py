"""The serving benchmark's own calls into the product (benchmarks/serving.py), on a tiny home: it registers
its champion through the promotion history and measures its in-process floor with the champion the service
would serve. `make bench` runs nowhere in CI; this keeps its product calls from breaking unseen again (a
changed `ModelSource.champion()` once lost every figure of a run). The load runs themselves are timing, not
tested."""

from __future__ import annotations

import mlflow
import pytest

from core.settings import Settings, get_settings

pytestmark = pytest.mark.integration


def test_the_benchmarks_champion_and_floor_run_against_the_product(tmp_path, monkeypatch):
    from benchmarks.serving import floor, register_champion
    from features.repo import apply
    from serving.models import ModelSource

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("MLOPS_PROFILE", "local")
    get_settings.cache_clear()
    try:
        register_champion(tmp_path)
        settings = Settings(home=tmp_path)
        champion = ModelSource(
            settings.mlflow_tracking_uri, ledger_url=settings.serving_ledger_url
        ).champion()
        assert champion is not None and champion.version == "1" and champion.out_of_band is None
        apply(settings)  # the feature service the floor reads the online store through
        items = [{"customer_id": f"c{n:07d}", "merchant_id": f"m{n:06d}"} for n in range(5)]
        figures = floor(tmp_path, items, 5)
        assert figures["requests"] == 5 and 0 < figures["p50_ms"] <= figures["p99_ms"]
    finally:
        mlflow.set_tracking_uri(None)
        get_settings.cache_clear()
