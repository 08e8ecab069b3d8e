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
        # the reasons' cost, with the champion the service would serve
        from benchmarks.serving import reasons_cost

        source = ModelSource(settings.mlflow_tracking_uri, ledger_url=settings.serving_ledger_url)
        cost = reasons_cost(source.load(champion.version), rows=5)
        assert set(cost) == {"score_one_us", "explain_one_us", "explain_per_transaction_in_64_us"}
        assert all(value > 0 for value in cost.values())
        # the scoring log's two ways in, the same rows each (it checks every row was written)
        from benchmarks.serving import log_paths_cost

        paths = log_paths_cost(rows=200)
        assert paths["rows"] == 200 and paths["dicts_us_per_row"] > 0 and paths["columns_us_per_row"] > 0
    finally:
        mlflow.set_tracking_uri(None)
        get_settings.cache_clear()


def test_the_benchmarks_replicas_run_side_by_side_against_the_product(tmp_path, monkeypatch):
    """`replica_throughput` starts replicated services (serving.replicated) sharing one log on the machine's
    Redis, splits the requests between them, and cleans its stream up; every request answered."""
    import json
    import os
    from datetime import date

    import redis

    from benchmarks.serving import _request, register_champion, replica_throughput
    from core.settings import Settings
    from serving.auth import open_callers, token_for
    from tests.integration.test_scoring_service import transaction

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("MLOPS_PROFILE", "local")
    get_settings.cache_clear()
    try:
        register_champion(tmp_path)
        open_callers(Settings(home=tmp_path))
        token = token_for(Settings(home=tmp_path), "score")
        requests = [_request("/score", json.dumps(transaction(n)).encode(), token) for n in range(40)]
        env = {**os.environ, "MLOPS_HOME": str(tmp_path), "MLOPS_PROFILE": "local"}
        before = set(redis.Redis().keys("mlops:bench:replicas:*"))
        figures = replica_throughput(env, date(2026, 1, 10), requests, 2.0, processes=2, in_flight=4)
        assert figures["processes"] == 2 and figures["failures"] == 0
        assert len(figures["per_process"]) == 2 and all(tps > 0 for tps in figures["per_process"])
        assert set(redis.Redis().keys("mlops:bench:replicas:*")) == before, "the run's stream is removed"
    finally:
        mlflow.set_tracking_uri(None)
        get_settings.cache_clear()
