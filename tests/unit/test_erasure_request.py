"""The erase_customer DAG's decisions around its approval (mlops/erasure.py): who may let an erasure run, and
what a refusal or silence does. Nothing reaches the erasure in these cases, so no installation is needed."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from core.settings import get_settings
from mlops.erasure import ERASE, REFUSE, erase_if_approved, erasure_request


@pytest.fixture
def approvers(monkeypatch, tmp_path):
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))  # nothing is written: every case stops first
    monkeypatch.setenv("MLOPS_APPROVAL__APPROVERS", json.dumps(["dpo", "alice"]))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _answer(user: str, choice: str | None) -> dict:
    return {"chosen_options": [choice] if choice else [], "responded_by_user": {"id": user, "name": user}}


def test_the_request_names_the_customer_and_what_will_go_and_refuses_what_is_not_an_id():
    asked = erasure_request(" c0000042 ", "DSR-7", rebuild=True, started_by="alice")
    assert asked["customer"] == "c0000042" and asked["started_by"] == "alice"
    assert "**c0000042** (DSR-7), asked by alice" in asked["body"] and "gold" in asked["body"]
    assert "later `mlops features backfill`" in erasure_request("c1", "", False, "")["body"]
    with pytest.raises(ValueError, match=r"the `customer` param: 'c1/\.\./x' is not a customer id"):
        erasure_request("c1/../x", "DSR-7", rebuild=True, started_by="alice")


@pytest.mark.usefixtures("approvers")
def test_the_starter_and_a_non_member_cannot_let_it_run_and_a_refusal_or_silence_erases_nothing():
    asked = erasure_request("c0000042", "DSR-7", rebuild=False, started_by="alice")
    with pytest.raises(AirflowFailException, match="alice asked for this erasure and cannot approve it"):
        erase_if_approved(asked, _answer("alice", ERASE))
    with pytest.raises(AirflowFailException, match="mallory is not in the approvers group"):
        erase_if_approved(asked, _answer("mallory", ERASE))
    with pytest.raises(AirflowSkipException, match="refused by dpo: nothing was erased"):
        erase_if_approved(asked, _answer("dpo", REFUSE))
    with pytest.raises(AirflowSkipException, match="no answer in time: nothing was erased"):
        erase_if_approved(asked, None)
    with pytest.raises(AirflowSkipException, match="nothing was asked"):
        erase_if_approved(None, _answer("dpo", ERASE))
