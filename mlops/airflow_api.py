"""A small client of Airflow 3's REST API (v2) for `mlops demo`: log in, unpause, backfill, follow runs
through their asset events, read task instances and XComs.

Authentication is the simple auth manager's: POST /auth/token with a user's password returns a JWT that
every /api/v2 call carries as a bearer token. The tests use the official `apache-airflow-client` against
the same API; the demo does not depend on it (it is a dev dependency).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from datetime import time as clock_time
from typing import Any

import httpx

FINISHED = {"success", "failed"}
# SQLite serializes writers: while another component holds the lock the API answers 503 "database is
# locked" (backfill creation says so) or 500 "Database error". Such calls are retried for this long.
LOCKED_RETRY_SECONDS = 60.0


class AirflowAPIError(RuntimeError):
    """A call to Airflow's REST API failed; the message names the call, the answer and what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AirflowAPI:
    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        answer = httpx.post(
            f"{self.base_url}/auth/token", json={"username": username, "password": password}, timeout=timeout
        )
        if answer.status_code != 201:
            raise AirflowAPIError(
                f"login to {self.base_url} as {username!r} failed ({answer.status_code}: "
                f"{answer.text[:200]}); the password is in "
                "$MLOPS_HOME/airflow/simple_auth_manager_passwords.json.generated"
            )
        self.client = httpx.Client(
            base_url=f"{self.base_url}/api/v2",
            headers={"Authorization": f"Bearer {answer.json()['access_token']}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self.client.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        deadline = time.monotonic() + LOCKED_RETRY_SECONDS
        while True:
            answer = self.client.request(method, path, **kwargs)
            locked = (answer.status_code == 503 and "locked" in answer.text) or (
                answer.status_code == 500 and "Database error" in answer.text
            )
            if not locked or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if answer.is_error:
            raise AirflowAPIError(
                f"{method} {self.base_url}/api/v2{path} answered {answer.status_code}: {answer.text[:500]}",
                answer.status_code,
            )
        return answer.json() if answer.content else None

    # DAGs
    def dags(self) -> dict[str, dict]:
        return {dag["dag_id"]: dag for dag in self.call("GET", "/dags", params={"limit": 100})["dags"]}

    def import_errors(self) -> list[dict]:
        return self.call("GET", "/importErrors", params={"limit": 100})["import_errors"]

    def unpause(self, dag_id: str) -> None:
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def backfill(self, dag_id: str, first: date, last: date, max_active_runs: int = 1) -> dict:
        """One run per schedule interval that starts in [first, last], oldest first."""
        body = {
            "dag_id": dag_id,
            "from_date": _midnight(first),
            "to_date": _midnight(last),
            "run_backwards": False,
            "reprocess_behavior": "none",
            "max_active_runs": max_active_runs,
        }
        try:
            return self.call("POST", "/backfills", json=body)
        except AirflowAPIError as exc:
            # A retried request whose first try was committed after all: that backfill is the one.
            if exc.status != 409:
                raise
            for backfill in self.call("GET", "/backfills", params={"dag_id": dag_id})["backfills"]:
                same = (backfill["from_date"][:10], backfill["to_date"][:10]) == (str(first), str(last))
                if same and backfill["completed_at"] is None:
                    return backfill
            raise

    def trigger(self, dag_id: str, conf: dict | None = None) -> dict:
        return self.call("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})

    # Runs
    def dag_runs(self, dag_id: str, **params: Any) -> list[dict]:
        params.setdefault("limit", 100)
        params.setdefault("order_by", "run_after")
        return self.call("GET", f"/dags/{dag_id}/dagRuns", params=params)["dag_runs"]

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        answer = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        return {ti["task_id"]: ti for ti in answer["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.call("GET", path, params={"deserialize": True})["value"]

    def asset_events(self, source_dag_id: str, source_run_id: str) -> list[dict]:
        params = {"source_dag_id": source_dag_id, "source_run_id": source_run_id, "limit": 100}
        return self.call("GET", "/assets/events", params=params)["asset_events"]

    # Waiting
    def wait_for_run(
        self, dag_id: str, run_id: str, deadline: float, on_wait: Callable[[], None] | None = None
    ):
        """The run once it has finished (success or failed)."""
        return wait_until(
            lambda: _finished(self.dag_run(dag_id, run_id)),
            deadline,
            f"DAG run {dag_id} / {run_id} to finish",
            on_wait,
        )

    def wait_for_created_runs(
        self, source_dag_id: str, source_run_id: str, asset: str, deadline: float
    ) -> list[dict]:
        """The runs that the asset events of `asset` emitted by a run scheduled (empty if it emitted none)."""

        def created() -> list[dict] | None:
            try:
                events = [e for e in self.asset_events(source_dag_id, source_run_id) if e["name"] == asset]
            except AirflowAPIError as exc:
                if exc.status != 500:
                    raise
                # Airflow 3.3 answers 500 while a run that an event created is still queued (its start_date
                # is empty: apache/airflow#71360, fixed after 3.3.2). The run starts once its DAG has room.
                return None
            if any(not e["created_dagruns"] for e in events):
                return None  # the scheduler has not consumed it yet (the consumer may be at max_active_runs)
            return [run for e in events for run in e["created_dagruns"]]

        return wait_until(
            created, deadline, f"the {asset} event of {source_dag_id} / {source_run_id} to start a run"
        )


def _finished(run: dict) -> dict | None:
    return run if run["state"] in FINISHED else None


def _midnight(day: date) -> str:
    return datetime.combine(day, clock_time.min, tzinfo=UTC).isoformat()


def wait_until(
    condition: Callable[[], Any], deadline: float, what: str, on_wait: Callable[[], None] | None = None
):
    """Poll `condition` every 2 s until it returns something truthy; fail at the deadline naming `what`."""
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        if on_wait:
            on_wait()
        time.sleep(2.0)
