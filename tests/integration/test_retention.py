"""Retention of every layer above landing (mlops/chain.py `retention`, what the enforce_retention DAG runs) on
a copy of the reference lake: its own dates are the recent ones; a copy of each dated entry under a date older
than the retentions stands for the old data (gold's copy altered, so its DVC objects are its own). MLflow
(SQLite) and the promotion history are real; the dates count back from the newest arrival ingested."""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from core.errors import PipelineError
from core.settings import Settings
from mlops.chain import retention
from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, table_path
from pipelines.retention import dated_entries
from pipelines.versioning import record_revision, revision_files, track_many
from tests import lake as reference
from training.registry import ModelRegistry
from training.retention import DELETED_TAG

NEWEST = max(reference.DAYS)
OLD = NEWEST - timedelta(days=500)  # past every retention's default (400 days)
KEPT_OLD = NEWEST - timedelta(days=300)  # old, within them


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=reference.reference_lake(tmp_path / "home").home, spark_shuffle_partitions=2)


def _copy_dated(settings: Settings, day: date) -> list[str]:
    """A copy of the newest date's entries of every dated table under `day`; their paths (to MLOPS_HOME)."""
    copies = []
    own = tuple(settings.lake / name for name in ("quarantine", "reconciliation"))  # their own retention
    for root in (settings.lake, settings.home / "training_sets", settings.home / "datasets"):
        for _table, entries in dated_entries(root, own).items():
            for source in entries.get(max(entries), []):
                target = source.with_name(source.name.replace(max(entries).isoformat(), day.isoformat()))
                if source.is_dir():
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)
                copies.append(str(target.relative_to(settings.home)))
    return copies


def _gold_revision(settings: Settings, day: date, drop: int) -> tuple[str, set[str]]:
    """A DVC revision of gold at `day` whose files differ from every other (`drop` rows fewer): its id and
    the objects only it uses."""
    folders = []
    for table in (CUSTOMER_TABLE, MERCHANT_TABLE):
        partition = table_path(settings.lake, table) / f"event_date={day.isoformat()}"
        for path in partition.glob("*.parquet"):
            rows = pq.read_table(path)
            path.unlink()
            pq.write_table(rows.slice(drop), path)
        folders.append((f"gold/{table}/event_date={day.isoformat()}", partition))
    members = track_many(settings, folders)
    rev = record_revision(settings, dict(zip((CUSTOMER_TABLE, MERCHANT_TABLE), members, strict=True)))
    # their .dvc files point at today's content: only the revision uses these objects after the next write
    for _, folder in folders:
        for path in folder.glob("*.parquet"):
            pq.write_table(pq.read_table(path).slice(1), path)
    track_many(settings, folders)
    files = {p for member in revision_files(settings, rev).values() for p in map(str, member.values())}
    return rev, files


def _version(client: MlflowClient, name: str, as_of: date, rev: str) -> tuple[str, Path]:
    """A registered version trained on `rev` as of `as_of`, with an artifact on disk; its number and that."""
    run = client.create_run(client.get_experiment_by_name("retention").experiment_id)
    client.log_text(run.info.run_id, "weights", "model/weights.txt")
    version = client.create_model_version(
        name, f"runs:/{run.info.run_id}/model", run.info.run_id,
        tags={"lineage.as_of": as_of.isoformat(), "lineage.training_set_rev": rev},
    )  # fmt: skip
    artifact = Path(run.info.artifact_uri.removeprefix("file://")) / "model" / "weights.txt"
    assert artifact.is_file()
    return str(version.version), artifact


def _in_the_cluster(settings: Settings) -> dict:
    """The cluster's enforce_retention: the floor and the newest arrival in the Airflow image, the models'
    part in the training image's pod (`python -m training retention-models`), the rest in the Airflow image
    again with the pod's result (what the DAG passes it as XCom: JSON)."""
    import json

    from mlops.chain import retention_plan
    from training.retention import models_retention

    plan = retention_plan(settings)
    newest = date.fromisoformat(plan["newest_ingested"]) if plan["newest_ingested"] else None
    models = json.loads(json.dumps(models_retention(settings, newest)))
    return retention(settings, models=models)


@pytest.mark.parametrize("where", ["one process", "the cluster's steps"])
def test_every_layer_keeps_its_retention_and_what_may_serve_again(settings, where):
    run = retention if where == "one process" else _in_the_cluster
    old_copies = _copy_dated(settings, OLD) + _copy_dated(settings, OLD + timedelta(days=1))
    recent_copies = _copy_dated(settings, KEPT_OLD)
    assert any(p.startswith("lake/silver/") for p in old_copies)
    assert any(p.startswith("lake/gold/") for p in old_copies) and any("state/" in p for p in old_copies)
    assert any(p.startswith("datasets/") for p in old_copies)
    old_rev, old_objects = _gold_revision(settings, OLD, drop=2)
    protected_rev, protected_objects = _gold_revision(settings, OLD + timedelta(days=1), drop=3)
    recent_rev, _ = _gold_revision(settings, KEPT_OLD, drop=4)

    # Two old versions: one the champion alias names (its training set is protected_rev), one nothing names.
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    client = registry.client
    client.create_experiment("retention", artifact_location=(settings.mlflow_dir / "artifacts").as_uri())
    client.create_registered_model(registry.name)
    archived, archived_artifact = _version(client, registry.name, OLD, old_rev)
    champion, champion_artifact = _version(client, registry.name, OLD, protected_rev)
    client.set_registered_model_alias(registry.name, "champion", champion)

    report = run(settings)

    assert report["newest_ingested"] == NEWEST.isoformat()
    # The lake, the training sets and the DVC files: the old copies gone, the others kept.
    assert set(old_copies) - set(report["lake_removed"]) == set()
    assert set(report["lake_removed"]) - set(old_copies) == set()
    for path in old_copies:
        assert not (settings.home / path).exists(), path
    for path in recent_copies:
        assert (settings.home / path).exists(), path
    assert (settings.lake / "quarantine").is_dir() and (settings.lake / "reconciliation").is_dir()
    # DVC: the old revision and the objects only it used are gone from the remote; the protected one stays.
    assert report["revisions_removed"] == [old_rev]
    assert report["kept"] == {
        f"revision {protected_rev}": "the training set of a version that may serve again"
    }
    manifests = settings.home / "datasets" / "revisions"
    assert not (manifests / f"{old_rev}.json").exists()
    assert {(manifests / f"{r}.json").exists() for r in (protected_rev, recent_rev)} == {True}
    assert not any(Path(p).exists() for p in old_objects - protected_objects)
    assert all(Path(p).exists() for p in protected_objects)
    assert report["objects_removed"]["remote"] > 0 and report["objects_removed"]["cache"] > 0
    revision_files(settings, protected_rev)  # still whole
    # MLflow: the archived version's artifacts gone and said on it; the champion's kept.
    assert report["models"]["artifacts_removed"] == [archived]
    assert not archived_artifact.exists() and champion_artifact.is_file()
    assert client.get_model_version(registry.name, archived).tags[DELETED_TAG] == NEWEST.isoformat()
    assert DELETED_TAG not in client.get_model_version(registry.name, champion).tags

    # Again: nothing more to do.
    again = run(settings)
    assert again["lake_removed"] == [] and again["revisions_removed"] == []
    assert again["models"]["artifacts_removed"] == []


def test_a_retention_shorter_than_one_retrain_reads_deletes_nothing(settings):
    copies = _copy_dated(settings, OLD)
    before = sorted(p.name for p in (settings.home / "datasets" / "revisions").glob("*.json"))
    short = settings.model_copy(update={"retention": settings.retention.model_copy(update={"lake_days": 40})})
    refused = r"MLOPS_RETENTION__LAKE_DAYS=40 is shorter .* raise it to 63"
    for run in (retention, _in_the_cluster):  # the cluster's first step checks it, before the models' pod
        with pytest.raises(PipelineError, match=refused):
            run(short)
    assert all((settings.home / p).exists() for p in copies)
    assert sorted(p.name for p in (settings.home / "datasets" / "revisions").glob("*.json")) == before


def test_where_mlflow_cannot_be_imported_every_training_set_is_kept_and_it_says_so(settings, monkeypatch):
    """The Airflow image carries no MLflow (its retention task runs there in the cluster): nothing can say
    which versions may serve again, so every training set's revision stays, no artifact goes, and the
    report says why; the lake and the gold revisions past their retention go as before."""
    import sys

    from training.dataset import TRAINING_SET_MEMBER

    _copy_dated(settings, OLD)
    old_gold, _ = _gold_revision(settings, OLD, drop=2)
    folder = settings.home / "training_sets" / f"as_of={OLD}"
    folder.mkdir(parents=True)
    pq.write_table(
        pq.read_table(next((settings.lake / "silver").rglob("*.parquet"))), folder / "part.parquet"
    )
    old_set = record_revision(
        settings, {TRAINING_SET_MEMBER: track_many(settings, [(f"training_sets/as_of={OLD}", folder)])[0]}
    )
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError, as in that image

    report = retention(settings)

    assert "the model registry cannot be read here" in report["models"]["not_read"]
    assert report["models"]["artifacts_removed"] == []
    assert report["revisions_removed"] == [old_gold]
    assert (
        report["kept"][f"revision {old_set}"] == "a training set, kept while the registry cannot be read here"
    )
    revision_files(settings, old_set)  # still whole in the remote
