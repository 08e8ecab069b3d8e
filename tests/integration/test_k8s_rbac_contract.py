"""The RBAC contract of the cluster profile's pod tasks: every Kubernetes API request the retrain DAG's
`train` task really makes is one the Roles in infra/ grant to the service account that makes it.

The `train` task is parsed from the DAG file under the cluster profile, exactly as the DAG builds it (a
deferrable TrainingPodOperator, durable, deleting its pod, logs on, no XCom sidecar), and pointed through an
Airflow connection at a small HTTP server on 127.0.0.1 that answers as the Kubernetes API does and records
every request. The provider's own code paths then run against it, phase by phase, each tagged with who makes
its requests in the cluster:

- worker: `execute` builds the pod, looks for one to reattach to (durable), creates it and defers;
- triggerer: the trigger, serialized and rebuilt from its classpath as the triggerer does, follows the pod
  from Pending through Running to Succeeded (reading the pod, watching its events) until its first event;
- worker: `trigger_reentry` reads the pod and its logs, reads the pod's result from the pod results table
  (PostgreSQL), and deletes the pod;
- worker: a retry that reattaches: the pod of an earlier try is still running, and the retry finds it by the
  identity in the task state store, or by its labels, and creates no second pod;
- triggerer: a user kills the deferred task, and the trigger's on_kill deletes the pod;
- worker: resumed after a pod failed: logs, the pod labelled as checked (a patch), deleted, the task fails.

Each recorded request is mapped to its authorization attributes (verb, resource/subresource, namespace) as
the API server's request-info resolver does, and checked against each overlay's rendered Roles and
RoleBindings (and any ClusterRoles and ClusterRoleBindings) with the RBAC authorizer's matching rules:
worker phases as system:serviceaccount:mlops-orchestration:airflow-worker, the triggerer phase as
system:serviceaccount:mlops-orchestration:airflow-triggerer. A second test removes one needed grant at a time
and shows the same check reports the denial.

In the cluster the task reaches the API server in-cluster with its pod's service account token; here it uses
a connection with a kubeconfig and a bearer token, which changes how the client authenticates, not which
requests it makes. What only a real API server can still show: authentication (that the token really is
that service account's), admission and Pod Security (test_retrain_pod.py checks the pod against the
restricted profile and the quotas, but not through the admission chain), scheduling and the kubelet (image
pulls, GPU placement, real pod phases), real watch semantics (resource versions, bookmarks, 410 Gone,
long-lived streams) and kubelet log streaming (`follow=true` on a running container). The fake answers
enough of the API to drive the client code; it does not prove the client handles every real response.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import itertools
import json
import re
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from core.settings import get_settings
from orchestration import k8s_contract as contract
from tests.integration.conftest import OVERLAYS, find, one
from tests.integration.test_retrain_pod import (
    DAG_ID,
    MLFLOW_RUN,
    RUN_ID,
    TRAINING_SET_REV,
    TRIGGERED_BY,
    StandInTaskInstance,
    parse_train_task,
)

CONN_ID = "k8s_contract"
TOKEN = "contract-test-token"  # what the kubeconfig's user presents (a service account token in the cluster)
# What the node reports as the trainer's image once it ran: the image by digest.
IMAGE_ID = f"registry.example.com/{contract.TRAINING_IMAGE_REPOSITORY}@sha256:" + "3c" * 32
LOG_LINES = ["epoch 1/2 loss=0.41", "epoch 2/2 loss=0.27", '{"status": "trained"}']
# Each phase of the task's life -> the service account that makes its requests in the cluster.
PHASE_ACCOUNT = {
    "worker: execute": contract.AIRFLOW_WORKER_SERVICE_ACCOUNT,
    "triggerer: trigger run": contract.AIRFLOW_TRIGGERER_SERVICE_ACCOUNT,
    "worker: trigger_reentry": contract.AIRFLOW_WORKER_SERVICE_ACCOUNT,
    "worker: retry that reattaches": contract.AIRFLOW_WORKER_SERVICE_ACCOUNT,
    "triggerer: on_kill": contract.AIRFLOW_TRIGGERER_SERVICE_ACCOUNT,
    "worker: trigger_reentry, pod failed": contract.AIRFLOW_WORKER_SERVICE_ACCOUNT,
}


# --- a Kubernetes API server, just enough of it, that records every request -------------------------------


@dataclass(frozen=True)
class Recorded:
    phase: str
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Whether a label selector of equality terms (`k=v`, `k==v`, `k!=v`, `!k`, `k`) selects these labels, as
    the API server filters a list: `k!=v` also selects objects without `k`."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class FakeKubeApi:
    """Pods and events in namespaces, over plain HTTP. A pod's phase follows a script: each GET of the pod
    shows the next phase of `scripts[(namespace, name)]` (the last one stays), so the test decides how far a
    pod has got by the time each reader looks. A pod in `hold_for_events` shows its current phase without
    moving on until its events have been read (listed or watched), for at most that many GETs: the trigger
    watches a pod's events only while it waits for the pod to start, however fast the machine is."""

    phase: str = "setup"
    requests: list[Recorded] = field(default_factory=list)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    scripts: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    hold_for_events: dict[tuple[str, str], int] = field(default_factory=dict)
    events_read: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closing: threading.Event = field(default_factory=threading.Event)  # set when the server stops
    versions: Iterator[int] = field(default_factory=lambda: itertools.count(1000))

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Requests arriving meanwhile are recorded as `phase`'s (who makes them in the cluster)."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def recorded(self, phase: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if phase is None or r.phase == phase]

    # -- pods --------------------------------------------------------------------------------------------

    def add_pod(self, pod: dict[str, Any], namespace: str, script: list[str]) -> dict[str, Any]:
        metadata = pod.setdefault("metadata", {})
        if not metadata.get("name"):
            metadata["name"] = metadata.get("generateName", "pod-") + uuid.uuid4().hex[:5]
        metadata.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
        pod.update(kind="Pod", apiVersion="v1")
        key = (namespace, metadata["name"])
        self.pods[key] = pod
        self.scripts[key] = list(script)
        self._set_phase(pod, self.scripts[key][0])
        return pod

    def _set_phase(self, pod: dict[str, Any], phase: str) -> None:
        """The pod's status as the kubelet reports it in `phase`: the base container waiting, running, or
        terminated (exit code 0, or 1 when Failed), with the image id (the digest) the node pulled."""
        container = contract.TRAINING_CONTAINER
        image = next(c["image"] for c in pod["spec"]["containers"] if c["name"] == container)
        started = pod["metadata"]["creationTimestamp"]
        state: dict[str, Any] = {
            "Pending": {"waiting": {"reason": "ContainerCreating"}},
            "Running": {"running": {"startedAt": started}},
            "Succeeded": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": started,
                    "finishedAt": _now(),
                }
            },
            "Failed": {
                "terminated": {"exitCode": 1, "reason": "Error", "startedAt": started, "finishedAt": _now()}
            },
        }[phase]
        pod["status"] = {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": container,
                    "image": image,
                    "imageID": "" if phase == "Pending" else IMAGE_ID,
                    "ready": phase == "Running",
                    "restartCount": 0,
                    "started": phase == "Running",
                    "state": state,
                }
            ],
        }
        pod["metadata"]["resourceVersion"] = str(next(self.versions))

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: bytes):
        """(HTTP status, JSON object or raw bytes) for one request; what is shared is answered as a copy."""
        match = re.fullmatch(r"/api/v1/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path)
        if not match:
            return 404, _status(404, "NotFound", f"the fake API serves no {path}")
        namespace, resource, name, subresource = match.groups()
        watching = query_flag(query, "watch")
        with self.lock:
            if resource == "pods":
                code, payload = self._pods(method, namespace, name, subresource, query, body, watching)
                return code, copy.deepcopy(payload)
        if resource == "events" and method == "GET" and name is None:
            selector = query.get("fieldSelector", [""])[0]
            if selector.startswith("involvedObject.name="):
                with self.lock:
                    self.events_read.add((namespace, selector.split("=", 1)[1]))
            if watching:
                # A watch that sees no event before its timeoutSeconds ends with an empty body: it stays
                # open that long (at most 0.2 s here, so a client that reconnects does not spin), or until
                # the server stops.
                self.closing.wait(min(float(query.get("timeoutSeconds", ["1"])[0]), 0.2))
                return 200, b""
            rv = str(next(self.versions))
            return 200, {
                "kind": "EventList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": rv},
                "items": [],
            }
        return 404, _status(404, "NotFound", f"the fake API serves no {method} {path}")

    def _pods(self, method, namespace, name, subresource, query, body, watching):
        key = (namespace, name)
        if name is None:
            if method == "POST":
                pod = json.loads(body)
                if (namespace, pod["metadata"].get("name")) in self.pods:
                    return 409, _status(409, "AlreadyExists", f'pods "{pod["metadata"]["name"]}" exists')
                return 201, self.add_pod(pod, namespace, ["Pending"])
            if method == "GET" and not watching:
                selector = query.get("labelSelector", [""])[0]
                items = [p for (ns, _), p in self.pods.items() if ns == namespace
                         and selector_matches(selector, p["metadata"].get("labels") or {})]  # fmt: skip
                meta = {"resourceVersion": str(next(self.versions))}
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
        elif key not in self.pods:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        elif subresource == "log" and method == "GET":
            return 200, ("\n".join(LOG_LINES) + "\n").encode()
        elif subresource is None and method == "GET":
            script = self.scripts[key]
            held = self.hold_for_events.get(key, 0) > 0 and key not in self.events_read
            if held:
                self.hold_for_events[key] -= 1
            self._set_phase(self.pods[key], script[0])
            if len(script) > 1 and not held:
                script.pop(0)
            return 200, self.pods[key]
        elif subresource is None and method == "PATCH":
            labels = (json.loads(body).get("metadata") or {}).get("labels") or {}
            self.pods[key]["metadata"].setdefault("labels", {}).update(labels)
            return 200, self.pods[key]
        elif subresource is None and method == "DELETE":
            pod = self.pods.pop(key)
            pod["metadata"]["deletionTimestamp"] = _now()
            return 200, pod
        return 405, _status(405, "MethodNotAllowed", f"the fake API serves no {method} on pods")


@contextmanager
def serving(api: FakeKubeApi) -> Iterator[str]:
    """The fake API on a free port of 127.0.0.1; yields its address."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query, keep_blank_values=True)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            api.requests.append(
                Recorded(api.phase, self.command, url.path, query, self.headers.get("Authorization"))
            )
            code, payload = api.answer(self.command, url.path, query, body)
            if isinstance(payload, bytes):
                content_type = "application/json" if url.path.endswith("/events") else "text/plain"
                data = payload
            else:
                content_type, data = "application/json", json.dumps(payload).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on it (a cancelled event watch)

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def do_PATCH(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        api.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --- what the API server authorizes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Attributes:
    """A request's authorization attributes, as the API server's request-info resolver derives them."""

    verb: str
    api_group: str | None = None  # None: a non-resource request (path below)
    resource: str = ""
    subresource: str = ""
    namespace: str | None = None
    name: str | None = None
    path: str = ""

    def __str__(self) -> str:
        if self.api_group is None:
            return f"{self.verb} {self.path} (non-resource)"
        what = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        group = f" ({self.api_group})" if self.api_group else ""
        where = f" in {self.namespace}" if self.namespace else " (cluster-wide)"
        return f"{self.verb} {what}{group}{where}"


_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# What follows a namespace's name that is its own subresource, not a resource in it.
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}


def query_flag(query: dict[str, list[str]], name: str) -> bool:
    """A boolean query parameter as the API server decodes it: absent, `false` (any case) or `0` is false,
    any other value (even an empty one) true."""
    values = query.get(name)
    return bool(values) and values[0] != "0" and values[0].lower() != "false"


def request_attributes(method: str, path: str, query: dict[str, list[str]]) -> Attributes:
    """A request's authorization attributes, as the API server's RequestInfoFactory resolves them:
    /api/v1/[namespaces/{ns}/]{resource}[/{name}[/{subresource}]] (or /apis/{group}/{version}/...); POST is
    create, GET get, PUT update, PATCH patch, DELETE delete. A GET or DELETE without a name is on the
    collection: list, or watch when `watch` is set (true, 1, ...), or deletecollection; a collection GET
    whose fieldSelector pins metadata.name names that object (for resourceNames). A named GET stays get,
    watch or not. Anything else (discovery, /version, /healthz) is a non-resource request."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return Attributes(verb=method.lower(), path=path)
    verb = _VERBS[method]
    if rest[0] == "watch":  # the deprecated /api/v1/watch/... paths
        verb, rest = "watch", rest[1:]
    namespace = None
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource, name, subresource = [*rest, "", "", ""][:3]
    if not name and verb == "get":
        verb = "watch" if query_flag(query, "watch") else "list"
        for term in query.get("fieldSelector", [""])[0].split(","):
            key, _, value = term.replace("==", "=").partition("=")
            if key.strip() == "metadata.name" and value:
                name = value.strip()
    elif not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, group, resource, subresource, namespace, name or None, path)


def _binds(binding: dict[str, Any], account: str, account_namespace: str) -> bool:
    """Whether the binding's subjects include the service account (by kind, user name or group)."""
    user = f"system:serviceaccount:{account_namespace}:{account}"
    groups = {"system:serviceaccounts", f"system:serviceaccounts:{account_namespace}", "system:authenticated"}
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "ServiceAccount" and name == account and subject.get("namespace") == account_namespace:
            return True
        if (kind == "User" and name == user) or (kind == "Group" and name in groups):
            return True
    return False


def granted_rules(objects, account: str, namespace: str | None, account_namespace: str) -> list[dict]:
    """The policy rules the service account holds in `namespace` (None: cluster-wide): the rules of the
    Roles and ClusterRoles that RoleBindings there, and ClusterRoleBindings anywhere, bind it to."""
    bindings = find(objects, "ClusterRoleBinding")
    if namespace is not None:
        bindings += find(objects, "RoleBinding", namespace=namespace)
    rules = []
    for binding in bindings:
        if not _binds(binding, account, account_namespace):
            continue
        ref = binding["roleRef"]
        if ref["kind"] == "Role" and binding["kind"] == "RoleBinding":
            roles = find(objects, "Role", ref["name"], binding["metadata"]["namespace"])
        elif ref["kind"] == "ClusterRole":
            roles = find(objects, "ClusterRole", ref["name"])
        else:
            roles = []  # a ClusterRoleBinding cannot grant a Role: the authorizer ignores it
        for role in roles:  # a binding to a role that does not exist grants nothing
            rules += role.get("rules") or []
    return rules


def rule_allows(rule: dict[str, Any], request: Attributes) -> bool:
    """The RBAC authorizer's rule matching: verbs, apiGroups ("" is core), resources (`res/sub`, `*`,
    `*/sub`), resourceNames (absent: any name; present: only requests that name one of them, so never a
    create, list or watch), nonResourceURLs (exact or a `prefix*`)."""
    verbs = rule.get("verbs") or []
    if "*" not in verbs and request.verb not in verbs:
        return False
    if request.api_group is None:
        return any(
            url == "*" or url == request.path or (url.endswith("*") and request.path.startswith(url[:-1]))
            for url in rule.get("nonResourceURLs") or []
        )
    groups = rule.get("apiGroups") or []
    if "*" not in groups and request.api_group not in groups:
        return False
    resources = rule.get("resources") or []
    combined = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    if not (
        "*" in resources
        or combined in resources
        or (request.subresource and f"*/{request.subresource}" in resources)
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or request.name in names


def rbac_denials(objects, requests: Iterable[tuple[str, Attributes]]) -> list[str]:
    """Every (phase, request) the rendered RBAC objects do not allow the phase's service account, as
    `<account> may not <verb> <resource> in <namespace> [<phase>]`; empty when all are allowed."""
    denied = []
    for phase, request in sorted(set(requests), key=str):
        account = PHASE_ACCOUNT[phase]
        rules = granted_rules(objects, account, request.namespace, contract.ORCHESTRATION_NAMESPACE)
        if not any(rule_allows(rule, request) for rule in rules):
            denied.append(f"{account} may not {request} [{phase}]")
    return denied


# --- the train task, run against the fake API --------------------------------------------------------------


class TaskStateStore:
    """Airflow 3.3's task state store as the operator uses it (durable: the pod it created, per task)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


class ContractTaskInstance(StandInTaskInstance):
    """The task instance of the run's `train` task: what the operator reads of it and what it pushes."""

    def __init__(self, try_number: int) -> None:
        self.dag_id, self.task_id, self.run_id, self.map_index = DAG_ID, "train", RUN_ID, -1
        self.try_number = try_number
        self.start_date = datetime.now(UTC)  # the deferral's deadline counts from it
        self.pushed: list[tuple[str, Any]] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append((key, value))


def task_context(task, ti: ContractTaskInstance, store: TaskStateStore | None) -> dict[str, Any]:
    context = {
        "ti": ti,
        "task_instance": ti,
        "task": task,
        "dag": task.dag,
        "run_id": RUN_ID,
        "dag_run": SimpleNamespace(run_id=RUN_ID, triggering_user_name=TRIGGERED_BY),
        "params": {name: task.params[name] for name in task.params},
        "logical_date": datetime(2026, 1, 5, 4, tzinfo=UTC),
    }
    if store is not None:
        context["task_state_store"] = store
    return context


def worker_copy(parsed, ti: ContractTaskInstance, store: TaskStateStore | None):
    """A fresh copy of the parsed task with its templates rendered (as each worker process gets it), and its
    context."""
    task = copy.deepcopy(parsed)
    context = task_context(task, ti, store)
    task.render_template_fields(context)
    return task, context


def kube_connection(address: str) -> dict[str, Any]:
    """The Airflow connection to the fake API: a kubeconfig with a bearer-token user, in the `kube_config`
    extra, which both the worker's KubernetesHook and the triggerer's AsyncKubernetesHook load (as a dict,
    written to a temporary file); the worker also hands the extras to the trigger (connection_extras)."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "contract", "cluster": {"server": address}}],
        "users": [{"name": "contract", "user": {"token": TOKEN}}],
        "contexts": [{"name": "contract", "context": {"cluster": "contract", "user": "contract"}}],
        "current-context": "contract",
    }
    return {"conn_type": "kubernetes", "extra": {"kube_config": kubeconfig}}


def first_trigger_event(trigger) -> Any:
    """Drive the trigger's run() as the triggerer does, until its first event."""

    async def run() -> Any:
        events = trigger.run()
        try:
            return await asyncio.wait_for(anext(events), timeout=60)
        finally:
            await events.aclose()

    return asyncio.run(run())


@dataclass
class Scenario:
    api: FakeKubeApi
    returned: Any
    trained: dict[str, Any]
    pushed: list[tuple[str, Any]]

    def attributes(self, phase: str | None = None) -> list[tuple[str, Attributes]]:
        return [(r.phase, request_attributes(r.method, r.path, r.query)) for r in self.api.recorded(phase)]

    def verbs(self, phase: str) -> set[tuple[str, str, str | None]]:
        return {
            (a.verb, f"{a.resource}/{a.subresource}" if a.subresource else a.resource, a.namespace)
            for _, a in self.attributes(phase)
        }


@pytest.fixture
def scenario(monkeypatch, postgres_database) -> Iterator[Scenario]:
    """The train task's life against the fake API, every request recorded with its phase."""
    from airflow.providers.cncf.kubernetes.operators.pod import POD_IDENTIFIER_STATE_KEY
    from airflow.providers.common.compat.sdk import AirflowException
    from airflow.sdk.exceptions import TaskDeferred

    from core import pod_results

    api = FakeKubeApi()
    with serving(api) as address:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(kube_connection(address)))
        monkeypatch.delenv("KUBECONFIG", raising=False)  # the operator would hand its content to the trigger
        parsed, settings = parse_train_task(
            monkeypatch,
            MLOPS_CLUSTER__KUBERNETES_CONN_ID=CONN_ID,
            MLOPS_CLUSTER__POSTGRES_DSN=postgres_database.replace("+psycopg2", ""),
        )
        assert (parsed.kubernetes_conn_id, parsed.in_cluster) == (CONN_ID, None)
        assert parsed.deferrable and parsed.durable and not parsed.do_xcom_push and parsed.get_logs
        assert parsed.on_finish_action.value == "delete_pod"
        namespace = settings.cluster.kubernetes_namespace
        store = TaskStateStore()

        # worker, try 1: no pod of this task yet, so it creates one and defers to the trigger.
        ti = ContractTaskInstance(try_number=1)
        task, context = worker_copy(parsed, ti, store)
        with api.in_phase("worker: execute"), pytest.raises(TaskDeferred) as deferred:
            task.execute(context)
        ((_, pod_name),) = [(ns, name) for ns, name in api.pods if ns == namespace]
        created = copy.deepcopy(api.pods[(namespace, pod_name)])
        assert store.get(POD_IDENTIFIER_STATE_KEY) == {"name": pod_name, "namespace": namespace}

        # triggerer: the trigger as the triggerer rebuilds it from its serialized form, polling fast; the pod
        # is Pending until its events have been watched, then Running for two reads, then Succeeded.
        classpath, kwargs = deferred.value.trigger.serialize()
        module, name = classpath.rsplit(".", 1)
        trigger = getattr(importlib.import_module(module), name)(**kwargs)
        assert (trigger.pod_name, trigger.pod_namespace) == (pod_name, namespace)
        trigger.poll_interval, trigger.startup_check_interval = 0.05, 0.1
        api.scripts[(namespace, pod_name)] = ["Pending", "Running", "Running", "Succeeded"]
        api.hold_for_events[(namespace, pod_name)] = 50
        with api.in_phase("triggerer: trigger run"):
            event = first_trigger_event(trigger)
        assert event.payload["status"] == "success", event.payload

        # worker, resumed: the pod recorded its result (in the pod, the training CLI's emit does this).
        trained = {"run_id": MLFLOW_RUN, "status": "trained", "training_set_rev": TRAINING_SET_REV}
        pod_results.write(postgres_database, namespace, pod_name, trained)
        resumed, context = worker_copy(parsed, ti, store)
        with api.in_phase("worker: trigger_reentry"):
            returned = resumed.trigger_reentry(context, event.payload)
        assert (namespace, pod_name) not in api.pods  # deleted

        # worker, a retry while an earlier try's pod (one like the created pod, by its labels) still runs:
        # found by the identity the earlier try left in the task state store, or, where it left none, by
        # its labels; either way reattached, not created again.
        earlier = copy.deepcopy(created)
        earlier["metadata"]["name"] = f"{pod_name}-earlier"
        api.add_pod(earlier, namespace, ["Running"])
        store.set(POD_IDENTIFIER_STATE_KEY, {"name": earlier["metadata"]["name"], "namespace": namespace})
        for retry_store in (store, TaskStateStore()):
            retry, context = worker_copy(parsed, ContractTaskInstance(try_number=2), retry_store)
            with api.in_phase("worker: retry that reattaches"), pytest.raises(TaskDeferred) as again:
                retry.execute(context)
            assert again.value.trigger.pod_name == earlier["metadata"]["name"]

        # triggerer, the retry's deferred task killed by a user (Airflow 3.3 calls the trigger's on_kill):
        # the trigger deletes the pod it follows.
        classpath, kwargs = again.value.trigger.serialize()
        module, name = classpath.rsplit(".", 1)
        killed = getattr(importlib.import_module(module), name)(**kwargs)
        with api.in_phase("triggerer: on_kill"):
            asyncio.run(killed.on_kill())
        assert (namespace, earlier["metadata"]["name"]) not in api.pods

        # worker, resumed after the trigger saw a pod fail: logs, the pod marked as checked (never
        # reattached to again), deleted, and the task fails.
        failed = copy.deepcopy(created)
        failed["metadata"]["name"] = f"{pod_name}-failed"
        api.add_pod(failed, namespace, ["Failed"])
        resumed, context = worker_copy(parsed, ContractTaskInstance(try_number=3), TaskStateStore())
        failure = {"status": "failed", "namespace": namespace, "name": failed["metadata"]["name"],
                   "message": "Container state failed", "last_log_time": None}  # fmt: skip
        with api.in_phase("worker: trigger_reentry, pod failed"), pytest.raises(AirflowException):
            resumed.trigger_reentry(context, failure)
        assert (namespace, failed["metadata"]["name"]) not in api.pods
    yield Scenario(api, returned, trained, ti.pushed)
    get_settings.cache_clear()  # settings of this test's environment, which the monkeypatch undoes next


# --- the contract ------------------------------------------------------------------------------------------


def test_requests_map_to_the_attributes_the_api_server_authorizes():
    ns = "/api/v1/namespaces/mlops-training"
    cases = {
        ("GET", f"{ns}/pods/p", ""): ("get", "pods", "", "p"),
        ("GET", f"{ns}/pods/p", "watch=true"): ("get", "pods", "", "p"),  # a named GET stays get
        ("GET", f"{ns}/pods", "labelSelector=a%3Db"): ("list", "pods", "", None),
        ("GET", f"{ns}/pods", "watch=false"): ("list", "pods", "", None),
        ("GET", f"{ns}/events", "watch=True"): ("watch", "events", "", None),  # kubernetes_asyncio's
        ("GET", f"{ns}/events", "watch=1"): ("watch", "events", "", None),
        ("GET", f"{ns}/pods", "fieldSelector=metadata.name%3Dp&watch=true"): ("watch", "pods", "", "p"),
        ("GET", "/api/v1/watch/namespaces/mlops-training/pods", ""): ("watch", "pods", "", None),
        ("GET", f"{ns}/pods/p/log", "follow=true"): ("get", "pods", "log", "p"),
        ("POST", f"{ns}/pods", ""): ("create", "pods", "", None),
        ("POST", f"{ns}/pods/p/exec", "command=sh"): ("create", "pods", "exec", "p"),
        ("PUT", f"{ns}/pods/p", ""): ("update", "pods", "", "p"),
        ("PATCH", f"{ns}/pods/p", ""): ("patch", "pods", "", "p"),
        ("DELETE", f"{ns}/pods/p", ""): ("delete", "pods", "", "p"),
        ("DELETE", f"{ns}/pods", ""): ("deletecollection", "pods", "", None),
    }
    for (method, path, query), expected in cases.items():
        got = request_attributes(method, path, parse_qs(query, keep_blank_values=True))
        assert (got.verb, got.resource, got.subresource, got.name) == expected, (method, path, query)
        assert (got.api_group, got.namespace) == ("", "mlops-training"), (method, path, query)
    jobs = request_attributes("GET", "/apis/batch/v1/namespaces/x/jobs", {})
    assert (jobs.verb, jobs.api_group, jobs.resource, jobs.namespace) == ("list", "batch", "jobs", "x")
    assert request_attributes("GET", "/version", {}).api_group is None  # non-resource
    namespace = request_attributes("GET", "/api/v1/namespaces/x", {})
    assert (namespace.verb, namespace.resource, namespace.name) == ("get", "namespaces", "x")


def test_every_request_the_train_task_makes_is_one_its_service_account_may_make(scenario, rendered):
    """Run for real against the recording API: each phase's requests are allowed, in every overlay, to the
    service account that makes them in the cluster (the worker's or the triggerer's)."""
    ns = contract.TRAINING_NAMESPACE
    # Not trivially small: each phase did what it is there for.
    assert {("list", "pods", ns), ("create", "pods", ns)} <= scenario.verbs("worker: execute")
    following = scenario.verbs("triggerer: trigger run")
    assert {("get", "pods", ns), ("watch", "events", ns)} <= following
    assert not {verb for verb, _, _ in following} & {"create", "update", "patch", "delete"}
    resumed = scenario.verbs("worker: trigger_reentry")
    assert {("get", "pods", ns), ("get", "pods/log", ns), ("delete", "pods", ns)} <= resumed
    reattached = scenario.verbs("worker: retry that reattaches")
    assert {("get", "pods", ns), ("list", "pods", ns)} <= reattached
    assert not {verb for verb, _, _ in reattached} & {"create"}  # no second pod
    assert ("delete", "pods", ns) in scenario.verbs("triggerer: on_kill")
    failing = scenario.verbs("worker: trigger_reentry, pod failed")
    assert {("get", "pods/log", ns), ("patch", "pods", ns), ("delete", "pods", ns)} <= failing
    assert [r.method for r in scenario.api.recorded() if r.method == "POST"] == ["POST"]
    assert {r.authorization for r in scenario.api.recorded()} == {f"Bearer {TOKEN}"}
    assert {r.phase for r in scenario.api.recorded()} == set(PHASE_ACCOUNT)
    # and the task's result is what its pod recorded, with the image it ran by digest
    returned = {**scenario.trained, "image_id": IMAGE_ID}
    assert scenario.returned == returned
    assert ("return_value", returned) in scenario.pushed

    denied = {overlay: rbac_denials(rendered[overlay], scenario.attributes()) for overlay in OVERLAYS}
    assert not any(denied.values()), "requests the rendered RBAC denies:\n" + "\n".join(
        f"  {overlay}: {denial}" for overlay, denials in denied.items() for denial in denials
    )


def _role(objects, name: str) -> dict[str, Any]:
    return one(objects, "Role", name, contract.TRAINING_NAMESPACE)


def _drop_verb(objects, role: str, resource: str, verb: str) -> None:
    for rule in _role(objects, role)["rules"]:
        if resource in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]


def _drop_resource(objects, role: str, resource: str) -> None:
    for rule in _role(objects, role)["rules"]:
        rule["resources"] = [r for r in rule["resources"] if r != resource]


def _unbind_triggerer(objects) -> None:
    """The watcher RoleBinding gone: only the worker's binding is left, which names no triggerer."""
    objects.remove(one(objects, "RoleBinding", contract.TRAINING_WATCHER_ROLE, contract.TRAINING_NAMESPACE))


def _pin_names(objects) -> None:
    """The launcher's pod rule limited to one pod name: no create, list or watch can name it."""
    for rule in _role(objects, contract.TRAINING_LAUNCHER_ROLE)["rules"]:
        if rule["resources"] == ["pods"]:
            rule["resourceNames"] = ["fraud-train"]


LAUNCHER, WATCHER = contract.TRAINING_LAUNCHER_ROLE, contract.TRAINING_WATCHER_ROLE
NS = contract.TRAINING_NAMESPACE
WORKER_SA, TRIGGERER_SA = contract.AIRFLOW_WORKER_SERVICE_ACCOUNT, contract.AIRFLOW_TRIGGERER_SERVICE_ACCOUNT
BROKEN = [
    (
        "the launcher may not delete pods",
        lambda objects: _drop_verb(objects, LAUNCHER, "pods", "delete"),
        [f"{WORKER_SA} may not delete pods in {NS} [worker: trigger_reentry]"],
    ),
    (
        "the launcher may not patch pods",
        lambda objects: _drop_verb(objects, LAUNCHER, "pods", "patch"),
        [f"{WORKER_SA} may not patch pods in {NS} [worker: trigger_reentry, pod failed]"],
    ),
    (
        "the launcher may not read logs",
        lambda objects: _drop_resource(objects, LAUNCHER, "pods/log"),
        [f"{WORKER_SA} may not get pods/log in {NS} [worker: trigger_reentry]"],
    ),
    (
        "the launcher's pod rule has resourceNames",
        _pin_names,
        [
            f"{WORKER_SA} may not create pods in {NS} [worker: execute]",
            f"{WORKER_SA} may not list pods in {NS} [worker: retry that reattaches]",
        ],
    ),
    (
        # The hook falls back to polling then, so a real deferral would still succeed: only this shows it.
        "the watcher may not watch events",
        lambda objects: _drop_verb(objects, WATCHER, "events", "watch"),
        [f"{TRIGGERER_SA} may not watch events in {NS} [triggerer: trigger run]"],
    ),
    (
        "the watcher may not delete pods",
        lambda objects: _drop_verb(objects, WATCHER, "pods", "delete"),
        [f"{TRIGGERER_SA} may not delete pods in {NS} [triggerer: on_kill]"],
    ),
    (
        "the triggerer has only the worker's binding",
        _unbind_triggerer,
        [
            f"{TRIGGERER_SA} may not get pods in {NS} [triggerer: trigger run]",
            f"{TRIGGERER_SA} may not watch events in {NS} [triggerer: trigger run]",
        ],
    ),
]


def test_the_check_reports_a_request_once_a_grant_it_needs_is_removed(scenario, rendered):
    """The same check, over the same recorded requests, with one needed grant removed at a time."""
    requests = scenario.attributes()
    for overlay in OVERLAYS:
        assert rbac_denials(rendered[overlay], requests) == [], overlay
        for what, remove, expected in BROKEN:
            objects = copy.deepcopy(rendered[overlay])
            remove(objects)
            denied = rbac_denials(objects, requests)
            missing = [denial for denial in expected if denial not in denied]
            assert not missing, f"{overlay}, {what}: not reported {missing}; reported {denied}"
