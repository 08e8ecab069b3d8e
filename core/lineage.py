"""OpenLineage events for every stage of the chain (docs/lineage.md).

Each step function that reads or writes data is decorated with `emits(job, datasets)`: it sends a START
event when it begins and a COMPLETE (with the datasets it read and wrote, and the scalar fields of its
record) or FAIL (with the error) when it ends. The same functions run in Airflow tasks, in training pods,
in the CLI and in the demo, so every path emits the same events. The scoring service emits one event per
(scoring date, model version) it writes to its log.

Events are always written as files under `$MLOPS_HOME/lineage/` (OpenLineage's file transport layout: one
JSON event per file), which `mlops lineage` reads; with `lineage.url` set they are also posted to that
OpenLineage consumer (Marquez, or any other) by the OpenLineage client's HTTP transport. Emitting never
fails a step: a lost event is logged, and `mlops lineage` says where it had to fall back on the registry.

The events are built here as plain dicts in the OpenLineage 2-0-2 schema rather than with the client's
classes: importing `openlineage.client` loads every transport, in every task process on the arrival's
critical path (the `lineage` benchmark, docs/benchmarks.md). tests/unit/test_lineage_contract.py builds
the same events with the client's own classes and requires identical JSON; pyproject.toml pins the client
below its next minor.

Dataset names follow OpenLineage's naming: files and lake partitions as (`file`, absolute path); DVC
revisions in the namespace of the DVC remote, named `<member>@<revision>`; MLflow runs, model versions,
aliases and artifacts in the namespace of the tracking URI; feature views in the online store's.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from core.pod_results import POD_NAME_ENV
from core.residency import redact

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

PRODUCER = "https://github.com/mlops-fraud/mlops-fraud"
EVENT_SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
_FACETS = "https://openlineage.io/spec/facets/"
# Each standard facet this module writes, by its key, with the schema the OpenLineage client gives it.
FACET_SCHEMAS = {
    "parent": _FACETS + "1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet",
    "jobType": _FACETS + "2-0-4/JobTypeJobFacet.json#/$defs/JobTypeJobFacet",
    "version": _FACETS + "1-0-1/DatasetVersionDatasetFacet.json#/$defs/DatasetVersionDatasetFacet",
    "dataQualityAssertions": _FACETS
    + "1-1-0/DataQualityAssertionsDatasetFacet.json#/$defs/DataQualityAssertionsDatasetFacet",
    "errorMessage": _FACETS + "1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet",
    "outputStatistics": _FACETS
    + "1-0-2/OutputStatisticsOutputDatasetFacet.json#/$defs/OutputStatisticsOutputDatasetFacet",
}
# This product's own run facet: the step's record (its scalar fields) and, for training, what reproduces it.
RUN_FACET = "mlops"
RUN_FACET_SCHEMA = PRODUCER + "/blob/main/docs/lineage.md#the-mlops-run-facet"
EVENTS_DIR = "lineage"
START, COMPLETE, FAIL = "START", "COMPLETE", "FAIL"
# Airflow sets these in a task's environment; a pod gets the DAG run's ids from its task.
AIRFLOW_DAG, AIRFLOW_RUN, AIRFLOW_TASK = "AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID"
# Ids of Airflow's DAG runs as OpenLineage parents: a UUID made from the DAG and run ids, the same in every
# task of the run (OpenLineage wants a UUID; Airflow's run ids are not).
_AIRFLOW_RUN_IDS = uuid.UUID("6f1c0e52-6a55-4ad8-9f0e-2d3b8c1f4a77")

P = ParamSpec("P")
R = TypeVar("R")


def _facet(key: str, **fields: Any) -> dict[str, Any]:
    return {"_producer": PRODUCER, "_schemaURL": FACET_SCHEMAS[key], **fields}


@dataclass(frozen=True)
class Dataset:
    """An OpenLineage dataset: where it lives (`namespace`), what it is (`name`), and its facets."""

    namespace: str
    name: str
    facets: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    input_facets: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    output_facets: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    def as_input(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "facets": self.facets,
            "inputFacets": self.input_facets,
        }

    def as_output(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "facets": self.facets,
            "outputFacets": self.output_facets,
        }


@dataclass
class Datasets:
    """What one run of a step read and wrote; `facts` go to the run's `mlops` facet beside its record's."""

    inputs: list[Dataset] = field(default_factory=list)
    outputs: list[Dataset] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


# --- dataset names ----------------------------------------------------------------------------------------


def path(location: Path, *, rows: int | None = None, version: str | None = None) -> Dataset:
    """A file or a lake partition (a folder), by its absolute path; `rows` written (an output's statistics)
    and a `version` (a DVC hash) when known."""
    facets = {"version": _facet("version", datasetVersion=version)} if version else {}
    output = {"outputStatistics": _facet("outputStatistics", rowCount=rows)} if rows is not None else {}
    return Dataset("file", str(Path(location).absolute()), facets, output_facets=output)


def validated(dataset: Dataset, suite: dict[str, Any]) -> Dataset:
    """`dataset` as the input of a GX validation, with the suite's results as a data-quality facet."""
    assertions = [
        {
            "assertion": a["expectation"],
            "success": a["success"],
            "column": a.get("column"),
            "name": suite["suite"],
        }
        for a in suite.get("assertions", [])
    ]
    facet = _facet("dataQualityAssertions", assertions=assertions)
    return Dataset(dataset.namespace, dataset.name, dataset.facets, {"dataQualityAssertions": facet})


def dvc_revision(settings: Settings, member: str, rev: str) -> Dataset:
    """A DVC revision (pipelines/versioning.py record_revision) of `member` (e.g. `gold/event_date=...`),
    in the namespace of the DVC remote that holds it."""
    return Dataset(
        redact(settings.dvc_remote_url), f"{member}@{rev}", {"version": _facet("version", datasetVersion=rev)}
    )


def mlflow(settings: Settings, name: str, version: str | None = None) -> Dataset:
    """An MLflow object by its path in the tracking server (`runs/<id>`, `models/<name>/versions/<n>`,
    `models/<name>/aliases/<alias>`, `runs/<id>/artifacts/<path>`)."""
    facets = {"version": _facet("version", datasetVersion=version)} if version else {}
    return Dataset(redact(settings.mlflow_tracking_uri), name, facets)


def model_version(settings: Settings, model: str, version: str) -> Dataset:
    return mlflow(settings, f"models/{model}/versions/{version}")


def online_store(settings: Settings, view: str) -> Dataset:
    """A feature view in the profile's online store (SQLite file or Redis)."""
    where = (
        settings.cluster.redis_url if settings.online_store == "redis" else f"sqlite://{settings.feast_dir}"
    )
    return Dataset(redact(where), f"feature_views/{view}")


# --- events -----------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _scalars(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        return {}
    return {k: v for k, v in record.items() if isinstance(v, str | int | float | bool) or v is None}


def _parent() -> dict[str, Any]:
    dag_id, run_id = os.environ.get(AIRFLOW_DAG), os.environ.get(AIRFLOW_RUN)
    if not (dag_id and run_id):
        return {}
    parent = {
        # the empty facets as the client writes them
        "run": {"runId": str(uuid.uuid5(_AIRFLOW_RUN_IDS, f"{dag_id}/{run_id}")), "facets": {}},
        "job": {"namespace": "airflow", "name": dag_id, "facets": {}},
    }
    return {"parent": _facet("parent", **parent)}


def event(
    settings: Settings,
    job: str,
    run_id: str,
    kind: str,
    datasets: Datasets | None = None,
    run_facets: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One OpenLineage RunEvent, as the client's `Serde.to_dict` would write it (no null fields)."""
    datasets = datasets or Datasets()
    job_facets = {"jobType": _facet("jobType", processingType="BATCH", integration="MLOPS", jobType="TASK")}
    return _without_nulls(
        {
            "eventTime": _now(),
            "eventType": kind,
            "producer": PRODUCER,
            "schemaURL": EVENT_SCHEMA,
            "run": {"runId": run_id, "facets": {**_parent(), **(run_facets or {})}},
            "job": {"namespace": settings.lineage.namespace, "name": job, "facets": job_facets},
            "inputs": [d.as_input() for d in datasets.inputs],
            "outputs": [d.as_output() for d in datasets.outputs],
        }
    )


def _without_nulls(value: Any) -> Any:
    """What the client's serializer does: no null field, and no null or empty object in a list."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value if v is not None and v != {}]
    return value


# A pod of the cluster profile mounts the shared filesystem read-only: its events are kept here (at most
# RELAY_LIMIT, the oldest dropped and counted) and go back with its result through the pod results table
# (core/pod_results.py), and the Airflow task that launched it sends them (`relay`).
RELAY_LIMIT = 64
RELAY_KEY = "lineage_events"
_held: list[dict[str, Any]] = []
_dropped = [0]


def take_held() -> list[dict[str, Any]]:
    """The events this pod process kept for its launcher, emptied (and a note of any it had to drop)."""
    held, _held[:] = list(_held), []
    if _dropped[0]:
        log.warning(
            "lineage: %d events of this pod were dropped (more than %d held)", _dropped[0], RELAY_LIMIT
        )
        _dropped[0] = 0
    return held


def relay(settings: Settings, events: list[dict[str, Any]]) -> None:
    """Send the events a pod kept, as if emitted here (its launcher's task, which can write the files)."""
    for payload in events:
        emit(settings, payload, relayed=True)


def emit(settings: Settings, payload: dict[str, Any], relayed: bool = False) -> None:
    """Write the event under $MLOPS_HOME/lineage/ and post it to `lineage.url` when set; in a pod, keep it
    for the launching task instead. Never raises."""
    if not settings.lineage.enabled:
        return
    if os.environ.get(POD_NAME_ENV) and not relayed:
        if len(_held) >= RELAY_LIMIT:
            _held.pop(0)
            _dropped[0] += 1
        _held.append(payload)
        if payload["eventType"] == FAIL:  # a failed pod records no result: its log keeps the event
            log.warning("lineage event of this pod: %s", json.dumps(payload, sort_keys=True, default=str))
        return
    folder = settings.home / EVENTS_DIR
    name = f"{payload['eventTime'].replace(':', '')}-{payload['run']['runId']}-{payload['eventType']}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        scratch = folder / f".{name}.tmp"
        scratch.write_text(json.dumps(payload, sort_keys=True, default=str) + "\n")
        scratch.replace(folder / name)
    except (OSError, TypeError, ValueError):  # a full disk, a read-only folder, a value JSON cannot hold
        log.exception(
            "lineage: the %s event of %s cannot be written under %s",
            payload["eventType"],
            payload["job"]["name"],
            folder,
        )
    if settings.lineage.url:
        _post(settings, payload)


# After a post fails, this process posts nothing for `lineage.pause_s` (the events stay in the files): a
# consumer that is down costs one post's retries, not every step's.
_paused_until = [0.0]


def _post(settings: Settings, payload: dict[str, Any]) -> None:
    import time

    if time.monotonic() < _paused_until[0]:
        log.warning(
            "lineage: %s's %s event not posted (the consumer failed less than %.0f s ago); it is in "
            "the files",
            payload["job"]["name"],
            payload["eventType"],
            settings.lineage.pause_s,
        )
        return
    config = settings.lineage
    try:
        _http(config.url, config.endpoint, config.timeout_s, config.retries).emit(payload)
    except Exception:
        _paused_until[0] = time.monotonic() + config.pause_s
        log.exception(
            "lineage: the %s event of %s was not accepted by %s",
            payload["eventType"],
            payload["job"]["name"],
            redact(config.url or ""),
        )


@functools.cache
def _http(url: str, endpoint: str, timeout_s: float, retries: int):
    """The OpenLineage client's HTTP transport (one per process and consumer; it keeps its session)."""
    from openlineage.client.transport.http import HttpConfig, HttpTransport
    from openlineage.client.transport.http_common import DEFAULT_RETRY_CONFIG

    retry = {**DEFAULT_RETRY_CONFIG, "total": retries, "read": retries, "connect": retries}
    return HttpTransport(HttpConfig(url=url, endpoint=endpoint, timeout=timeout_s, retry=retry))


def _error(exc: BaseException) -> dict[str, Any]:
    trace = "".join(traceback.format_exception(exc))[-8000:]
    return {
        "errorMessage": _facet(
            "errorMessage", message=str(exc)[:2000], programmingLanguage="python", stackTrace=trace
        )
    }


def _mlops(facts: dict[str, Any]) -> dict[str, Any]:
    return {RUN_FACET: {"_producer": PRODUCER, "_schemaURL": RUN_FACET_SCHEMA, **facts}}


def emits(
    job: str, datasets: Callable[..., Datasets]
) -> Callable[[Callable[Concatenate[Settings, P], R]], Callable[Concatenate[Settings, P], R]]:
    """Decorate a step `step(settings, *args)`: START when it begins; when it returns, COMPLETE with
    `datasets(settings, result, *args, **kwargs)` (what it read and wrote) and the scalar fields of its
    record; FAIL with the error when it raises. A failure to describe the datasets is logged and the
    COMPLETE event sent without them: lineage never fails the step."""

    def decorate(step: Callable[Concatenate[Settings, P], R]) -> Callable[Concatenate[Settings, P], R]:
        @functools.wraps(step)
        def run(settings: Settings, *args: P.args, **kwargs: P.kwargs) -> R:
            if not settings.lineage.enabled:
                return step(settings, *args, **kwargs)
            run_id = str(uuid.uuid4())
            emit(settings, event(settings, job, run_id, START))
            try:
                result = step(settings, *args, **kwargs)
            except BaseException as exc:
                emit(settings, event(settings, job, run_id, FAIL, run_facets=_error(exc)))
                raise
            try:
                found = datasets(settings, result, *args, **kwargs)
            except Exception:
                log.exception("lineage: the datasets of %s could not be described", job)
                found = Datasets(facts={"lineage_error": "datasets not described; see the task's log"})
            facts = {**_scalars(result), **found.facts}
            emit(settings, event(settings, job, run_id, COMPLETE, found, _mlops(facts)))
            return result

        return run

    return decorate


def emit_once(settings: Settings, job: str, datasets: Datasets) -> None:
    """A run that is over as it is described (the scoring service's day of a version): one COMPLETE."""
    emit(settings, event(settings, job, str(uuid.uuid4()), COMPLETE, datasets, _mlops(datasets.facts)))


# --- reading ----------------------------------------------------------------------------------------------


def read_events(settings: Settings, kinds: Iterable[str] = (COMPLETE,)) -> list[dict[str, Any]]:
    """The events under $MLOPS_HOME/lineage/ of the given types, oldest first; an unreadable file is
    skipped with a warning naming it."""
    folder = settings.home / EVENTS_DIR
    wanted = set(kinds)
    found = []
    for file in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        if not any(file.name.endswith(f"-{kind}.json") for kind in wanted):
            continue
        try:
            found.append(json.loads(file.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("lineage: %s is not a readable event (%s); left out", file, exc)
    return sorted(found, key=lambda e: e["eventTime"])
