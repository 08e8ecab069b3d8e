"""The Feast definitions follow the gold contract; the per-profile configuration is filled from settings."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from core.settings import Settings
from features.definitions import (
    CUSTOMER_VIEW,
    FEATURE_SERVICE,
    INTEGER_FEATURES,
    MERCHANT_VIEW,
    build_definitions,
)
from features.repo import FeatureStoreError, redis_connection_string, render_config
from pipelines.gold.contract import CUSTOMER_FEATURES, MERCHANT_FEATURES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return build_definitions(tmp_path_factory.mktemp("lake"))


@pytest.mark.parametrize(
    ("view", "join_key", "features", "ttl"),
    [
        (CUSTOMER_VIEW, "customer_id", CUSTOMER_FEATURES, timedelta(days=30)),
        (MERCHANT_VIEW, "merchant_id", MERCHANT_FEATURES, timedelta(days=7)),
    ],
)
def test_views_carry_every_contract_column_with_its_type(repo, view, join_key, features, ttl):
    fv = {v.name: v for v in repo.feature_views}[view]
    assert fv.ttl == ttl
    assert [e.name for e in fv.entity_columns] == [join_key]
    assert [f.name for f in fv.features] == list(features)
    types = {f.name: str(f.dtype) for f in fv.features}
    for name in features:
        expected = (
            "Int64" if ("_count_" in name or "chargebacks" in name or "distinct" in name) else "Float64"
        )
        assert types[name] == expected, name
    assert fv.batch_source.timestamp_field == "event_timestamp"
    assert fv.batch_source.created_timestamp_column == "created_timestamp"


def test_counts_are_the_integer_features():
    assert "customer_txn_count_1h" in INTEGER_FEATURES
    assert "merchant_chargebacks_30d" in INTEGER_FEATURES
    assert "customer_amount_sum_1h" not in INTEGER_FEATURES
    assert "merchant_fraud_rate_30d" not in INTEGER_FEATURES


def test_sources_read_the_gold_tables_of_the_given_lake(tmp_path):
    repo = build_definitions(tmp_path / "lake")
    assert repo.customer_source.path == str(tmp_path / "lake" / "gold" / "customer_features")
    assert repo.merchant_source.path == str(tmp_path / "lake" / "gold" / "merchant_features")


def test_feature_service_serves_both_views_whole(repo):
    service = repo.fraud_model_v1
    assert service.name == FEATURE_SERVICE
    served = {p.name: [f.name for f in p.features] for p in service.feature_view_projections}
    assert served == {CUSTOMER_VIEW: list(CUSTOMER_FEATURES), MERCHANT_VIEW: list(MERCHANT_FEATURES)}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", "127.0.0.1:6379,db=0"),
        ("redis://cache.internal", "cache.internal:6379"),
        ("redis://:s%40cret@cache:6380/2", "cache:6380,db=2,password=s@cret"),
        ("rediss://cache:6380/1", "cache:6380,db=1,ssl=true"),
    ],
)
def test_redis_urls_become_feast_connection_strings(url, expected):
    assert redis_connection_string(url) == expected


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "redis://host:6379/zero"])
def test_a_redis_url_feast_cannot_use_is_refused_naming_the_setting(url):
    with pytest.raises(FeatureStoreError, match="MLOPS_CLUSTER__REDIS_URL"):
        redis_connection_string(url)


@pytest.mark.parametrize("profile", ["local", "cluster"])
def test_configuration_is_filled_from_settings(monkeypatch, tmp_path, profile):
    monkeypatch.setenv("MLOPS_PROFILE", profile)
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLOPS_CLUSTER__REDIS_URL", "redis://10.1.2.3:6390/3")
    config = yaml.safe_load(render_config(Settings(), project="p1"))
    assert config["project"] == "p1"
    assert config["registry"]["path"] == str(tmp_path / "home" / "feast" / "registry.db")
    assert "${" not in json.dumps(config)
    if profile == "local":
        assert config["online_store"] == {"type": "sqlite", "path": str(tmp_path / "home/feast/online.db")}
    else:
        assert config["online_store"]["type"] == "redis"
        assert config["online_store"]["connection_string"] == "10.1.2.3:6390,db=3"
    assert not (tmp_path / "home").exists(), "rendering the configuration must not create anything"


def test_importing_the_features_package_does_not_import_feast():
    """Feast makes a temp folder and sets PROMETHEUS_MULTIPROC_DIR for the process when imported."""
    probe = (
        "import sys, features.definitions, features.repo, features.materialize, features.online, "
        "features.offline; "
        "print(sorted(m for m in sys.modules if m == 'feast' or m.startswith('feast.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
