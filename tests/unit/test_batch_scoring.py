"""Batch scoring's edges that need no lake (the day's output against the running service is proven in
tests/e2e/test_scoring_parity.py)."""

from __future__ import annotations

from datetime import date

import pytest

from core.errors import PipelineError
from core.settings import Settings
from pipelines.contracts import TRANSACTIONS_CONTRACT
from serving.app import EXAMPLE
from serving.contract import ContractError, validate_request

pytestmark = pytest.mark.unit

# The service's own example request, its ids as the lake stores them (pseudonyms).
STORED = {**EXAMPLE, "customer_id": "pc" + "0" * 20, "merchant_id": "pm" + "f" * 20}


def test_a_day_silver_does_not_hold_is_refused_naming_the_folder(tmp_path):
    from serving.batch import score_day

    settings = Settings(home=tmp_path)
    with pytest.raises(PipelineError, match=r"no silver transaction has an event time on 2026-01-10.*silver"):
        score_day(settings, date(2026, 1, 10))
    assert not (settings.lake / "decisions").exists()


def test_stored_identifiers_parse_as_the_lake_keeps_them_and_raw_ones_do_not():
    (parsed,), _ = validate_request(TRANSACTIONS_CONTRACT, dict(STORED), stored=True)
    assert parsed["customer_id"] == STORED["customer_id"] and parsed["amount"] == 42.5
    # a caller's request is judged by the raw form: a pseudonym there is refused, and a raw id in the lake
    with pytest.raises(ContractError, match="customer_id"):
        validate_request(TRANSACTIONS_CONTRACT, dict(STORED))
    with pytest.raises(ContractError, match="customer_id"):
        validate_request(TRANSACTIONS_CONTRACT, {**STORED, "customer_id": "c0000001"}, stored=True)
