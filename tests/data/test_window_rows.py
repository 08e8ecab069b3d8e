"""The training set's second read (training/feature_rows.WindowRows) decodes only the row groups that hold a
kept row and keeps the frauds it read apart for the next read: whatever the layout (id-hash order in small
groups, an older file in scan order), the store's state (empty, warm, written for rows since rebuilt), the
rows it returns are the rows at the positions asked for, value for value. Small feature-rows lakes written
as training/feature_rows.py writes them (benchmarks/training_set.py's rows: the same columns and types)."""

from __future__ import annotations

import io
from datetime import date, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from benchmarks.training_set import _rows_of, build_lake
from core.settings import Settings
from pipelines.lake import write_json
from training import feature_rows
from training.dataset import (
    FRAME_KEYS,
    SERVICE_FEATURES,
    TRANSACTION_INPUTS,
    as_written,
    build_training_table,
)

DAYS = [date(2026, 3, 1) + timedelta(days=k) for k in range(3)]
ROWS = 2_000
COLUMNS = [*FRAME_KEYS, *TRANSACTION_INPUTS, *SERVICE_FEATURES]
THIN = ["transaction_id", "event_timestamp", feature_rows.ID_HASH, feature_rows.ARRIVAL]


@pytest.fixture(autouse=True)
def small_groups(monkeypatch):
    monkeypatch.setattr(feature_rows, "ROW_GROUP_ROWS", 100)


def _write_date(lake, day: date, seed: int, signature: str) -> pa.Table:
    rows = _rows_of(day, ROWS, seed)
    empty = {view.name: feature_rows._empty_carry(view) for view in feature_rows.VIEWS}
    feature_rows._write(lake, day, rows, empty)
    write_json(feature_rows._record_path(lake, day), {"event_date": day.isoformat(), "signature": signature})
    return rows


def _whole(lake) -> pa.Table:
    """Every row of the window's files, file after file: what the positions index."""
    return pa.concat_tables(
        pq.read_table(feature_rows._rows_path(lake, day) / feature_rows.ROWS_FILE, columns=COLUMNS)
        for day in DAYS
    )


def _plan(thin: pa.Table, rate: float, fraud_share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions a sample would keep (hash below `rate`, and every fraud) and which of them are frauds."""
    rng = np.random.default_rng(seed)
    fraud = rng.random(thin.num_rows) < fraud_share
    keep = fraud | (thin[feature_rows.ID_HASH].to_numpy() < rate)
    positions = np.flatnonzero(keep)
    return positions, fraud[positions]


def _same(got: pa.Table | None, expected: pa.Table) -> bool:
    """Equal in schema and value, NaN equal to NaN (Arrow's `equals` holds NaN unequal to itself)."""
    assert got is not None
    assert got.schema == expected.schema
    pd.testing.assert_frame_equal(got.to_pandas(), expected.to_pandas(), check_exact=True)
    return True


def _take(lake, positions: np.ndarray, fraud: np.ndarray) -> tuple[pa.Table, dict]:
    """The rows at `positions`, put back in that order (the read returns them with their places)."""
    rows = feature_rows.WindowRows(lake, DAYS)
    rows.thin(THIN)
    table, order = rows.take(positions, fraud, COLUMNS)
    assert sorted(order) == list(range(len(positions)))  # each asked for once
    return table.take(pa.array(np.argsort(order))), rows.stats


def test_only_the_groups_of_kept_rows_are_decoded_and_frauds_come_from_the_store_next_time(tmp_path):
    for k, day in enumerate(DAYS):
        _write_date(tmp_path, day, seed=k, signature=f"s{k}")
    total = len(DAYS) * ROWS
    thin = feature_rows.WindowRows(tmp_path, DAYS).thin(THIN)
    positions, fraud = _plan(thin, rate=0.1, fraud_share=0.005, seed=1)
    expected = _whole(tmp_path).take(pa.array(positions))

    first, cold = _take(tmp_path, positions, fraud)
    assert _same(first, expected)
    assert cold["frauds_added"] == int(fraud.sum()) > 0
    assert cold["frauds_from_store"] == 0
    assert cold["rows_decoded"] < total / 2  # hash order: the sample's groups and the frauds' groups

    again, warm = _take(tmp_path, positions, fraud)
    assert _same(again, expected)
    assert warm["frauds_added"] == 0
    assert warm["frauds_from_store"] > 0  # the frauds outside the sample's groups
    assert warm["rows_decoded"] < cold["rows_decoded"]

    # New chargebacks: more frauds among the same rows; the old ones come from the store, the new are added.
    more_positions, more_fraud = _plan(thin, rate=0.1, fraud_share=0.01, seed=2)
    more_fraud |= np.isin(more_positions, positions[fraud])
    both = np.union1d(positions, more_positions)
    flags = np.isin(both, np.concatenate([positions[fraud], more_positions[more_fraud]]))
    later, stats = _take(tmp_path, both, flags)
    assert _same(later, _whole(tmp_path).take(pa.array(both)))
    assert stats["frauds_from_store"] > 0 and stats["frauds_added"] > 0


def test_a_rebuilt_date_does_not_take_frauds_kept_from_its_old_rows(tmp_path):
    for k, day in enumerate(DAYS):
        _write_date(tmp_path, day, seed=k, signature=f"s{k}")
    thin = feature_rows.WindowRows(tmp_path, DAYS).thin(THIN)
    positions, fraud = _plan(thin, rate=0.05, fraud_share=0.01, seed=3)
    _take(tmp_path, positions, fraud)  # the frauds kept apart
    # The middle date rebuilt from changed gold: the same transactions, other feature values. Its store goes
    # with the rebuild; one written back by a reader of the old rows is refused by its signature.
    stale = pq.read_table(feature_rows._frauds_path(tmp_path, DAYS[1]))
    _write_date(tmp_path, DAYS[1], seed=1, signature="s1-rebuilt")
    assert not feature_rows._frauds_path(tmp_path, DAYS[1]).exists()
    changed = feature_rows._rows_path(tmp_path, DAYS[1]) / feature_rows.ROWS_FILE
    table = pq.read_table(changed)
    feature = SERVICE_FEATURES[0]
    table = table.set_column(
        table.column_names.index(feature), feature, pc.add(table[feature].fill_null(0.0), 1000.0)
    )
    feature_rows._replace(changed.parent, {feature_rows.ROWS_FILE: table}, order_by_hash=True)
    pq.write_table(stale, feature_rows._frauds_path(tmp_path, DAYS[1]))

    rebuilt, _ = _take(tmp_path, positions, fraud)
    assert _same(rebuilt, _whole(tmp_path).take(pa.array(positions)))
    was_stored = rebuilt.filter(pc.is_in(rebuilt["transaction_id"], stale["transaction_id"]))
    assert was_stored.num_rows > 0 and pc.min(was_stored[feature]).as_py() >= 1000


def test_a_file_in_scan_order_reads_the_same_and_is_rewritten_in_hash_order(tmp_path):
    for k, day in enumerate(DAYS):
        _write_date(tmp_path, day, seed=k, signature=f"s{k}")
    old = feature_rows._rows_path(tmp_path, DAYS[0]) / feature_rows.ROWS_FILE
    scan_order = _rows_of(DAYS[0], ROWS, 0)
    pq.write_table(scan_order, old, compression="lz4")  # as a lake before the hash order holds it
    assert not feature_rows.in_hash_order(old)
    thin = feature_rows.WindowRows(tmp_path, DAYS).thin(THIN)
    positions, fraud = _plan(thin, rate=0.1, fraud_share=0.01, seed=4)
    taken, _ = _take(tmp_path, positions, fraud)
    assert _same(taken, _whole(tmp_path).take(pa.array(positions)))

    assert feature_rows._relayout(tmp_path, DAYS[0])
    assert feature_rows.in_hash_order(old)
    relaid = pq.read_table(old)
    assert relaid.num_rows == ROWS and pq.ParquetFile(old).num_row_groups == ROWS // 100
    assert np.all(np.diff(relaid[feature_rows.ID_HASH].to_numpy()) >= 0)
    by_id = [("transaction_id", "ascending")]
    assert _same(relaid.sort_by(by_id), scan_order.sort_by(by_id))
    assert not feature_rows._relayout(tmp_path, DAYS[0])  # once


def test_the_training_set_is_the_same_from_small_groups_and_the_store_as_from_whole_files(
    tmp_path, monkeypatch
):
    """build_training_table on a lake with chargebacks at the feed's rate and delays: with groups of 100
    rows and the frauds kept apart (read cold, then warm), the same table as with one group a file."""
    last, days = date(2026, 2, 5), 4
    arguments = {"window_days": days, "max_fit_rows": 1_500, "require_fraud": False}
    small = Settings(home=tmp_path / "small")
    build_lake(small, last, days, rows=3_000)
    cold, info = build_training_table(small, last, **arguments)
    assert info["negative_sample_rate"] < 0.5  # the sampled read is exercised
    warm, _ = build_training_table(small, last, **arguments)
    assert any(feature_rows._frauds_path(small.lake, last - timedelta(days=k)).exists() for k in range(days))

    monkeypatch.setattr(feature_rows, "ROW_GROUP_ROWS", 1_000_000)
    whole = Settings(home=tmp_path / "whole")
    build_lake(whole, last, days, rows=3_000)
    reference, reference_info = build_training_table(whole, last, **arguments)
    assert cold.num_rows > 0 and int(pc.sum(cold["label"]).as_py()) > 0
    assert _same(cold, reference) and _same(warm, reference)
    assert info == reference_info
    written = {_written(as_written(t)) for t in (cold, warm, reference)}
    assert len(written) == 1  # the same bytes, so the same DVC hash, however the rows were read


def _written(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="lz4")
    return sink.getvalue()


def test_ids_are_taken_file_by_file_in_the_order_asked(tmp_path):
    for k, day in enumerate(DAYS):
        _write_date(tmp_path, day, seed=k, signature=f"s{k}")
    rows = feature_rows.WindowRows(tmp_path, DAYS)
    thin = rows.thin(THIN)
    asked = np.random.default_rng(5).permutation(thin.num_rows)[:500]
    assert rows.ids_at(asked).to_pylist() == thin["transaction_id"].take(pa.array(asked)).to_pylist()


@pytest.mark.parametrize("change", [300, -300, 0])
def test_a_file_rewritten_between_the_passes_is_named(tmp_path, change):
    for k, day in enumerate(DAYS):
        _write_date(tmp_path, day, seed=k, signature=f"s{k}")
    rows = feature_rows.WindowRows(tmp_path, DAYS)
    thin = rows.thin(THIN)
    # Between the passes the date is rebuilt with transactions added or withdrawn (the rows move in the
    # file), or with the same count of other transactions.
    rebuilt = _rows_of(DAYS[2], ROWS + change, seed=9)
    if change == 0:
        rebuilt = rebuilt.set_column(
            0, "transaction_id", pc.binary_join_element_wise(rebuilt["transaction_id"], "x", "")
        )
    empty = {view.name: feature_rows._empty_carry(view) for view in feature_rows.VIEWS}
    feature_rows._write(tmp_path, DAYS[2], rebuilt, empty)
    positions, fraud = _plan(thin, rate=0.1, fraud_share=0.02, seed=6)
    with pytest.raises(feature_rows.RowsChangedError, match=f"event_date={DAYS[2]}"):
        rows.take(positions, fraud, COLUMNS)


@pytest.mark.parametrize("order", ["hash", "scan"])
def test_known_frauds_are_matched_by_id_even_where_hashes_collide(tmp_path, order):
    from training.dataset import unit_hash

    _write_date(tmp_path, DAYS[0], seed=0, signature="s0")
    if order == "scan":
        path = feature_rows._rows_path(tmp_path, DAYS[0]) / feature_rows.ROWS_FILE
        pq.write_table(_rows_of(DAYS[0], ROWS, 0), path)
    rows = feature_rows.WindowRows(tmp_path, DAYS[:1])
    thin = rows.thin(THIN)
    ids = thin["transaction_id"].combine_chunks()
    frauds = ids.take(pa.array([3, 70, 1_999]))
    hashes = thin[feature_rows.ID_HASH].to_numpy().copy()
    # A legitimate row whose hash equals a fraud's (in a hash-ordered file, the next row: order kept).
    twin = 10 if order == "scan" else 4
    hashes[twin] = unit_hash(frauds)[0]
    part = rows.parts[0]
    rows.parts[0] = part.set_column(
        part.column_names.index(feature_rows.ID_HASH), feature_rows.ID_HASH, pa.array(hashes)
    )
    expected = pc.is_in(ids, value_set=frauds).to_numpy(zero_copy_only=False)
    assert expected.sum() == 3 and not expected[twin]
    assert np.array_equal(rows.holding(frauds), expected)
    assert not rows.holding(pa.array([], pa.string())).any()
