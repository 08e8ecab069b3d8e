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

from core import lineage
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
    import numpy as np
    import pyarrow as pa

    from core.settings import Settings

log = logging.getLogger(__name__)

FORMAT = 1  # part of every signature: rows written by another layout are rebuilt, not misread
ID_HASH = "id_hash"  # model_contract.inputs.unit_hash of the transaction id: the sampling draws on it
ARRIVAL = "arrival_date"
KEY_COLUMNS = ("transaction_id", "customer_id", "merchant_id", EVENT_TIMESTAMP)
ROWS_FILE = "part-00000.parquet"
# Each date's rows are written in id-hash order, in row groups of this many rows: the sample's legitimate
# rows (hash below the rate) are then the first groups of each file, and a fraud's row is found by reading
# one group. Marked in the file's metadata (older files, in scan order, are rewritten once: _relayout).
ROW_GROUP_ROWS = 16_384
ORDER_KEY = b"mlops.rows_order"
HASH_ORDER = b"id_hash"
SIGNATURE_KEY = b"mlops.signature"


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


def _frauds_path(lake: Path, day: date) -> Path:
    """The rows of the date's known frauds, kept apart by the training sets that read them (WindowRows)."""
    return lake / "state" / "training_rows_frauds" / f"{PARTITION_COLUMN}={day.isoformat()}.parquet"


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


def _rows_lineage(settings: Settings, record: dict, event_dates: list[date]) -> lineage.Datasets:
    """Rows and carry of each date built, from its gold and the carry of the date before it."""
    lake = settings.lake
    built = [date.fromisoformat(d) for d in record.get("built", [])]
    read: list[Path] = []
    for day in built:
        read += [
            table_path(lake, t) / f"{PARTITION_COLUMN}={day.isoformat()}"
            for t in (CUSTOMER_TABLE, MERCHANT_TABLE)
        ]
        if day - timedelta(days=1) not in built:
            read.append(_carry_path(lake, day - timedelta(days=1)))
    return lineage.Datasets(
        [lineage.path(p) for p in read if p.exists()],
        [lineage.path(p) for day in built for p in (_rows_path(lake, day), _carry_path(lake, day))],
    )


@lineage.emits("build_training_rows", _rows_lineage)
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
        return {
            "built": [],
            "fresh": sorted(d.isoformat() for d in set(days)),
            "relaid": _relayout_all(lake, days),
        }
    require_gold(settings)  # no gold at all: name the command that writes it
    # Walk back from the oldest stale date while the carry it needs is stale and gold exists to make it.
    first = stale[0]
    while signatures.any_gold(first - timedelta(days=1)) and not is_fresh(
        lake, first - timedelta(days=1), signatures
    ):
        first -= timedelta(days=1)
    carried = _read_carry(lake, first - timedelta(days=1), signatures)
    reported = _reported_frauds(settings, first)  # read once for every date built
    built = []
    day = first
    while day <= stale[-1]:
        if day not in stale and not signatures.any_gold(day):
            carried = {view.name: _empty_carry(view) for view in VIEWS}  # before the first gold: nothing
        elif day != first and day not in stale and is_fresh(lake, day, signatures):
            carried = _read_carry(lake, day, signatures)  # fresh: read, not rebuilt
        else:
            carried = build_date(settings, day, carried, signatures, reported)
            built.append(day.isoformat())
        day += timedelta(days=1)
    log.info("feature rows built for %d date(s): %s", len(built), ", ".join(built))
    fresh = sorted({d.isoformat() for d in days} - set(built))
    return {"built": built, "fresh": fresh, "relaid": _relayout_all(lake, days)}


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
    settings: Settings,
    day: date,
    carried: dict[str, pa.Table],
    signatures: _Signatures | None = None,
    reported: pa.Array | None = None,
) -> dict[str, pa.Table]:
    """Write the rows of event date `day` (from its silver, its gold and what the day before carried) and
    what it carries into the next, and keep apart the rows of the frauds `reported` so far (read from the
    labels when not given); record its signature last. Returns the carry."""
    import pyarrow as pa
    import pyarrow.compute as pc

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
    if rows is not None:  # the frauds reported so far, kept apart while the rows are at hand (WindowRows)
        if reported is None:
            reported = _reported_frauds(settings, day)
        frauds = rows.filter(pc.is_in(rows["transaction_id"], value_set=reported))
        _write_frauds(lake, day, signature, frauds)
    write_json(
        _record_path(lake, day),
        {"event_date": day.isoformat(), "signature": signature, "rows": 0 if rows is None else rows.num_rows},
    )
    return carry


def _reported_frauds(settings: Settings, day: date) -> pa.Array:
    """The ids of every transaction reported as fraud in a labels arrival from `day` on (a transaction's
    chargeback comes after it, and the rows of a date are built after its own arrival): more than a
    training set as of some date knows, which is what a store of candidates may hold."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    root = Tables(settings.lake).silver_labels
    if not any(root.glob("arrival_date=*/*.parquet")):
        return pa.array([], pa.string())
    labels = ds.dataset(root, format="parquet", partitioning="hive").to_table(
        columns=["transaction_id", "is_fraud"],
        filter=ds.field("arrival_date").cast("string") >= day.isoformat(),
    )
    return pc.unique(labels["transaction_id"].filter(pc.cast(labels["is_fraud"], pa.bool_())))


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


def _replace(target: Path, files: dict[str, pa.Table], order_by_hash: bool = False) -> None:
    """Replace the folder `target` by one holding `files`: staged beside its place, then swapped in."""
    import pyarrow.parquet as pq

    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, table in files.items():
        # Dictionaries only for the entity keys and dates: on ids and float features they cost more
        # than they save.
        keys = [c for c in (CUSTOMER_JOIN_KEY, MERCHANT_JOIN_KEY, ARRIVAL) if c in table.column_names]
        # LZ4, not zstd: a training set decodes a month of these; LZ4 read a date's rows in 0.42 s
        # against zstd's 0.75 s, for 1.36x the bytes (measured: docs/benchmarks.md).
        if order_by_hash:
            table = _in_hash_order(table)
        pq.write_table(
            table,
            staging / name,
            compression="lz4",
            use_dictionary=keys,
            row_group_size=ROW_GROUP_ROWS if order_by_hash else None,
        )
    old = target.with_name(f".{target.name}.{os.getpid()}.old")
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _in_hash_order(rows: pa.Table) -> pa.Table:
    """`rows` sorted by the id hash (then the id), marked so in the file's metadata: the training set's
    sample keeps the rows under a hash threshold, which then lie in the first row groups of each file."""
    import pyarrow.compute as pc

    order = pc.sort_indices(rows, sort_keys=[(ID_HASH, "ascending"), ("transaction_id", "ascending")])
    rows = rows.take(order)
    return rows.replace_schema_metadata({**(rows.schema.metadata or {}), ORDER_KEY: HASH_ORDER})


def in_hash_order(path: Path) -> bool:
    """Whether the rows file at `path` was written in id-hash order (older lakes hold scan order)."""
    import pyarrow.parquet as pq

    return (pq.read_schema(path).metadata or {}).get(ORDER_KEY) == HASH_ORDER


def _relayout(lake: Path, day: date) -> bool:
    """Rewrite a date's rows file written in scan order (a lake built before the hash order) in hash order:
    the same rows, so its record stays valid. Returns whether it rewrote."""
    import pyarrow.parquet as pq

    path = _rows_path(lake, day) / ROWS_FILE
    if not path.is_file() or in_hash_order(path):
        return False
    _replace(_rows_path(lake, day), {ROWS_FILE: pq.read_table(path)}, order_by_hash=True)
    return True


def _relayout_all(lake: Path, days: list[date]) -> list[str]:
    """`_relayout` for each of `days`: the dates rewritten."""
    return [d.isoformat() for d in sorted(set(days)) if _relayout(lake, d)]


def _write(lake: Path, day: date, rows: pa.Table | None, carry: dict[str, pa.Table]) -> None:
    """Replace the date's rows (in id-hash order) and carry, and drop the frauds kept apart from its old
    rows."""
    _record_path(lake, day).unlink(missing_ok=True)  # stale until the new record is written
    _frauds_path(lake, day).unlink(missing_ok=True)
    if rows is None:
        shutil.rmtree(_rows_path(lake, day), ignore_errors=True)
    else:
        _replace(_rows_path(lake, day), {ROWS_FILE: rows}, order_by_hash=True)
    _replace(_carry_path(lake, day), {f"{view.name}.parquet": carry[view.name] for view in VIEWS})


def _write_frauds(lake: Path, day: date, signature: str, frauds: pa.Table) -> None:
    """Keep `frauds` (rows of `day` read from rows of `signature`) apart: written beside, then swapped in."""
    import pyarrow.parquet as pq

    path = _frauds_path(lake, day)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frauds = frauds.replace_schema_metadata({SIGNATURE_KEY: signature.encode()})
    pq.write_table(frauds, staging, compression="lz4")
    os.replace(staging, path)


def rows_dataset(lake: Path):
    """Every date's rows as one dataset (event_date a string partition), or None when none were built."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    root = rows_root(lake)
    if not root.is_dir() or not any(root.glob(f"{PARTITION_COLUMN}=*/{ROWS_FILE}")):
        return None
    partitioning = ds.partitioning(pa.schema([(PARTITION_COLUMN, pa.string())]), flavor="hive")
    return ds.dataset(root, format="parquet", partitioning=partitioning, exclude_invalid_files=False)


class RowsChangedError(FeatureRowsError):
    """A rows file changed between the two passes of a read (a features run rebuilt it)."""


class WindowRows:
    """The rows files of a window's event dates, read in two passes: a few columns of every row (the
    training set's sample is planned on them), then whole rows at chosen positions.

    The second pass decodes only the row groups that hold a chosen row, so the cost follows the rows kept,
    not the window: in id-hash order the sample's legitimate rows are each file's first groups. Frauds,
    all kept and spread over every group, are kept apart per date (`_frauds_path`, with the signature of
    the rows they were read from): a chosen fraud found there is taken from it, one that is not (its
    chargeback came since the last read) is read from its group and added. So a daily retrain decodes the
    sample's groups and the groups of the day's new chargebacks, which fall mostly on the last few dates."""

    def __init__(self, lake: Path, event_dates: list[date]) -> None:
        import numpy as np

        self.lake = lake
        self.files: list[tuple[date, Path, str | None]] = []
        for day in sorted(event_dates):
            path = _rows_path(lake, day) / ROWS_FILE
            if path.is_file():
                record = read_json(_record_path(lake, day)) or {}
                self.files.append((day, path, record.get("signature")))
        self.parts: list[pa.Table] = []  # the first pass, a table a file
        self.starts = np.zeros(1, dtype=np.int64)  # each file's first row in the thin table, and the end
        self.stats = {"rows_decoded": 0, "groups_read": 0, "frauds_from_store": 0, "frauds_added": 0}

    def thin(self, columns: list[str]) -> pa.Table:
        """`columns` of every row of every file, file after file in date order, rows in file order."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.parts = [
            pq.read_table(path, columns=columns, read_dictionary=[ARRIVAL]) for _, path, _ in self.files
        ]
        self.starts = np.concatenate([[0], np.cumsum([part.num_rows for part in self.parts])])
        if not self.parts:
            return pa.table({c: pa.array([], pa.string()) for c in columns})
        return pa.concat_tables(self.parts)

    def ids_at(self, positions: np.ndarray) -> pa.Array:
        """The transaction ids at `positions` (into the thin table, any order), taken file by file."""
        import numpy as np
        import pyarrow as pa

        files = np.searchsorted(self.starts, positions, side="right") - 1
        order = np.argsort(files, kind="stable")
        pieces = []
        for k in np.unique(files):
            chosen = positions[order][files[order] == k] - self.starts[k]
            pieces.append(self.parts[k]["transaction_id"].take(pa.array(chosen)))
        taken = pa.chunked_array(pieces, pa.string()).combine_chunks()
        return taken.take(pa.array(np.argsort(order, kind="stable")))

    def holding(self, ids: pa.Array) -> np.ndarray:
        """A mask over the thin table of the rows whose transaction id is in `ids` (the known frauds). Their
        id hashes are looked up first, by bisection where a file is in hash order, then the ids of the few
        rows found, so a collision of hashes marks nothing."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from model_contract.inputs import unit_hash

        found = np.zeros(int(self.starts[-1]), dtype=bool)
        if len(ids) == 0:
            return found
        wanted = np.sort(unit_hash(ids))
        candidates = []
        for k, part in enumerate(self.parts):
            hashes = part[ID_HASH].to_numpy()
            if len(hashes) and np.all(hashes[1:] >= hashes[:-1]):
                low = np.searchsorted(hashes, wanted, side="left")
                count = np.searchsorted(hashes, wanted, side="right") - low
                starts = np.repeat(low, count)
                within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
                rows = starts + within
            else:  # scan order (a file not yet rewritten)
                hit = pc.is_in(pa.array(hashes), value_set=pa.array(wanted))
                rows = np.flatnonzero(hit.to_numpy(zero_copy_only=False))
            candidates.append(np.unique(rows) + self.starts[k])
        positions = np.concatenate(candidates) if candidates else np.zeros(0, dtype=np.int64)
        found[positions] = pc.is_in(self.ids_at(positions), value_set=ids).to_numpy(zero_copy_only=False)
        return found

    def take(
        self, positions: np.ndarray, fraud: np.ndarray, columns: list[str]
    ) -> tuple[pa.Table, np.ndarray]:
        """`columns` of the rows at `positions` (ascending, into the thin table; `fraud` flags the frauds
        among them), and for each row returned its index in `positions` (rows come group by group, the
        frauds kept apart after them: the caller orders the table once, as it wants it).
        Raises RowsChangedError when a file no longer holds the ids the first pass read."""
        import numpy as np
        import pyarrow as pa

        bounds = np.searchsorted(positions, self.starts)
        pieces, orders = [], []
        for k, (day, path, signature) in enumerate(self.files):
            lo, hi = bounds[k], bounds[k + 1]
            if lo == hi:
                continue
            ids = self.parts[k]["transaction_id"]
            table, order = self._take_file(
                day, path, signature, positions[lo:hi] - self.starts[k], fraud[lo:hi], ids, columns
            )
            pieces.append(table)
            orders.append(order + lo)
        if not pieces:
            return pa.schema([]).empty_table(), np.zeros(0, dtype=np.int64)
        return pa.concat_tables(pieces), np.concatenate(orders)

    def _take_file(
        self,
        day: date,
        path: Path,
        signature: str | None,
        rows: np.ndarray,
        fraud: np.ndarray,
        file_ids: pa.ChunkedArray,
        columns: list[str],
    ) -> tuple[pa.Table, np.ndarray]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except OSError as gone:
            raise RowsChangedError(f"the rows file {path} changed while it was read ({gone})") from gone
        if parquet.metadata.num_rows != len(file_ids):
            raise RowsChangedError(
                f"the rows file {path} changed while it was read: {parquet.metadata.num_rows} rows, "
                f"{len(file_ids)} at the first pass"
            )
        sizes = np.array([parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)])
        group_starts = np.concatenate([[0], np.cumsum(sizes)])
        group = np.searchsorted(group_starts, rows, side="right") - 1
        needed = np.zeros(len(sizes), dtype=bool)
        needed[group[~fraud]] = True
        ids = file_ids.take(pa.array(rows))
        stored = self._stored_frauds(day, signature, columns) if fraud.any() else None
        at = np.full(len(rows), -1, dtype=np.int64)
        if stored is not None:
            at = (
                pc.fill_null(pc.index_in(ids, value_set=stored["transaction_id"]), -1)
                .to_numpy()
                .astype(np.int64)
            )
        from_store = fraud & ~needed[group] & (at >= 0)
        needed[group[~from_store]] = True
        pieces, order = [], []
        # Group by group: a take from one decoded group gathers the rows it keeps, never copies the group.
        in_read = np.flatnonzero(~from_store)
        group_of_read = group[in_read]
        edges = np.searchsorted(group_of_read, np.flatnonzero(needed))
        for g, first in zip(np.flatnonzero(needed), edges, strict=True):
            last = np.searchsorted(group_of_read, g, side="right")
            decoded = parquet.read_row_group(int(g), columns=columns)
            mine = in_read[first:last]
            pieces.append(decoded.take(pa.array(rows[mine] - group_starts[g])))
            order.append(mine)
            self.stats["groups_read"] += 1
            self.stats["rows_decoded"] += int(sizes[g])
        read = pa.concat_tables(pieces) if pieces else None
        if read is not None and not read["transaction_id"].equals(ids.take(pa.array(np.concatenate(order)))):
            raise RowsChangedError(f"the rows file {path} changed while it was read")
        in_store = np.flatnonzero(from_store)
        if len(in_store):
            assert stored is not None, "a row from the store was found there"
            pieces.append(stored.select(columns).take(pa.array(at[in_store])))
            order.append(in_store)
            self.stats["frauds_from_store"] += len(in_store)
        table = pa.concat_tables(pieces)
        order_all = np.concatenate(order)
        # The frauds read from their groups and not yet apart: kept apart for the next read.
        new = np.flatnonzero(fraud[order_all] & (at[order_all] < 0))
        if len(new) and signature is not None:
            added = table.take(pa.array(new))
            keep = added if stored is None else pa.concat_tables([stored.select(columns), added])
            _write_frauds(self.lake, day, signature, keep)
            self.stats["frauds_added"] += len(new)
        return table, order_all

    def _stored_frauds(self, day: date, signature: str | None, columns: list[str]) -> pa.Table | None:
        """The date's frauds kept apart, when they were read from rows of the same signature and hold the
        columns asked for; None otherwise."""
        import pyarrow.parquet as pq

        path = _frauds_path(self.lake, day)
        if signature is None or not path.is_file():
            return None
        try:
            table = pq.read_table(path)
        except OSError:
            return None  # torn or unreadable: read the rows again and write it anew
        kept_for = (table.schema.metadata or {}).get(SIGNATURE_KEY, b"").decode()
        if kept_for != signature or not set(columns) <= set(table.column_names):
            return None
        return table
