"""The live state's daily fold: what was observed since the last fold (each customer's tail) goes into the
history's columns again, and what no later row can read is dropped. O(rows) in numpy, once a day
(`LiveState.advance`, or `LiveState.fold` where the service defers it)."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from features.live.columns import Customer, History, window_starts
from features.live.values import DAY_MS, US_PER_MS, id_hashes

if TYPE_CHECKING:
    import numpy as np

    from features.live.state import LiveState


def compact(state: LiveState) -> None:
    """Fold what was observed since the last compaction into the history, in columns again, and drop
    what no later row can read: customers silent for the retained span, rows older than it before
    their customer's latest (unless they arrived within the ids' reach). O(rows) in numpy, once a day,
    while nothing else touches the state (the service folds beside it instead: LiveState.begin_fold)."""
    history, touched = state._history, state._customers
    if history is None and not touched:
        return
    state._history = build(state, history, touched, state._now_ms)
    state._customers = {}
    state._copies = {}
    state._dropped = {}  # the rows of erased customers (LiveState.forget) were left out of the new history
    state._view = state._recent_id = None  # both hold the old history, which must go now


def build(state: LiveState, history: History | None, touched: dict[str, Customer], now_ms: int) -> History:
    """The new history: `history`'s rows and the tails of `touched` in columns, what no later row can read
    at `now_ms` dropped. Reads only its arguments and the state's fixed spans: neither `history` nor a
    customer of `touched` may change while it runs."""
    import numpy as np
    import pyarrow as pa

    empty = np.zeros(0, dtype=np.int64)
    n_old = len(history.keys) if history is not None else 0
    a, b = (history.starts[:-1].copy(), history.starts[1:].copy()) if history is not None else (empty, empty)
    extra = [c for key, c in touched.items() if history is None or key not in history.code_of]
    keys = (history.keys if history is not None else []) + [c.key for c in extra]
    tails: list[tuple[int, Customer]] = [(n_old + k, c) for k, c in enumerate(extra)]
    for c in touched.values():
        if c.history is not None and c.history is history:
            a[c.code], b[c.code] = c.a, c.b
            tails.append((c.code, c))
        elif c.history is None and history is not None and c.key in history.code_of:
            # erased (LiveState.forget): none of its history's rows, only what it did since
            erased = history.code_of[c.key]
            a[erased] = b[erased]
            tails.append((erased, c))
    tails.sort(key=lambda item: item[0])
    n = len(keys)
    base_len = np.zeros(n, dtype=np.int64)
    base_len[:n_old] = b - a
    tail_codes = np.array([code for code, _ in tails], dtype=np.int64)
    tail_len = np.zeros(n, dtype=np.int64)
    tail_len[tail_codes] = [len(c.us) for _, c in tails]
    total_len = base_len + tail_len
    new_start = np.cumsum(total_len) - total_len
    rows = int(total_len.sum())

    def spread(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Per row: its group's start plus its position within the group."""
        offsets = np.cumsum(lengths) - lengths
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
        return np.repeat(starts, lengths) + within

    old_len = base_len[:n_old]
    source = spread(a, old_len)  # the history's rows kept, customer by customer
    where_old = spread(new_start[:n_old], old_len)  # where they go
    where_new = spread(new_start[tail_codes] + base_len[tail_codes], tail_len[tail_codes])

    def column(name: str, tail_arrays: list[array], dtype: type) -> np.ndarray:
        out: np.ndarray = np.empty(rows, dtype=dtype)
        if history is not None:
            out[where_old] = getattr(history, name)[source]
        if len(where_new):
            out[where_new] = np.concatenate([np.frombuffer(t, dtype=dtype) for t in tail_arrays])
        return out

    columns = {
        "us": column("us", [c.us for _, c in tails], np.int64),
        "usd": column("usd", [c.usd for _, c in tails], np.float64),
        "flags": column("flags", [c.foreign for _, c in tails], np.int8),
        "arrival": column("arrival", [c.arrival for _, c in tails], np.int32),
        "merchant": column("merchant", [c.merchant for _, c in tails], np.int32),
    }
    tail_ids = pa.array([tid for _, c in tails for tid in c.ids], pa.large_string())
    hashes = np.empty(rows, dtype=np.uint64)
    # The ids known: the history's window rows and the tails'; id_index: each row's, or -1.
    id_index = np.full(rows, -1, dtype=np.int64)
    if history is not None:
        hashes[where_old] = history.hashes[source]
        code = np.repeat(np.arange(n_old), old_len)
        known = source >= history.window_start[code]
        window_rows = history.window_base[code[known]] + source[known] - history.window_start[code[known]]
        known_ids = pa.concat_arrays([history.window_ids.array.take(pa.array(window_rows)), tail_ids])
        id_index[where_old[known]] = np.arange(len(window_rows))
        id_index[where_new] = len(window_rows) + np.arange(len(where_new))
    else:
        known_ids = tail_ids
        id_index[where_new] = np.arange(len(where_new))
    hashes[where_new] = id_hashes(tail_ids)
    columns["hashes"] = hashes
    # Bit 1 again wherever the ids are known (a tail's rows may share a millisecond with the window's).
    code = np.repeat(np.arange(n), total_len)
    at = np.flatnonzero(id_index >= 0)
    first = History.first_in_millisecond(code[at], columns["us"][at], known_ids.take(pa.array(id_index[at])))
    columns["flags"][at] = (columns["flags"][at] & 1) | np.where(first, 0, 2).astype(np.int8)

    ms = columns["us"] // US_PER_MS
    last_ms = np.zeros(n, dtype=np.int64)
    nonempty = total_len > 0
    last_ms[nonempty] = ms[(new_start + total_len - 1)[nonempty]]
    silent = last_ms <= now_ms - state._retain_ms
    recent = columns["arrival"] >= now_ms // DAY_MS - state._id_reach_days
    keep = recent | (~silent[code] & (ms > last_ms[code] - state._retain_ms))
    lengths = np.bincount(code[keep], minlength=n)
    present = np.flatnonzero(lengths)
    starts = np.zeros(len(present) + 1, dtype=np.int64)
    np.cumsum(lengths[present], out=starts[1:])
    kept = {name: values[keep] for name, values in columns.items()}
    window_start = window_starts(starts, kept["us"], state._lateness_us)
    in_window = np.arange(len(kept["us"])) >= np.repeat(window_start, lengths[present])
    window_index = id_index[keep][in_window]
    if (window_index < 0).any():  # an observed transaction further back than the lateness allows
        raise RuntimeError("the live state's compaction lost the ids of a customer's window")
    return History(
        [keys[c] for c in present.tolist()],
        lengths[present],
        kept,
        window_start,
        known_ids.take(pa.array(window_index)),
    )
