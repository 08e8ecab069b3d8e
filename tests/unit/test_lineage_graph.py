"""mlops/lineage.py on events written by core/lineage.py: upstream follows each dataset to its newest producer
before the run that read it, each dataset carries its newest validation before that read, downstream follows
what the version made, and a version no event produced is taken from the registry, saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import lineage
from core.settings import Settings
from mlops.lineage import describe, lineage_of


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


def _write(settings: Settings, job: str, time: str, inputs=(), outputs=()) -> None:
    payload = lineage.event(
        settings, job, f"run-{job}-{time}", lineage.COMPLETE, lineage.Datasets(list(inputs), list(outputs))
    )
    payload["eventTime"] = f"2026-03-0{time}T00:00:00+00:00"  # the events' order, set by the test
    folder = settings.home / lineage.EVENTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{time}-{job}-COMPLETE.json").write_text(json.dumps(payload))


def _edges(graph: dict, key: str) -> list[tuple[str, str, str]]:
    return [(e["job"], e["from"][1].rsplit("/", 1)[-1], e["to"][1].rsplit("/", 1)[-1]) for e in graph[key]]


def test_upstream_is_the_graph_as_the_reader_saw_it_and_downstream_what_the_version_made(settings):
    landing = lineage.path(settings.landing / "2026-03-02" / "transactions-1.csv")
    other = lineage.path(settings.landing / "2026-03-02" / "transactions-2.csv")
    gold = lineage.path(settings.lake / "gold" / "event_date=2026-03-02")
    passed = {
        "suite": "gold_customer_features",
        "assertions": [
            {"expectation": "expect_column_values_to_not_be_null", "column": "customer_id", "success": True}
        ],
    }
    failed = {
        "suite": "gold_customer_features",
        "assertions": [
            {"expectation": "expect_column_values_to_not_be_null", "column": "customer_id", "success": False}
        ],
    }
    training_set = lineage.dvc_revision(settings, "training_set", "abc")
    run = lineage.mlflow(settings, "runs/r1")
    version = lineage.model_version(settings, "fraud-detector", "1")
    alias = lineage.mlflow(settings, "models/fraud-detector/aliases/champion", version="1")
    _write(settings, "build_gold", "1", [landing], [gold])
    _write(settings, "validate_gold", "2", [lineage.validated(gold, passed)])
    _write(settings, "training_set", "3", [gold], [training_set])
    _write(settings, "build_gold", "4", [other], [gold])  # rebuilt after the training set read it
    _write(settings, "validate_gold", "5", [lineage.validated(gold, failed)])
    _write(settings, "train", "6", [training_set], [run])
    _write(settings, "register", "7", [run], [version])
    _write(settings, "promote", "8", [version], [alias])

    graph = lineage_of(settings, "1")
    assert _edges(graph, "upstream") == [
        ("register", "r1", "1"),
        ("train", "training_set@abc", "r1"),
        ("training_set", "event_date=2026-03-02", "training_set@abc"),
        ("build_gold", "transactions-1.csv", "event_date=2026-03-02"),  # not the rebuild from -2.csv
    ]
    [(name, quality)] = graph["quality"].items()
    assert (
        name.endswith("event_date=2026-03-02")
        and quality["success"]
        and quality["time"].startswith("2026-03-02")
    )
    assert _edges(graph, "downstream") == [("promote", "1", "champion")]
    assert graph["from_registry"] == [] and graph["missing"] == []
    text = "\n".join(describe(settings, graph))
    assert "build_gold: landing/2026-03-02/transactions-1.csv -> lake/gold/event_date=2026-03-02" in text
    assert "gold_customer_features passed" in text


def test_a_dataset_without_its_producing_event_is_listed_as_missing(settings):
    training_set = lineage.dvc_revision(settings, "training_set", "abc")
    run = lineage.mlflow(settings, "runs/r1")
    _write(settings, "train", "1", [training_set], [run])
    _write(settings, "register", "2", [run], [lineage.model_version(settings, "fraud-detector", "1")])
    graph = lineage_of(settings, "1")
    assert graph["missing"] == [list(training_set.key)]
    assert "no event produced: training_set@abc" in describe(settings, graph)


def test_a_version_no_event_registered_comes_from_the_registry_and_says_so(settings):
    import mlflow

    from training.registry import ModelRegistry

    settings.mlflow_dir.mkdir(parents=True)
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    client = registry.client
    experiment = client.create_experiment("lineage-test", artifact_location=str(settings.home / "artifacts"))
    run = client.create_run(experiment, tags={"lineage.training_set_rev": "abc"})
    client.create_registered_model(registry.name)
    made = client.create_model_version(
        registry.name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id
    )
    client.set_model_version_tag(registry.name, made.version, "lineage.training_set_rev", "abc")
    training_set = lineage.dvc_revision(settings, "training_set", "abc")
    gold = lineage.path(settings.lake / "gold" / "event_date=2026-03-02")
    _write(settings, "training_set", "1", [gold], [training_set])

    graph = lineage_of(settings, str(made.version))
    assert [(e["origin"], e["to"][1]) for e in graph["upstream"]] == [
        ("registry", f"models/fraud-detector/versions/{made.version}"),
        ("registry", f"runs/{run.info.run_id}"),
        ("event", "training_set@abc"),
    ]
    assert any("no lineage event registered" in note for note in graph["from_registry"])
    with pytest.raises(LookupError, match="has no version '99' in sqlite"):
        lineage_of(settings, "99")
    mlflow.set_tracking_uri(None)
