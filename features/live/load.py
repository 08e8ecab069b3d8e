"""The live state's load: silver's transactions and chargebacks, read with Arrow (no Spark), into a new
`LiveState`'s columns, in two passes over the files so that the load's peak stays near the state's own
size (features/live/__init__.py has the figures). These functions fill the state's own fields: they are
its bootstrap, kept apart from what it does once running."""

from __future__ import annotations

import logging
from array import array
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from features.definitions import CUSTOMER_TTL, MERCHANT_TTL
from features.live.columns import History, Merchant, window_starts
from features.live.memory import (
    BYTES_PER_TRANSACTION,
    StateTooLargeError,
    map_large_allocations,
    release_freed_memory,
)
from features.live.values import (
    CHARGEBACK_REACH_DAYS,
    DAY_MS,
    EPOCH,
    US_PER_MS,
    id_hashes,
    is_foreign,
    micros,
    usd_rate,
)
from pipelines.gold.contract import LOOKBACK_DAYS
from pipelines.lake import Tables

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from core.settings import Settings
    from features.live.state import LiveState

log = logging.getLogger(__name__)

# Bootstrap reach: the row of an entity's last transaction before the start may be served up to its TTL
# later, and that row reads its 30-day windows and the previous transaction's arrival 30 days further back.
_TRANSACTION_REACH_DAYS = max(CUSTOMER_TTL, MERCHANT_TTL).days + LOOKBACK_DAYS + 2
_LABEL_REACH_DAYS = MERCHANT_TTL.days + LOOKBACK_DAYS + 1
_SLICE_ROWS = 1 << 20  # rows per slice where the load would otherwise copy a value for every row


def bootstrap(state: LiveState, settings: Settings, start: datetime, max_bytes: int | None = None) -> None:
    """Fill a new `state` as of `start` from the lake's silver tables: every transaction with event time
    before `start` in the arrivals gold reads for dates from `start` on (and for the rows of each entity's
    last earlier transaction, still served within its TTL), and the fraud chargebacks reported before
    `start` that gold attributes to a merchant. Transactions and chargebacks at or after `start` are
    left to `observe` / `observe_chargeback`: pass the time the lake's data ends (the service's
    start), or the start of a day to replay it."""
    start_us = micros(start, "start")
    map_large_allocations()
    state._now_ms = start_us // US_PER_MS
    tables = Tables(settings.lake)
    arrivals = silver_arrivals(tables.silver)
    if not arrivals:
        log.warning("no silver transactions under %s: the live state starts empty", tables.silver)
        return
    start_day = date.fromordinal(EPOCH.date().toordinal() + start_us // (DAY_MS * US_PER_MS))
    first = start_day - timedelta(days=_TRANSACTION_REACH_DAYS)
    if max_bytes is not None:
        rows = _count(tables.silver, first, before=("event_timestamp", start))
        if rows * BYTES_PER_TRANSACTION > max_bytes:
            size = rows * BYTES_PER_TRANSACTION / 2**30
            raise StateTooLargeError(
                f"the live state would hold {rows:,} transactions of {tables.silver} (about {size:.1f} "
                f"GiB at {BYTES_PER_TRANSACTION} bytes each), over serving.max_state_bytes "
                f"({max_bytes / 2**30:.1f} GiB): give the service more memory and raise the setting with "
                "it, or serve with serving.live_state=false (the online store's state, without same-day "
                "activity)"
            )
    read = load_transactions(state, tables.silver, first, start)
    load_chargebacks(state, tables, set(arrivals), start_day, start)
    release_freed_memory()
    log.info(
        "live state from %s: %d transactions before %s read, %d kept in %.0f MiB of columns, "
        "%d customers, %d merchants, %d chargebacks",
        tables.silver,
        read,
        start.isoformat(),
        state.kept_transactions(),
        state.nbytes() / 2**20,
        len(state._history.keys) if state._history is not None else 0,
        len(state.merchants),
        sum(len(m.chargebacks) for m in state.merchants.values()),
    )


def load_transactions(state: LiveState, root: Path, first_day: date, start: datetime) -> int:
    """Bulk load of silver's transactions in the arrivals from `first_day` with event time before `start`,
    in two passes over the files so that the load's peak stays near the state's own size: the first
    keeps each row's compact columns (time, USD amount, flags, arrival, customer and merchant codes,
    the id's hash); after one sort per entity kind, the second reads the ids only of the rows that keep
    theirs (each customer's window and its same-millisecond ties). Returns the rows read."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    fragments, condition, schema = _fragments(root, first_day, ("event_timestamp", start))
    # Each file's customer and merchant ids dictionary-encoded; one set of codes for all files after.
    local: dict[str, list[tuple[pa.Array, np.ndarray]]] = {"customer": [], "merchant": []}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ("us", "usd", "flags", "arrival", "hashes")}
    sizes = []
    for fragment in fragments:
        table = fragment.to_table(
            schema=schema,
            columns=[
                "transaction_id",
                "customer_id",
                "merchant_id",
                "amount",
                "currency",
                "country",
                "event_timestamp",
                "arrival_date",
            ],
            filter=condition,
        )
        sizes.append(table.num_rows)
        if not table.num_rows:
            continue
        parts["us"].append(
            table["event_timestamp"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
        )
        # Through the decimal text: Arrow's decimal-to-double cast is not correctly rounded; Spark's is.
        amounts = pc.cast(pc.cast(table["amount"], pa.string()), pa.float64()).to_numpy()
        currencies = table["currency"].combine_chunks().dictionary_encode()
        rates = np.array([usd_rate(c) for c in currencies.dictionary.to_pylist()])
        parts["usd"].append(amounts / rates[currencies.indices.to_numpy(zero_copy_only=False)])
        # Abroad from the (country, currency) pairs present, looked up per row (a null country is abroad).
        countries = table["country"].combine_chunks().dictionary_encode()
        known = countries.dictionary.to_pylist()
        pairs = np.array(
            [
                [is_foreign(country, c) for c in currencies.dictionary.to_pylist()]
                for country in [*known, None]
            ],
            dtype=np.int8,
        )
        country = pc.fill_null(countries.indices, len(known)).to_numpy(zero_copy_only=False)
        parts["flags"].append(pairs[country, currencies.indices.to_numpy(zero_copy_only=False)])
        parts["arrival"].append(table["arrival_date"].cast(pa.int32()).to_numpy().astype(np.int32))
        for kind in ("customer", "merchant"):
            encoded = table[f"{kind}_id"].combine_chunks().dictionary_encode()
            local[kind].append((encoded.dictionary, encoded.indices.to_numpy(zero_copy_only=False)))
        parts["hashes"].append(id_hashes(table["transaction_id"].combine_chunks().cast(pa.large_string())))
        del table, amounts, currencies, countries, pairs, country
        release_freed_memory()  # the file's columns (Arrow's threads free into their own arenas)
    rows = sum(sizes)
    if not rows:
        return 0
    col = {name: np.concatenate(parts.pop(name)) for name in list(parts)}
    customers, parts["customer"] = _codes(local.pop("customer"))
    state._merchant_keys, parts["merchant"] = _codes(local.pop("merchant"))
    state._merchant_codes = {key: code for code, key in enumerate(state._merchant_keys)}
    col.update({name: np.concatenate(parts.pop(name)) for name in ("customer", "merchant")})
    release_freed_memory()
    id_from = state._now_ms // DAY_MS - state._id_reach_days

    # Merchants: each one's arrays, from one sort by (merchant, time).
    order = _sort(col["merchant"], col["us"])
    m_sorted = col["merchant"][order]
    bounds = np.flatnonzero(np.diff(m_sorted)) + 1
    firsts, lasts = np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [rows]]).tolist()
    codes = m_sorted[firsts].tolist()
    del m_sorted, bounds
    us_sorted, usd_sorted = col["us"][order], col["usd"][order]
    del order
    for a, b, code in zip(firsts, lasts, codes, strict=True):
        ms_slice = us_sorted[a:b] // US_PER_MS
        a += int(np.searchsorted(ms_slice, ms_slice[-1] - state._retain_ms, side="right"))
        key = state._merchant_keys[code]
        merchant = state.merchants[key] = Merchant(key)
        merchant.us.frombytes(us_sorted[a:b].tobytes())
        merchant.cum = array("d", np.concatenate([[0.0], np.cumsum(usd_sorted[a:b])]).tobytes())
    del us_sorted, usd_sorted
    release_freed_memory()

    # Customers: the history, from one sort by (customer, time). Kept: what the retained span reaches
    # (after each customer's latest), and what a resend or a chargeback may still name (arrived within
    # the ids' reach).
    customer = col.pop("customer")
    order = _sort(customer, col["us"])
    group = customer[order]
    del customer
    us_sorted = col["us"][order]
    bounds = np.flatnonzero(np.diff(group)) + 1
    starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [rows]])
    # Kept in the retained span: a millisecond later than the customer's latest less the span.
    threshold = (us_sorted[ends - 1] // US_PER_MS - state._retain_ms + 1) * US_PER_MS
    keep = _at_least(us_sorted, threshold, ends - starts)
    keep |= col["arrival"][order] >= id_from
    order, group, us_sorted = order[keep], group[keep], us_sorted[keep]
    del bounds, starts, ends, threshold, keep
    release_freed_memory()
    lengths = np.bincount(group, minlength=len(customers))
    present = np.flatnonzero(lengths)
    lengths = lengths[present]
    starts = np.zeros(len(present) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    window_start = window_starts(starts, us_sorted, state._lateness_us)
    in_window = _at_least(None, window_start, lengths)
    # Rows sharing a millisecond with another of their customer's: their order and bit 1 need the ids.
    tied = np.zeros(len(order), dtype=bool)
    ms = us_sorted // US_PER_MS
    same = (group[1:] == group[:-1]) & (ms[1:] == ms[:-1])
    del ms
    tied[1:] |= same
    tied[:-1] |= same
    del same
    wanted = np.flatnonzero(in_window | tied)  # positions in `order`
    ids = _ids_at(fragments, condition, schema, sizes, order[wanted])
    first = np.ones(len(order), dtype=bool)
    at = np.flatnonzero(tied)
    if len(at):
        tied_ids = ids.take(pa.array(np.searchsorted(wanted, at)))
        # Same-microsecond ties in id order (the sort above left them in file order).
        resort = pc.sort_indices(
            pa.table({"c": group[at], "us": us_sorted[at], "id": tied_ids}),
            [("c", "ascending"), ("us", "ascending"), ("id", "ascending")],
        ).to_numpy()
        order[at] = order[at][resort]
        us_sorted[at] = us_sorted[at][resort]
        tied_ids = tied_ids.take(pa.array(resort))
        first[at] = History.first_in_millisecond(group[at], us_sorted[at], tied_ids)
        # The window's ids: a tied row's follows the new order of its ties.
        window_rows = np.flatnonzero(in_window)
        k = np.minimum(np.searchsorted(at, window_rows), len(at) - 1)
        source = np.where(at[k] == window_rows, len(ids) + k, np.searchsorted(wanted, window_rows))
        window_ids = pa.concat_arrays([ids, tied_ids]).take(pa.array(source))
    else:
        window_ids = ids.take(pa.array(np.searchsorted(wanted, np.flatnonzero(in_window))))
    del ids, tied, at, wanted, group
    del col["us"]
    flags = col.pop("flags")[order] | np.where(first, 0, 2).astype(np.int8)
    del first
    release_freed_memory()
    state._history = History(
        [customers[c] for c in present.tolist()],
        lengths,
        {
            "us": us_sorted,
            "usd": col.pop("usd")[order],
            "flags": flags,
            "arrival": col.pop("arrival")[order],
            "merchant": col.pop("merchant")[order],
            "hashes": col.pop("hashes")[order],
        },
        window_start,
        window_ids,
    )
    return rows


def load_chargebacks(
    state: LiveState, tables: Tables, with_silver: set[date], start_day: date, start: datetime
) -> None:
    """Fraud chargebacks reported before `start`, attributed as gold does: a chargeback that arrived on
    X goes to the merchant of each silver copy of its transaction in the arrivals X-32 .. X, and only
    arrivals that also have silver transactions are read (state.arrivals_with_silver)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first = start_day - timedelta(days=max(_LABEL_REACH_DAYS, state.dedup_lookback_days))
    labels = _read(
        tables.silver_labels,
        ["transaction_id", "is_fraud", "label_timestamp", "arrival_date"],
        first,
        before=("label_timestamp", start),
    )
    if not labels.num_rows:
        return
    label_arrival = labels["arrival_date"].cast(pa.int32()).to_pylist()
    label_us = labels["label_timestamp"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    ids = labels["transaction_id"].to_pylist()
    epoch = EPOCH.date().toordinal()
    silver_days = {d.toordinal() - epoch for d in with_silver}
    dedup_from = start_day.toordinal() - epoch - state.dedup_lookback_days
    for tid, arrival, us in zip(ids, label_arrival, label_us, strict=True):
        if arrival >= dedup_from and tid not in state._reported:  # silver dedups by id, fraud or not
            state._mark_reported(tid, us // US_PER_MS // DAY_MS)
    fraud = [
        (tid, arrival, us)
        for tid, arrival, us, flag in zip(
            ids, label_arrival, label_us, labels["is_fraud"].to_pylist(), strict=True
        )
        if flag == 1 and arrival in silver_days
    ]
    if not fraud:
        return
    low = date.fromordinal(epoch + min(a for _, a, _ in fraud) - CHARGEBACK_REACH_DAYS)
    wanted = pa.array(sorted({tid for tid, _, _ in fraud}), pa.string())
    copies = _read(
        tables.silver,
        ["transaction_id", "merchant_id", "arrival_date"],
        low,
        where=pc.is_in(pc.field("transaction_id"), value_set=wanted),
    )
    merchants_of: dict[str, list[tuple[int, str]]] = {}
    for tid, merchant, arrival in zip(
        copies["transaction_id"].to_pylist(),
        copies["merchant_id"].to_pylist(),
        copies["arrival_date"].cast(pa.int32()).to_pylist(),
        strict=True,
    ):
        merchants_of.setdefault(tid, []).append((arrival, merchant))
    for tid, arrival, us in fraud:
        for copy_arrival, merchant in merchants_of.get(tid, ()):
            if arrival - CHARGEBACK_REACH_DAYS <= copy_arrival <= arrival:
                state._merchant(merchant).chargebacks.append(us // US_PER_MS)
                state._attributed.setdefault(tid, []).append((merchant, us // US_PER_MS))
    for merchant in state.merchants.values():
        merchant.chargebacks = array("q", sorted(merchant.chargebacks))


def silver_arrivals(root: Path) -> list[date]:
    """The arrival dates of a silver table, oldest first."""
    prefix = "arrival_date="
    if not root.is_dir():
        return []
    return sorted(
        date.fromisoformat(p.name.removeprefix(prefix))
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(prefix)
    )


def _silver(root: Path):
    """A silver table's files as one Arrow dataset (hive partitions by arrival date)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(pa.schema([("arrival_date", pa.date32())]), flavor="hive")
    return ds.dataset(root, format="parquet", partitioning=partitioning)


def _since(first: date, before: tuple[str, datetime] | None = None):
    """The filter: arrivals on or after `first` and, with `before`, its column earlier than its time."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    condition = ds.field("arrival_date") >= pa.scalar(first, pa.date32())
    if before is not None:
        column, when = before
        condition &= ds.field(column) < pa.scalar(when, pa.timestamp("us", tz="UTC"))
    return condition


def _read(
    root: Path, columns: list[str], first: date, before: tuple[str, datetime] | None = None, where=None
) -> pa.Table:
    """A silver table's `columns` from the arrivals on or after `first` (hive partitions, by Arrow)."""
    import pyarrow as pa

    if not root.is_dir():
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    condition = _since(first, before)
    if where is not None:
        condition &= where
    return _silver(root).to_table(columns=columns, filter=condition)


def _fragments(root: Path, first: date, before: tuple[str, datetime]):
    """(the files of a silver table in the arrivals on or after `first`, the filter that also keeps rows
    with `before`'s column earlier than its time, the dataset's schema)."""
    condition = _since(first, before)
    if not root.is_dir():
        return [], condition, None
    dataset = _silver(root)
    return list(dataset.get_fragments(filter=condition)), condition, dataset.schema


def _ids_at(fragments: list, condition, schema, sizes: list[int], positions: np.ndarray) -> pa.Array:
    """The transaction ids of the rows at `positions` (in the order of the files and, within each, of the
    rows `condition` keeps: `sizes` rows each), in the order of `positions`."""
    import numpy as np
    import pyarrow as pa

    by_position = np.argsort(positions, kind="stable")
    wanted = positions[by_position]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    chunks = []
    for k, fragment in enumerate(fragments):
        lo, hi = np.searchsorted(wanted, [offsets[k], offsets[k + 1]])
        if lo == hi:
            continue
        ids = fragment.to_table(schema=schema, columns=["transaction_id"], filter=condition)["transaction_id"]
        if len(ids) != sizes[k]:
            raise RuntimeError(
                f"{fragment.path} changed while the live state loaded from it: restart the load"
            )
        chunks.append(ids.take(pa.array(wanted[lo:hi] - offsets[k])).combine_chunks().cast(pa.large_string()))
    ids = pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_string())
    back = np.empty_like(by_position)
    back[by_position] = np.arange(len(by_position))
    return ids.take(pa.array(back))


def _codes(files: list[tuple[pa.Array, np.ndarray]]) -> tuple[list[str], list[np.ndarray]]:
    """(the distinct values of all files, each file's rows as codes into them), from each file's
    dictionary encoding (its distinct values, its rows' indices into them): one encoding of the files'
    dictionaries together gives each file's values their codes."""
    import numpy as np
    import pyarrow as pa

    dictionaries = [dictionary for dictionary, _ in files]
    encoded = pa.concat_arrays(dictionaries).dictionary_encode()
    codes_of_values = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    offsets = np.cumsum([0] + [len(dictionary) for dictionary in dictionaries]).tolist()
    codes = [codes_of_values[offsets[k] : offsets[k + 1]][indices] for k, (_, indices) in enumerate(files)]
    return encoded.dictionary.to_pylist(), codes


def _at_least(values: np.ndarray | None, bounds: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row: whether its value (its position, for None) is at least its group's bound, the rows grouped
    in order, `lengths` of them a group. In slices of a million rows, so that the bounds are never
    repeated for every row at once (the load's peak)."""
    import numpy as np

    total = int(lengths.sum())
    out = np.empty(total, dtype=bool)
    ends = np.cumsum(lengths)
    for lo in range(0, total, _SLICE_ROWS):
        hi = min(lo + _SLICE_ROWS, total)
        groups = np.arange(
            np.searchsorted(ends, lo, side="right"), np.searchsorted(ends, hi - 1, side="right") + 1
        )
        counts = np.minimum(ends[groups], hi) - np.maximum(ends[groups] - lengths[groups], lo)
        here = np.arange(lo, hi) if values is None else values[lo:hi]
        out[lo:hi] = here >= np.repeat(bounds[groups], counts)
    return out


def _sort(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """Row order by (first, then), ties in row order (numpy's lexsort is stable: faster here than Arrow's
    sort of a two-column table, and it allocates only the order)."""
    import numpy as np

    return np.lexsort((then, first))


def _count(root: Path, first: date, before: tuple[str, datetime]) -> int:
    """The rows `_read` would read from the arrivals on or after `first`, counted from the files' metadata
    and the filter (no column is materialised)."""
    if not root.is_dir():
        return 0
    return _silver(root).count_rows(filter=_since(first, before))
