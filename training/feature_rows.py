"""Each event date's feature rows, built once when its gold is built; training sets are read from them.

A transaction's model inputs never change once the gold of its event date is built: its own columns are
fixed, and its features are its entities' state just before it, which only gold of that date and the days
before decide. Only its label changes later, as chargebacks come in. So per event date E, one row per
silver transaction of E (from every arrival holding rows of E) is written once: ids, event time, arrival
date, a hash of the id (for sampling), the transaction's own model inputs and the feature service's
features as the point-in-time join gives them. A training set as of D reads its window's rows and joins
the labels known at D (training/dataset.py), instead of joining 30 days of silver with 30 days of gold on
every retrain.

Joining a date needs each entity's latest gold row before each transaction, which may be weeks old (the
customer view's TTL is 30 days). Rather than read 30 days of gold for every date, each date keeps what it
carries into the next, per view: every entity's latest row up to one lag (FEATURE_LAG) before the next
day, rows older than the view's TTL left out, plus the rows after that point. The rows of E are matched
against carry(E-1) and gold(E) by the offline join's own function (features.offline.match_latest): a query
of E lies after every row up to that point, so of those only the entity's latest can answer it; the rows
after it are carried whole.
tests/data/test_feature_rows_carry.py checks the carry against the join over all of gold;
tests/integration/test_late_events.py compares whole training sets with the full join's.

Rows and carry of E depend only on gold of E-32 .. E (the longest TTL, the lag and the day itself). Each
date records a signature of those dates' gold build records (pipelines/gold/contract.build_path: what each
gold date was built from), so a gold date rebuilt from changed inputs (a late event, a re-delivery) makes
the dates that read it stale; `ensure_feature_rows` rebuilds stale dates oldest first (the features job
after building gold; a training set for its window, on a lake built before these rows existed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import PipelineError
from features.definitions import (
    CUSTOMER_JOIN_KEY,
    CUSTOMER_TTL,
    CUSTOMER_VIEW,
    MERCHANT_JOIN_KEY,
    MERCHANT_TTL,
    MERCHANT_VIEW,
)
from features.sources import require_gold
from pipelines.gold.contract import (
    CREATED_TIMESTAMP,
    CUSTOMER_FEATURES,
    CUSTOMER_TABLE,
    EVENT_TIMESTAMP,
    MERCHANT_FEATURES,
    MERCHANT_TABLE,
    PARTITION_COLUMN,
    build_path,
    table_path,
)
from pipelines.lake import Tables, read_json, write_json

if TYPE_CHECKING:
    import pyarrow as pa

    from core.settings import Settings

log = logging.getLogger(__name__)

FORMAT = 1  # part of every signature: rows written by another layout are rebuilt, not misread
ID_HASH = "id_hash"  # model_contract.inputs.unit_hash of the transaction id: the sampling draws on it
ARRIVAL = "arrival_date"
KEY_COLUMNS = ("transaction_id", "customer_id", "merchant_id", EVENT_TIMESTAMP)
ROWS_FILE = "part-00000.parquet"


@dataclass(frozen=True)
class View:
    """A feature view of the fraud_model_v1 service as the rows join it (the same names, keys, TTLs and
    features the Feast definitions are built from: features/definitions.py)."""

    name: str
    table: str
    key: str
    ttl: timedelta
    features: tuple[str, ...]


VIEWS = (
    View(CUSTOMER_VIEW, CUSTOMER_TABLE, CUSTOMER_JOIN_KEY, CUSTOMER_TTL, CUSTOMER_FEATURES),
    View(MERCHANT_VIEW, MERCHANT_TABLE, MERCHANT_JOIN_KEY, MERCHANT_TTL, MERCHANT_FEATURES),
)
# The gold dates a date's rows and carry depend on: the longest TTL, the lag before the day, the day.
SPAN_DAYS = max(v.ttl.days for v in VIEWS) + 2


class FeatureRowsError(PipelineError):
    """Feature rows cannot be built: the message names the date, what is missing and what to run."""


def rows_root(lake: Path) -> Path:
    return lake / "training_rows"


def _state_root(lake: Path) -> Path:
    return lake / "state" / "training_rows"


def _rows_path(lake: Path, day: date) -> Path:
    return rows_root(lake) / f"{PARTITION_COLUMN}={day.isoformat()}"


def _carry_path(lake: Path, day: date) -> Path:
    return _state_root(lake) / f"{PARTITION_COLUMN}={day.isoformat()}"


def _record_path(lake: Path, day: date) -> Path:
    return _state_root(lake) / f"{PARTITION_COLUMN}={day.isoformat()}.json"


def _start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


class _Signatures:
    """Signatures of dates, each from the gold build records of its span (each record read once)."""

    def __init__(self, lake: Path) -> None:
        self.lake = lake
        self._texts: dict[date, str] = {}

    def record(self, day: date) -> str:
        if day not in self._texts:
            path = build_path(self.lake, day)
            self._texts[day] = path.read_text() if path.is_file() else "-"
        return self._texts[day]

    def of(self, day: date) -> str:
        digest = hashlib.sha256(f"feature-rows {FORMAT}\n".encode())
        for k in range(SPAN_DAYS, -1, -1):
            d = day - timedelta(days=k)
            digest.update(f"{d.isoformat()}\n{self.record(d)}\n".encode())
        return digest.hexdigest()

    def any_gold(self, last: date) -> bool:
        """Whether a gold date was built in the span of `last` (else what it carries is nothing)."""
        return any(self.record(last - timedelta(days=k)) != "-" for k in range(SPAN_DAYS + 1))


def is_fresh(lake: Path, day: date, signatures: _Signatures) -> bool:
    record = read_json(_record_path(lake, day))
    return (
        record is not None
        and record.get("signature") == signatures.of(day)
        and _carry_path(lake, day).is_dir()
    )


def build_feature_rows(settings: Settings, event_dates: list[date]) -> dict:
    """The features job's step: the rows of the event dates it (re)built gold for, and of any later date
    whose rows read them (the gold of a date is read by the rows of the 32 dates after it)."""
    later = _built_dates(settings.lake)
    reach = [d for d in later if any(0 <= (d - e).days <= SPAN_DAYS for e in event_dates)]
    return ensure_feature_rows(settings, sorted({*event_dates, *reach}))


def _built_dates(lake: Path) -> list[date]:
    prefix = f"{PARTITION_COLUMN}="
    root = _state_root(lake)
    found = root.glob(f"{prefix}*.json") if root.is_dir() else ()
    return sorted(date.fromisoformat(p.stem.removeprefix(prefix)) for p in found)


def ensure_feature_rows(settings: Settings, days: list[date]) -> dict:
    """Build the rows of every date in `days` that has none or stale ones, and of the dates before them
    whose carry they need, oldest first. Returns the dates built and kept."""
    lake = settings.lake
    signatures = _Signatures(lake)
    stale = sorted(d for d in set(days) if not is_fresh(lake, d, signatures))
    if not stale:
        return {"built": [], "fresh": sorted(d.isoformat() for d in set(days))}
    require_gold(settings)  # no gold at all: name the command that writes it
    # Walk back from the oldest stale date while the carry it needs is stale and gold exists to make it.
    first = stale[0]
    while signatures.any_gold(first - timedelta(days=1)) and not is_fresh(
        lake, first - timedelta(days=1), signatures
    ):
        first -= timedelta(days=1)
    carried = _read_carry(lake, first - timedelta(days=1), signatures)
    built = []
    day = first
    while day <= stale[-1]:
        if day not in stale and not signatures.any_gold(day):
            carried = {view.name: _empty_carry(view) for view in VIEWS}  # before the first gold: nothing
        elif day != first and day not in stale and is_fresh(lake, day, signatures):
            carried = _read_carry(lake, day, signatures)  # fresh: read, not rebuilt
        else:
            carried = build_date(settings, day, carried, signatures)
            built.append(day.isoformat())
        day += timedelta(days=1)
    log.info("feature rows built for %d date(s): %s", len(built), ", ".join(built))
    return {"built": built, "fresh": sorted({d.isoformat() for d in days} - set(built))}


def _read_carry(lake: Path, day: date, signatures: _Signatures) -> dict[str, pa.Table]:
    """What `day` carries into the next date: read when fresh, nothing when no gold date precedes it."""
    import pyarrow.parquet as pq

    if not signatures.any_gold(day):
        return {view.name: _empty_carry(view) for view in VIEWS}
    if not is_fresh(lake, day, signatures):  # ensure_feature_rows walks back until this holds
        raise FeatureRowsError(f"feature rows of {day} are stale; rebuild from there (ensure_feature_rows)")
    return {view.name: pq.read_table(_carry_path(lake, day) / f"{view.name}.parquet") for view in VIEWS}


def _schema(view: View) -> pa.Schema:
    """Gold of `view` as the rows join it: both times in microseconds UTC, every feature float64."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    fields = [(view.key, pa.string()), (EVENT_TIMESTAMP, ts), (CREATED_TIMESTAMP, ts)]
    return pa.schema(fields + [(f, pa.float64()) for f in view.features])


def _empty_carry(view: View) -> pa.Table:
    return _schema(view).empty_table()


def _gold_of(lake: Path, view: View, day: date) -> pa.Table | None:
    """Gold of `view` for event date `day` as the join reads it, or None when the date has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from features.offline import normalise_timestamps

    partition = table_path(lake, view.table) / f"{PARTITION_COLUMN}={day.isoformat()}"
    files = sorted(partition.glob("*.parquet")) if partition.is_dir() else []
    if not files:
        return None
    columns = [view.key, EVENT_TIMESTAMP, CREATED_TIMESTAMP, *view.features]
    table = normalise_timestamps(pa.concat_tables(pq.read_table(f, columns=columns) for f in files))
    # Features as float64, as the training set holds them (counts are exact below 2**53).
    return table.cast(_schema(view))


def _silver_of(settings: Settings, day: date) -> pa.Table:
    """The silver transactions of event date `day`, from every arrival that may hold them (an arrival holds
    events of its own date and up to `late_event_days` before it), arrival by arrival in date order."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from model_contract.inputs import utc
    from pipelines.contracts import TRANSACTION_COLUMNS

    silver = Tables(settings.lake).silver
    last = day + timedelta(days=settings.ingest.late_event_days)
    partitions = [
        p
        for k in range((last - day).days + 1)
        if (p := Tables.partition(silver, day + timedelta(days=k))).is_dir()
    ]
    columns = list(TRANSACTION_COLUMNS)
    if not partitions:
        return pa.schema([(c, pa.string()) for c in (*columns, ARRIVAL)]).empty_table()
    tables = []
    for partition in partitions:  # in arrival order: ties keep the order a read of silver gives them
        arrival = partition.name.removeprefix("arrival_date=")
        dataset = ds.dataset(partition, format="parquet")
        part = dataset.to_table(columns=columns, filter=ds.field("event_date") == pa.scalar(day))
        tables.append(part.append_column(ARRIVAL, pa.array([arrival] * part.num_rows, pa.string())))
    return utc(pa.concat_tables(tables), EVENT_TIMESTAMP)


def build_date(
    settings: Settings, day: date, carried: dict[str, pa.Table], signatures: _Signatures | None = None
) -> dict[str, pa.Table]:
    """Write the rows of event date `day` (from its silver, its gold and what the day before carried) and
    what it carries into the next; record its signature last. Returns the carry."""
    import numpy as np
    import pyarrow as pa

    from features.offline import match_latest
    from model_contract.inputs import FEATURE_LAG, transaction_inputs_of_table, unit_hash

    lake = settings.lake
    signatures = signatures or _Signatures(lake)
    signature = signatures.of(day)
    golds = {view.name: _gold_of(lake, view, day) for view in VIEWS}
    silver = _silver_of(settings, day)
    expected = {name: (0 if g is None else g.num_rows) for name, g in golds.items()}
    if any(n != silver.num_rows for n in expected.values()):
        raise FeatureRowsError(
            f"event date {day}: {silver.num_rows} silver transactions (arrivals {day} .. "
            f"{day + timedelta(days=settings.ingest.late_event_days)}) but gold holds {expected} rows; "
            f"gold is one row per transaction: build it first (`mlops features --date {day}`)"
        )
    rows = None
    if silver.num_rows:
        columns: dict[str, pa.Array | pa.ChunkedArray | np.ndarray] = {c: silver[c] for c in KEY_COLUMNS}
        columns.update(transaction_inputs_of_table(silver))
        # State just before each transaction, as the join of the training set asks for it.
        lag_ns = FEATURE_LAG // timedelta(microseconds=1) * 1000
        query_ns = silver[EVENT_TIMESTAMP].cast(pa.int64()).to_numpy() * 1000 - lag_ns
        for view in VIEWS:
            gold = golds[view.name]
            assert gold is not None, "gold rows were counted above"
            candidates = pa.concat_tables([carried[view.name], gold])
            matched = match_latest(
                candidates, view.key, silver[view.key], query_ns, view.ttl, list(view.features)
            )
            columns.update({name: matched[name] for name in view.features})
        columns[ARRIVAL] = silver[ARRIVAL]
        columns[ID_HASH] = unit_hash(silver["transaction_id"])
        rows = pa.table(columns)
    carry = {v.name: _carry(v, carried[v.name], golds[v.name], day, FEATURE_LAG) for v in VIEWS}
    _write(lake, day, rows, carry)
    write_json(
        _record_path(lake, day),
        {"event_date": day.isoformat(), "signature": signature, "rows": 0 if rows is None else rows.num_rows},
    )
    return carry


def _carry(view: View, carried: pa.Table, gold: pa.Table | None, day: date, lag: timedelta) -> pa.Table:
    """What `day` carries into the next date for `view`: each entity's latest row (by event time, created
    time, then order) up to the next day's start less `lag`, the rows after that point, nothing older than
    the view's TTL before that point (no later query could see it)."""
    import numpy as np
    import pyarrow as pa

    rows = carried if gold is None else pa.concat_tables([carried, gold])
    if rows.num_rows == 0:
        return rows
    boundary = _us(_start(day + timedelta(days=1)) - lag)
    oldest = _us(_start(day + timedelta(days=1)) - lag - view.ttl)
    times = rows[EVENT_TIMESTAMP].cast(pa.int64()).to_numpy()
    created = rows[CREATED_TIMESTAMP].cast(pa.int64()).to_numpy()
    codes = rows[view.key].combine_chunks().dictionary_encode().indices.to_numpy(zero_copy_only=False)
    before = np.flatnonzero(times <= boundary)
    order = before[np.lexsort((before, created[before], times[before], codes[before]))]
    last = order[np.append(codes[order][1:] != codes[order][:-1], True)] if len(order) else order
    last = last[times[last] >= oldest]
    after = np.flatnonzero(times > boundary)
    return rows.take(pa.array(np.concatenate([np.sort(last), after])))


def _write(lake: Path, day: date, rows: pa.Table | None, carry: dict[str, pa.Table]) -> None:
    """Replace the date's rows and carry: each folder staged beside its place, then swapped in."""
    import pyarrow.parquet as pq

    def replace(target: Path, files: dict[str, pa.Table]) -> None:
        staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name, table in files.items():
            # Dictionaries only for the entity keys and dates: on ids and float features they cost more
            # than they save.
            keys = [c for c in (CUSTOMER_JOIN_KEY, MERCHANT_JOIN_KEY, ARRIVAL) if c in table.column_names]
            # LZ4, not zstd: a training set decodes a month of these; LZ4 read a date's rows in 0.42 s
            # against zstd's 0.75 s, for 1.36x the bytes (measured: docs/benchmarks.md).
            pq.write_table(table, staging / name, compression="lz4", use_dictionary=keys)
        old = target.with_name(f".{target.name}.{os.getpid()}.old")
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)

    _record_path(lake, day).unlink(missing_ok=True)  # stale until the new record is written
    if rows is None:
        shutil.rmtree(_rows_path(lake, day), ignore_errors=True)
    else:
        replace(_rows_path(lake, day), {ROWS_FILE: rows})
    replace(_carry_path(lake, day), {f"{view.name}.parquet": carry[view.name] for view in VIEWS})


def rows_dataset(lake: Path):
    """Every date's rows as one dataset (event_date a string partition), or None when none were built."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    root = rows_root(lake)
    if not root.is_dir() or not any(root.glob(f"{PARTITION_COLUMN}=*/{ROWS_FILE}")):
        return None
    partitioning = ds.partitioning(pa.schema([(PARTITION_COLUMN, pa.string())]), flavor="hive")
    return ds.dataset(root, format="parquet", partitioning=partitioning, exclude_invalid_files=False)
