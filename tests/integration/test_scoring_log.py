"""The scoring log on disk (serving/scoring_log.py, real Parquet files): partitioned by the service's scoring
time rather than the caller's event time, read back by event date, bounded while the disk refuses writes
(rows dropped and counted, the problem named until it catches up), old scoring dates deleted, temporary
files of a killed writer removed."""

from __future__ import annotations

import os
import sys
import threading
from datetime import UTC, date, datetime, timedelta

import numpy as np
import pyarrow.parquet as pq
import pytest

from serving.scoring_log import (
    CONVERT_COLUMN_ROWS,
    CONVERT_ROWS,
    DICTIONARY_COLUMNS,
    Columns,
    ScoringLog,
    read_scoring_log,
    schema,
)
from serving.threads import BACKGROUND_NICENESS
from tests.conftest import wait_for
from training.dataset import CATEGORICAL_FEATURES, NUMERIC_FEATURES

D = date(2026, 3, 10)


def row(n: int, event: datetime, scored: datetime) -> dict:
    return {
        "transaction_id": f"tx{n:016x}",
        "customer_id": "c0000001",
        "merchant_id": "m000001",
        "event_timestamp": event,
        "scored_at": scored,
        "amount": 10.0,
        "currency": "EUR",
        **dict.fromkeys(CATEGORICAL_FEATURES, "x"),
        **dict.fromkeys(NUMERIC_FEATURES, 1.0),
        "model_name": "fraud-detector",
        "model_version": "1",
        "score": 0.1,
        "decision": "approve",
        "threshold": 0.5,
        "shadow_version": None,
        "shadow_score": None,
        "missing_entities": None,
        "latency_ms": 1.0,
        "caller": "test",
    }


def at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def _written(log: ScoringLog, rows: list[dict]) -> None:
    log.append(rows)
    log.flush()


def test_rows_go_by_the_date_they_were_scored_and_are_read_back_by_event_date(tmp_path):
    log = ScoringLog(tmp_path / "log", flush_interval_s=60)
    late = row(1, at(D, 23), at(D + timedelta(days=1), 0))  # scored after midnight
    ahead = row(2, datetime(2099, 1, 1, tzinfo=UTC), at(D, 12))  # whatever time a caller's clock says
    before = row(3, at(D - timedelta(days=1), 22), at(D, 1))
    _written(log, [late, ahead, before])
    log.close()
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["date=2026-03-10", "date=2026-03-11"]
    ids = read_scoring_log(tmp_path / "log", D, D, ["transaction_id"])["transaction_id"].to_pylist()
    assert ids == [late["transaction_id"]]
    earlier = read_scoring_log(tmp_path / "log", D - timedelta(days=1), D - timedelta(days=1))
    assert earlier["transaction_id"].to_pylist() == [before["transaction_id"]]
    assert read_scoring_log(tmp_path / "log", D + timedelta(days=5), D + timedelta(days=6)).num_rows == 0


def test_while_the_disk_refuses_rows_are_held_up_to_the_cap_then_dropped_counted_and_named(tmp_path):
    root = tmp_path / "log"
    root.write_text("not a folder")  # every write fails until it is removed
    log = ScoringLog(root, flush_rows=5, flush_interval_s=60, max_pending_rows=10)
    _written(log, [row(n, at(D, 10), at(D, 10)) for n in range(8)])
    assert log.errors >= 1 and log.pending == 8 and log.dropped == 0 and log.problem is None
    _written(log, [row(n, at(D, 11), at(D, 11)) for n in range(8, 14)])
    assert log.pending == 10 and log.dropped == 4
    assert "10 rows" in log.problem and "log_max_pending_rows" in log.problem
    root.unlink()  # the disk is back: the held rows are written at the next flush, the problem clears
    log.flush()
    assert log.pending == 0 and log.problem is None and log.written == 10
    _written(log, [row(99, at(D, 12), at(D, 12))])  # taken again
    log.close()
    assert log.written == 11 and log.dropped == 4
    assert read_scoring_log(root, D, D).num_rows == 11


def test_scoring_dates_older_than_the_retention_are_deleted_and_leftover_temporary_files_removed(tmp_path):
    root = tmp_path / "log"
    stale = root / "date=2026-03-10" / ".part-20260310T000000000000-deadbeef.parquet.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half a file")
    log = ScoringLog(root, flush_interval_s=60, retention_days=90)
    assert not stale.exists()
    old, recent = D - timedelta(days=120), D - timedelta(days=30)
    _written(log, [row(1, at(old, 9), at(old, 9)), row(2, at(recent, 9), at(recent, 9))])
    _written(log, [row(3, at(D, 9), at(D, 9))])
    log.close()
    assert sorted(p.name for p in root.iterdir()) == [f"date={recent}", f"date={D}"]
    assert log.removed_partitions == 1


def test_rows_become_arrow_in_small_chunks_as_they_come_and_a_row_that_misfits_fails_alone(tmp_path):
    """Converting a whole flush's rows at once held the GIL for tens of milliseconds and stalled every
    request; rows are converted CONVERT_ROWS at a time as they come. A row that does not fit the schema is
    dropped, counted and named; the rest of its chunk is written."""
    log = ScoringLog(tmp_path / "log", flush_interval_s=60)
    rows = [row(n, at(D, 10), at(D, 10)) for n in range(3 * CONVERT_ROWS + 5)]
    rows[CONVERT_ROWS + 7]["score"] = "not a number"
    for start in range(0, len(rows), 16):  # as a service appends them, a batch at a time
        log.append(rows[start : start + 16])
    wait_for(lambda: log._converted >= 3 * CONVERT_ROWS - 1, 30, "the rows to be converted before the flush")
    assert log.written == 0  # nothing flushed yet: the conversion came first
    log.flush()
    log.close()
    assert (log.written, log.dropped, log.pending) == (len(rows) - 1, 1, 0)
    assert log.errors == 1
    written = read_scoring_log(tmp_path / "log", D, D, ["transaction_id"])["transaction_id"].to_pylist()
    assert written == [r["transaction_id"] for i, r in enumerate(rows) if i != CONVERT_ROWS + 7]


def test_the_writer_thread_runs_at_a_lower_priority_than_the_request_path(tmp_path):
    """Its bursts (Parquet writes) must not take a core from the requests (serving/threads.py)."""
    if sys.platform != "linux":
        pytest.skip("per-thread priorities are Linux's")
    log = ScoringLog(tmp_path / "log", flush_interval_s=60)
    try:
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        writer = log._thread.native_id
        wait_for(
            lambda: os.getpriority(os.PRIO_PROCESS, writer) == min(19, base + BACKGROUND_NICENESS),
            30,
            "the scoring log's writer to lower its priority",
        )
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    finally:
        log.close()


def _as_columns(rows: list[dict], day: date) -> Columns:
    """The rows as the scorer hands them over: the model inputs as one float64 table (NaN where missing), the
    score as an array, every other column a list."""
    names = schema().names
    data = {name: [r.get(name) for r in rows] for name in names}
    table = np.array(
        [[np.nan if r[f] is None else r[f] for f in NUMERIC_FEATURES] for r in rows], dtype="float64"
    )
    data.update(zip(NUMERIC_FEATURES, table.T, strict=True))
    data["score"] = np.array([r["score"] for r in rows], dtype="float64")
    return Columns(day, len(rows), data)


def test_a_scored_batch_given_as_columns_is_written_as_the_same_rows_given_as_dicts(tmp_path):
    """The scorer's way (Columns: its arrays as they are) and the rows' way (dicts, from_pylist) write equal
    tables: a missing model input is null, a score that is NaN stays NaN, a shadow's values where it scored,
    rows of two scoring dates in their own partitions, batches merged CONVERT_COLUMN_ROWS rows at a time."""
    rows = []
    for n in range(CONVERT_COLUMN_ROWS + 40):
        scored = at(D, 23) if n < CONVERT_COLUMN_ROWS else at(D + timedelta(days=1), 0)
        r = {**row(n, at(D, 22), scored), "shadow_threshold": None, "shadow_decision": None, "reasons": None}
        r[NUMERIC_FEATURES[n % len(NUMERIC_FEATURES)]] = None  # a missing input
        r[NUMERIC_FEATURES[0]] = float(n)
        if n % 7 == 0:
            r.update(shadow_version="2", shadow_score=0.25, shadow_threshold=0.4, shadow_decision="approve")
        if n == 5:
            r["score"] = float("nan")  # a champion's non-finite score: logged as it was, not as missing
        rows.append(r)
    by_dicts, by_columns = ScoringLog(tmp_path / "dicts"), ScoringLog(tmp_path / "columns")
    for start in range(0, len(rows), 24):  # batches as the micro-batcher makes them, none across midnight
        batch = rows[start : start + 24]
        for day in sorted({r["scored_at"].date() for r in batch}):
            same_day = [r for r in batch if r["scored_at"].date() == day]
            by_dicts.append(same_day)
            by_columns.append_columns(_as_columns(same_day, day))
    for log in (by_dicts, by_columns):
        log.flush()
        log.close()
        assert (log.written, log.dropped, log.errors) == (len(rows), 0, 0)
    for folder in ("date=2026-03-10", "date=2026-03-11"):
        (expected,) = [pq.read_table(p) for p in (tmp_path / "dicts" / folder).glob("*.parquet")]
        (got,) = [pq.read_table(p) for p in (tmp_path / "columns" / folder).glob("*.parquet")]
        assert got.schema.equals(expected.schema) and got.num_rows == expected.num_rows > 0
        # column by column, so a difference names its column; the score (NaN != NaN) is compared below
        for name in (n for n in schema().names if n != "score"):
            assert got[name].to_pylist() == expected[name].to_pylist(), name
        scores, expected_scores = got["score"].to_pylist(), expected["score"].to_pylist()
        assert [s != s for s in scores] == [s != s for s in expected_scores]  # NaN where it was NaN
        assert [s for s in scores if s == s] == [s for s in expected_scores if s == s]
    assert got[NUMERIC_FEATURES[1]].null_count > 0  # the missing inputs are nulls, not NaN
    # the few-valued columns are dictionary-encoded in the file, the ids are not
    assert set(DICTIONARY_COLUMNS) < set(schema().names)
    (written,) = (tmp_path / "columns" / "date=2026-03-11").glob("*.parquet")
    group = pq.ParquetFile(written).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert "RLE_DICTIONARY" in encodings["decision"] and "RLE_DICTIONARY" not in encodings["transaction_id"]


def test_a_column_batch_that_misfits_is_written_row_by_row_without_the_misfit_and_the_cap_holds(tmp_path):
    rows = [row(n, at(D, 10), at(D, 10)) for n in range(20)]
    batch = _as_columns(rows, D)
    batch.data["caller"][3] = 12345  # not a string: the batch cannot become Arrow in one call
    log = ScoringLog(tmp_path / "log", flush_interval_s=60, max_pending_rows=16)
    log.append_columns(batch)  # 16 fit under the cap, 4 are dropped at once
    log.flush()
    log.close()
    assert (log.written, log.dropped, log.errors, log.pending) == (15, 5, 1, 0)
    written = read_scoring_log(tmp_path / "log", D, D, ["transaction_id"])["transaction_id"].to_pylist()
    assert written == [r["transaction_id"] for i, r in enumerate(rows[:16]) if i != 3]
    with pytest.raises(ValueError, match=r"missing \['caller'\], unknown \['who'\]"):
        Columns(D, 1, {**{k: v for k, v in batch.data.items() if k != "caller"}, "who": ["x"]})
