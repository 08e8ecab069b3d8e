"""Separated duties at the promotion history, on this machine's PostgreSQL: three logins as the cluster has
them (infra/README.md). The promoter's may append; the training pods' may not touch the table, so its attempt
to promote is refused by the database and said as what it means; the scoring service's may only read, which
is all it needs to serve the recorded champion. The table is created once by its owner; neither the promoter
nor the others run a DDL after that (Ledger.create finds it in place)."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from training.ledger import Ledger, LedgerAccessError, LedgerReader
from training.registry import ModelRegistry, promote_manually

pytestmark = pytest.mark.integration


def _login(url: str, role: str) -> str:
    return sa.make_url(url).set(username=role).render_as_string(hide_password=False)


@pytest.fixture
def logins(postgres_database):
    """The owner's URL, and the promoter's, trainer's and reader's, each a role of its own (dropped after)."""
    suffix = uuid.uuid4().hex[:8]
    roles = {kind: f"mlops_{kind}_{suffix}" for kind in ("promoter", "trainer", "reader")}
    owner = sa.create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    Ledger(postgres_database).create()
    database = sa.make_url(postgres_database).database
    with owner.connect() as conn:
        for role in roles.values():
            conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
            conn.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
        conn.exec_driver_sql(f'GRANT SELECT, INSERT ON promotion_history TO "{roles["promoter"]}"')
        conn.exec_driver_sql(f'GRANT USAGE ON SEQUENCE promotion_history_id_seq TO "{roles["promoter"]}"')
        conn.exec_driver_sql(f'GRANT SELECT ON promotion_history TO "{roles["reader"]}"')
    try:
        yield {"owner": postgres_database, **{k: _login(postgres_database, r) for k, r in roles.items()}}
    finally:
        with owner.connect() as conn:
            for role in roles.values():
                conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                conn.exec_driver_sql(f'DROP ROLE "{role}"')
        owner.dispose()


@pytest.fixture
def registry(tmp_path):
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    registry = ModelRegistry(tracking)
    client = MlflowClient(tracking, registry_uri=tracking)
    client.create_registered_model(registry.name)
    for _ in range(2):
        client.create_model_version(registry.name, source=(tmp_path / "model").as_uri())
    return registry


def _promote(registry: ModelRegistry, url: str, version: str, actor: str):
    ledger = Ledger(url)
    try:
        return promote_manually(registry, ledger, version, "separated duties", actor=actor)
    finally:
        ledger.dispose()


def test_only_the_promoters_login_moves_the_champion_and_the_service_reads_it_read_only(logins, registry):
    promoted = _promote(registry, logins["promoter"], "1", "promoter")
    assert promoted.decision == "promoted" and registry.champion() == "1"

    # the training pods' login: refused by the database before anything is written or moved
    with pytest.raises(LedgerAccessError) as refused:
        _promote(registry, logins["trainer"], "2", "trainer")
    message = str(refused.value)
    assert logins["trainer"].split("//")[1].split("@")[0] in message and "promotion_history" in message
    assert "permission denied" in message and "promoter's login" in message
    # the service's login reads, and may not write either
    with pytest.raises(LedgerAccessError, match="may not write"):
        _promote(registry, logins["reader"], "2", "reader")

    history = Ledger(logins["owner"]).history(registry.name)
    assert [(row.decision, row.champion_after, row.decided_by) for row in history] == [
        ("promoted", "1", "promoter")
    ]
    assert registry.champion() == "1"
    reader = LedgerReader(logins["reader"])
    assert reader.champion(registry.name) == ("1", promoted.id)
    reader.dispose()
