"""Airflow 3's REST API (v2) for `mlops demo`, through the official client (`apache-airflow-client`, the
server's minor version): log in, unpause, backfill, follow runs through their asset events, read task
instances and XComs. Answers are the client's models (DAGRunResponse, TaskInstanceResponse, ...).

Authentication is the simple auth manager's: POST /auth/token with a user's password returns a JWT that
every /api/v2 call carries as a bearer token. The client has no call for that endpoint (its LoginApi only
redirects a browser to the auth manager's login page), so the login is one POST through the client's own
HTTP layer (ApiClient.param_serialize / call_api): same transport, same errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from datetime import time as clock_time
from typing import Any, TypeVar, cast

from airflow_client.client import (
    ApiClient,
    AssetApi,
    BackfillApi,
    BackfillPostBody,
    Configuration,
    DAGApi,
    DAGPatchBody,
    DagRunApi,
    DagRunAssetReference,
    DAGRunResponse,
    DagRunState,
    ImportErrorApi,
    ImportErrorResponse,
    ReprocessBehavior,
    TaskInstanceApi,
    TaskInstanceResponse,
    TriggerDAGRunPostBody,
    XComApi,
)
from airflow_client.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

T = TypeVar("T")
FINISHED = {DagRunState.SUCCESS, DagRunState.FAILED}
PAGE = 100  # list calls page through their answers this many items at a time
# SQLite serializes writers: while another component holds the lock the API answers 503 "database is
# locked" (backfill creation says so) or 500 "Database error". Such calls are retried for this long.
LOCKED_RETRY_SECONDS = 60.0
WHAT_TO_DO = {
    401: "the login token was refused (expired?): run the command again to log in anew",
    403: "the user may not do this: log in as the admin user of the simple auth manager",
    404: "no such DAG, run, task or XCom: check that the dag-processor parsed dags/ (Airflow UI, "
    "Browse > DAG import errors) and that the run got this far",
}
SERVER_TROUBLE = "read the api-server's log: $MLOPS_HOME/run/api-server.log"


class AirflowAPIError(RuntimeError):
    """A call to Airflow's REST API failed; the message names the call, the answer and what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AirflowAPI:
    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.client = ApiClient(Configuration(host=self.base_url))
        self.client.configuration.access_token = self._login(username, password)
        self.dags_api = DAGApi(self.client)
        self.import_errors_api = ImportErrorApi(self.client)
        self.backfills_api = BackfillApi(self.client)
        self.runs_api = DagRunApi(self.client)
        self.task_instances_api = TaskInstanceApi(self.client)
        self.xcoms_api = XComApi(self.client)
        self.assets_api = AssetApi(self.client)
        # Run before each poll of the waits below (the demo sets a watchdog of the stack's processes).
        self.on_poll: Callable[[], None] | None = None

    def _login(self, username: str, password: str) -> str:
        request = self.client.param_serialize(
            "POST",
            "/auth/token",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body={"username": username, "password": password},
        )
        where = f"{self.base_url}/auth/token as {username!r}"
        try:
            answer = self.client.call_api(*request, _request_timeout=self.timeout)
            answer.read()
            # "object" deserializes to the JSON object; the client annotates `data` as the generic default.
            token = cast(dict[str, Any], self.client.response_deserialize(answer, {"201": "object"}).data)
            return token["access_token"]
        except ApiException as exc:
            raise AirflowAPIError(
                f"login to {where} failed ({exc.status}: {_body(exc)}); the password is in "
                "$MLOPS_HOME/airflow/simple_auth_manager_passwords.json.generated",
                exc.status,
            ) from exc
        except TransportError as exc:
            raise AirflowAPIError(f"login to {where}: {_no_answer(exc)}") from exc

    def close(self) -> None:
        self.client.rest_client.pool_manager.clear()

    def call(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One call of the client (a method of one of its *Api classes), retried while SQLite is locked;
        any failure as an AirflowAPIError naming the call, the answer and what to do."""
        deadline = time.monotonic() + LOCKED_RETRY_SECONDS
        while True:
            try:
                return call(*args, _request_timeout=self.timeout, **kwargs)
            except ApiException as exc:
                if _locked(exc) and time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                advice = WHAT_TO_DO.get(exc.status or 0) or (
                    SERVER_TROUBLE if (exc.status or 0) >= 500 else "the answer says why"
                )
                raise AirflowAPIError(
                    f"{_named(call, args, kwargs)} to Airflow at {self.base_url} answered {exc.status}: "
                    f"{_body(exc)}; {advice}",
                    exc.status,
                ) from exc
            except TransportError as exc:
                raise AirflowAPIError(f"{_named(call, args, kwargs)}: {_no_answer(exc)}") from exc

    def _every(self, call: Callable[..., Any], field: str, *args: Any, **kwargs: Any) -> list:
        """All items of a list call, a page at a time."""
        items: list = []
        while True:
            page = getattr(self.call(call, *args, limit=PAGE, offset=len(items), **kwargs), field)
            items += page
            if len(page) < PAGE:
                return items

    # DAGs
    def dag_ids(self) -> set[str]:
        return {dag.dag_id for dag in self._every(self.dags_api.get_dags, "dags")}

    def import_errors(self) -> list[ImportErrorResponse]:
        return self._every(self.import_errors_api.get_import_errors, "import_errors")

    def unpause(self, dag_id: str) -> None:
        self.call(self.dags_api.patch_dag, dag_id, DAGPatchBody(is_paused=False), update_mask=["is_paused"])

    def backfill(self, dag_id: str, first: date, last: date, max_active_runs: int = 1) -> None:
        """One run per schedule interval that starts in [first, last], oldest first."""
        body = BackfillPostBody(
            dag_id=dag_id,
            from_date=midnight(first),
            to_date=midnight(last),
            run_backwards=False,
            reprocess_behavior=ReprocessBehavior.NONE,
            max_active_runs=max_active_runs,
        )
        try:
            self.call(self.backfills_api.create_backfill, body)
        except AirflowAPIError as exc:
            # A retried request whose first try was committed after all: that backfill is the one.
            if exc.status != 409:
                raise
            backfills = self._every(self.backfills_api.list_backfills, "backfills", dag_id)
            if not any(
                (b.from_date.date(), b.to_date.date()) == (first, last) and b.completed_at is None
                for b in backfills
            ):
                raise

    # Runs
    def trigger(self, dag_id: str, conf: dict[str, Any], logical_date: datetime | None = None) -> str:
        """Start a run of `dag_id` with `conf` (its params); returns the run id."""
        body = TriggerDAGRunPostBody(conf=conf, logical_date=logical_date or datetime.now(UTC))
        return self.call(self.runs_api.trigger_dag_run, dag_id, body).dag_run_id

    def dag_runs(self, dag_id: str, **filters: Any) -> list[DAGRunResponse]:
        """The DAG's runs, oldest first; `filters` are get_dag_runs's (run_type=[...], ...)."""
        return self._every(self.runs_api.get_dag_runs, "dag_runs", dag_id, order_by=["run_after"], **filters)

    def dag_run(self, dag_id: str, run_id: str) -> DAGRunResponse:
        return self.call(self.runs_api.get_dag_run, dag_id, run_id)

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskInstanceResponse]:
        """Every task instance of the run: a mapped task has one per map index (map_index 0..n-1)."""
        return self._every(self.task_instances_api.get_task_instances, "task_instances", dag_id, run_id)

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> TaskInstanceResponse:
        """The task instance of a task that is not mapped."""
        return self.call(self.task_instances_api.get_task_instance, dag_id, run_id, task_id)

    def xcom(
        self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1
    ) -> Any:
        """An XCom's value; a mapped task has one per map index."""
        entry = self.call(
            self.xcoms_api.get_xcom_entry,
            dag_id=dag_id,
            dag_run_id=run_id,
            task_id=task_id,
            xcom_key=key,
            map_index=map_index,
            deserialize=True,
        )
        if entry.actual_instance is None:
            raise AirflowAPIError(f"XCom {key!r} of {dag_id}/{run_id}/{task_id}[{map_index}] came back empty")
        return entry.actual_instance.value  # the API answers one of two schemas (native or string value)

    # Assets
    def post_asset_event(self, uri: str, extra: dict[str, Any]) -> tuple[int, int]:
        """Record an event of the asset `uri` (as a producer outside Airflow does); returns (asset id,
        event id). The asset must be known: a parsed DAG uses it."""
        from airflow_client.client.models.create_asset_events_body import CreateAssetEventsBody

        assets = self.call(self.assets_api.get_assets, uri_prefix_pattern=uri).assets
        found = [a for a in assets if a.uri == uri]
        if not found:
            raise AirflowAPIError(
                f"Airflow at {self.base_url} knows no asset {uri}; it is registered when a DAG using it "
                "is parsed"
            )
        event = self.call(
            self.assets_api.create_asset_event, CreateAssetEventsBody(asset_id=found[0].id, extra=extra)
        )
        return found[0].id, event.id

    def wait_for_event_runs(
        self, asset_id: int, event_id: int, deadline: float
    ) -> list[DagRunAssetReference]:
        """The runs an asset event scheduled, once the scheduler has consumed it."""

        def created() -> list[DagRunAssetReference] | None:
            events = self._every(self.assets_api.get_asset_events, "asset_events", asset_id=asset_id)
            mine = [e for e in events if e.id == event_id]
            return mine[0].created_dagruns if mine and mine[0].created_dagruns else None

        return wait_until(created, deadline, f"asset event {event_id} to start a run", self.on_poll)

    # Waiting
    def wait_for_run(self, dag_id: str, run_id: str, deadline: float) -> DAGRunResponse:
        """The run once it has finished (success or failed)."""
        return wait_until(
            lambda: _finished(self.dag_run(dag_id, run_id)),
            deadline,
            f"DAG run {dag_id} / {run_id} to finish",
            self.on_poll,
        )

    def wait_for_created_runs(
        self, source_dag_id: str, source_run_id: str, asset: str, deadline: float
    ) -> list[DagRunAssetReference]:
        """The runs that the asset events of `asset` emitted by a run scheduled (empty if it emitted none)."""

        def created() -> list[DagRunAssetReference] | None:
            try:
                events = self._every(
                    self.assets_api.get_asset_events,
                    "asset_events",
                    source_dag_id=source_dag_id,
                    source_run_id=source_run_id,
                )
            except AirflowAPIError as exc:
                if exc.status != 500:
                    raise
                # Airflow 3.3 answers 500 while a run that an event created is still queued (its start_date
                # is empty: apache/airflow#71360, fixed after 3.3.2). The run starts once its DAG has room.
                return None
            events = [e for e in events if e.name == asset]
            if any(not e.created_dagruns for e in events):
                return None  # the scheduler has not consumed it yet (the consumer may be at max_active_runs)
            return [run for e in events for run in e.created_dagruns]

        return wait_until(
            created,
            deadline,
            f"the {asset} event of {source_dag_id} / {source_run_id} to start a run",
            self.on_poll,
        )


def _finished(run: DAGRunResponse) -> DAGRunResponse | None:
    return run if run.state in FINISHED else None


def _locked(exc: ApiException) -> bool:
    body = exc.body or ""
    return (exc.status == 503 and "locked" in body) or (exc.status == 500 and "Database error" in body)


def _body(exc: ApiException) -> str:
    return (exc.body or exc.reason or "no body")[:500]


def _no_answer(exc: Exception) -> str:
    return f"no answer ({exc}); is the stack up? `make up` starts it, then {SERVER_TROUBLE}"


def _named(call: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """`DagRunApi.get_dag_run('ingest_transactions', 'backfill__...')`: the client call, for messages."""
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{getattr(call, '__qualname__', call)}({', '.join(shown)})"[:300]


def midnight(day: date) -> datetime:
    return datetime.combine(day, clock_time.min, tzinfo=UTC)


def wait_until(
    condition: Callable[[], T | None],
    deadline: float,
    what: str,
    on_poll: Callable[[], None] | None = None,
) -> T:
    """Poll `condition` every 2 s until it returns something truthy; fail at the deadline naming `what`.
    `on_poll` runs before each poll (the demo's watchdog of the stack's processes)."""
    while True:
        if on_poll is not None:
            on_poll()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(2.0)
