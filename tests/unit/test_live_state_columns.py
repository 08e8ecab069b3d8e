"""The live state in columns (features/live/): customers' history as one numpy column per field, folded in
again each day (features/live/fold.py), loaded from silver in two passes, ids kept only in each customer's
window. Whatever the layout, the rows are those of a state that only ever observed: ties in one millisecond
ordered by id, late transactions landing inside the history, resends and chargebacks found through the
hashed ids."""

from __future__ import annotations

import contextlib
import random
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.live import LiveState

T0 = datetime(2026, 3, 1, tzinfo=UTC)
DAYS = 8


def _stream(seed: int) -> list[tuple[datetime, dict]]:
    """(arrival time, transaction) in arrival order over DAYS days: some transactions up to 20 hours late,
    pairs in one microsecond or one millisecond with ids in either order, and resends."""
    rng = random.Random(seed)
    out: list[tuple[datetime, dict]] = []
    for _ in range(900):
        when = T0 + timedelta(seconds=rng.randrange(DAYS * 86_400), microseconds=rng.randrange(10**6))
        txn = {
            "transaction_id": f"tx{rng.randrange(16**12):012x}",
            "customer_id": f"c{rng.randrange(25):03d}",
            "merchant_id": f"m{rng.randrange(4)}",
            "amount": round(rng.choice([10.0, rng.uniform(1, 400)]), 2),
            "currency": rng.choice(["EUR", "USD", "GBP"]),
            "country": rng.choice(["DE", "US", "GB", None]),
            "event_timestamp": when,
        }
        late = timedelta(hours=rng.choice([0, 0, 0, rng.uniform(0, 20)]))
        out.append((when + late, txn))
        if rng.random() < 0.15:  # a tie: the same customer in the same microsecond or millisecond
            tie = dict(
                txn, transaction_id=f"tx{rng.randrange(16**12):012x}", amount=round(rng.uniform(1, 99), 2)
            )
            tie["event_timestamp"] = when + timedelta(microseconds=rng.choice([0, 0, 1, 700]))
            tie["event_timestamp"] -= timedelta(
                microseconds=when.microsecond % 1000 if rng.random() < 0.5 else 0
            )
            out.append((when + late + timedelta(hours=rng.choice([0, 3, 14])), tie))
        if rng.random() < 0.05 and out:  # a resend of an earlier transaction, arriving later
            arrived, earlier = rng.choice(out)
            out.append((arrived + timedelta(hours=rng.uniform(1, 30)), dict(earlier)))
    return sorted(out, key=lambda item: item[0])


def test_a_state_folded_into_columns_each_day_gives_the_rows_of_one_that_only_observed():
    stream = _stream(11)
    folded, observing = LiveState(late_event_days=1), LiveState(late_event_days=1)
    seen: list[str] = []
    for arrived, txn in stream:
        folded.advance(arrived)  # the service's clock: a new day folds the day before into the columns
        refused = folded.refusal([txn])
        assert refused == observing.refusal([txn]), txn
        if refused is None:
            assert folded.observe(txn) == observing.observe(txn), txn
            seen.append(txn["transaction_id"])
        if len(seen) % 40 == 0:  # a chargeback for a transaction observed before, maybe days before
            tid = random.Random(len(seen)).choice(seen)
            assert folded.observe_chargeback(tid, arrived) == observing.observe_chargeback(tid, arrived)
    history = folded._history
    assert history is not None and len(history) > 600  # most of it was folded, the last day is not
    assert folded.kept_transactions() == observing.kept_transactions() == len(set(seen))
    for tid in seen:
        assert folded.rows_of(tid) == observing.rows_of(tid), tid
    end = stream[-1][0]
    for customer in {txn["customer_id"] for _, txn in stream}:
        for merchant in ("m0", "m3"):
            assert folded.state_before(customer, merchant, end) == observing.state_before(
                customer, merchant, end
            )


def _write_silver(home: Path, stream: list[tuple[datetime, dict]], before: datetime) -> list[dict]:
    """Silver's transactions (those before `before`, each arriving on its event date, two files a day with
    the later id of a tie written first) as `LiveState.from_lake` reads them."""
    rows = [txn for _, txn in stream if txn["event_timestamp"] < before]
    unique = list({txn["transaction_id"]: txn for txn in rows}.values())
    by_day: dict[date, list[dict]] = {}
    for txn in sorted(unique, key=lambda t: (t["event_timestamp"], t["transaction_id"]), reverse=True):
        by_day.setdefault(txn["event_timestamp"].date(), []).append(txn)
    for day, txns in by_day.items():
        folder = home / "lake" / "silver" / "transactions" / f"arrival_date={day.isoformat()}"
        folder.mkdir(parents=True)
        table = pa.table(
            {
                "transaction_id": [t["transaction_id"] for t in txns],
                "customer_id": [t["customer_id"] for t in txns],
                "merchant_id": [t["merchant_id"] for t in txns],
                "amount": pa.array([str(t["amount"]) for t in txns]).cast(pa.decimal128(12, 2)),
                "currency": [t["currency"] for t in txns],
                "country": [t["country"] for t in txns],
                "event_timestamp": pa.array(
                    [t["event_timestamp"] for t in txns], pa.timestamp("us", tz="UTC")
                ),
            }
        )
        half = table.num_rows // 2
        pq.write_table(table.slice(0, half), folder / "part-0.parquet")
        pq.write_table(table.slice(half), folder / "part-1.parquet")
    return sorted(unique, key=lambda t: (t["event_timestamp"], t["transaction_id"]))


def test_a_state_loaded_from_the_lake_gives_the_rows_of_one_that_observed_the_same_transactions(tmp_path):
    from core.settings import Settings

    stream = _stream(5)
    start = T0 + timedelta(days=DAYS - 2)
    history = _write_silver(tmp_path / "home", stream, start)
    loaded = LiveState.from_lake(Settings(home=tmp_path / "home"), start)
    observing = LiveState(late_event_days=1)
    for txn in history:
        observing.observe(txn)
    assert loaded.kept_transactions() == len(history)
    for txn in history:
        assert loaded.rows_of(txn["transaction_id"]) == observing.rows_of(txn["transaction_id"]), txn
    # Then live traffic from the start: late ones land inside the loaded history's window, some in the
    # microsecond or millisecond of a loaded transaction of their customer.
    live = [(arrived, txn) for arrived, txn in stream if txn["event_timestamp"] >= start]
    rng = random.Random(3)
    for txn in history[-40:]:
        tie = dict(txn, transaction_id=f"tx{rng.randrange(16**12):012x}")
        tie["event_timestamp"] += timedelta(microseconds=rng.choice([0, 1, -1]))
        live.append((start, tie))
    for arrived, txn in sorted(live, key=lambda item: item[0]):
        loaded.advance(max(arrived, start))
        refused = loaded.refusal([txn])
        assert refused == observing.refusal([txn]), txn
        if refused is None:
            assert loaded.observe(txn) == observing.observe(txn), txn
    for txn in history:
        assert loaded.rows_of(txn["transaction_id"]) == observing.rows_of(txn["transaction_id"]), txn


def test_the_columns_take_under_70_bytes_a_transaction(tmp_path):
    """The budget of issue #32 item 5: 31 million transactions (30 days at a million a day) in 2 GiB is 69
    bytes each. Counted from the state's own arrays (`LiveState.nbytes`), not the process's memory;
    benchmarks/serving.py measures that."""
    from core.settings import Settings

    rng = random.Random(2)
    stream = []
    for n in range(30_000):
        when = T0 + timedelta(seconds=rng.randrange(30 * 86_400))
        txn = {
            "transaction_id": f"tx{n:016x}",
            "customer_id": f"c{rng.randrange(1_000):07d}",
            "merchant_id": f"m{rng.randrange(30):05d}",
            "amount": round(rng.uniform(1, 400), 2),
            "currency": "EUR",
            "country": "DE",
            "event_timestamp": when,
        }
        stream.append((when, txn))
    history = _write_silver(tmp_path / "home", stream, T0 + timedelta(days=30))
    state = LiveState.from_lake(Settings(home=tmp_path / "home"), T0 + timedelta(days=30))
    assert state.kept_transactions() == len(history)
    assert state.nbytes() / len(history) < 70


def test_a_service_leaves_the_days_fold_to_fold_and_reads_the_same_meanwhile():
    """`advance(now, fold=False)`, as the scoring service calls it on every batch: the day's fold into the
    columns waits for `fold` (which the service runs on the scorer's thread, never the event loop), and
    nothing read in between differs."""
    stream = _stream(23)
    waiting, folding = LiveState(late_event_days=1), LiveState(late_event_days=1)
    folds = 0
    for arrived, txn in stream:
        due = waiting.fold_due(arrived)
        waiting.advance(arrived, fold=False)
        folding.advance(arrived)
        assert waiting.fold_due(arrived) == due
        if due and random.Random(txn["transaction_id"]).random() < 0.5:  # sometimes a batch or two later
            before = len(waiting._history) if waiting._history is not None else 0
            waiting.fold()
            assert not waiting.fold_due(arrived)
            folds += int((len(waiting._history) if waiting._history is not None else 0) != before)
        if waiting.refusal([txn]) is None:
            assert waiting.observe(txn) == folding.observe(txn), txn
    assert folds >= 2
    waiting.fold()
    assert waiting.kept_transactions() == folding.kept_transactions()


def test_an_ids_hash_is_the_same_computed_alone_or_for_a_column():
    """The index is built from whole columns (`_id_hashes`) and searched with one id at a time (`id_hash`):
    both must give the same 64 bits, for any UTF-8 id and for a slice of a column."""
    from features.live.columns import Ids as _Ids
    from features.live.values import id_hash
    from features.live.values import id_hashes as _id_hashes

    ids = ["tx1", "é漢字-ß", "", "a" * 70, "tx0000000000000001", "tx0000000000000002"]
    column = pa.array(ids, pa.large_string())
    assert [int(h) for h in _id_hashes(column)] == [id_hash(tid) for tid in ids]
    part = column.slice(1, 4)
    assert [int(h) for h in _id_hashes(part)] == [id_hash(tid) for tid in ids[1:5]]
    assert [_Ids(part)[k] for k in range(4)] == ids[1:5]
    assert len({id_hash(tid) for tid in ids}) == len(ids)


def test_a_transaction_that_arrived_late_stays_findable_for_resends_and_chargebacks(tmp_path):
    """A transaction dated weeks before its customer's latest but arrived within the ids' reach is kept
    (beside the retained span) so that a resend of it is known and a chargeback for it is attributed, as
    silver and gold do."""
    from core.settings import Settings

    start = T0 + timedelta(days=60)
    old = {
        "transaction_id": "tx-late-arrival",
        "customer_id": "c001",
        "merchant_id": "m9",
        "amount": 25.0,
        "currency": "EUR",
        "country": "DE",
        "event_timestamp": start - timedelta(days=40),
    }
    recent = dict(
        old, transaction_id="tx-recent", merchant_id="m1", event_timestamp=start - timedelta(hours=1)
    )
    for txn, arrival in ((old, start - timedelta(days=2)), (recent, start - timedelta(hours=1))):
        folder = tmp_path / "home" / "lake" / "silver" / "transactions" / f"arrival_date={arrival.date()}"
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist([txn])
        amount = pa.array([str(txn["amount"])]).cast(pa.decimal128(12, 2))
        table = table.set_column(table.schema.get_field_index("amount"), "amount", amount)
        pq.write_table(table, folder / f"{txn['transaction_id']}.parquet")
    state = LiveState.from_lake(Settings(home=tmp_path / "home"), start)
    assert state.kept("c001") == 2
    assert state.refusal([dict(old)]) is None  # a resend, not a transaction 40 days late
    assert state.observe(dict(old)) == state.rows_of("tx-late-arrival")
    assert state.observe_chargeback("tx-late-arrival", start + timedelta(hours=1))


@pytest.mark.parametrize("mode", ["thread", "late", "failing"])
def test_a_fold_built_beside_the_state_while_it_observes_changes_nothing_it_answers(mode):
    """The service's fold (begin_fold, build_fold without the lock, finish_fold): transactions observed,
    resent and charged back while the columns are built give the rows of a state that only observed, and
    so does everything after the new columns are in. `thread`: built on another thread at once; `late`:
    built only after a few more transactions were observed (the build must read the state as frozen, not as
    it is by then); `failing`: the first build dies, everything is put back and the next fold takes it all."""
    import threading

    stream = _stream(31)
    beside, observing = LiveState(late_event_days=1), LiveState(late_event_days=1)
    seen: list[str] = []
    job, builder, folds, failed = None, None, 0, False

    def failing_build(job):
        raise MemoryError("no room for the new columns")

    for n, (arrived, txn) in enumerate(stream):
        beside.advance(arrived, fold=False)
        observing.advance(arrived)
        if job is None:
            job = beside.begin_fold()
            if job is not None and mode != "late":
                build = beside.build_fold
                if mode == "failing" and not failed:
                    failed, build = True, failing_build

                def run(job=job, build=build):
                    with contextlib.suppress(MemoryError):
                        build(job)

                builder = threading.Thread(target=run)
                builder.start()
        elif n % 7 == 0:  # a few transactions later: the columns are in
            if mode == "late":
                beside.build_fold(job)
            else:
                builder.join()
            beside.finish_fold(job)
            folds += int(job.built)
            job = None
        refused = beside.refusal([txn])
        assert refused == observing.refusal([txn]), txn
        if refused is None:
            assert beside.observe(txn) == observing.observe(txn), txn
            seen.append(txn["transaction_id"])
        if len(seen) % 40 == 0:
            tid = random.Random(len(seen)).choice(seen)
            assert beside.observe_chargeback(tid, arrived) == observing.observe_chargeback(tid, arrived)
    if job is not None:
        if mode == "late":
            beside.build_fold(job)
        else:
            builder.join()
        beside.finish_fold(job)
    assert folds >= 2 and beside._history is not None
    assert beside.kept_transactions() == observing.kept_transactions() == len(set(seen))
    for tid in seen:
        assert beside.rows_of(tid) == observing.rows_of(tid), tid
    end = stream[-1][0]
    for customer in {txn["customer_id"] for _, txn in stream}:
        for merchant in ("m0", "m3"):
            assert beside.state_before(customer, merchant, end) == observing.state_before(
                customer, merchant, end
            )
