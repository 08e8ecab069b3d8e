"""One arrival date of card transactions, simulated in time order and in bounded batches.

Pure: a world, a date and a seed in; numpy batches out. No files, no clock. The same arguments always give
the same batches, and a date's transactions do not depend on which other dates are generated.

Fraud model (what a good model can learn, and why it cannot be perfect):
- compromised cards make bursts of 1-6 transactions within minutes, at night more often than cardholders;
- most bursts hit merchants attractive to fraudsters (electronics, digital goods, cash, a few breached
  "magnet" merchants), often abroad, often online, with inflated amounts;
- a quarter of bursts are stealthy: home-country merchants and ordinary amounts;
- legitimate cardholders also travel and buy electronics, 4% of fraud is never reported, and a few
  legitimate transactions are charged back anyway (friendly fraud).
Labels arrive late, as chargebacks: a report time after the transaction (hours to weeks).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime

import numpy as np

from pipelines.synthetic.world import (
    CATEGORY_CHANNEL_MIX,
    CATEGORY_LOG_MEAN,
    CATEGORY_LOG_SD,
    FAVOURITE_MERCHANTS,
    World,
)

MS_PER_MINUTE = 60_000
MS_PER_HOUR = 3_600_000
MS_PER_DAY = 24 * MS_PER_HOUR
CHANNEL_ONLINE = 2
CHANNEL_ATM = 3
CATEGORY_CASH = 10

# Relative volume per hour of day, weekdays and weekends (weekends start later and run later).
WEEKDAY_HOURS = np.array(
    [
        0.6,
        0.35,
        0.25,
        0.2,
        0.2,
        0.35,
        0.9,
        1.8,
        2.8,
        3.3,
        3.6,
        4.1,
        4.9,
        4.6,
        4.0,
        3.9,
        4.1,
        4.7,
        5.2,
        5.0,
        4.1,
        3.1,
        2.0,
        1.1,
    ]
)
WEEKEND_HOURS = np.array(
    [
        1.0,
        0.7,
        0.45,
        0.3,
        0.2,
        0.2,
        0.4,
        0.8,
        1.6,
        2.6,
        3.6,
        4.4,
        5.0,
        5.0,
        4.6,
        4.4,
        4.4,
        4.6,
        5.0,
        5.0,
        4.6,
        3.8,
        2.8,
        1.8,
    ]
)
# Fraudsters keep odd hours: a flatter profile with a night bump.
FRAUD_HOURS = WEEKDAY_HOURS**0.35 + np.where(np.arange(24) < 6, 0.8, 0.0)
# Relative volume per weekday, Monday first; `rows_per_day` is the weekly average.
WEEKDAY_VOLUME = np.array([0.96, 0.97, 0.98, 1.0, 1.08, 1.10, 0.91])
WEEKDAY_VOLUME = WEEKDAY_VOLUME / WEEKDAY_VOLUME.mean()

FRAUD_RATE = 0.008
STEALTHY_BURST_SHARE = 0.25
UNREPORTED_FRAUD_SHARE = 0.04
FRIENDLY_FRAUD_RATE = 0.0004
MAX_LABEL_DELAY_DAYS = 30
CARD_LIMIT = 20_000.0  # in the card's currency; keeps clean amounts well inside the valid range
STREAM_FRAUD, STREAM_LEGIT, STREAM_FRIENDLY = 1, 2, 3
SLICE_ROWS = 100_000


@dataclass(frozen=True)
class Batch:
    """Transactions in time order; `key` identifies a transaction (see `transaction_ids`), `label_ms` is
    the chargeback report time, or -1 when none comes."""

    key: np.ndarray
    event_ms: np.ndarray
    customer: np.ndarray
    merchant: np.ndarray
    amount: np.ndarray
    channel: np.ndarray
    is_fraud: np.ndarray
    label_ms: np.ndarray

    def __len__(self) -> int:
        return len(self.event_ms)

    def take(self, index: np.ndarray | slice) -> Batch:
        return Batch(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def rows_for_day(rows_per_day: int, day: date) -> int:
    """Transactions on `day`: the weekly average scaled by the weekday's volume."""
    return round(float(rows_per_day * WEEKDAY_VOLUME[day.weekday()]))


def day_start_ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


@dataclass(frozen=True)
class DayPlan:
    """What is decided for a date before its rows are drawn: the fraud, and which legitimate
    transactions are charged back anyway. Cheap to compute, so labels of past dates can be recomputed."""

    fraud: Batch
    legit_rows: int
    friendly_index: np.ndarray  # positions among the date's legitimate rows
    friendly_label_ms: np.ndarray


def plan_day(
    world: World, day: date, rows: int, seed: int, stealthy_share: float = STEALTHY_BURST_SHARE
) -> DayPlan:
    start = day_start_ms(day)
    fraud = _fraud_bursts(world, _stream(seed, day, STREAM_FRAUD), day, rows, stealthy_share)
    legit_rows = rows - len(fraud)
    rng = _stream(seed, day, STREAM_FRIENDLY)
    friendly_count = int(rng.binomial(legit_rows, FRIENDLY_FRAUD_RATE)) if legit_rows else 0
    friendly = (
        np.sort(rng.choice(legit_rows, size=friendly_count, replace=False))
        if friendly_count
        else (np.zeros(0, dtype=np.int64))
    )
    # Disputes come days later: counted from the end of the day, so never before the transaction.
    label_ms = start + MS_PER_DAY + _delay_ms(rng, len(friendly), median_days=10.0)
    return DayPlan(fraud=fraud, legit_rows=legit_rows, friendly_index=friendly, friendly_label_ms=label_ms)


def chargebacks_of_day(
    world: World, day: date, rows: int, seed: int, stealthy_share: float = STEALTHY_BURST_SHARE
) -> tuple[np.ndarray, np.ndarray]:
    """(keys, report times) of every chargeback for transactions made on `day`, whenever reported (with the
    `stealthy_share` the day was simulated with)."""
    plan = plan_day(world, day, rows, seed, stealthy_share)
    reported = plan.fraud.label_ms >= 0
    keys = np.concatenate(
        [plan.fraud.key[reported], transaction_keys(day, STREAM_LEGIT, plan.friendly_index)]
    )
    return keys, np.concatenate([plan.fraud.label_ms[reported], plan.friendly_label_ms])


def simulate_day(
    world: World,
    day: date,
    rows: int,
    seed: int,
    max_batch: int = 200_000,
    stealthy_share: float = STEALTHY_BURST_SHARE,
) -> Iterator[Batch]:
    """Yield `rows` transactions of `day` in time order, at most `max_batch` at a time.

    Rows are drawn per slice of consecutive minutes holding about SLICE_ROWS rows, so memory stays
    bounded whatever the day's volume; the slicing depends only on the data, never on `max_batch`.
    """
    start = day_start_ms(day)
    plan = plan_day(world, day, rows, seed, stealthy_share)
    rng = _stream(seed, day, STREAM_LEGIT)
    minute_weights = np.repeat(_hour_profile(day) / 60.0, 60)
    legit_per_minute = rng.multinomial(plan.legit_rows, _normalise(minute_weights))
    fraud_minute = (plan.fraud.event_ms - start) // MS_PER_MINUTE
    first_legit = 0
    for first_minute, end_minute in _slices(legit_per_minute, SLICE_ROWS):
        counts = legit_per_minute[first_minute:end_minute]
        legit_rows = int(counts.sum())
        minute_start = start + np.repeat(np.arange(first_minute, end_minute) * MS_PER_MINUTE, counts)
        event_ms = minute_start + rng.integers(0, MS_PER_MINUTE, size=legit_rows)
        legit = _legit(world, rng, day, event_ms, first_legit)
        friendly = (plan.friendly_index >= first_legit) & (plan.friendly_index < first_legit + legit_rows)
        legit.label_ms[plan.friendly_index[friendly] - first_legit] = plan.friendly_label_ms[friendly]
        first_legit += legit_rows
        in_slice = (fraud_minute >= first_minute) & (fraud_minute < end_minute)
        merged = _concat(legit, plan.fraud.take(in_slice))
        ordered = merged.take(np.argsort(merged.event_ms, kind="stable"))
        for offset in range(0, len(ordered), max_batch):
            yield ordered.take(slice(offset, offset + max_batch))


def _slices(per_minute: np.ndarray, target_rows: int) -> Iterator[tuple[int, int]]:
    """Consecutive minute ranges [first, end) covering the day, each holding about `target_rows` rows."""
    first, held = 0, 0
    for minute, count in enumerate(per_minute.tolist()):
        held += count
        if held >= target_rows:
            yield first, minute + 1
            first, held = minute + 1, 0
    if first < len(per_minute):
        yield first, len(per_minute)


def transaction_keys(day: date, stream: int, index: np.ndarray) -> np.ndarray:
    """Unique 64-bit keys: a bijective mix of (date, stream, position), so ids reveal neither the order
    of generation nor whether a transaction is fraud."""
    raw = (np.uint64(day.toordinal()) << np.uint64(34)) | (np.uint64(stream) << np.uint64(32))
    return _splitmix64(raw | np.asarray(index, dtype=np.uint64))


def transaction_ids(keys: np.ndarray) -> np.ndarray:
    """`tx` and 16 hex digits per key, vectorised."""
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    nibbles = (keys.astype(np.uint64)[:, None] >> shifts) & np.uint64(0xF)
    chars = _HEX[nibbles.astype(np.intp)]
    return np.char.add("tx", np.ascontiguousarray(chars).view("S16").ravel().astype("U16"))


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _stream(seed: int, day: date, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, day.toordinal(), stream])


def _hour_profile(day: date) -> np.ndarray:
    return WEEKEND_HOURS if day.weekday() >= 5 else WEEKDAY_HOURS


def _normalise(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()


def _legit(world: World, rng: np.random.Generator, day: date, event_ms: np.ndarray, first: int) -> Batch:
    rows = len(event_ms)
    customer = rng.choice(world.customers, size=rows, p=world.customer_activity)
    route = rng.random(rows)
    merchant = world.customer_favourites[customer, rng.integers(0, FAVOURITE_MERCHANTS, size=rows)]
    home_other = (route >= 0.70) & (route < 0.96)
    merchant[home_other] = _home_merchants(world, rng, customer[home_other])
    abroad = route >= 0.96  # travel and cross-border shopping
    merchant[abroad] = rng.choice(world.merchants, size=int(abroad.sum()), p=world.merchant_popularity)
    category = world.merchant_category[merchant]
    log_amount = rng.normal(
        CATEGORY_LOG_MEAN[category] + world.customer_spend_offset[customer], CATEGORY_LOG_SD[category]
    )
    return Batch(
        key=transaction_keys(day, STREAM_LEGIT, np.arange(first, first + rows)),
        event_ms=event_ms,
        customer=customer,
        merchant=merchant,
        amount=_money(log_amount, world.customer_currency_rate[customer]),
        channel=_channel(rng, category),
        is_fraud=np.zeros(rows, dtype=bool),
        label_ms=np.full(rows, -1, dtype=np.int64),
    )


def _fraud_bursts(
    world: World, rng: np.random.Generator, day: date, rows: int, stealthy_share: float = STEALTHY_BURST_SHARE
) -> Batch:
    start_ms = day_start_ms(day)
    target = int(rng.binomial(rows, FRAUD_RATE)) if rows else 0
    sizes = np.minimum(1 + rng.poisson(1.5, size=max(target, 1)), 6)
    bursts = int(np.searchsorted(np.cumsum(sizes), target) + 1) if target else 0
    sizes = sizes[:bursts]
    if bursts:
        sizes[-1] -= int(sizes.sum()) - target  # exactly `target` rows
    burst_of_row = np.repeat(np.arange(bursts), sizes)
    burst_customer = rng.choice(world.customers, size=bursts, p=world.customer_activity)
    burst_start = rng.choice(24, size=bursts, p=_normalise(FRAUD_HOURS)) * MS_PER_HOUR + rng.integers(
        0, MS_PER_HOUR, size=bursts
    )
    # Stealthy bursts look like the customer's own spending: a home merchant, a small uplift, no switch
    # online. The `camouflage` fault raises their share (what a model trained before misses).
    stealthy_burst = rng.random(bursts) < stealthy_share
    # Minutes between the transactions of one burst.
    gaps = rng.exponential(6 * 60_000, size=target).astype(np.int64)
    first_of_burst = np.r_[True, burst_of_row[1:] != burst_of_row[:-1]] if target else np.zeros(0, bool)
    gaps[first_of_burst] = 0
    within = _cumsum_by_group(gaps, burst_of_row)
    event_ms = start_ms + np.minimum(burst_start[burst_of_row] + within, MS_PER_DAY - 1)

    customer = burst_customer[burst_of_row]
    stealthy = stealthy_burst[burst_of_row]
    merchant = rng.choice(world.merchants, size=target, p=world.merchant_fraud_weight)
    merchant[stealthy] = _home_merchants(world, rng, customer[stealthy])
    category = world.merchant_category[merchant]
    uplift = np.where(stealthy, 0.15, 0.65)
    log_amount = rng.normal(
        CATEGORY_LOG_MEAN[category] + world.customer_spend_offset[customer] + uplift,
        CATEGORY_LOG_SD[category],
    )
    channel = _channel(rng, category)
    go_online = ~stealthy & (category != CATEGORY_CASH) & (rng.random(target) < 0.5)
    channel[go_online] = CHANNEL_ONLINE
    # Same-day reports come from cardholders calling in; the rest from monthly statements.
    delay = _delay_ms(rng, target, median_days=2.5)
    same_day = rng.random(target) < 0.2
    delay[same_day] = rng.integers(MS_PER_HOUR // 2, 12 * MS_PER_HOUR, size=int(same_day.sum()))
    label_ms = event_ms + delay
    label_ms[rng.random(target) < UNREPORTED_FRAUD_SHARE] = -1
    return Batch(
        key=transaction_keys(day, STREAM_FRAUD, np.arange(target)),
        event_ms=event_ms,
        customer=customer,
        merchant=merchant,
        amount=_money(log_amount, world.customer_currency_rate[customer]),
        channel=channel,
        is_fraud=np.ones(target, dtype=bool),
        label_ms=label_ms,
    )


def _home_merchants(world: World, rng: np.random.Generator, customers: np.ndarray) -> np.ndarray:
    merchants = np.empty(len(customers), dtype=np.int64)
    homes = world.customer_home[customers]
    for country in np.unique(homes):
        who = np.flatnonzero(homes == country)
        merchants[who] = rng.choice(
            world.merchants_by_country[country], size=who.size, p=world.popularity_by_country[country]
        )
    return merchants


def _channel(rng: np.random.Generator, category: np.ndarray) -> np.ndarray:
    cumulative = np.cumsum(CATEGORY_CHANNEL_MIX, axis=1)[category]
    draw = rng.random(len(category))[:, None]
    return np.minimum((draw >= cumulative).sum(axis=1), CATEGORY_CHANNEL_MIX.shape[1] - 1)


def _money(log_amount_usd: np.ndarray, currency_rate: np.ndarray) -> np.ndarray:
    return np.clip(np.round(np.exp(log_amount_usd) * currency_rate, 2), 0.5, CARD_LIMIT)


def _delay_ms(rng: np.random.Generator, size: int, median_days: float) -> np.ndarray:
    days = np.minimum(rng.lognormal(np.log(median_days), 0.8, size=size), MAX_LABEL_DELAY_DAYS)
    return (days * MS_PER_DAY).astype(np.int64)


def _cumsum_by_group(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Running sum of `values` that restarts where `group` changes (groups are contiguous)."""
    total = np.cumsum(values)
    if not len(values):
        return total
    starts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1]
    before = np.repeat(total[starts] - values[starts], np.diff(np.r_[starts, len(values)]))
    return total - before


def _concat(a: Batch, b: Batch) -> Batch:
    return Batch(*(np.concatenate([getattr(a, f), getattr(b, f)]) for f in Batch.__dataclass_fields__))
