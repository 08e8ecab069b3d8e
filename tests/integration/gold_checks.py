"""Checks of the features stage's end state, shared by the late-event and feed-week tests: gold holds one
row per silver transaction on its event date, equals a rebuild from scratch, and the online store holds
each entity's latest gold row."""

from __future__ import annotations

import hashlib
import shutil
from datetime import date
from pathlib import Path

import pytest

from core.settings import Settings
from pipelines.gold import job as gold


def counts_by_event_date(root: Path, column: str = "event_date") -> dict[str, int]:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(root, format="parquet", partitioning="hive").to_table(columns=[column])
    counts = pc.value_counts(pc.cast(table[column], "string"))
    return {c["values"].as_py(): c["counts"].as_py() for c in counts}


def silver_by_event_date(settings: Settings) -> dict[str, int]:
    return counts_by_event_date(settings.lake / "silver" / "transactions")


def gold_tables(settings: Settings) -> list[Path]:
    return [settings.lake / "gold" / t for t in ("customer_features", "merchant_features")]


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.parquet"))
        if not any(part.startswith(".") for part in p.relative_to(root).parts)  # a reader's view: no staging
    }


def gold_digests(settings: Settings) -> dict[str, dict[str, str]]:
    """Each gold table's Parquet files as a reader sees them, by path: their contents' digests."""
    return {t.name: _digests(t) for t in gold_tables(settings)}


def assert_gold_is_a_rebuild_from_scratch(settings: Settings, scratch: Path) -> None:
    """Whatever order the arrivals came in, the gold kept must be byte for byte the gold that building every
    event date anew from the final silver gives."""
    kept = gold_digests(settings)
    fresh = settings.model_copy(update={"home": scratch / "scratch-home"})
    shutil.copytree(settings.lake / "silver", fresh.lake / "silver")  # transactions and labels
    for event_date in sorted(silver_by_event_date(settings)):
        gold.build_gold(fresh, date.fromisoformat(event_date))
    assert kept == gold_digests(fresh)


def assert_online_holds_latest_gold(settings: Settings) -> None:
    """Every entity of gold reads back its latest gold row (event, then created time) from the online
    store, for both views."""
    import pyarrow.dataset as ds

    from features.online import online_features

    customers, merchants = (
        ds.dataset(t, format="parquet", partitioning="hive")
        .to_table()
        .to_pandas()
        .sort_values(["event_timestamp", "created_timestamp"])
        for t in gold_tables(settings)
    )
    latest_customer = customers.groupby("customer_id").tail(1).set_index("customer_id").sort_index()
    latest_merchant = merchants.groupby("merchant_id").tail(1).set_index("merchant_id").sort_index()
    merchant_ids = list(latest_merchant.index)
    rows = [
        {"customer_id": c, "merchant_id": merchant_ids[i % len(merchant_ids)]}
        for i, c in enumerate(latest_customer.index)
    ]
    rows += [{"customer_id": latest_customer.index[0], "merchant_id": m} for m in merchant_ids]
    online = online_features(settings, rows)
    n = len(latest_customer)
    for feature in ("customer_txn_count_30d", "customer_amount_sum_30d", "customer_txn_count_24h"):
        assert online[feature][:n] == pytest.approx(latest_customer[feature].tolist()), feature
    for feature in ("merchant_txn_count_7d", "merchant_amount_sum_24h", "merchant_chargebacks_30d"):
        assert online[feature][n:] == pytest.approx(latest_merchant[feature].tolist()), feature


def assert_training_set_is_the_full_join(settings: Settings, as_of: date, window_days: int) -> dict:
    """The training set read from the feature rows (training/feature_rows.py) equals the point-in-time join
    of the whole window, row for row and value for value, sampled (a cap below the window's rows) and not;
    returns what a second look at the rows found to rebuild (nothing, once they are fresh)."""
    import pandas as pd

    from training.dataset import build_training_frame, build_training_frame_by_join
    from training.feature_rows import ensure_feature_rows

    for cap in (None, 300):
        arguments = {"window_days": window_days, "label_maturity_days": 1, "max_fit_rows": cap}
        rows = build_training_frame(settings, as_of, require_fraud=False, **arguments)
        joined = build_training_frame_by_join(settings, as_of, require_fraud=False, **arguments)
        assert len(rows) > 0
        if cap is not None:
            assert rows.attrs["negative_sample_rate"] < 1.0  # the sampled read is exercised
        pd.testing.assert_frame_equal(rows, joined, check_exact=True)
        assert rows.attrs == joined.attrs
    assert_frauds_kept_apart_are_their_rows(settings)
    return ensure_feature_rows(settings, [as_of])


def assert_frauds_kept_apart_are_their_rows(settings: Settings) -> None:
    """Each date's frauds kept apart (training/feature_rows.WindowRows) are rows of that date's current rows
    file, value for value, recorded with its signature; at least one date has some. (A store may hold a
    transaction whose chargeback a re-delivered labels file withdrew: a read takes from it only the rows
    it knows as frauds, which the full-join comparison above checks.)"""
    import pandas as pd
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipelines.lake import read_json
    from training import feature_rows

    stores = sorted((settings.lake / "state" / "training_rows_frauds").glob("event_date=*.parquet"))
    assert stores, "no date kept its frauds apart"
    for path in stores:
        day = date.fromisoformat(path.stem.removeprefix("event_date="))
        stored = pq.read_table(path)
        signature = (stored.schema.metadata or {}).get(feature_rows.SIGNATURE_KEY, b"").decode()
        assert signature == read_json(feature_rows._record_path(settings.lake, day))["signature"], day
        rows = pq.read_table(feature_rows._rows_path(settings.lake, day) / feature_rows.ROWS_FILE)
        same = rows.filter(pc.is_in(rows["transaction_id"], value_set=stored["transaction_id"]))
        by_id = [("transaction_id", "ascending")]
        assert same.num_rows == stored.num_rows, day
        pd.testing.assert_frame_equal(
            stored.sort_by(by_id).to_pandas(), same.select(stored.column_names).sort_by(by_id).to_pandas()
        )
