"""`mlops serve` as a process, against a real MLflow registry (SQLite) holding real ONNX exports of FraudMLP
models: no champion (503 with the reason), an unloadable champion (503, never a score from nothing), then a
champion, requests good and bad (400, 413, 422 naming field and rule), the Open Inference Protocol, the
champion swapped under load without a failed request, the challenger scored in shadow, and the scoring log
on disk. The lake is empty here, so every entity is unknown and said so; train/serve parity on real
features is tests/e2e/test_scoring_parity.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import orjson
import pyarrow.parquet as pq
import pytest
import torch

from core import pseudonym
from core.settings import Settings
from tests.conftest import free_port, wait_for
from tests.model.tensors import make_split
from tests.receivers import self_signed
from training.artifacts import log_model
from training.dataset import MODEL_INPUTS, NUMERIC_FEATURES
from training.ledger import Ledger
from training.registry import CHAMPION_ALIAS, MODEL_NAME, ModelRegistry, promote_manually

MAX_ITEMS = 20
# The service's callers (serving/auth.py): this module's client has every role; one caller may only score,
# and the chargeback feed's token is kept in the file as its digest.
TOKENS = {
    "test-all": "all-roles-token-0123456789abcdef",
    "test-scorer": "scorer-only-token-0123456789abcdef",
    "test-feed": "feed-only-token-0123456789abcdef",
    "test-eraser": "eraser-only-token-0123456789abcdef",
}
BEARER = {"authorization": f"Bearer {TOKENS['test-all']}"}
LOAD_ANSWERS = 50  # answers from each champion while the alias moves under load


def transaction(n: int, **overrides) -> dict:
    item = {
        "transaction_id": f"tx{n:016x}",
        "customer_id": f"c{n % 1000:07d}",
        "merchant_id": f"m{n % 100:06d}",
        "amount": 12.5 + n,
        "currency": "EUR",
        "country": "DE",
        "channel": "contactless",
        "merchant_category": "grocery",
        "event_timestamp": f"2026-01-10T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
    }
    return {**item, **overrides}


def _model(seed: int, nan: bool = False):
    from training.model import FraudMLP

    torch.manual_seed(seed)
    model = FraudMLP()
    model.fit_normalization(make_split(2_000, seed=seed).x[:, : len(NUMERIC_FEATURES)])
    if nan:  # a broken model, as a diverged training run leaves one: every score NaN
        with torch.no_grad():
            model.mlp[-1].bias.fill_(float("nan"))
    return model.eval()


def _register(
    tracking_uri: str,
    artifacts: Path,
    seed: int,
    onnx: bool = True,
    nan: bool = False,
    tags: dict[str, str] | None = None,
) -> str:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name("serving-test") is None:
        mlflow.create_experiment("serving-test", artifact_location=artifacts.as_uri())
    mlflow.set_experiment("serving-test")
    model = _model(seed, nan)
    with mlflow.start_run() as run:
        log_model(model, name="model", pip_requirements=[])
    version = ModelRegistry(tracking_uri).register(run.info.run_id, tags=tags)
    if onnx:
        _export(tracking_uri, run.info.run_id, model, artifacts / f"onnx-{seed}{'-nan' if nan else ''}")
    return version


def _export(tracking_uri: str, run_id: str, model, folder: Path) -> None:
    from mlflow import MlflowClient

    from training.export import to_onnx

    folder.mkdir(parents=True, exist_ok=True)
    path = to_onnx(model, torch.zeros(2, len(MODEL_INPUTS)), folder / "model.onnx")
    MlflowClient(tracking_uri).log_artifact(run_id, str(path), "onnx")


class Server:
    def __init__(self, home: Path, live_from: str | None = "2026-01-10T00:00:00Z", **settings: str) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / f"serve-{self.port}.log"  # one per process: replicas share a home
        tokens = home / "serving" / "tokens.json"
        tokens.parent.mkdir(parents=True, exist_ok=True)
        feed_digest = hashlib.sha256(TOKENS["test-feed"].encode()).hexdigest()
        tokens.write_text(
            json.dumps(
                {
                    "callers": [
                        {
                            "name": "test-all",
                            "roles": ["score", "chargebacks", "read"],
                            "token": TOKENS["test-all"],
                        },
                        {"name": "test-scorer", "roles": ["score"], "token": TOKENS["test-scorer"]},
                        {"name": "test-feed", "roles": ["chargebacks"], "token": f"sha256:{feed_digest}"},
                        {"name": "test-eraser", "roles": ["erase"], "token": TOKENS["test-eraser"]},
                    ]
                }
            )
        )
        env = {
            **os.environ,
            "MLOPS_HOME": str(home),
            "MLOPS_SERVING__RELOAD_INTERVAL_S": "0.2",
            "MLOPS_SERVING__MAX_REQUEST_ITEMS": str(MAX_ITEMS),
            "MLOPS_SERVING__LOG_FLUSH_INTERVAL_S": "0.2",
            **({"MLOPS_SERVING__LIVE_FROM": live_from} if live_from else {}),
            **settings,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlops.cli", "serve", "--port", str(self.port)],
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.client = httpx.Client(base_url=self.url, timeout=30, headers=BEARER)

    def live(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return self.client.get("/v2/health/live").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def registry_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("serving-home")
    (home / "mlflow").mkdir()
    return home


@pytest.fixture(scope="module")
def server(registry_home):
    server = Server(registry_home)
    wait_for(server.live, 120, "the scoring service to listen")
    yield server
    server.stop()


def _tracking(home: Path) -> str:
    return f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"


def _promote(home: Path, version: str) -> None:
    """Make `version` the champion the way a person does (`mlops promote`): a history row, then the alias."""
    ledger = Ledger(f"sqlite:///{home / 'mlflow' / 'promotions.db'}")
    try:
        promote_manually(ModelRegistry(_tracking(home)), ledger, version, "the scoring test", actor="tester")
    finally:
        ledger.dispose()


def test_without_a_loadable_champion_the_service_refuses_to_score_and_says_why(server, registry_home):
    answer = server.client.post("/score", json=transaction(1))
    assert answer.status_code == 503
    assert "no model to score with" in answer.json()["detail"] and CHAMPION_ALIAS in answer.json()["detail"]
    ready = server.client.get("/v2/health/ready")
    assert ready.status_code == 503 and CHAMPION_ALIAS in ready.json()["reason"]
    assert ready.json()["error"] == ready.json()["reason"]  # the protocol's error object on /v2

    # the alias moved with MLflow's own client, outside the promotion history: not served, and said
    tracking = _tracking(registry_home)
    version = _register(tracking, registry_home / "artifacts", seed=1, onnx=False)
    ModelRegistry(tracking).client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, version)
    wait_for(
        lambda: server.client.get("/status").json()["alias_out_of_band"] is not None,
        30,
        "the service to see the alias moved out of band",
    )
    moved = server.client.get("/status").json()["alias_out_of_band"]
    assert f"points at v{version}" in moved and "not served" in moved and "mlops promote" in moved
    answer = server.client.post("/score", json=transaction(2))
    assert answer.status_code == 503 and "records no champion" in answer.json()["detail"]

    # recorded by a person (`mlops promote`): now the champion, but its ONNX file was never exported: still
    # no score, and the reason names the fix
    _promote(registry_home, version)
    wait_for(
        lambda: "no ONNX export" in (server.client.get("/v2/health/ready").json().get("reason") or ""),
        30,
        "the service to see the champion without an export",
    )
    answer = server.client.post("/score", json=transaction(2))
    assert answer.status_code == 503 and f"v{version} has no ONNX export" in answer.json()["detail"]
    assert "mlops export" in answer.json()["detail"]


@pytest.fixture(scope="module")
def champion(server, registry_home):
    """v1 exported and champion; the service ready."""
    tracking = _tracking(registry_home)
    registry = ModelRegistry(tracking)
    if registry.champion() is None:
        _promote(registry_home, _register(tracking, registry_home / "artifacts", seed=1, onnx=False))
    version = registry.champion()
    assert version is not None
    run_id = registry.client.get_model_version(MODEL_NAME, version).run_id
    _export(tracking, run_id, _model(1), registry_home / "artifacts" / "onnx-late")
    wait_for(lambda: server.client.get("/v2/health/ready").status_code == 200, 30, "the champion to load")
    return version


def test_a_transaction_is_scored_with_the_features_used_and_unknown_entities_named(
    server, champion, registry_home
):
    answer = server.client.post("/score", json=transaction(3))
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["transaction_id"] == transaction(3)["transaction_id"]
    assert 0.0 <= result["score"] <= 1.0
    assert result["decision"] == ("decline" if result["score"] >= result["threshold"] else "approve")
    assert result["model"] == {"name": MODEL_NAME, "version": champion}
    assert list(result["features"]) == list(NUMERIC_FEATURES)
    assert result["features"]["log_amount_usd"] == pytest.approx(
        torch.log1p(torch.tensor(15.5 / 0.92)).item()
    )
    # an empty lake: neither entity has state, the score used missing values and says so
    assert result["missing_entities"] == ["customer_id", "merchant_id"]
    assert result["features"]["customer_txn_count_24h"] is None
    # the note names the customer by the pseudonym the service gave its id on arrival, never the raw id
    pseudonyms = pseudonym.for_settings(Settings(home=registry_home))
    assert server.client.get("/status").json()["pseudonym_key_id"] == pseudonyms.key_id
    assert f"customer {pseudonyms.customer('c0000003')}" in result["notes"][0]
    assert "missing" in result["notes"][0] and "c0000003" not in answer.text

    many = server.client.post("/score", json=[transaction(10), transaction(11)])
    assert many.status_code == 200
    assert [r["transaction_id"] for r in many.json()] == [
        transaction(10)["transaction_id"],
        transaction(11)["transaction_id"],
    ]
    # the live state moved: the second transaction of customer c0000010 sees the first
    again = server.client.post(
        "/score", json=transaction(1010, event_timestamp="2026-01-10T13:00:00Z")
    ).json()
    assert again["missing_entities"] == []  # merchant m000010 was seen by transaction 10 too
    assert again["features"]["customer_txn_count_24h"] == 1


def test_an_alias_moved_outside_the_history_is_not_served_and_is_said(server, champion, registry_home):
    """Whoever can move MLflow's alias (its client, its UI) must not choose what is served: the service keeps
    the champion the promotion history records and says where the alias went."""
    tracking = _tracking(registry_home)
    other = _register(tracking, registry_home / "artifacts", seed=5)
    client = ModelRegistry(tracking).client
    client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, other)
    try:
        wait_for(
            lambda: server.client.get("/status").json()["alias_out_of_band"] is not None,
            30,
            "the service to see the alias moved",
        )
        status = server.client.get("/status").json()
        assert status["champion"] == champion and f"points at v{other}" in status["alias_out_of_band"]
        answer = server.client.post("/score", json=transaction(30))
        assert answer.status_code == 200 and answer.json()["model"]["version"] == champion
    finally:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, champion)
    wait_for(
        lambda: server.client.get("/status").json()["alias_out_of_band"] is None, 30, "the alias back in line"
    )


def test_bad_requests_are_refused_with_what_to_change(server, champion):
    scored_before = server.client.get("/status").json()["transactions"]
    unknown = server.client.post("/score", json=transaction(4, colour="red"))
    assert unknown.status_code == 422
    [problem] = unknown.json()["detail"]
    assert problem["field"] == "colour" and problem["rule"].startswith("unknown field")

    wrong = server.client.post(
        "/score", json=[transaction(5), transaction(6, amount="1,000", currency="XXX")]
    )
    assert wrong.status_code == 422
    found = {(p["loc"][1], p["field"]): p["rule"] for p in wrong.json()["detail"]}
    assert found[(1, "amount")].startswith("pattern") and found[(1, "currency")].startswith("allowed")
    assert all(item == 1 for item, _ in found)

    typed = server.client.post("/score", json=transaction(7, customer_id=7, event_timestamp="yesterday"))
    fields = {p["field"]: p["rule"] for p in typed.json()["detail"]}
    assert (
        typed.status_code == 422 and fields["customer_id"].startswith("type") and "event_timestamp" in fields
    )

    missing = {k: v for k, v in transaction(8).items() if k != "merchant_id"}
    assert server.client.post("/score", json=missing).json()["detail"][0]["rule"].startswith("required")

    assert (
        server.client.post(
            "/score", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    # a local time whose UTC instant falls outside years 1-9999: refused, not a 500
    for instant in ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"):
        edge = server.client.post("/score", json=transaction(9, event_timestamp=instant))
        assert edge.status_code == 422, edge.text
        [problem] = edge.json()["detail"]
        assert problem["field"] == "event_timestamp" and problem["rule"].startswith("range"), problem
    # what is echoed back is short, whatever was sent: a long string, a list nested 1,000 deep (which a plain
    # repr answers with RecursionError)
    deep = b"[" * 1000 + b"]" * 1000
    body = orjson.dumps(transaction(12, customer_id="c" * 5000)).replace(
        b'"country":"DE"', b'"country":' + deep
    )
    echoed = server.client.post("/score", content=body, headers={"content-type": "application/json"})
    assert echoed.status_code == 422, echoed.text
    shown = {p["field"]: p["value"] for p in echoed.json()["detail"]}
    assert set(shown) == {"customer_id", "country"}
    assert all(len(str(value)) <= 80 for value in shown.values()), shown

    oversized = server.client.post("/score", json=[transaction(i) for i in range(MAX_ITEMS + 1)])
    assert oversized.status_code == 413 and str(MAX_ITEMS) in oversized.json()["detail"]
    # nothing refused was scored: the counter did not move
    assert server.client.get("/status").json()["transactions"] == scored_before


def test_times_outside_the_services_window_are_refused_and_move_no_state(server, champion):
    # The service replays 2026-01-10 (MLOPS_SERVING__LIVE_FROM): its window is that day, with up to a day
    # less five minutes before it and five minutes after it (serving/clock.py).
    known = {"customer_id": "c0700001", "merchant_id": "m070001"}
    first = server.client.post(
        "/score", json=transaction(2001, **known, event_timestamp="2026-01-10T14:00:00Z")
    )
    assert first.status_code == 200, first.text
    ahead = server.client.post(
        "/score",
        json=transaction(
            2002, customer_id="c0799999", merchant_id="m079999", event_timestamp="2099-01-01T00:00:00Z"
        ),
    )
    assert ahead.status_code == 422, ahead.text
    [problem] = ahead.json()["detail"]
    assert problem["field"] == "event_timestamp" and problem["rule"].startswith("window:"), problem
    assert "2026-01-11T00:05:00Z" in problem["rule"] and problem["value"] == "2099-01-01T00:00:00Z"
    before = server.client.post("/score", json=transaction(2003, event_timestamp="2026-01-08T23:00:00Z"))
    assert before.status_code == 422 and before.json()["detail"][0]["field"] == "event_timestamp"
    report = {"transaction_id": transaction(2001)["transaction_id"], "is_fraud": 1}
    dated_ahead = server.client.post(
        "/chargebacks", json={**report, "label_timestamp": "2099-01-02T00:00:00Z"}
    )
    assert dated_ahead.status_code == 422, dated_ahead.text
    assert dated_ahead.json()["detail"][0]["field"] == "label_timestamp"
    # Nothing moved: the customer's and the merchant's state is there for their next transaction.
    later = server.client.post(
        "/score", json=transaction(2004, **known, event_timestamp="2026-01-10T14:30:00Z")
    )
    assert later.status_code == 200, later.text
    assert later.json()["missing_entities"] == [] and later.json()["features"]["customer_txn_count_24h"] == 1
    status = server.client.get("/status").json()["clock"]
    assert status["mode"] == "replay" and status["window"][1].startswith("2026-01-11T00:05:00")


def test_what_loading_built_is_frozen_out_of_the_cyclic_collector(server, champion):
    """The state, the models and the imports live as long as the process: a full collection walking them
    stalled requests (docs/benchmarks.md, "Scoring service"), so they are frozen once loaded."""
    wait_for(lambda: server.client.get("/v2/health/ready").status_code == 200, 60, "the service to be ready")
    assert server.client.get("/status").json()["gc_frozen_objects"] > 10_000


def test_a_late_transaction_fails_only_its_own_request(server, champion, registry_home):
    """A transaction inside the window but more than a day older than its customer's latest: the live
    state cannot compute its features. Its request is refused (422 naming it) and leaves nothing in the
    state; requests scored beside it are answered."""
    latest = transaction(
        2101, customer_id="c0710001", merchant_id="m071001", event_timestamp="2026-01-10T20:00:00Z"
    )
    assert server.client.post("/score", json=latest).status_code == 200
    late = transaction(
        2102, customer_id="c0710001", merchant_id="m071002", event_timestamp="2026-01-09T18:00:00Z"
    )
    fresh = transaction(
        2103, customer_id="c0710003", merchant_id="m071003", event_timestamp="2026-01-10T20:01:00Z"
    )
    refused = server.client.post("/score", json=[fresh, late])
    assert refused.status_code == 422, refused.text
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["body", 1, "event_timestamp"] and problem["rule"].startswith("late:"), problem
    # it names the customer as the service knows them: by pseudonym, never the raw id
    assert pseudonym.for_settings(Settings(home=registry_home)).customer("c0710001") in problem["rule"]
    assert "c0710001" not in refused.text
    # The request's first item was not kept: its customer is still unknown to the next transaction.
    after = transaction(
        2104, customer_id="c0710003", merchant_id="m071004", event_timestamp="2026-01-10T20:02:00Z"
    )
    assert server.client.post("/score", json=after).json()["missing_entities"][0] == "customer_id"

    # Concurrent requests, one of them late: each answered for itself, whichever batch it was scored in.
    def burst(round_: int) -> tuple[list[int], int]:
        barrier = threading.Barrier(8)
        codes: list[int] = [0] * 8

        def post(k: int) -> None:
            n = 2200 + round_ * 10 + k
            item = (
                {**late, "transaction_id": transaction(n)["transaction_id"]}
                if k == 0
                else transaction(n, customer_id=f"c072{n:04d}", event_timestamp="2026-01-10T21:00:00Z")
            )
            with httpx.Client(base_url=server.url, timeout=30, headers=BEARER) as client:
                barrier.wait()
                codes[k] = client.post("/score", json=item).status_code

        batches = server.client.get("/status").json()["batches"]
        threads = [threading.Thread(target=post, args=(k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return codes, server.client.get("/status").json()["batches"] - batches

    for round_ in range(5):
        codes, batches = burst(round_)
        assert codes == [422] + [200] * 7, codes
        if batches < 7:  # the late request shared a batch with others (the scorer was busy meanwhile)
            break
    else:
        pytest.fail("five bursts of eight concurrent requests were never batched together")


def test_callers_need_a_token_with_the_routes_role_a_json_body_and_a_served_host(
    server, champion, registry_home
):
    item = transaction(
        2301, customer_id="c0730001", merchant_id="m073001", event_timestamp="2026-01-10T15:00:00Z"
    )
    report = {
        "transaction_id": item["transaction_id"],
        "is_fraud": 1,
        "label_timestamp": "2026-01-10T15:30:00Z",
    }
    scorer = {"authorization": f"Bearer {TOKENS['test-scorer']}"}
    feed = {"authorization": f"Bearer {TOKENS['test-feed']}"}  # the file holds its digest only
    with httpx.Client(base_url=server.url, timeout=30) as bare:
        assert bare.get("/v2/health/live").status_code == 200  # the probes need no token
        assert bare.get("/v2/health/ready").status_code == 200
        missing = bare.post("/score", json=item)
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
        assert (
            bare.post("/score", json=item, headers={"authorization": "Bearer not-a-token"}).status_code == 401
        )
        for path in ("/status", "/docs", "/openapi.json", "/v2/models/fraud-detector"):
            assert bare.get(path).status_code == 401, path
        # The chargeback feed has a role of its own: a scoring caller cannot report fraud or read the status.
        assert bare.post("/chargebacks", json=report, headers=scorer).status_code == 403
        assert bare.get("/status", headers=scorer).status_code == 403
        assert bare.post("/score", json=item, headers=feed).status_code == 403
        assert bare.post("/score", json=item, headers=scorer).status_code == 200
        fed = bare.post("/chargebacks", json=report, headers=feed)
        assert fed.status_code == 200 and fed.json()["attributed"] == 1, fed.text
        # Only JSON bodies: a web page may send text/plain or a form anywhere without asking, never JSON.
        text = bare.post(
            "/score", content=orjson.dumps(item), headers={**scorer, "content-type": "text/plain"}
        )
        assert text.status_code == 415, text.text
        form = bare.post("/chargebacks", data={"transaction_id": item["transaction_id"]}, headers=feed)
        assert form.status_code == 415
        # A Host this service does not serve: a page that rebound its own name to this machine.
        rebound = bare.post("/score", json=item, headers={**scorer, "host": "attacker.example"})
        assert rebound.status_code == 400 and "allowed_hosts" in rebound.json()["detail"]

    # The audit: the scoring log names each transaction's caller; a chargeback call is a line of the log.
    def logged() -> list[dict]:
        rows = pq.read_table(registry_home / "scoring_log").to_pylist()
        return [r for r in rows if r["transaction_id"] == item["transaction_id"]]

    wait_for(lambda: bool(logged()), 30, "the scoring log to flush")
    assert [r["caller"] for r in logged()] == ["test-scorer"]
    audited = [
        line for line in server.log.read_text().splitlines() if " audit " in line and "test-feed" in line
    ]
    assert audited and json.loads(audited[-1].split(" audit ", 1)[1])["transaction_ids"] == [
        item["transaction_id"]
    ]


def test_a_rotated_tokens_file_takes_effect_without_a_restart(server, champion, registry_home):
    """A rotated Secret (the file swapped under the service) admits the new token and no longer the old
    one within seconds; a new file that cannot be used leaves the callers as they were, and says so."""
    path = registry_home / "serving" / "tokens.json"
    original = path.read_text()
    rotated = json.loads(original)
    new_token = "rotated-scorer-token-0123456789abcdef"
    rotated["callers"] = [c for c in rotated["callers"] if c["name"] != "test-scorer"]
    rotated["callers"].append({"name": "test-scorer-2", "roles": ["score"], "token": new_token})

    def answered(token: str) -> int:
        headers = {"authorization": f"Bearer {token}"}
        return httpx.post(f"{server.url}/score", json=transaction(610), headers=headers).status_code

    def swap(text: str) -> None:  # as the kubelet does: a new file renamed into place
        staged = path.with_suffix(".staged")
        staged.write_text(text)
        staged.replace(path)

    try:
        assert answered(TOKENS["test-scorer"]) == 200
        swap(json.dumps(rotated))
        wait_for(lambda: answered(new_token) == 200, 30, "the rotated token to be admitted")
        assert answered(TOKENS["test-scorer"]) == 401  # the old one is out, with no restart
        tokens = server.client.get("/status").json()["tokens"]
        assert tokens["reloads"] >= 1 and tokens["problem"] is None
        swap("{not json")
        wait_for(
            lambda: (server.client.get("/status").json()["tokens"]["problem"] or "").startswith(
                "the tokens file changed but cannot be used"
            ),
            30,
            "the broken file to be said",
        )
        assert answered(new_token) == 200  # the callers stayed as they were
    finally:
        swap(original)
    wait_for(lambda: answered(TOKENS["test-scorer"]) == 200, 30, "the original tokens back")


def test_with_a_certificate_the_service_answers_https_only(tmp_path, registry_home, champion):
    """serving.tls_cert_file and tls_key_file: a real TLS client that trusts the certificate scores over
    HTTPS; plain HTTP to the same port gets no answer; one setting without the other is refused."""
    cert_file, key_file = self_signed(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "mlflow").symlink_to(registry_home / "mlflow")  # the same registry and champion
    server = Server(
        home, MLOPS_SERVING__TLS_CERT_FILE=str(cert_file), MLOPS_SERVING__TLS_KEY_FILE=str(key_file)
    )
    server.url = server.url.replace("http://", "https://")
    server.client = httpx.Client(base_url=server.url, timeout=30, headers=BEARER, verify=str(cert_file))
    try:
        wait_for(server.live, 120, "the service to listen over TLS")
        wait_for(lambda: server.client.get("/v2/health/ready").status_code == 200, 60, "the champion")
        assert server.client.post("/score", json=transaction(640)).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(server.url.replace("https://", "http://") + "/v2/health/live", timeout=5)
        with pytest.raises(httpx.ConnectError):  # a client that does not trust it refuses the handshake
            httpx.get(server.url + "/v2/health/live", timeout=5)
    finally:
        server.stop()
    with pytest.raises(ValueError, match="go together"):
        Settings(home=home, serving={"tls_cert_file": cert_file})


def test_a_tokens_file_the_service_cannot_use_stops_its_start_with_what_to_fix(tmp_path):
    from core.settings import Settings
    from serving.auth import TokensFileError, open_callers, token_for

    mounted = Settings(home=tmp_path / "pod", serving={"tokens_file": tmp_path / "secret" / "tokens.json"})  # type: ignore[arg-type]
    with pytest.raises(TokensFileError, match=r"no tokens file at .*serving\.tokens_file"):
        open_callers(mounted)  # a named file (a Secret's mount) is never generated
    local = Settings(home=tmp_path / "local")
    assert len(open_callers(local)) == 3  # generated on first start, readable by its owner only
    assert token_for(local, "erase")  # a local eraser: `mlops erase` tells the service to forget
    assert (tmp_path / "local" / "serving" / "tokens.json").stat().st_mode & 0o077 == 0
    broken = tmp_path / "broken.json"
    for text, says in (
        ("{", "cannot be read as JSON"),
        ('{"callers": [{"name": "x", "roles": ["admin"], "token": "0123456789abcdef0123456789"}]}', "roles"),
        ('{"callers": [{"name": "x", "roles": ["score"], "token": "short"}]}', "24 characters"),
    ):
        broken.write_text(text)
        with pytest.raises(TokensFileError, match=says):
            open_callers(Settings(home=tmp_path / "local", serving={"tokens_file": broken}))  # type: ignore[arg-type]


def test_a_body_past_the_limit_is_refused_while_it_arrives(server, champion):
    """A chunked body announces no length: the service counts what arrives and answers 413 once it passes
    the limit, without waiting for (or holding) the rest."""
    import socket

    limit = MAX_ITEMS * 4096  # serving.app.BYTES_PER_ITEM a transaction
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as raw:
        raw.sendall(
            f"POST /score HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {BEARER['authorization']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        chunk = b"[" + b" " * 16_383
        for _ in range(limit // len(chunk) + 2):  # past the limit, and the body never ends
            raw.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        answer = raw.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer[:200]


def test_past_its_admission_limits_the_service_answers_503_with_retry_after(
    champion, registry_home, tmp_path
):
    home = tmp_path / "tight"
    home.mkdir()
    (home / "mlflow").symlink_to(registry_home / "mlflow")  # the same registry and champion
    tight = Server(home, MLOPS_SERVING__MAX_IN_FLIGHT="2", MLOPS_SERVING__MAX_QUEUED_REQUESTS="1")
    try:
        wait_for(
            lambda: tight.live() and tight.client.get("/v2/health/ready").status_code == 200, 120, "ready"
        )

        def burst(round_: int) -> list[httpx.Response]:
            barrier = threading.Barrier(16)
            answers: list[httpx.Response] = []

            def post(k: int) -> None:
                n = 2400 + round_ * 20 + k
                item = transaction(n, customer_id=f"c074{n:04d}", event_timestamp="2026-01-10T16:00:00Z")
                with httpx.Client(base_url=tight.url, timeout=30, headers=BEARER) as client:
                    barrier.wait()
                    answers.append(client.post("/score", json=[item] * 1))

            threads = [threading.Thread(target=post, args=(k,)) for k in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return answers

        for round_ in range(5):
            answers = burst(round_)
            assert {a.status_code for a in answers} <= {200, 503}, [
                a.text for a in answers if a.status_code >= 400
            ]
            refused = [a for a in answers if a.status_code == 503]
            assert all(a.headers.get("retry-after") == "1" for a in refused)
            if refused and len(refused) < len(answers):
                break
        else:
            pytest.fail("five bursts of sixteen requests never passed the limits of two in flight")
        # Refused at once, not queued: the service answers the next request as usual.
        again = tight.client.post("/score", json=transaction(2499, event_timestamp="2026-01-10T16:05:00Z"))
        assert again.status_code == 200, again.text
    finally:
        tight.stop()


def test_a_restart_serving_live_restores_what_was_scored_since_the_last_landing(
    champion, registry_home, tmp_path
):
    """Serving live (the machine's clock, no replayed day): the transactions scored and the chargebacks
    posted since the last landing are in the scoring log and its journal, not the lake; a restarted service
    takes them back into its state."""
    from datetime import UTC, datetime, timedelta

    home = tmp_path / "live"
    home.mkdir()
    (home / "mlflow").symlink_to(registry_home / "mlflow")
    now = datetime.now(UTC).replace(microsecond=0)
    known = {"customer_id": "c0750001", "merchant_id": "m075001"}

    def at(minutes_ago: int) -> str:
        return (now - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")

    def ready(server: Server) -> bool:
        return server.live() and server.client.get("/v2/health/ready").status_code == 200

    first = Server(home, live_from=None)
    try:
        wait_for(lambda: ready(first), 120, "the live service to be ready")
        for n, ago in ((2501, 30), (2502, 20), (2503, 10)):
            answer = first.client.post("/score", json=transaction(n, **known, event_timestamp=at(ago)))
            assert answer.status_code == 200, answer.text
        report = {
            "transaction_id": transaction(2502)["transaction_id"],
            "is_fraud": 1,
            "label_timestamp": at(15),
        }
        assert first.client.post("/chargebacks", json=report).json()["attributed"] == 1
    finally:
        first.stop()  # SIGTERM: the scoring log is written out
    second = Server(home, live_from=None)
    try:
        wait_for(lambda: ready(second), 120, "the restarted service to be ready")
        answer = second.client.post("/score", json=transaction(2504, **known, event_timestamp=at(5)))
        assert answer.status_code == 200, answer.text
        assert (
            answer.json()["missing_entities"] == []
            and answer.json()["features"]["customer_txn_count_1h"] == 3
        )
        # The chargeback posted before the restart still counts for the merchant (the journal).
        assert answer.json()["features"]["merchant_chargebacks_30d"] == 1
        status = second.client.get("/status").json()
        assert status["clock"]["mode"] == "wall" and status["restored_from_scoring_log"]["observed"] == 3, (
            status
        )
    finally:
        second.stop()


def test_anything_unexpected_is_a_json_500_with_an_incident_and_no_internals(registry_home):
    from fastapi.testclient import TestClient

    from core.settings import Settings
    from serving.app import create_app

    app = create_app(Settings(home=registry_home, serving={"auth": False, "allowed_hosts": ["testserver"]}))  # type: ignore[arg-type]

    @app.get("/broken")
    async def broken():
        raise RuntimeError("secret internals: /etc/passwd at line 42")

    # Outside a `with` block the client does not run the lifespan: no model or state is needed here.
    answer = TestClient(app, raise_server_exceptions=False).get("/broken")
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/json"
    detail = answer.json()["detail"]
    assert "incident" in detail and "secret" not in answer.text and "Traceback" not in answer.text


def test_the_open_inference_protocol_scores_columns(server, champion):
    items = [transaction(20), transaction(21)]
    request = {
        "id": "req-1",
        "inputs": [
            {
                "name": name,
                "shape": [2],
                "datatype": "FP64" if name == "amount" else "BYTES",
                "data": [i[name] for i in items],
            }
            for name in items[0]
        ],
    }
    answer = server.client.post(f"/v2/models/{MODEL_NAME}/infer", json=request)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model_name"] == MODEL_NAME and body["model_version"] == champion and body["id"] == "req-1"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["score"]["shape"] == [2] and len(outputs["decision"]["data"]) == 2
    assert server.client.get(f"/v2/models/{MODEL_NAME}/ready").json()["ready"] is True
    assert server.client.get("/v2/models/other/ready").status_code == 404
    # as OIP clients send it: the JSON body with no Content-Type (the bearer token guards the route)
    untyped = server.client.post(f"/v2/models/{MODEL_NAME}/infer", content=orjson.dumps(request))
    assert "content-type" not in untyped.request.headers
    assert untyped.status_code == 200 and untyped.json()["id"] == "req-1", untyped.text
    # every /v2 error is the protocol's error object, whoever answered it; other routes keep `detail`
    unknown = server.client.get("/v2/models/other/ready")
    assert unknown.status_code == 404 and "no model 'other' here" in unknown.json()["error"]
    assert server.client.get("/v2/nothing/here").json() == {"error": "Not Found"}
    anonymous = httpx.post(f"{server.url}/v2/models/{MODEL_NAME}/infer", json=request)
    assert anonymous.status_code == 401 and "a token is needed" in anonymous.json()["error"]
    texted = server.client.post(
        f"/v2/models/{MODEL_NAME}/infer", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert texted.status_code == 415 and "Content-Type: application/json" in texted.json()["error"]
    request["inputs"][0]["data"] = ["nope", "nope"]
    refused = server.client.post(f"/v2/models/{MODEL_NAME}/infer", json=request)
    assert refused.status_code == 422 and refused.json()["error"], refused.text
    assert (
        "detail" in server.client.post("/score", content=b"{}", headers={"content-type": "text/plain"}).json()
    )
    assert server.client.get("/openapi.json").json()["paths"]["/score"]["post"]["requestBody"]


def _oip_inputs(http, items: list[dict], binary: bool) -> list:
    """One tensor per contract field, as tritonclient builds them (binary: the binary tensor extension)."""
    import numpy as np

    tensors = []
    for name in items[0]:
        values = [i[name] for i in items]
        if name == "amount":
            tensor = http.InferInput(name, [len(items)], "FP64")
            tensor.set_data_from_numpy(np.array(values, dtype=np.float64), binary_data=binary)
        else:
            tensor = http.InferInput(name, [len(items)], "BYTES")
            tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
        tensors.append(tensor)
    return tensors


def test_a_real_oip_client_library_scores_binary_and_json_tensors_and_reads_a_refusal(server, champion):
    """tritonclient's HTTP client (the OIP client the issue saw fail: no Content-Type, `{"error"}` expected,
    binary tensors by default): the same scores as /score, binary and JSON, and a refusal it can read."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(url=server.url.removeprefix("http://"))
    # tritonclient writes its own headers into the dict it is given: a copy each call
    assert "binary_tensor_data" in client.get_server_metadata(headers=dict(BEARER))["extensions"]
    items = [transaction(40 + n) for n in range(3)]
    expected = server.client.post("/score", json=items).json()  # the same transactions: resends below
    for binary in (True, False):
        outputs = [http.InferRequestedOutput(name, binary_data=binary) for name in ("decision", "score")]
        inputs = _oip_inputs(http, items, binary)
        result = client.infer(MODEL_NAME, inputs, outputs=outputs, headers=dict(BEARER))
        assert [o["name"] for o in result.get_response()["outputs"]] == ["decision", "score"]
        assert result.as_numpy("score").tolist() == [r["score"] for r in expected]
        decisions = [d.decode() if isinstance(d, bytes) else d for d in result.as_numpy("decision").tolist()]
        assert decisions == [r["decision"] for r in expected]
    broken = [dict(i, amount=-1.0) for i in items]
    with pytest.raises(InferenceServerException, match="amount"):
        client.infer(MODEL_NAME, _oip_inputs(http, broken, True), headers=dict(BEARER))
    client.close()


@pytest.mark.parametrize(
    ("header", "size", "tail", "problem"),
    [
        ("12", 0, b"", "not JSON"),  # the header length cuts the JSON short
        ("999", 0, b"", "not a byte count within the body"),
        (None, 0, b"\x00\x00\x00\x00", "no input's binary_data_size accounts for"),
        (None, 6, b"\x05\x00\x00\x00ab", "fewer are left"),
        (None, 3, b"\x01\x00", "runs past"),
    ],
)
def test_binary_tensor_data_that_does_not_add_up_is_refused_naming_it(
    server, champion, header, size, tail, problem
):
    items = [transaction(60)]
    country = {"name": "country", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": size}}
    head = {
        "inputs": [
            {"name": name, "shape": [1], "datatype": "FP64" if name == "amount" else "BYTES", "data": [value]}
            for name, value in items[0].items()
            if name != "country"
        ]
        + [country]
    }
    raw = orjson.dumps(head)
    answer = server.client.post(
        f"/v2/models/{MODEL_NAME}/infer",
        content=raw + tail,
        headers={"inference-header-content-length": header or str(len(raw))},
    )
    assert answer.status_code == 400 and problem in answer.json()["error"], answer.text


def _scrape(server) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    answer = server.client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain"), answer.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def test_prometheus_metrics_count_latency_decisions_and_refusals_per_route(server, champion):
    """GET /metrics (the `read` role): latency per route, responses by status (refusals by the guard
    included), decisions by kind and version, and what /status shows, in Prometheus's text format."""
    assert httpx.get(f"{server.url}/metrics").status_code == 401  # no token: not for anyone
    before = _scrape(server)
    good = server.client.post("/score", json=[transaction(500), transaction(501)])
    assert good.status_code == 200, good.text
    assert server.client.post("/score", json={**transaction(502), "amount": "x"}).status_code == 422
    after = _scrape(server)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    decided = [r["decision"] for r in good.json()]
    for decision in set(decided):
        assert delta("mlops_scoring_decisions_total", decision=decision, version=champion) == decided.count(
            decision
        )
    assert delta("mlops_scoring_responses_total", route="/score", status="200") == 1
    assert delta("mlops_scoring_responses_total", route="/score", status="422") == 1
    assert delta("mlops_scoring_request_duration_seconds_count", route="/score") == 2
    assert delta("mlops_scoring_transactions_total") == 2
    assert after[("mlops_scoring_ready", ())] == 1
    threshold = server.client.get("/status").json()["champion_threshold"]["threshold"]
    assert (
        after[("mlops_scoring_model_threshold", (("role", "champion"), ("version", champion)))] == threshold
    )
    assert ("mlops_scoring_queue_depth", ()) in after and ("mlops_scoring_fold_max_seconds", ()) in after


def test_the_champion_moves_under_load_without_a_failed_request_and_the_challenger_runs_in_shadow(
    server, champion, registry_home
):
    tracking = _tracking(registry_home)
    challenger = _register(tracking, registry_home / "artifacts", seed=2)
    wait_for(lambda: server.client.get("/status").json()["shadow"] == challenger, 30, "the shadow to load")
    answers: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(base_url=server.url, timeout=30, headers=BEARER) as client:
            n = 100
            while not stop.is_set():
                n += 1
                reply = client.post("/score", json=transaction(n))
                answers.append(
                    (
                        reply.status_code,
                        reply.json().get("model", {}).get("version")
                        if reply.status_code == 200
                        else reply.text,
                    )
                )

    def answered_by(version: str) -> int:
        return sum(1 for code, answered in list(answers) if code == 200 and answered == version)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    # the load: requests answered by each champion in turn, while four clients keep the service busy
    wait_for(lambda: answered_by(champion) >= LOAD_ANSWERS, 60, f"{LOAD_ANSWERS} answers from v{champion}")
    _promote(registry_home, challenger)
    wait_for(lambda: server.client.get("/status").json()["champion"] == challenger, 30, "the new champion")
    wait_for(
        lambda: answered_by(challenger) >= LOAD_ANSWERS, 60, f"{LOAD_ANSWERS} answers from v{challenger}"
    )
    stop.set()
    for thread in threads:
        thread.join()
    assert answers and all(code == 200 for code, _ in answers), [a for a in answers if a[0] != 200][:3]
    versions = [v for _, v in answers]
    assert versions[0] == champion and versions[-1] == challenger
    assert server.client.get("/status").json()["largest_batch"] > 1  # concurrent requests were batched

    # the scoring log has every answer, with the shadow's score while v1 was champion
    server_status = server.client.get("/status").json()
    wait_for(
        lambda: (
            server.client.get("/status").json()["scoring_log_rows_written"] >= server_status["transactions"]
        ),
        30,
        "the scoring log to flush",
    )
    rows = pq.read_table(registry_home / "scoring_log").to_pylist()
    assert len(rows) == server.client.get("/status").json()["transactions"]
    shadowed = [r for r in rows if r["model_version"] == champion and r["shadow_version"] == challenger]
    assert shadowed and all(r["shadow_score"] is not None for r in shadowed)
    assert all(r["latency_ms"] > 0 and r["date"] for r in rows)


def test_a_score_that_is_not_a_number_is_declined_and_counted_never_approved(server, champion, registry_home):
    tracking = _tracking(registry_home)
    broken = _register(tracking, registry_home / "artifacts", seed=3, nan=True)
    _promote(registry_home, broken)
    wait_for(lambda: server.client.get("/status").json()["champion"] == broken, 30, "the broken champion")
    before = server.client.get("/status").json()["non_finite_scores"]
    answer = server.client.post("/score", json=[transaction(40), transaction(41)])
    assert answer.status_code == 200, answer.text
    for result in answer.json():
        assert result["model"]["version"] == broken
        assert result["decision"] == "decline" and result["score"] is None
        assert any("no finite score" in note for note in result["notes"]), result["notes"]
    assert server.client.get("/status").json()["non_finite_scores"] == before + 2


def test_champion_and_shadow_each_decide_at_their_own_operating_point(server, champion, registry_home):
    """Two versions with different thresholds (their operating points, model_contract/operating_point.py),
    served side by side: the champion's answers decide at its own, the shadow's logged decisions at its
    own."""
    from model_contract.operating_point import OperatingPoint

    tracking = _tracking(registry_home)
    points = {
        "low": OperatingPoint(0.2, None, 0.05, 0.05, 0.3, 0.9),
        "high": OperatingPoint(0.9, 0.6, 0.001, 0.001, 0.9, 0.2),
    }
    versions = {}
    for seed, kind in ((6, "low"), (7, "high")):  # recorded at registration, as `register` does
        versions[kind] = _register(tracking, registry_home / "artifacts", seed, tags=points[kind].tags())
    _promote(registry_home, versions["low"])  # the newer, "high", is the shadow
    wait_for(
        lambda: (lambda s: (s["champion"], s["shadow"]) == (versions["low"], versions["high"]))(
            server.client.get("/status").json()
        ),
        30,
        "the champion and shadow with their own operating points",
    )
    status = server.client.get("/status").json()
    assert status["champion_threshold"]["threshold"] == 0.2
    assert status["shadow_threshold"] == {
        "threshold": 0.9,
        "review_threshold": 0.6,
        "source": "operating point (at most 0.10% declined)",
    }
    answer = server.client.post("/score", json=[transaction(n) for n in range(200, 220)])
    assert answer.status_code == 200, answer.text
    for result in answer.json():
        assert result["model"]["version"] == versions["low"] and result["threshold"] == 0.2
        assert result["decision"] == ("decline" if result["score"] >= 0.2 else "approve")
    wait_for(
        lambda: any(
            r["model_version"] == versions["low"] and r["shadow_version"] == versions["high"]
            for r in pq.read_table(registry_home / "scoring_log").to_pylist()
        ),
        30,
        "the shadow's rows in the scoring log",
    )
    shadowed = [
        r
        for r in pq.read_table(registry_home / "scoring_log").to_pylist()
        if r["model_version"] == versions["low"] and r["shadow_version"] == versions["high"]
    ]
    for row in shadowed:
        assert row["threshold"] == 0.2 and row["shadow_threshold"] == 0.9
        expected = (
            "decline" if row["shadow_score"] >= 0.9 else "review" if row["shadow_score"] >= 0.6 else "approve"
        )
        assert row["shadow_decision"] == expected
    # the same transactions, two decisions: each version at its own threshold
    assert any(row["decision"] != row["shadow_decision"] for row in shadowed)


def test_an_erased_customer_leaves_the_live_state_and_what_they_scored_reaches_the_log_first(
    server, champion, registry_home
):
    """POST /erasures (what `mlops erase` calls first): the person's history is gone, their transactions
    leave their merchant's counts, and the rows their scoring had on the way are on disk when it answers."""
    from serving.erasure import forget_in_service

    erased, other, merchant = "c0790001", "c0790002", "m079001"

    def scored(n: int, customer: str, minute: int) -> dict:
        item = transaction(
            7900 + n,
            customer_id=customer,
            merchant_id=merchant,
            event_timestamp=f"2026-01-10T16:{minute:02d}:00Z",
        )
        answer = server.client.post("/score", json=item)
        assert answer.status_code == 200, answer.text
        return answer.json()

    for n, customer in enumerate([erased, other, erased, other, erased]):
        scored(n, customer, n)
    assert scored(5, erased, 10)["features"]["customer_txn_count_24h"] == 3
    eraser = {"authorization": f"Bearer {TOKENS['test-eraser']}"}
    body = {"customer_ids": [erased], "request": "REQ-7"}
    with httpx.Client(base_url=server.url, timeout=60) as bare:
        # a role of its own: every other caller is refused, and a body that is not a list of ids says so
        assert bare.post("/erasures", json=body, headers=BEARER).status_code == 403
        assert (
            bare.post(
                "/erasures", json=body, headers={"authorization": f"Bearer {TOKENS['test-scorer']}"}
            ).status_code
            == 403
        )
        bad = bare.post("/erasures", json={"customer_ids": ["c1/../x"]}, headers=eraser)
        assert bad.status_code == 422 and "c1/../x" in bad.text, bad.text
        assert bare.post("/erasures", json=[erased], headers=eraser).status_code == 422
        answer = bare.post("/erasures", json=body, headers=eraser)
    assert answer.status_code == 200, answer.text
    assert answer.json()["forgotten"] == {"customers": 1, "transactions": 4, "chargebacks": 0}
    assert answer.json()["settled"] is True
    # what they scored was on disk when it answered: the erasure's rewrite of the log finds all of it
    keyed = pseudonym.for_settings(Settings(home=registry_home))
    logged = pq.read_table(registry_home / "scoring_log", columns=["customer_id"]).column("customer_id")
    assert logged.to_pylist().count(keyed.customer(erased)) == 4
    # the audit names the request and the counts, never the person
    audited = [line for line in server.log.read_text().splitlines() if " audit " in line and "REQ-7" in line]
    assert audited and erased not in audited[-1] and keyed.customer(erased) not in audited[-1]

    # From here on the state is one that never saw them: no history, and the merchant counts the other's two.
    again = scored(6, erased, 20)
    assert again["features"]["customer_txn_count_24h"] is None and "customer_id" in again["missing_entities"]
    assert again["features"]["merchant_txn_count_24h"] == 2
    assert scored(7, erased, 21)["features"]["customer_txn_count_24h"] == 1  # new history is kept

    # `mlops erase`'s call: the service named by the settings, with the tokens file's eraser
    settings = Settings(home=registry_home, serving={"port": server.port})
    told = forget_in_service(settings, erased, keyed.customer(erased))
    assert told["status"] == "forgotten" and told["forgotten"]["transactions"] == 2, told
    nobody = forget_in_service(Settings(home=registry_home, serving={"port": free_port()}), erased, None)
    assert nobody["status"] == "not_running" and "erased lake" in nobody["why"], nobody
