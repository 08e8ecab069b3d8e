"""The training set: labeled transactions joined point in time with the fraud_model_v1 features.

Built as of a date D (the end of D is the cutoff): the silver transactions that arrived in the
`window_days` up to D, each labeled with what was known by the cutoff (a chargeback reported later does
not exist yet; a transaction without one counts as legitimate, which is how card issuers train; the
transactions of the last label-maturity days are left out, since most of their chargebacks are still to
come), joined
with each entity's feature state just before the transaction (event time - 1 ms, see
pipelines/gold/contract.py), plus the transaction's own columns. Rows are split by event time into
train, validation and holdout, sorted and written as one Parquet file, so the same inputs always give the
same bytes and the same DVC version.

At scale (a 30-day window of 1M transactions a day is ~27M rows, ~0.8% of them fraud) the train and
validation splits keep at most `max_fit_rows` rows: every fraud, and the legitimate transactions whose id
hashes below a rate (the same transaction is kept or left out whatever the as-of date, and the same inputs
still give the same bytes). The holdout keeps every fraud and its legitimate rows at the same rate, each
with a `weight` of 1 / rate (frauds 1), and the holdout metrics weigh rows by it (training/metrics.py): the
gate's figures estimate the population's, on a twelfth of the rows. The rate is recorded with the set. The
loss's class weight follows the sampled split (training/loop.py), so scores rank as before but are not
calibrated probabilities of the population.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from core import lineage
from core.errors import PipelineError

# The model's input contract is model_contract.inputs (below training, serving and monitoring); its names
# are also this module's, for the training code and tests that read them from the training set's module.
from model_contract.inputs import (
    CATEGORICAL_FEATURES,
    CATEGORICAL_VOCAB,
    FEATURE_LAG,
    MODEL_INPUTS,
    SERVICE_FEATURES,
    TRANSACTION_NUMERIC,
    MissingInputsError,
    cutoff,
    input_positions,
    transaction_inputs,
    unit_hash,
    utc,
)
from model_contract.inputs import NUMERIC_FEATURES as NUMERIC_FEATURES
from model_contract.inputs import amount_as_float as amount_as_float
from pipelines.contracts import TRANSACTION_COLUMNS

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from core.settings import Settings
    from pipelines.lake import Tables
    from training.feature_rows import WindowRows

    Values: TypeAlias = Sequence[str | None] | pa.Array | pa.ChunkedArray  # None (null) where missing

log = logging.getLogger(__name__)

LABEL = "label"
SPLIT = "split"
WEIGHT = "weight"  # how many transactions of the window a row stands for (1 / sampling rate, frauds 1)
SPLITS = ("train", "validation", "holdout")
DATASET_FILE = "training_set.parquet"
METADATA_FILE = "training_set.json"  # as-of date and window, versioned with the data
TRAINING_SET_MEMBER = "training_set"  # the training set's member in its DVC revision (and lineage name)


class TrainingSetError(PipelineError):
    """The training set cannot be built or read; the message says what is missing and what to run."""


class NothingToTrainError(TrainingSetError):
    """No transaction to learn from as of the date yet: none arrived in the window, or none is old enough
    for its chargebacks to have come in. The normal state of a young feed; the retrain DAG skips on it."""


@dataclass(frozen=True)
class SplitFractions:
    train: float = 0.7
    validation: float = 0.15

    def __post_init__(self) -> None:
        if not (0 < self.train < 1 and 0 < self.validation < 1 and self.train + self.validation < 1):
            raise ValueError(f"split fractions must leave room for a holdout: {self}")


def read_partitions(root: Path, first: date, last: date, columns: list[str]) -> pa.Table:
    import pyarrow.dataset as ds

    if not root.is_dir():
        raise TrainingSetError(
            f"no table at {root}; run `mlops ingest --date {last}` (and the dates before it) first"
        )
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    arrival = ds.field("arrival_date").cast("string")
    return dataset.to_table(
        columns=columns, filter=(arrival >= first.isoformat()) & (arrival <= last.isoformat())
    )


def labeled_transactions(
    settings: Settings, day: date, window_days: int, label_maturity_days: int = 0
) -> pd.DataFrame:
    """Silver transactions that arrived in (day - window_days, day], labeled as known at the cutoff, less
    those made in the last `label_maturity_days` before it: most of their chargebacks have not arrived
    (the median report delay is days), so they would teach and test the model that fraud is legitimate."""
    return _pandas(_labeled_table(settings, day, window_days, label_maturity_days))


def _pandas(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    frame["event_timestamp"] = frame["event_timestamp"].astype("datetime64[ns, UTC]")
    return frame


def _labeled_table(settings: Settings, day: date, window_days: int, label_maturity_days: int) -> pa.Table:
    """labeled_transactions as an Arrow table (a 30-day window of 1M rows a day fits in memory as Arrow,
    not as pandas objects)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipelines.lake import Tables

    tables = Tables(settings.lake)
    first = day - timedelta(days=window_days - 1)
    if not tables.silver.is_dir():
        raise NothingToTrainError(
            f"no silver transactions yet (no table at {tables.silver}); run `mlops ingest --date {day}` "
            "(and the dates before it) first"
        )
    transactions = read_partitions(tables.silver, first, day, list(TRANSACTION_COLUMNS))
    if transactions.num_rows == 0:
        raise NothingToTrainError(
            f"no silver transactions arrived between {first} and {day} under {tables.silver}; "
            f"run `mlops ingest --date {day}` first or widen --window-days"
        )
    transactions = utc(transactions, "event_timestamp")
    fraud = _known_fraud(tables, first, day)
    label = pc.cast(pc.is_in(transactions["transaction_id"], value_set=fraud), pa.int8())
    stamp = pa.timestamp("us", tz="UTC")
    transactions = transactions.append_column(LABEL, label)
    mature_before = cutoff(day) - timedelta(days=label_maturity_days)
    mature = transactions.filter(pc.less(transactions["event_timestamp"], pa.scalar(mature_before, stamp)))
    if mature.num_rows == 0:
        raise NothingToTrainError(
            f"none of the {transactions.num_rows} transactions that arrived between {first} and {day} is "
            f"older than the label maturity of {label_maturity_days} days; land and ingest more days or "
            "lower MLOPS_TRAINING__LABEL_MATURITY_DAYS"
        )
    return mature


def _known_fraud(tables: Tables, first: date, day: date) -> pa.Array:
    """The ids of transactions reported as fraud by the end of `day` (a window starting at `first`):
    labels can arrive up to 30 days after the transaction, and from before the window."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not any(tables.silver_labels.glob("arrival_date=*/*.parquet")):
        return pa.array([], pa.string())  # no chargeback reported yet (the first days of a feed)
    labels = utc(
        read_partitions(
            tables.silver_labels,
            first - timedelta(days=60),
            day,
            ["transaction_id", "is_fraud", "label_timestamp"],
        ),
        "label_timestamp",
    )
    known = pc.and_(
        pc.less(labels["label_timestamp"], pa.scalar(cutoff(day), pa.timestamp("us", tz="UTC"))),
        pc.cast(labels["is_fraud"], pa.bool_()),
    )
    return pc.unique(labels["transaction_id"].filter(known))


def transaction_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The transaction's own model inputs as a frame (pure: returns a new frame); see transaction_inputs."""
    import pandas as pd
    import pyarrow as pa

    stamps = frame["event_timestamp"]
    if stamps.dt.tz is None:
        stamps = stamps.dt.tz_localize("UTC")
    event_ms = stamps.dt.tz_convert("UTC").astype("datetime64[ns, UTC]").to_numpy(dtype="datetime64[ns]")

    def strings(column: str) -> pa.Array:
        return pa.array(frame[column], type=pa.string(), from_pandas=True)  # NaN and None: null

    inputs = transaction_inputs(
        frame["amount"].astype("float64").to_numpy(),
        strings("currency"),
        strings("country"),
        event_ms.astype("int64") // 1_000_000,
        {column: strings(column) for column in CATEGORICAL_VOCAB},
    )
    return pd.DataFrame(inputs, index=frame.index)


def time_splits(event_time: pd.Series, fractions: SplitFractions) -> pd.Series:
    """train / validation / holdout by event time: the holdout is the most recent slice, as in production."""
    import pandas as pd

    ranks = event_time.rank(method="first").to_numpy()
    return pd.Series(_splits_of_ranks(ranks, fractions), index=event_time.index, name=SPLIT)


def _split_sizes(rows: int, fractions: SplitFractions) -> tuple[int, int]:
    """How many of `rows` rows (in event-time order) are train, and train + validation: rank k (1..n) is
    train when k / n <= the train fraction, validation when k / n <= train + validation (found by bisection,
    not by dividing every rank: the window has ~30M rows)."""
    import numpy as np

    def at_most(fraction: float) -> int:  # the last k with k / rows <= fraction (k / rows rises with k)
        low, high = 0, rows
        while low < high:
            middle = (low + high + 1) // 2
            if np.float64(middle) / np.float64(rows) <= fraction:
                low = middle
            else:
                high = middle - 1
        return low

    return at_most(fractions.train), at_most(fractions.train + fractions.validation)


def _splits_of_ranks(ranks: np.ndarray, fractions: SplitFractions) -> np.ndarray:
    """Ranks 1..n in event-time order -> split names."""
    import numpy as np

    train_rows, fit_rows = _split_sizes(len(ranks), fractions)
    return np.where(ranks <= train_rows, "train", np.where(ranks <= fit_rows, "validation", "holdout"))


def _first_rows(times: np.ndarray, ids: pa.ChunkedArray, count: int) -> np.ndarray:
    """A mask of the `count` rows that come first in (event time, id) order, found by selection (one
    np.partition of the times, then a sort of the ids tied at the boundary's time), not by sorting every
    row. Rows equal in both keep their scan order, as a stable sort would."""
    import numpy as np
    import pyarrow.compute as pc

    if count <= 0:
        return np.zeros(len(times), dtype=bool)
    if count >= len(times):
        return np.ones(len(times), dtype=bool)
    boundary = np.partition(times, count - 1)[count - 1]
    mask = times < boundary
    tied = np.flatnonzero(times == boundary)
    room = count - int(mask.sum())
    order = pc.sort_indices(ids.take(tied)).to_numpy()  # stable: equal ids keep their scan order
    mask[tied[order[:room]]] = True
    return mask


def _sample_plan(
    times: np.ndarray,
    ids: pa.ChunkedArray,
    fraud: np.ndarray,
    fractions: SplitFractions,
    max_fit_rows: int | None,
    hashes: Callable[[], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Which rows to keep, and the split and weight of each kept row (in the rows' order): the split by
    position in (event time, id) order, the legitimate transactions sampled at the rate that leaves the
    train and validation splits `max_fit_rows` rows in both, by `hashes()` (unit_hash of the ids), and the
    holdout at the same rate, with weights (see the module docstring).

    The split of every row is decided by selection (`_first_rows`), not by sorting every row: a 30-day
    window at 1M transactions a day is ~27M rows, ~2.3M of them kept."""
    import numpy as np

    rows = len(times)
    train_rows, fit_rows = _split_sizes(rows, fractions)
    in_train, fit = _first_rows(times, ids, train_rows), _first_rows(times, ids, fit_rows)
    fit_fraud = int((fit & fraud).sum())
    rate = 1.0
    keep = np.ones(rows, dtype=bool)
    if max_fit_rows is not None and fit_rows > max_fit_rows:
        negatives = fit_rows - fit_fraud
        # Every fraud stays; if frauds alone exceed the cap, as many legitimate rows as frauds.
        rate = min(1.0, max(max_fit_rows - fit_fraud, fit_fraud) / negatives)
        keep = fraud | (hashes() < rate)
    splits = np.where(in_train[keep], "train", np.where(fit[keep], "validation", "holdout"))
    weights = np.where(fraud[keep], 1.0, 1.0 / rate)
    sampling = {
        "negative_sample_rate": rate,
        "fit_rows_before_sampling": fit_rows,
        "max_fit_rows": max_fit_rows,
    }
    return keep, splits, weights, sampling


def _split_and_sample(
    table: pa.Table, fractions: SplitFractions, max_fit_rows: int | None
) -> tuple[pa.Table, dict]:
    """`_sample_plan` applied to `table` (labelled transactions): the rows kept, sorted by
    (event time, id), with their split and weight."""
    import pyarrow as pa
    import pyarrow.compute as pc

    times = table["event_timestamp"].cast(pa.int64()).to_numpy()
    ids = table["transaction_id"]
    keep, splits, weights, sampling = _sample_plan(
        times, ids, table[LABEL].to_numpy() == 1, fractions, max_fit_rows, lambda: unit_hash(ids)
    )
    del times
    kept = table.filter(pa.array(keep)) if sampling["negative_sample_rate"] < 1.0 else table
    order = pc.sort_indices(
        kept, sort_keys=[("event_timestamp", "ascending"), ("transaction_id", "ascending")]
    )
    kept = kept.take(order)
    order = order.to_numpy()
    kept = kept.append_column(SPLIT, pa.array(splits[order], pa.string()))
    kept = kept.append_column(WEIGHT, pa.array(weights[order], pa.float64()))
    return kept, sampling


def label_coverage(settings: Settings, day: date, window_days: int) -> dict:
    """Which label arrivals a training set as of `day` could use: it reads the chargebacks reported
    through `day`; the dates of its window whose labels file was never delivered (not ingested, or
    ingested with no labels file: a header-only file is a day without chargebacks, not a missing one) are
    named. The set is built anyway, since a feed can skip a day, but the run states it and the record
    keeps it."""
    from pipelines.lake import Tables, read_json

    tables = Tables(settings.lake)
    window = [day - timedelta(days=k) for k in range(window_days - 1, -1, -1)]
    missing = [
        d.isoformat() for d in window if not (read_json(tables.labels_reconciliation(d)) or {}).get("files")
    ]
    if missing:
        log.warning("training set as of %s: no labels ingested for %s", day, ", ".join(missing))
    return {"labels_reported_through": day.isoformat(), "label_arrivals_missing": missing}


TRANSACTION_INPUTS: tuple[str, ...] = (*TRANSACTION_NUMERIC, *(f"{c}_code" for c in CATEGORICAL_FEATURES))
FRAME_KEYS = ("transaction_id", "customer_id", "merchant_id", "event_timestamp")


def build_training_frame(
    settings: Settings,
    day: date,
    window_days: int = 30,
    label_maturity_days: int = 0,
    fractions: SplitFractions = SplitFractions(),
    max_fit_rows: int | None = None,
    require_fraud: bool = True,
) -> pd.DataFrame:
    """The training set as of `day` as a DataFrame (see the module docstring); its `attrs` say how the
    train and validation splits were sampled. `require_fraud=False` returns the rows even when no fraud is
    known yet (the train/serve parity check compares features of a day whose labels have not come in).
    The rows are `build_training_table`'s."""
    table, attrs = build_training_table(
        settings, day, window_days, label_maturity_days, fractions, max_fit_rows, require_fraud
    )
    frame = _pandas(table)
    frame.attrs.update(attrs)
    return frame


def build_training_table(
    settings: Settings,
    day: date,
    window_days: int = 30,
    label_maturity_days: int = 0,
    fractions: SplitFractions = SplitFractions(),
    max_fit_rows: int | None = None,
    require_fraud: bool = True,
    read_stats: dict | None = None,
) -> tuple[pa.Table, dict]:
    """The training set as of `day` as an Arrow table sorted by (event time, id), and what its frame's
    `attrs` hold (the sampling and the label coverage). The retrain writes it as it is, without a pandas
    round trip (`write_training_set`). `read_stats`, when given, receives what the read decoded (not in
    the attrs: they are versioned with the set, and the same set may be read with more or less decoding).

    Read from the feature rows of the window's event dates (training/feature_rows.py: each transaction's
    inputs, built once with its date's gold; any date without fresh rows is built first), with the labels
    known at the end of `day` joined: the same rows and values as `build_training_frame_by_join`, the
    point-in-time join of the whole window, at a fraction of its cost. Two reads: the ids, times and id
    hashes of the whole window decide the splits and the sample; then only the row groups holding a kept
    row are read whole, and the frauds kept apart by earlier reads are taken from there."""
    from datetime import UTC, datetime

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipelines.lake import Tables
    from training import feature_rows

    tables = Tables(settings.lake)
    first = day - timedelta(days=window_days - 1)
    if not tables.silver.is_dir():
        raise NothingToTrainError(
            f"no silver transactions yet (no table at {tables.silver}); run `mlops ingest --date {day}` "
            "(and the dates before it) first"
        )
    arrivals = [first + timedelta(days=k) for k in range(window_days)]
    if not any(Tables.partition(tables.silver, arrival).is_dir() for arrival in arrivals):
        raise NothingToTrainError(
            f"no silver transactions arrived between {first} and {day} under {tables.silver}; "
            f"run `mlops ingest --date {day}` first or widen --window-days"
        )
    # An arrival of the window holds events of up to `late_event_days` before it.
    earliest = first - timedelta(days=settings.ingest.late_event_days)
    event_dates = [earliest + timedelta(days=k) for k in range((day - earliest).days + 1)]
    feature_rows.ensure_feature_rows(settings, event_dates)
    rows = feature_rows.WindowRows(settings.lake, event_dates)
    thin = rows.thin(["transaction_id", "event_timestamp", feature_rows.ID_HASH, feature_rows.ARRIVAL])
    in_window = _arrivals_between(thin[feature_rows.ARRIVAL], first, day)
    window_rows = int(in_window.sum())
    _require_every_transaction(tables, first, day, window_rows)
    if window_rows == 0:
        raise NothingToTrainError(
            f"no silver transactions arrived between {first} and {day} under {tables.silver}; "
            f"run `mlops ingest --date {day}` first or widen --window-days"
        )
    times = thin["event_timestamp"].cast(pa.int64()).to_numpy()
    oldest_immature = cutoff(day) - timedelta(days=label_maturity_days)
    mature_before = (oldest_immature - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    mature = np.flatnonzero(in_window & (times < mature_before))  # positions in the thin read
    if len(mature) == 0:
        raise NothingToTrainError(
            f"none of the {window_rows} transactions that arrived between {first} and {day} is "
            f"older than the label maturity of {label_maturity_days} days; land and ingest more days or "
            "lower MLOPS_TRAINING__LABEL_MATURITY_DAYS"
        )
    fraud_ids = _known_fraud(tables, first, day)
    fraud = rows.holding(fraud_ids)
    keep, splits, weights, sampling = _sample_plan(
        times[mature],
        _Subset(rows, mature),
        fraud[mature],
        fractions,
        max_fit_rows,
        lambda: thin[feature_rows.ID_HASH].to_numpy()[mature],
    )
    del times
    # The second pass decodes only the row groups that hold a kept row (and takes the frauds kept apart
    # by earlier reads): see feature_rows.WindowRows.
    positions = mature[keep]
    try:
        kept, order = rows.take(
            positions, fraud[positions], [*FRAME_KEYS, *TRANSACTION_INPUTS, *SERVICE_FEATURES]
        )
    except feature_rows.RowsChangedError as changed:
        raise TrainingSetError(
            f"the feature rows under {feature_rows.rows_root(settings.lake)} changed while the training set "
            f"as of {day} was read (a features run rebuilt them: {changed}); run the training set again"
        ) from changed
    log.info("training set as of %s, the read: %s", day, rows.stats)
    if read_stats is not None:
        read_stats.update(rows.stats, window_rows=window_rows)
    labels = pc.cast(pc.is_in(kept["transaction_id"], value_set=fraud_ids), pa.int8())
    kept = kept.add_column(len(FRAME_KEYS), LABEL, labels)
    kept = kept.append_column(SPLIT, pa.array(splits[order], pa.string()))
    kept = kept.append_column(WEIGHT, pa.array(weights[order], pa.float64()))
    by_time = pc.sort_indices(
        kept, sort_keys=[("event_timestamp", "ascending"), ("transaction_id", "ascending")]
    )
    table = kept.take(by_time)
    _require_fraud(table, day, window_days, require_fraud)
    return table, {**sampling, **label_coverage(settings, day, window_days)}


class _Subset:
    """The ids of a window's rows at `positions`, taken only where asked (`_first_rows` takes the few rows
    tied at a split's boundary), file by file."""

    def __init__(self, rows: WindowRows, positions: np.ndarray) -> None:
        self.rows, self.positions = rows, positions

    def take(self, indices: np.ndarray) -> pa.Array:
        return self.rows.ids_at(self.positions[indices])


def _arrivals_between(arrivals: pa.ChunkedArray, first: date, last: date) -> np.ndarray:
    """A mask of the rows whose arrival date (ISO text, dictionary-encoded as the rows files hold it)
    lies in first .. last, decided once per distinct value."""
    import numpy as np
    import pyarrow as pa

    parts = []
    for chunk in arrivals.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        low, high = first.isoformat(), last.isoformat()
        inside = np.array([v is not None and low <= v <= high for v in values] + [False])
        codes = chunk.indices.fill_null(len(values)).to_numpy()
        parts.append(inside[codes])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _require_every_transaction(tables: Tables, first: date, day: date, rows: int) -> None:
    """The window's feature rows number its silver transactions (from the Parquet footers of silver): a
    silver partition rewritten since its rows were built would otherwise train on the old rows."""
    import pyarrow.parquet as pq

    silver = 0
    for k in range((day - first).days + 1):
        partition = tables.partition(tables.silver, first + timedelta(days=k))
        for path in sorted(partition.glob("*.parquet")) if partition.is_dir() else []:
            silver += pq.ParquetFile(path).metadata.num_rows
    if silver != rows:
        raise TrainingSetError(
            f"the feature rows of the arrivals {first} .. {day} hold {rows} transactions but silver holds "
            f"{silver}; silver changed after its features were built: run the features job for those "
            "arrivals (`mlops features --date YYYY-MM-DD`), then the training set again"
        )


def _require_fraud(table: pa.Table, day: date, window_days: int, require_fraud: bool) -> None:
    import pyarrow.compute as pc

    if not require_fraud:
        return
    if not pc.any(pc.and_(pc.equal(table[SPLIT], "train"), pc.equal(table[LABEL], 1))).as_py():
        raise TrainingSetError(
            f"the training set as of {day} has no known fraud in its train split "
            f"({table.num_rows} transactions, window {window_days} days); land and ingest more days of data "
            "or widen --window-days"
        )


def build_training_frame_by_join(
    settings: Settings,
    day: date,
    window_days: int = 30,
    label_maturity_days: int = 0,
    fractions: SplitFractions = SplitFractions(),
    max_fit_rows: int | None = None,
    require_fraud: bool = True,
) -> pd.DataFrame:
    """The training set as of `day` by a point-in-time join of the whole window's silver with gold through
    the Feast registry's views: what `build_training_frame` reads from the feature rows, computed from
    scratch. Kept as the reference the feature rows are tested against (tests/integration/gold_checks.py,
    after late, out-of-order and re-delivered arrivals)."""
    from concurrent.futures import ThreadPoolExecutor

    from features import offline, sources

    def registry() -> list:
        sources.require_gold(settings)  # a missing gold table is named as before, and Feast is not opened
        return offline.service_views(settings)

    # Feast's import and the registry read (seconds of Python) run beside the silver read and the split,
    # which spend their time in Arrow and numpy with the GIL released. Errors keep their order: no silver
    # to train on first (the retrain DAG skips on it), then a missing gold table.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="registry") as pool:
        views = pool.submit(registry)
        table, sampling = _split_and_sample(
            _labeled_table(settings, day, window_days, label_maturity_days), fractions, max_fit_rows
        )
        transactions = _pandas(table)
        del table
        entity_df = transactions[["customer_id", "merchant_id"]].copy()
        entity_df["event_timestamp"] = transactions["event_timestamp"] - FEATURE_LAG
        joined = offline.historical_features(settings, entity_df, views=views.result())
    features = joined[list(SERVICE_FEATURES)].astype("float64").reset_index(drop=True)
    frame = transactions[["transaction_id", "customer_id", "merchant_id", "event_timestamp", LABEL]].copy()
    frame = frame.join(transaction_columns(transactions)).join(features)
    frame[SPLIT] = transactions[SPLIT]
    frame[WEIGHT] = transactions[WEIGHT]
    frame.attrs.update(sampling)
    frame.attrs.update(label_coverage(settings, day, window_days))
    _require_fraud(frame, day, window_days, require_fraud)
    return frame


def dataset_folder(settings: Settings, day: date) -> Path:
    return settings.home / "training_sets" / f"as_of={day.isoformat()}"


def write_training_set(
    settings: Settings,
    day: date,
    window_days: int = 30,
    label_maturity_days: int = 0,
    max_fit_rows: int | None = None,
) -> dict:
    """Build, write and version the training set as of `day`; returns its DVC revision and counts, and
    what its read decoded."""
    read: dict = {}
    table, sampling = build_training_table(
        settings, day, window_days, label_maturity_days, max_fit_rows=max_fit_rows, read_stats=read
    )
    metadata = training_set_metadata(window_days, label_maturity_days, sampling)
    rev, folder = version_training_frame(settings, day, table, metadata)
    counts = {
        row[SPLIT]: {"rows": int(row[f"{LABEL}_count"]), "positives": int(row[f"{LABEL}_sum"])}
        for row in table.group_by(SPLIT).aggregate([(LABEL, "count"), (LABEL, "sum")]).to_pylist()
    }
    splits = {s: counts[s] for s in SPLITS}
    return {
        "training_set_rev": rev,
        "rows": table.num_rows,
        "positives": sum(split["positives"] for split in splits.values()),
        "splits": splits,
        "path": str((folder / DATASET_FILE).relative_to(settings.home)),
        **sampling,
        "read": read,
    }


def _training_set_lineage(
    settings: Settings, record: dict, day: date, window_days: int | None = None
) -> lineage.Datasets:
    """The window's feature rows and the DVC revisions of its gold, the labels known at `day`."""
    from pipelines.gold.contract import gold_revision_path
    from pipelines.lake import Tables, read_json
    from training.feature_rows import _rows_path

    window = window_days or settings.training.window_days
    days = [day - timedelta(days=k) for k in range(window)]
    revisions = [read_json(gold_revision_path(settings.home, d)) for d in days]
    labels = Tables(settings.lake).silver_labels
    label_days = [day - timedelta(days=k) for k in range(window + 60)]
    return lineage.Datasets(
        [
            *(
                lineage.dvc_revision(settings, f"gold/event_date={r['event_date']}", r["dataset_rev"])
                for r in revisions
                if r
            ),
            *(
                lineage.path(_rows_path(settings.lake, d))
                for d in days
                if _rows_path(settings.lake, d).is_dir()
            ),
            *(
                lineage.path(Tables.partition(labels, d))
                for d in label_days
                if Tables.partition(labels, d).is_dir()
            ),
        ],
        [lineage.dvc_revision(settings, TRAINING_SET_MEMBER, record["training_set_rev"])],
        {"as_of": day.isoformat(), "window_days": window},
    )


@lineage.emits("training_set", _training_set_lineage)
def build_training_set(settings: Settings, day: date, window_days: int | None = None) -> dict:
    """The retrain's first step: build and version the training set as of `day` with the training
    settings; its `seconds` go on to the training run."""
    import time

    from training.label_maturity import label_maturity

    started = time.perf_counter()
    maturity = label_maturity(settings, day)
    record = write_training_set(
        settings,
        day,
        window_days or settings.training.window_days,
        maturity.days,
        max_fit_rows=settings.training.max_fit_rows,
    )
    record["label_maturity"] = {"days": maturity.days, "source": maturity.source}
    record["as_of"] = day.isoformat()
    record["seconds"] = time.perf_counter() - started
    return record


def version_training_frame(
    settings: Settings, day: date, frame: pd.DataFrame | pa.Table, metadata: dict
) -> tuple[str, Path]:
    """Write a training frame (or `build_training_table`'s table) and its metadata (as-of date added) to the
    as-of folder and version it with DVC; returns the revision and the folder."""

    from pipelines.versioning import record_revision, track

    folder = dataset_folder(settings, day)
    write_training_folder(folder, day, as_written(frame), metadata)
    member = track(settings, f"training/as_of={day.isoformat()}", folder)
    return record_revision(settings, {TRAINING_SET_MEMBER: member}), folder


def training_set_metadata(window_days: int, label_maturity_days: int, sampling: dict) -> dict:
    """What a training set's metadata file holds besides its as-of date."""
    return {"window_days": window_days, "label_maturity_days": label_maturity_days, **sampling}


def write_training_folder(folder: Path, day: date, table: pa.Table, metadata: dict) -> None:
    """The training set's data and metadata files in `folder`, as DVC versions them (and a rebuild hashes)."""
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    # Files are replaced, never rewritten in place: a versioned file is a hard link to its DVC cache object.
    staging = folder / f".{DATASET_FILE}.tmp"
    # LZ4: faster than zstd to write and to read at the goal's size, for a tenth more bytes
    # (docs/benchmarks.md); the retrain writes it once and its train, evaluate and export read it.
    pq.write_table(table, staging, compression="lz4")
    staging.replace(folder / DATASET_FILE)
    staging = folder / f".{METADATA_FILE}.tmp"
    staging.write_text(json.dumps({"as_of": day.isoformat(), **metadata}, sort_keys=True) + "\n")
    staging.replace(folder / METADATA_FILE)


def as_written(frame: pd.DataFrame | pa.Table) -> pa.Table:
    """The Arrow table a training set file holds: a frame as pandas converts it, or `build_training_table`'s
    table as the frame of its rows would be converted, without the round trip through pandas of 2M+ rows:
    nanosecond times, pandas' metadata (from the empty frame, typed by the table's schema), a missing float
    as null rather than NaN. The same table either way (tests/unit/test_training_table.py)."""
    import pyarrow as pa

    if not isinstance(frame, pa.Table):
        return pa.Table.from_pandas(frame, preserve_index=False)
    fields = [
        pa.field(f.name, pa.timestamp("ns", tz=f.type.tz)) if pa.types.is_timestamp(f.type) else f
        for f in frame.schema
    ]
    empty = _pandas(frame.slice(0, 0))
    return _nan_as_null(frame).cast(
        pa.Table.from_pandas(empty, schema=pa.schema(fields), preserve_index=False).schema
    )


def _nan_as_null(table: pa.Table) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    for index, column_type in enumerate(table.schema):
        if pa.types.is_floating(column_type.type):
            values = table.column(index)
            nan = pc.is_nan(values)
            if pc.any(nan).as_py():
                table = table.set_column(
                    index, column_type, pc.if_else(nan, pa.scalar(None, column_type.type), values)
                )
    return table


def model_arrays(
    frame: pd.DataFrame, inputs: Sequence[str] = MODEL_INPUTS, what: str = "the training set"
) -> tuple[np.ndarray, np.ndarray]:
    """The model inputs (float32 in `inputs` order, missing values as NaN) and labels (float32 0/1).
    Raises MissingInputsError naming the inputs `frame` lacks."""
    lacking = [name for name in inputs if name not in frame]
    if lacking:
        raise MissingInputsError(
            f"{what} lacks the model input(s) {', '.join(lacking)}: a set made before they were declared "
            "(compute gold again for the window's dates, `mlops features --date ...`, then retrain)",
            lacking,
        )
    x = frame[list(inputs)].to_numpy(dtype="float32", na_value=float("nan"))
    return x, frame[LABEL].to_numpy(dtype="float32")


@dataclass(frozen=True)
class Holdout:
    """The holdout of a training set, as the evaluation, the gate and the export score it: `x` holds
    `inputs` (by default today's MODEL_INPUTS); `matrix` gives any version its own inputs of the same rows."""

    rev: str
    x: np.ndarray
    y: np.ndarray
    weights: np.ndarray | None  # transactions each row stands for; None: one each (sets before sampling)
    inputs: tuple[str, ...] = MODEL_INPUTS
    # Reads further input columns of the same rows, in the same order (the set's file, read again).
    read_more: Callable[[list[str]], pd.DataFrame] | None = field(default=None, compare=False, repr=False)

    def matrix(self, inputs: Sequence[str], who: str = "the model") -> np.ndarray:
        """The rows' values of `inputs`, in that order (a version addressed by the names it was trained on).
        Raises MissingInputsError naming what the training set does not carry."""
        import numpy as np

        inputs = tuple(inputs)
        if inputs == self.inputs:
            return self.x
        extra = [name for name in inputs if name not in self.inputs]
        if not extra:
            return self.x[:, input_positions(inputs, self.inputs, who)]
        more = self.read_more(extra) if self.read_more else None
        lacking = [name for name in extra if more is None or name not in more]
        if lacking:
            raise MissingInputsError(
                f"{who} takes input(s) that training set {self.rev} does not carry: {', '.join(lacking)} "
                "(removed from the declarations before the set was made)",
                lacking,
            )
        assert more is not None
        columns = {name: self.x[:, j] for j, name in enumerate(self.inputs)}
        columns.update({name: more[name].to_numpy(dtype="float32", na_value=float("nan")) for name in extra})
        return np.column_stack([columns[name] for name in inputs]).astype("float32")


def read_holdout(settings: Settings, rev: str, inputs: Sequence[str] = MODEL_INPUTS) -> Holdout:
    """The holdout rows of training set `rev`: the model `inputs` (today's by default: a version's own for
    its export), labels and weights only."""
    frame = read_training_set(settings, rev, "holdout", [*inputs, LABEL, SPLIT, WEIGHT])
    x, y = model_arrays(frame, inputs, f"training set {rev}")
    return Holdout(
        rev,
        x,
        y,
        frame[WEIGHT].to_numpy() if WEIGHT in frame else None,
        tuple(inputs),
        lambda names: read_training_set(settings, rev, "holdout", list(names)),
    )


def read_training_set(
    settings: Settings, rev: str, split: str | None = None, columns: list[str] | None = None
) -> pd.DataFrame:
    """The training set of DVC revision `rev`, read in place from the DVC remote by content hash (no DVC
    repository, no writes: the training pod mounts the shared volume read-only); only the rows of `split`
    and the `columns` the file has, when given (the gate and the export need the holdout's model inputs: a
    sixth of the rows, a third of the columns)."""
    import pandas as pd
    import pyarrow.parquet as pq

    from pipelines.versioning import revision_files

    members = revision_files(settings, rev)
    files = members.get(TRAINING_SET_MEMBER)
    if files is None or DATASET_FILE not in files:
        raise TrainingSetError(f"revision {rev!r} is not a training set (members: {sorted(members)})")
    data = files[DATASET_FILE]
    if columns is not None:
        present = set(pq.read_schema(data).names)
        columns = [c for c in columns if c in present]
    frame = pd.read_parquet(data, columns=columns, filters=[(SPLIT, "==", split)] if split else None)
    if "event_timestamp" in frame:
        frame["event_timestamp"] = pd.to_datetime(frame["event_timestamp"], utc=True)
    if METADATA_FILE in files:  # sets versioned before the metadata file existed lack it
        frame.attrs.update(json.loads(files[METADATA_FILE].read_text()))
    return frame
