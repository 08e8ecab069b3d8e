"""The scoring log's own conversion of rows to Arrow (serving/scoring_log.py `as_table`, column by column, for
speed) against Arrow's own `Table.from_pylist`, which it replaces on the writer's path: the same table for
every kind of row the service writes, and a refusal for a row that does not fit. pyarrow is pinned below its
next minor (pyproject.toml) so a change of Arrow's conversion rules is met here first."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from model_contract.inputs import NUMERIC_FEATURES
from serving.scoring_log import as_table, schema

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 10, 12, 30, 0, 123456, tzinfo=UTC)


def _row(n: int, **changes) -> dict:
    row = {
        "transaction_id": f"tx{n:016x}",
        "customer_id": "pc" + "0" * 20,
        "merchant_id": "pm" + "f" * 20,
        "event_timestamp": NOW - timedelta(seconds=n),
        "scored_at": NOW,
        "amount": 12.5 + n,
        "currency": "EUR",
        "country": "DE",
        "channel": "online",
        "merchant_category": "grocery",
        **{name: float(n) for name in NUMERIC_FEATURES},
        "model_name": "fraud-detector",
        "model_version": "3",
        "score": 0.25,
        "decision": "approve",
        "threshold": 0.5,
        "shadow_version": None,
        "shadow_score": None,
        "shadow_threshold": None,
        "shadow_decision": None,
        "missing_entities": None,
        "reasons": None,
        "latency_ms": 1.5,
        "caller": "local-scorer",
    }
    row.update(changes)
    return row


def test_every_kind_of_row_gives_arrows_own_table():
    rows = [
        _row(0),
        _row(1, customer_txn_count_1h=3, customer_amount_std_1h=None),  # an integer feature, a missing one
        _row(2, country=None, channel=None, missing_entities="customer_id", reasons="amount_usd:+0.120000"),
        _row(3, shadow_version="4", shadow_score=0.75, shadow_threshold=0.6, shadow_decision="decline"),
        _row(4, score=math.nan, decision="decline"),  # a broken model's score is logged as it came
        _row(5, event_timestamp=datetime(2026, 1, 10, 14, 0, tzinfo=timezone(timedelta(hours=2)))),
        _row(6, caller=None, unknown_key="ignored"),
        {k: v for k, v in _row(7).items() if k != "shadow_decision"},  # a log from before a column: null
    ]
    ours, arrows = as_table(rows), pa.Table.from_pylist(rows, schema=schema())
    assert ours.schema == arrows.schema == schema()
    assert _values(ours) == _values(arrows)
    assert ours.num_rows == len(rows) and ours.column("shadow_decision").null_count == 7
    assert math.isnan(ours.column("score")[4].as_py())


def _values(table: pa.Table) -> list[dict]:
    """The table's rows, NaN made comparable (NaN != NaN, and Table.equals says so)."""
    return [
        {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        for row in table.to_pylist()
    ]


@pytest.mark.parametrize(
    ("misfit", "refused"),
    [
        ({"score": "high"}, True),
        ({"event_timestamp": "yesterday"}, True),
        ({"amount": [1.0]}, True),
        ({"transaction_id": None}, False),  # a null where the schema says not null: neither checks it
    ],
)
def test_a_row_that_does_not_fit_is_judged_as_arrow_judges_it(misfit, refused):
    """Refused the same way (the writer then converts the chunk row by row and drops the misfit alone), or
    taken the same way."""
    rows = [_row(0), _row(1, **misfit)]
    outcomes = []
    for convert in (lambda: pa.Table.from_pylist(rows, schema=schema()), lambda: as_table(rows)):
        try:
            outcomes.append(_values(convert()))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            outcomes.append(type(exc))
    assert outcomes[0] == outcomes[1]
    assert isinstance(outcomes[0], type) is refused
