from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import Profile, Settings, get_settings

REPO = Path(__file__).resolve().parents[2]


def test_local_profile_is_the_default_and_keeps_state_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "h"))
    settings = Settings()
    assert settings.profile is Profile.LOCAL
    assert settings.landing == tmp_path / "h" / "landing"
    assert settings.spark_master == "local[*]"
    assert settings.airflow_sql_conn == f"sqlite:///{tmp_path / 'h' / 'airflow' / 'airflow.db'}"
    assert settings.mlflow_tracking_uri.startswith("sqlite:///")
    assert settings.online_store == "sqlite"


def test_cluster_profile_points_at_services_and_accepts_nested_overrides(monkeypatch):
    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_CLUSTER__SPARK_MASTER", "spark://10.0.0.5:7077")
    monkeypatch.setenv("MLOPS_CLUSTER__POSTGRES_DSN", "postgresql://airflow@db:5432/airflow")
    settings = Settings()
    assert settings.profile is Profile.CLUSTER
    assert settings.spark_master == "spark://10.0.0.5:7077"
    assert settings.airflow_sql_conn == "postgresql+psycopg2://airflow@db:5432/airflow"
    assert settings.online_store == "redis"
    assert settings.mlflow_tracking_uri == "http://127.0.0.1:5000"


@pytest.mark.parametrize(
    ("profile", "runner", "expected"),
    [("local", None, "local"), ("cluster", None, "kubernetes"), ("cluster", "local", "local"),
     ("local", "kubernetes", "kubernetes")],
)  # fmt: skip
def test_training_runs_on_kubernetes_in_the_cluster_profile_unless_told_otherwise(
    monkeypatch, profile, runner, expected
):
    monkeypatch.setenv("MLOPS_PROFILE", profile)
    if runner:
        monkeypatch.setenv("MLOPS_TRAINING__RUNNER", runner)
    assert Settings().training_runner == expected


def test_an_unknown_training_runner_is_rejected(monkeypatch):
    monkeypatch.setenv("MLOPS_TRAINING__RUNNER", "slurm")
    with pytest.raises(ValidationError, match="kubernetes"):
        Settings()


def test_spark_runs_in_process_unless_a_connect_server_is_named(monkeypatch):
    from pipelines.spark import driver_conf, session_conf

    assert Settings().spark_remote is None
    monkeypatch.setenv("MLOPS_SPARK_REMOTE", "sc://127.0.0.1:15002")
    settings = Settings()
    assert settings.spark_remote == "sc://127.0.0.1:15002"
    # SQL settings go to each session (a Connect client may set them); static ones only to a driver.
    assert all(key.startswith("spark.sql.") for key in session_conf(settings))
    assert not any(key.startswith("spark.sql.") for key in driver_conf(settings))


def test_extra_jvm_options_reach_the_driver_and_the_executors_after_ours(monkeypatch):
    from pipelines.spark import HUGE_METHODS_COMPILED, driver_conf

    monkeypatch.setenv("MLOPS_SPARK_JAVA_OPTIONS", " -XX:TieredStopAtLevel=1 ")
    conf = driver_conf(Settings())
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert conf[key] == f"{HUGE_METHODS_COMPILED} -XX:TieredStopAtLevel=1"
    monkeypatch.setenv("MLOPS_SPARK_JAVA_OPTIONS", "")
    assert driver_conf(Settings())["spark.driver.extraJavaOptions"] == HUGE_METHODS_COMPILED


def test_landing_can_be_moved_out_of_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLOPS_LANDING_DIR", str(tmp_path / "elsewhere"))
    assert Settings().landing == tmp_path / "elsewhere"


@pytest.mark.parametrize("value", ["prod", "LOCAL ", ""])
def test_an_unknown_profile_is_rejected_with_the_allowed_values(monkeypatch, value):
    monkeypatch.setenv("MLOPS_PROFILE", value)
    with pytest.raises(ValidationError, match=r"local.*cluster"):
        Settings()


def test_settings_are_read_once_per_process(monkeypatch, tmp_path):
    first = get_settings()
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "other"))
    assert get_settings() is first


def test_ensure_dirs_creates_the_layout_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "h"))
    settings = Settings()
    assert not (tmp_path / "h").exists()
    settings.ensure_dirs()
    assert {p.name for p in (tmp_path / "h").iterdir()} == {"landing", "lake", "airflow", "mlflow", "feast"}


PROBE = """
import importlib, json, logging, pkgutil, socket, sys
# Third-party packages that configure logging when imported (Airflow does) are loaded first, so the count
# below measures what our own modules do.
import airflow.sdk.exceptions, pyspark.sql
baseline = len(logging.getLogger().handlers)
def refuse(*args, **kwargs):
    raise RuntimeError(f"network at import time: {args}")
socket.socket.connect = refuse
imported = []
for package in ("mlops", "pipelines", "training", "features"):
    module = importlib.import_module(package)
    imported.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
print(json.dumps({"imported": imported, "root_handlers": len(logging.getLogger().handlers) - baseline}))
"""


def test_importing_every_module_has_no_side_effects(tmp_path):
    home = tmp_path / "never-created"
    env = {"MLOPS_HOME": str(home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert "pipelines.synthetic.landing" in report["imported"]
    assert "mlops.cli" in report["imported"]
    assert not home.exists(), "a module created MLOPS_HOME at import time"
    assert report["root_handlers"] == 0, "a module configured logging at import time"


@pytest.mark.parametrize(
    ("region", "allowed", "accepted"),
    [("eu-west-1", '["eu-west-1","eu-central-1"]', True), ("us-east-1", '["eu-west-1"]', False)],
)
def test_storage_outside_the_allowed_regions_is_refused_when_settings_load(
    monkeypatch, region, allowed, accepted
):
    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_CLUSTER__OBJECT_STORE_URI", f"s3://fraud-lake/prod?region={region}")
    monkeypatch.setenv("MLOPS_STORAGE_POLICY__ALLOWED_REGIONS", allowed)
    if accepted:
        assert Settings().cluster.object_store_uri.startswith("s3://fraud-lake")
        return
    with pytest.raises(ValidationError) as error:
        Settings()
    message = str(error.value)
    assert f"s3://fraud-lake/prod?region={region}" in message and "us-east-1" in message
    assert "eu-west-1" in message  # the allowed list, so the reader knows what would pass


def test_local_paths_can_be_refused_by_policy(monkeypatch, tmp_path):
    monkeypatch.setenv("MLOPS_STORAGE_POLICY__ALLOW_LOCAL_PATHS", "false")
    with pytest.raises(ValidationError, match="local disk"):
        Settings()


def test_settings_written_out_as_environment_are_read_back_the_same_in_another_process(tmp_path, monkeypatch):
    """What a pod of the training image gets (orchestration/training_task.py pod_environment): every setting,
    lists and dicts as JSON, credentials left out; read back by a fresh process they are the same settings."""
    from core.settings import SECRET_SETTINGS, setting_env_names, settings_as_env

    for name in [n for n in os.environ if n.startswith("MLOPS_")]:
        monkeypatch.delenv(name)
    custom = {
        "MLOPS_PROFILE": "cluster",
        "MLOPS_HOME": str(tmp_path / "h"),
        "MLOPS_INGEST__IGNORE_FILES": '["*.md5", ".*"]',
        "MLOPS_TRAINING__NODE_SELECTOR": '{"pool": "a100"}',
        "MLOPS_TRAINING__MAX_FIT_ROWS": "1234",
        "MLOPS_GATE__MARGIN": "0.03",
        "MLOPS_CLUSTER__POSTGRES_DSN": "postgresql://u:secret@db:5432/x",
        "MLOPS_STORAGE_POLICY__ALLOWED_REGIONS": '["eu-west-1"]',
    }
    for name, value in custom.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    env = settings_as_env(settings)
    assert not SECRET_SETTINGS & set(env)
    assert "MLOPS_SPARK_REMOTE" not in env  # None: left unset, which reads back as None
    assert set(env) <= set(setting_env_names())
    code = (
        "import json; from core.settings import Settings; "
        "print(json.dumps(Settings().model_dump(mode='json')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("MLOPS_")}, **env},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    read_back = json.loads(done.stdout)
    expected = settings.model_dump(mode="json")
    expected["cluster"]["postgres_dsn"] = read_back["cluster"]["postgres_dsn"]  # the Secret's, not given here
    assert read_back == expected
    assert read_back["training"]["node_selector"] == {"pool": "a100"}
    assert read_back["ingest"]["ignore_files"] == ["*.md5", ".*"]


@pytest.mark.parametrize(
    ("name", "variable"),
    [("mlflow_ui_url", "MLOPS_MLFLOW_UI_URL"), ("alerts.webhook_url", "MLOPS_ALERTS__WEBHOOK_URL")],
)
def test_a_url_setting_takes_only_a_web_address_and_empty_means_unset(monkeypatch, name, variable):
    monkeypatch.setenv(variable, "sqlite:///mlflow.db")
    with pytest.raises(ValidationError, match=f"{name} must be an http:// or https:// URL"):
        Settings()
    monkeypatch.setenv(variable, "")
    settings = Settings()
    assert (settings.mlflow_ui_url if name == "mlflow_ui_url" else settings.alerts.webhook_url) is None
    monkeypatch.setenv(variable, "https://mlflow.example.com")
    assert "https://mlflow.example.com" in {Settings().mlflow_ui_url, Settings().alerts.webhook_url}


def test_every_store_of_the_cluster_profile_is_named_for_the_residency_check(monkeypatch):
    from pipelines.versioning import remote_url

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_CLUSTER__OBJECT_STORE_URI", "s3://fraud-lake/prod?region=eu-west-1")
    monkeypatch.setenv("MLOPS_CLUSTER__REDIS_URL", "redis://:pw@cache.internal:6379/0")
    monkeypatch.setenv("MLOPS_STORAGE_POLICY__ALLOWED_REGIONS", '["eu-west-1"]')
    settings = Settings()
    stores = settings.stores
    # Not s3://fraud-lake/prod?region=eu-west-1/dvc: the query is not part of the path.
    assert stores["DVC remote"] == "s3://fraud-lake/prod/dvc" == remote_url(settings)
    assert stores["MLflow artifacts"] == "s3://fraud-lake/prod/mlflow/artifacts"
    assert stores["object store"] == "s3://fraud-lake/prod?region=eu-west-1"
    assert stores["Redis (online store, live entity state)"] == "redis://:pw@cache.internal:6379/0"
    assert settings.cluster.postgres_dsn in stores.values()
    assert settings.cluster.mlflow_tracking_uri in stores.values()
    assert str(settings.landing) in stores.values() and str(settings.home) in stores.values()


def test_the_local_profile_names_its_files_as_its_stores(monkeypatch, tmp_path):
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path))
    stores = Settings().stores
    assert stores["MLflow backend and registry"] == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    assert stores["DVC remote"] == str(tmp_path / "dvc-remote")
    assert not any(uri.startswith(("redis", "postgres", "s3")) for uri in stores.values())


def test_a_secret_setting_travels_only_as_its_value_and_only_when_asked(tmp_path):
    """pydantic masks a SecretStr in a dump ("**********"): written out from a dump, the alert login's
    password would reach a pod as the mask. Left out by default (pods get credentials from their Secret),
    the value itself when asked (`mlops demo`'s own processes)."""
    from core.settings import settings_as_env

    settings = Settings(
        home=tmp_path,
        alerts={
            "smtp_host": "mail.example.com",
            "smtp_starttls": True,
            "smtp_username": "alerts@bank.example",
            "smtp_password": "s3cret-pass",
            "webhook_authorization": "Bearer hook-token",
        },
    )
    plain = settings_as_env(settings)
    assert "MLOPS_ALERTS__SMTP_PASSWORD" not in plain and "MLOPS_ALERTS__WEBHOOK_AUTHORIZATION" not in plain
    assert plain["MLOPS_ALERTS__SMTP_USERNAME"] == "alerts@bank.example"
    assert not any("****" in value for value in plain.values())
    secret = settings_as_env(settings, include_secrets=True)
    assert secret["MLOPS_ALERTS__SMTP_PASSWORD"] == "s3cret-pass"
    assert secret["MLOPS_ALERTS__WEBHOOK_AUTHORIZATION"] == "Bearer hook-token"
