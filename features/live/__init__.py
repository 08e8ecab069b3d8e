"""Entity state kept current while transactions are scored: each transaction's gold rows, computed in memory.

The training set joins every transaction with the gold row of each entity's latest transaction strictly
before it (event time - 1 ms, within the view's TTL). Gold is built once a day, so a scoring service that
read the online store would serve yesterday's state to a model that learned from today's. `LiveState`
keeps each entity's recent history and computes, for every transaction it observes, the customer and
merchant rows gold will hold for it (pipelines/gold/transforms.py), so that what it serves for a
transaction is what the training set gives that transaction (train/serve parity). No Spark: plain Python
and numpy over sorted columns: about 40 us per `observe` (measured, below).

The gold definition it reproduces, per transaction at t (milliseconds, UTC; Spark's `unix_millis`):
  - windows are (t - w, t] over event milliseconds: Spark's range frames include every transaction of the
    same millisecond, so two transactions of an entity at one millisecond get the same window values;
  - amounts in USD: the billing amount (exact, 2 decimals) / CURRENCY_PER_USD of its currency;
  - abroad: the merchant's country is not a home country of the card's currency; a transaction without a
    country counts as abroad (gold's `concat_ws` skips the null, and "USD" alone is no home pair);
  - customer 1h/24h std: Spark's `stddev_samp` (null for one transaction); 7d/30d std from the sums,
    sqrt(max(0, (sum of squares - sum^2 / n) / (n - 1))), null for one transaction;
  - customer seconds since previous: to the latest earlier transaction in (time, transaction_id) order, so
    of two at one millisecond the one with the larger id sees 0 s; gold takes it from the rows of D-1 and
    D, or from the daily totals of the arrivals D-30 .. D+late of older dates: a previous transaction is
    found when it arrived on or after D-30 (an event date up to `late_event_days` earlier than that still
    counts when it arrived late), else the value is null;
  - merchant chargebacks: fraud chargebacks reported in (t - 30d, t] (report time <= t counts), each
    attributed to the merchant of every silver copy of its transaction that arrived within the 32 days up
    to the chargeback's arrival (pipelines/gold/state.py); fraud rate = that / transactions in (t - 30d, t].

Times are tz-aware datetimes everywhere in the API (a naive one is refused): event times keep their
microseconds, which the training join compares (the row of a transaction is joined at t' when
event_us <= t'_us - 1000), while windows use whole milliseconds, as gold does.

How it is kept (issue #32 item 5: a million transactions a day, 30 days, within 2 GiB):
  - customers: one column per field for all of them (`_History`, numpy), each customer's rows together
    and sorted by (event time, transaction_id): time (us), USD amount, flags (abroad; whether another row
    of the customer in the same millisecond has a smaller id), arrival day, merchant code, and the id's
    64-bit hash with an index of rows by hash (resends, `rows_of`, chargeback attribution). The ids
    themselves are kept only in each customer's window, its rows from `late_event_days` before its last
    one: only there can an observed transaction land (an older one is refused), so only there is the
    order of two ids ever asked. What is observed goes to a per-customer tail (Python arrays) after its
    history rows; a late one that sorts inside the window first moves the window into the tail. Once a day
    (`advance`, or `fold` where the service defers it) the tails are folded into new columns and what no
    later row can read is dropped (fold.compact). Windows are found by binary search; sums over them are
    sums of the slices (O(k) for the k transactions of the window), which keeps the 7d/30d variance
    formula on the same sums gold uses: running totals would subtract large prefixes and turn a zero
    variance into rounding noise;
  - merchants: per merchant, time (us) and the running total of the USD amounts, and the report times
    of its chargebacks: every window is two binary searches and a subtraction, O(log n) for a merchant
    with thousands of transactions a month. Its rows depend only on the time, so no ids;
  - a transaction id is found by its 64-bit hash, and outside the windows a matching hash is taken for
    the id (inside, the ids are compared): a new id matches one of 31 million kept with a probability of
    about 2e-12, so a resend is told from a new transaction wrongly about once in a million days.
Entities keep about `retain_days` (30 + 2 x late days + 2) before their latest transaction; an entity silent
longer is dropped at the fold (its rows are past their TTL). The row of each entity's last transaction is
cached until something changes it, so `state_before` right after `observe` costs a copy, not a
recomputation.

Measured (benchmarks/serving.py --state-footprint: 31 days of synthetic silver, a customer a month per 30
transactions, a merchant per thousand; docs/benchmarks.md has the figures and the old layout's beside
them): 54 bytes of columns a transaction, about 56 of resident memory after the load and 100 at its
peak; the load 5.2 s for 4 million (two passes over the files: compact columns first, then only the ids
the windows keep); a day's fold 2.1 s at 4 million. `observe` 41 us median, `state_before` 13 us.

The package, by what it does (no module holds code per feature):
  - values.py: a transaction's own values (time, USD amount, abroad, the id's hash) and each declared
    feature's value from its input's values in its window (`Plan`, `aggregate`);
  - columns.py: the columns (`History`, `Customer`, `Merchant`) and each entity's gold rows from them;
  - state.py: `LiveState`, what the service asks (observe, rows, state_before, chargebacks, the clock);
  - load.py: the bootstrap from silver (`LiveState.from_lake`);
  - fold.py: the daily fold of what was observed into the columns;
  - memory.py: the sizing check, the columns' bytes, memory given back to the system.
"""

from features.live.load import silver_arrivals
from features.live.memory import (
    BYTES_PER_TRANSACTION,
    StateTooLargeError,
    map_large_allocations,
    memory_returnable,
    release_freed_memory,
)
from features.live.state import LateTransactionError, LiveState
from features.live.values import CHARGEBACK_REACH_DAYS, Row, id_hash, is_foreign, usd

__all__ = [
    "BYTES_PER_TRANSACTION",
    "CHARGEBACK_REACH_DAYS",
    "LateTransactionError",
    "LiveState",
    "Row",
    "StateTooLargeError",
    "id_hash",
    "is_foreign",
    "map_large_allocations",
    "memory_returnable",
    "release_freed_memory",
    "silver_arrivals",
    "usd",
]
