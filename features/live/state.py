"""`LiveState`: what the scoring service asks of the live state (observe a transaction, its rows, the rows
just before a time, chargebacks, the clock), over the columns of features/live/columns.py. The load is
load.py, the daily fold fold.py, the memory memory.py; the package's docstring has the design."""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from features.definitions import CUSTOMER_TTL, MERCHANT_TTL
from features.live import values
from features.live.columns import Customer, History, Merchant
from features.live.fold import build, compact
from features.live.memory import nbytes, release_freed_memory
from features.live.values import (
    CHARGEBACK_REACH_DAYS,
    DAY_MS,
    FEATURE_LAG_US,
    US_PER_MS,
    Row,
    is_foreign,
    micros,
    to_datetime,
    usd,
)
from pipelines.gold.contract import LOOKBACK_DAYS

if TYPE_CHECKING:
    from core.settings import Settings

_CUSTOMER_TTL_US = CUSTOMER_TTL // timedelta(microseconds=1)
_MERCHANT_TTL_US = MERCHANT_TTL // timedelta(microseconds=1)


class LateTransactionError(ValueError):
    """A transaction older than its entity's kept history can reach (see `LiveState.observe`)."""


# A transaction id's copies: (customer, merchant, event us, arrival day); a tuple, or a list of them for an
# id that silver holds more than once (copies further apart than its dedup lookback: gold counts each).
Copy = tuple[str, str, int, int]


@dataclass
class FoldJob:
    """A fold beside the state: the history and the customers and ids observed before it began (frozen:
    a customer observed again meanwhile is observed on a copy), and the new history once built."""

    history: History | None
    customers: dict[str, Customer]
    copies: dict[str, Copy | list[Copy]]
    now_ms: int
    result: History | None = None
    built: bool = False


class LiveState:
    """Per-entity history and gold's rows, in memory (see the package's docstring, features/live/__init__.py).

    `late_event_days` (settings.ingest): how much older than an entity's latest transaction an observed
    one may be, and how far back a late arrival reaches; `dedup_lookback_days`: how long a transaction id
    (or a chargeback's) is remembered, so a resend within it is not counted twice, as silver drops it.
    """

    def __init__(self, late_event_days: int = 1, dedup_lookback_days: int = 30) -> None:
        for plan in (values.CUSTOMER_PLAN, values.MERCHANT_PLAN):
            if plan.problem:  # refused at start, not on every scored request
                raise ValueError(plan.problem)
        self.late_event_days = late_event_days
        self.dedup_lookback_days = dedup_lookback_days
        self.retain_days = LOOKBACK_DAYS + 2 * late_event_days + 2
        self._retain_ms = self.retain_days * DAY_MS
        self._lateness_us = late_event_days * DAY_MS * US_PER_MS
        self._id_reach_days = max(CHARGEBACK_REACH_DAYS, dedup_lookback_days)
        self._history: History | None = None
        self._customers: dict[str, Customer] = {}  # customers observed since the last compaction
        self.merchants: dict[str, Merchant] = {}
        self._merchant_keys: list[str] = []
        self._merchant_codes: dict[str, int] = {}
        self._copies: dict[str, Copy | list[Copy]] = {}  # ids observed since the last compaction
        self._reported: dict[str, int] = {}  # transaction id of a chargeback -> its report day
        self._reported_by_day: dict[int, list[str]] = {}
        # transaction id of an attributed fraud chargeback -> [(merchant, report ms)]: what `forget` takes
        self._attributed: dict[str, list[tuple[str, int]]] = {}
        # Customers `forget` erased whose rows a history still holds until the next fold drops them: key ->
        # that history (its rows of the customer count for nothing); and those erased while a fold ran beside.
        self._dropped: dict[str, History] = {}
        self._erased_in_fold: set[str] = set()
        self._now_ms = -(2**62)
        self._fold_pending = False  # a new day began and its fold (fold.compact) has not run yet
        # A fold running beside the state (begin_fold .. finish_fold): what it reads, which nothing changes.
        self._frozen: FoldJob | None = None
        # The last customer looked at that only the history holds: a request reads it three times
        # (refusal, state_before, observe), so one view and one read of its columns serve all three.
        self._view: Customer | None = None
        # The last id looked up in the history, with what it found there (the history only changes at a fold).
        self._recent_id: tuple[str, History, int, tuple[Copy, ...]] | None = None

    # --- bootstrap ----------------------------------------------------------------------------------------

    @classmethod
    def from_lake(cls, settings: Settings, start: datetime, max_bytes: int | None = None) -> LiveState:
        """The state as of `start` from the lake's silver tables: every transaction with event time before
        `start` in the arrivals gold reads for dates from `start` on (and for the rows of each entity's
        last earlier transaction, still served within its TTL), and the fraud chargebacks reported before
        `start` that gold attributes to a merchant. Transactions and chargebacks at or after `start` are
        left to `observe` / `observe_chargeback`: pass the time the lake's data ends (the service's
        start), or the start of a day to replay it. Refused (StateTooLargeError) when the history would
        take more than `max_bytes`. The load itself: features/live/load.py."""
        from features.live.load import bootstrap

        state = cls(settings.ingest.late_event_days, settings.ingest.dedup_lookback_days)
        bootstrap(state, settings, start, max_bytes)
        return state

    # --- observing ----------------------------------------------------------------------------------------

    def observe(self, txn: Mapping[str, Any]) -> tuple[Row, Row]:
        """Add a transaction and return its new gold rows (customer, merchant), each with its key and
        `event_timestamp`, as gold will compute them.

        `txn`: transaction_id, customer_id, merchant_id, event_timestamp (tz-aware datetime), amount
        (2 decimals, in `currency`), currency, country (None allowed). A transaction_id seen before (within
        `dedup_lookback_days`) is a resend, which silver drops: nothing changes and the rows of the first
        copy come back. A transaction older than an entity's latest is inserted in its place: its own rows
        are exact, the later transactions' rows (as `state_before` and `rows_of` compute them) now include
        it, as gold's rebuild of those dates will; rows returned earlier are not re-issued. One more than
        `late_event_days` older than an entity's latest is refused (ValueError): its windows reach past
        what is kept (LateTransactionError). Of two transactions of an entity in one millisecond, the first
        one's returned rows lack the second (gold's include it); `rows_of` and `state_before` give the
        complete rows. The state's clock does not move: a transaction's time is its caller's, and only
        `advance` (the service's own clock) forgets what has expired."""
        tid = txn["transaction_id"]
        us = micros(txn["event_timestamp"], f"event_timestamp of transaction {tid}")
        day = us // US_PER_MS // DAY_MS  # a live transaction arrives on its event date
        known = self._resent(tid, day)
        rows = None if known is None else self._rows_of_copy(tid, known)
        if rows is not None:
            return rows
        amount = usd(txn["amount"], txn["currency"])
        foreign = is_foreign(txn.get("country"), txn["currency"])
        customer = self._customer(txn["customer_id"])
        merchant = self.merchants.get(txn["merchant_id"])
        for entity in (customer, merchant):
            if entity is not None and len(entity) and us < entity.last_us() - self._lateness_us:
                raise LateTransactionError(
                    f"transaction {tid} at {to_datetime(us).isoformat()} is more than {self.late_event_days} "
                    f"day(s) older than the latest transaction of {entity.key} "
                    f"({to_datetime(entity.last_us()).isoformat()}); the live state keeps too little history "
                    "to compute its rows. Gold will take it when it arrives; restart the service "
                    "(LiveState.from_lake) to serve rows that include it."
                )
        if customer is None:
            customer = Customer(txn["customer_id"])
        elif self._frozen is not None and self._frozen.customers.get(customer.key) is customer:
            customer = customer.clone()  # the fold beside the state reads the frozen one
        if customer is self._view:
            self._view = None
        self._customers.setdefault(customer.key, customer)  # the view of its history, kept from now on
        merchant = self._merchant(txn["merchant_id"])
        ci, columns = customer.insert(us, tid, amount, foreign, self._merchant_code(merchant.key), day)
        mi = merchant.insert(us, amount)
        self._remember(tid, (customer.key, merchant.key, us, day))
        new_rows = customer.row_at(ci, columns), merchant.row_at(mi)
        merchant.trim(merchant.last_us() // US_PER_MS - self._retain_ms)
        return new_rows

    def refusal(self, txns: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
        """(index, why) of the first of `txns` that `observe`, called on each in order, would refuse as
        older than its entities' kept history (LateTransactionError), or None; nothing is kept. A caller
        checks a request with it first, so a refused request leaves no transaction of it behind."""
        latest: dict[tuple[int, str], int] = {}
        for index, txn in enumerate(txns):
            tid = txn["transaction_id"]
            us = micros(txn["event_timestamp"], f"event_timestamp of transaction {tid}")
            known = self._resent(tid, us // US_PER_MS // DAY_MS)
            if known is not None and self._rows_of_copy(tid, known) is not None:
                continue  # a resend: its first copy's rows come back
            for kind, key in ((0, txn["customer_id"]), (1, txn["merchant_id"])):
                entity = self._customer(key) if kind == 0 else self.merchants.get(key)
                kept = entity.last_us() if entity is not None and len(entity) else us
                last = max(kept, latest.get((kind, key), us))
                if us < last - self._lateness_us:
                    return index, (
                        f"transaction {tid} at {to_datetime(us).isoformat()} is more than "
                        f"{self.late_event_days} day(s) older than the latest transaction of {key} "
                        f"({to_datetime(last).isoformat()}): the live state keeps too little history to "
                        "compute its features. Send it to the lake's landing instead: gold takes it when it "
                        "arrives"
                    )
                latest[(kind, key)] = last
        return None

    def observe_chargeback(self, transaction_id: str, label_time: datetime) -> bool:
        """A fraud chargeback reported at `label_time` (tz-aware): from then on it counts for the merchant
        of its transaction, for 30 days. Returns whether it was attributed now: False for a transaction
        not among the last 32 days' (gold cannot attribute it either) and for a chargeback of a
        transaction already reported within `dedup_lookback_days` (silver drops the resend)."""
        us = micros(label_time, f"label_time of the chargeback of {transaction_id}")
        label_ms = us // US_PER_MS
        day = label_ms // DAY_MS
        reported = self._reported.get(transaction_id)
        if reported is not None and day - self.dedup_lookback_days <= reported:
            return False
        self._mark_reported(transaction_id, day)
        attributed = False
        for _, merchant_key, _, arrival in self._known(transaction_id):
            if day - CHARGEBACK_REACH_DAYS <= arrival <= day:
                merchant = self._merchant(merchant_key)
                insort(merchant.chargebacks, label_ms)
                merchant.latest = None
                self._attributed.setdefault(transaction_id, []).append((merchant_key, label_ms))
                attributed = True
        return attributed

    def forget(self, keys: Iterable[str]) -> dict[str, int]:
        """Erase customers (their pseudonyms, as the state keys them): from now on the state is what it would
        be had it never observed them: their transactions leave their merchants' running totals, the fraud
        chargebacks of their transactions leave the merchants' counts, their ids are no longer remembered,
        and they have no history. Their rows leave memory at the next fold (the history's columns are
        rebuilt then: `fold_due` says it is due now). A transaction of theirs observed afterwards is new
        history. Counts what was taken: customers known, transactions, chargebacks."""
        erased = set(keys)
        counts = {"customers": 0, "transactions": 0, "chargebacks": 0}
        if not erased:
            return counts
        # The chargebacks first: which transactions are theirs is read from their rows, which go next.
        for tid, attributions in list(self._attributed.items()):
            if any(copy[0] in erased for copy in self._known(tid)):
                for merchant_key, label_ms in attributions:
                    merchant = self.merchants.get(merchant_key)
                    counts["chargebacks"] += merchant is not None and merchant.drop_chargeback(label_ms)
                del self._attributed[tid]
        history = self._history
        for key in erased:
            customer = self._customer(key)
            if customer is None:
                continue
            counts["customers"] += 1
            counts["transactions"] += len(customer)
            us, usd, _, merchants, _ = customer.columns()
            for at, amount, code in zip(us, usd, merchants, strict=True):
                merchant = self.merchants.get(self._merchant_keys[code])
                if merchant is not None:  # one trimmed away no longer counts it
                    merchant.remove(at, amount)
            # Nothing kept: `_customer` finds this empty one first, and the fold drops the history's rows.
            self._customers[key] = Customer(key)
            if history is not None and key in history.code_of:
                self._dropped[key] = history
            if self._frozen is not None:
                self._erased_in_fold.add(key)
        for tid, copies in list(self._copies.items()):
            mine = [copies] if isinstance(copies, tuple) else copies
            left = [copy for copy in mine if copy[0] not in erased]
            if len(left) != len(mine):
                if not left:
                    del self._copies[tid]
                else:
                    self._copies[tid] = left[0] if len(left) == 1 else left
        self._view = self._recent_id = None
        if counts["customers"]:
            self._fold_pending = True  # the history's rows of theirs leave memory at the next fold
        return counts

    # --- reading ------------------------------------------------------------------------------------------

    def state_before(self, customer_id: str, merchant_id: str, t: datetime) -> tuple[Row | None, Row | None]:
        """The rows the training set joins for a transaction at `t` (tz-aware): per entity, the row of its
        latest transaction with event time <= t - 1 ms, None when there is none or it is older than the
        view's TTL before t - 1 ms (features.offline._point_in_time). Of several transactions at that
        latest microsecond the one with the largest id is taken (gold's rows of such ties differ only in
        seconds since previous, and the training join keeps whichever its scan meets last)."""
        query = micros(t, "t") - FEATURE_LAG_US
        customer_row = merchant_row = None
        customer = self._customer(customer_id)
        if customer is not None:
            columns = customer.columns()
            i = bisect_right(columns[0], query) - 1
            if i >= 0 and columns[0][i] >= query - _CUSTOMER_TTL_US:
                customer_row = customer.row_at(i, columns)
        merchant = self.merchants.get(merchant_id)
        if merchant is not None:
            i = bisect_right(merchant.us, query) - 1
            if i >= 0 and merchant.us[i] >= query - _MERCHANT_TTL_US:
                merchant_row = merchant.row_at(i)
        return customer_row, merchant_row

    def rows_of(self, transaction_id: str) -> tuple[Row, Row] | None:
        """The current gold rows of an observed or bootstrapped transaction (its first copy), None when it
        is not remembered: complete for same-millisecond ties and late arrivals observed since."""
        known = self._known(transaction_id)
        return self._rows_of_copy(transaction_id, known) if known else None

    def kept(self, customer_id: str) -> int:
        """How many transactions of a customer the state keeps (0 for one it does not know)."""
        customer = self._customer(customer_id)
        return 0 if customer is None else len(customer)

    def kept_transactions(self) -> int:
        """How many transactions the customers' state keeps in all."""
        history = self._history
        total = 0 if history is None else len(history)
        frozen = self._frozen.customers if self._frozen is not None else {}
        for key, customer in {**frozen, **self._customers}.items():
            total += len(customer.us)
            if history is not None and key in history.code_of:
                a, b = history.span(history.code_of[key])
                total -= (b - a) - (customer.b - customer.a)  # a part moved into the tail is counted there
        return total

    def nbytes(self) -> int:
        """Bytes the state's columns hold (memory.nbytes)."""
        return nbytes(self)

    def _rows_of_copy(self, tid: str, known: list[Copy]) -> tuple[Row, Row] | None:
        """The rows of a remembered transaction's first copy, None when its history is no longer kept."""
        customer_key, merchant_key, us, _ = known[0]
        customer, merchant = self._customer(customer_key), self.merchants.get(merchant_key)
        if customer is None or merchant is None:
            return None
        ci, mi = customer.position(us, tid), merchant.position(us)
        if ci < 0 or mi < 0:
            return None
        return customer.row_at(ci), merchant.row_at(mi)

    # --- housekeeping -------------------------------------------------------------------------------------

    def _customer(self, key: str) -> Customer | None:
        """A customer's state, None for one the state does not know: the one observed since the last
        compaction, or a view of its history's rows that is not kept."""
        customer = self._customers.get(key)
        if customer is not None:
            return customer
        if self._frozen is not None:
            customer = self._frozen.customers.get(key)
            if customer is not None:
                return customer  # read as it is; `observe` changes a copy
        view = self._view
        if view is not None and view.key == key and view.history is self._history:
            return view
        history = self._history
        code = history.code_of.get(key) if history is not None else None
        if code is None:
            return None
        self._view = Customer(key, history, code)
        return self._view

    def _merchant(self, key: str) -> Merchant:
        merchant = self.merchants.get(key)
        if merchant is None:
            merchant = self.merchants[key] = Merchant(key)
        return merchant

    def _merchant_code(self, key: str) -> int:
        code = self._merchant_codes.get(key)
        if code is None:
            code = self._merchant_codes[key] = len(self._merchant_keys)
            self._merchant_keys.append(key)
        return code

    def _remember(self, tid: str, copy: Copy) -> None:
        known = self._copies.get(tid)
        if known is None:
            self._copies[tid] = copy
        elif isinstance(known, tuple):
            self._copies[tid] = [known, copy]
        else:
            known.append(copy)

    def _known(self, tid: str) -> list[Copy]:
        """The remembered copies of `tid`, earliest arrival first: the history's (those that arrived within
        the ids' reach of the clock's day), then those observed since the last compaction."""
        copies: list[Copy] = []
        history = self._history
        if history is not None:
            since = self._now_ms // DAY_MS - self._id_reach_days
            recent = self._recent_id
            if recent is not None and recent[0] == tid and recent[1] is history and recent[2] == since:
                copies.extend(recent[3])  # asked again (refusal, then observe): the history has not changed
            else:
                found = sorted((int(history.arrival[r]), int(history.us[r]), r) for r in history.rows_of(tid))
                dropped = self._dropped
                copies.extend(
                    (key, self._merchant_keys[history.merchant[r]], us, arrival)
                    for arrival, us, r in found
                    if arrival >= since and dropped.get(key := history.customer_of(r)) is not history
                )
                self._recent_id = (tid, history, since, tuple(copies))
        if self._frozen is not None:
            live = self._frozen.copies.get(tid)
            if live is not None:
                erased = self._erased_in_fold
                copies.extend(c for c in ([live] if isinstance(live, tuple) else live) if c[0] not in erased)
        live = self._copies.get(tid)
        if live is not None:
            copies.extend([live] if isinstance(live, tuple) else live)
        return copies

    def _mark_reported(self, tid: str, day: int) -> None:
        self._reported[tid] = day
        self._reported_by_day.setdefault(day, []).append(tid)

    def _resent(self, tid: str, day: int) -> list[Copy] | None:
        """The remembered copies of `tid` when a transaction of it arriving on `day` is a resend: one copy
        arrived within `dedup_lookback_days` before (silver drops the resend), whether or not the clock
        has moved far enough to forget the older ones."""
        copies = self._known(tid)
        return copies if any(day - self.dedup_lookback_days <= c[3] for c in copies) else None

    def advance(self, now: datetime, fold: bool = True) -> None:
        """Move the state's clock to `now`, the service's own time (never a request's): on a new day,
        what no later row can read is forgotten. A `now` earlier than the clock is ignored. With `fold`
        False, the new day's fold of what was observed into the columns (seconds at a million a day) is
        left to `fold`: a service runs it where no request waits on it."""
        self._advance(micros(now, "now") // US_PER_MS, fold)

    def fold_due(self, now: datetime) -> bool:
        """Whether a fold waits, or `advance(now)` would start a new day."""
        return self._fold_pending or micros(now, "now") // US_PER_MS // DAY_MS > self._now_ms // DAY_MS

    def fold(self) -> None:
        """Fold what was observed since into the history's columns, if a new day began since the last
        fold (fold.compact), and give the memory it freed back. Nothing while a fold runs beside."""
        if self._fold_pending and self._frozen is None:
            self._fold_pending = False
            compact(self)
            release_freed_memory()  # the compaction's temporaries, now out of scope

    # A fold beside the state, for a service that must not stop scoring for it (seconds at a million
    # transactions a day): `begin_fold` and `finish_fold` under the caller's lock (each a dictionary swap, and
    # the transactions observed meanwhile inserted again), `build_fold` on another thread, without it.

    def begin_fold(self) -> FoldJob | None:
        """Freeze what the fold reads (the history, the customers and ids observed so far) and start afresh
        for what comes next; None when no fold is due or one is running."""
        if not self._fold_pending or self._frozen is not None:
            return None
        self._fold_pending = False
        job = FoldJob(self._history, self._customers, self._copies, self._now_ms)
        self._frozen = job
        self._customers, self._copies = {}, {}
        self._view = self._recent_id = None
        return job

    def build_fold(self, job: FoldJob) -> None:
        """The new columns (fold.build), without the caller's lock: it reads only what `begin_fold` froze."""
        if job.history is not None or job.customers:
            job.result = build(self, job.history, job.customers, job.now_ms)
        else:
            job.result = job.history
        job.built = True

    def finish_fold(self, job: FoldJob) -> None:
        """Install the new columns and insert again, into them, what was observed since `begin_fold`; or,
        for a job whose build failed (not `built`), put everything back as it was (the fold is due again)."""
        assert job is self._frozen, "finish the fold that began"
        after_customers, after_copies = self._customers, self._copies
        self._frozen = None
        self._view = self._recent_id = None
        erased, self._erased_in_fold = self._erased_in_fold, set()
        if not job.built:
            # the copies observed meanwhile hold the frozen customers' rows and more: they win (a customer
            # erased meanwhile is an empty one there, and its frozen ids are not taken back)
            self._customers = {**job.customers, **after_customers}
            self._copies = {}
            for observed, skip in ((job.copies, erased), (after_copies, set())):
                for tid, copies in observed.items():
                    for copy in [copies] if isinstance(copies, tuple) else copies:
                        if copy[0] not in skip:
                            self._remember(tid, copy)
            self._fold_pending = True
            return
        self._history, self._customers, self._copies = job.result, {}, {}
        # Customers erased while the fold ran: the new history still has their frozen rows, which count for
        # nothing (the next fold drops them); what they did since is inserted into an empty state below.
        self._dropped = {key: job.result for key in erased if job.result is not None}
        for key in erased:
            self._customers[key] = Customer(key)
        if erased:
            self._fold_pending = True
        again: list[tuple[int, str, Copy, tuple]] = []
        for tid, copies in after_copies.items():
            for copy in [copies] if isinstance(copies, tuple) else copies:
                c = after_customers[copy[0]]  # observed since the freeze: in its tail
                k = next(k for k, known in enumerate(c.ids) if known == tid and c.us[k] == copy[2])
                again.append((copy[2], tid, copy, (c.usd[k], c.foreign[k], c.merchant[k])))
        for us, tid, copy, (amount, foreign, merchant) in sorted(again, key=lambda item: (item[0], item[1])):
            customer = self._customer(copy[0])
            if customer is None:  # (an erased customer's is empty, and still the one to insert into)
                customer = Customer(copy[0])
            if customer is self._view:
                self._view = None
            self._customers.setdefault(customer.key, customer)
            customer.insert(us, tid, amount, foreign, merchant, copy[3])
            self._remember(tid, copy)
        release_freed_memory()

    def _advance(self, ms: int, fold: bool = True) -> None:
        """Move the clock; on a new day, forget what no later row can read (once a day, O(entities)) and
        fold the day into the columns (now or at `fold`)."""
        if ms <= self._now_ms:
            return
        new_day = ms // DAY_MS != self._now_ms // DAY_MS
        self._now_ms = ms
        if new_day:
            self._forget(ms // DAY_MS)
            self._fold_pending = True
            if fold:
                self.fold()

    def _forget(self, today: int) -> None:
        cutoff = self._now_ms - self._retain_ms
        for key in [
            k
            for k, m in self.merchants.items()
            if (not m.us or m.us[-1] // US_PER_MS <= cutoff)
            and (not m.chargebacks or m.chargebacks[-1] <= cutoff)
        ]:
            del self.merchants[key]
        for day in [d for d in self._reported_by_day if d < today - self.dedup_lookback_days]:
            for tid in self._reported_by_day.pop(day):
                if self._reported.get(tid) == day:
                    del self._reported[tid]
        for tid in [t for t, made in self._attributed.items() if made[-1][1] <= cutoff]:
            del self._attributed[tid]  # past every window a later row reads: nothing left to take back
