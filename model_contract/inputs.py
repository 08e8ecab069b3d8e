"""The model's input contract: which columns a model sees, in which order, and how a transaction's own values
become inputs. One definition below training (the training set, the feature rows), serving (the scoring
service) and monitoring (drift, live performance), so none of them reaches into another's modules for it.

- the inputs: the transaction's own numeric columns (TRANSACTION_NUMERIC), the feature service's entity
  features (SERVICE_FEATURES, the gold definition's), and the categorical columns with their fixed
  vocabularies (CATEGORICAL_VOCAB, from the feed contract; code 0 = unknown); MODEL_INPUTS is the matrix's
  column order;
- `transaction_inputs` (and `transaction_inputs_of_table` for Arrow tables of silver): the one function every
  layer computes a transaction's own inputs with;
- the point in time: an entity's state just before a transaction (FEATURE_LAG), and what a training set as
  of a date may know (`cutoff`);
- `unit_hash`: the per-transaction number a sampled set keeps or leaves a transaction out by, the same on
  every machine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING

from core.errors import PipelineError
from pipelines.contracts import CHANNELS, COUNTRIES, CURRENCY_PER_USD, HOME_COUNTRIES, MERCHANT_CATEGORIES
from pipelines.gold.contract import CUSTOMER_FEATURES, FEATURES, MERCHANT_FEATURES

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    import pyarrow as pa

    Values: TypeAlias = Sequence[str | None] | pa.Array | pa.ChunkedArray  # None (null) where missing


class ModelInputError(PipelineError):
    """A model input cannot be computed from what was given; the message says which value."""


# State just before the transaction: gold rows include the transaction itself.
FEATURE_LAG = timedelta(milliseconds=1)

# The transaction's own columns the model sees, next to the feature service's.
TRANSACTION_NUMERIC = ("log_amount_usd", "hour_sin", "hour_cos", "is_weekend", "is_foreign")
# Categorical columns and their fixed vocabularies (from the feed contract; index 0 = unknown).
CATEGORICAL_VOCAB: dict[str, tuple[str, ...]] = {
    "channel": CHANNELS,
    "merchant_category": MERCHANT_CATEGORIES,
    "country": COUNTRIES,
}
SERVICE_FEATURES: tuple[str, ...] = (*CUSTOMER_FEATURES, *MERCHANT_FEATURES)
NUMERIC_FEATURES: tuple[str, ...] = (*TRANSACTION_NUMERIC, *SERVICE_FEATURES)
CATEGORICAL_FEATURES: tuple[str, ...] = tuple(CATEGORICAL_VOCAB)
# The model's input, in order: numeric features, then categorical codes (as float32, one matrix).
MODEL_INPUTS: tuple[str, ...] = (*NUMERIC_FEATURES, *(f"{c}_code" for c in CATEGORICAL_FEATURES))


def training_inputs(built: Sequence[str] = MODEL_INPUTS, deprecated: Sequence[str] = ()) -> tuple[str, ...]:
    """What a version trained now takes: every input built (`built`, in its order) but the deprecated
    features, which stay built for the versions that take them (pipelines/gold/contract.py DEPRECATED)."""
    return tuple(name for name in built if name not in set(deprecated))


def numeric_width(inputs: Sequence[str]) -> int:
    """How many of `inputs` are numeric: they come first, then the categorical codes (training/model.py)."""
    numeric = set(NUMERIC_FEATURES)
    width = sum(1 for name in inputs if name in numeric)
    if any(name not in numeric for name in inputs[:width]):
        raise ModelInputError(f"the numeric inputs come before the categorical codes: {', '.join(inputs)}")
    return width


DEPRECATED_FEATURES: tuple[str, ...] = tuple(f.name for f in FEATURES if f.deprecated)
# A new version's inputs, in MODEL_INPUTS order: the training set carries every built input, so that a
# champion that still takes a deprecated feature is scored on the same rows as its challenger.
TRAINING_INPUTS: tuple[str, ...] = training_inputs(MODEL_INPUTS, DEPRECATED_FEATURES)


class MissingInputsError(ModelInputError):
    """A version takes inputs that are not built today (a feature removed from the declarations, or one
    declared after this code); `missing` names them."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


def input_positions(
    inputs: Sequence[str], available: Sequence[str] = MODEL_INPUTS, who: str = "the model"
) -> list[int]:
    """Where each of a version's recorded inputs sits among `available` (the columns built today, in
    MODEL_INPUTS order), in the version's own order: a version is addressed by the names it was trained on,
    never by position. Raises MissingInputsError naming the inputs `available` lacks."""
    slot = {name: j for j, name in enumerate(available)}
    missing = [name for name in inputs if name not in slot]
    if missing:
        raise MissingInputsError(
            f"{who} takes {len(missing)} input(s) that are not built from today's declarations: "
            f"{', '.join(missing)} (declared features: pipelines/gold/contract.py FEATURES). Serve or "
            "compare a version trained on today's declarations, or declare the feature again and backfill "
            "gold",
            missing,
        )
    if len(set(inputs)) != len(inputs):
        raise ModelInputError(f"{who} records an input twice: {', '.join(inputs)}")
    return [slot[name] for name in inputs]


def inputs_difference(before: Sequence[str], after: Sequence[str]) -> dict[str, list[str]]:
    """What `after` adds to and removes from `before`, by name (each in its own order)."""
    return {
        "added": [name for name in after if name not in set(before)],
        "removed": [name for name in before if name not in set(after)],
    }


def cutoff(day: date) -> datetime:
    """The end of `day` (UTC): what the training set as of `day` may know."""
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


def utc(table: pa.Table, column: str) -> pa.Table:
    """`column` as microsecond UTC timestamps, however the writer stored it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = table[column]
    if values.type.tz is None:  # a writer without a zone: the contract's times are UTC
        values = pc.assume_timezone(values, "UTC")
    return table.set_column(
        table.schema.get_field_index(column), column, values.cast(pa.timestamp("us", tz="UTC"))
    )


MS_PER_HOUR = 3_600_000
MS_PER_DAY = 86_400_000
_CODES = {
    column: {value: index + 1 for index, value in enumerate(vocab)}
    for column, vocab in CATEGORICAL_VOCAB.items()
}


def _per_value(values: Values, function: Callable[[str | None], float]) -> np.ndarray:
    """`function` of each value as float64. A list goes value by value (the scoring service's few rows); an
    Arrow array (a day's million rows, a handful of distinct values) is dictionary-encoded and `function` is
    called once per distinct value, nulls as None: the same function, so the same numbers."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(values, pa.Array | pa.ChunkedArray):
        return np.array([function(v) for v in values], dtype="float64")
    encoded = pc.dictionary_encode(values)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    out = []
    for chunk in chunks:
        table = np.array([function(v) for v in chunk.dictionary.to_pylist()] + [function(None)], "float64")
        indices = chunk.indices.fill_null(len(chunk.dictionary)).to_numpy(zero_copy_only=False)
        out.append(table[indices])
    return np.concatenate(out) if out else np.zeros(0)


def _per_pair(
    first: Values, second: Values, function: Callable[[str | None, str | None], float]
) -> np.ndarray:
    """`function` of each pair of values, as `_per_value` (Arrow arrays: once per distinct pair)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(first, pa.Array | pa.ChunkedArray):
        return np.array([function(a, b) for a, b in zip(first, second, strict=True)], dtype="float64")
    assert isinstance(second, pa.Array | pa.ChunkedArray), "both lists or both Arrow arrays"
    codes, names = [], []
    for values in (first, second):
        encoded = pc.dictionary_encode(values)
        encoded = encoded.combine_chunks() if isinstance(encoded, pa.ChunkedArray) else encoded
        names.append([*encoded.dictionary.to_pylist(), None])
        codes.append(encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False))
    pair = codes[0].astype(np.int64) * len(names[1]) + codes[1]
    distinct, inverse = np.unique(pair, return_inverse=True)
    table = np.array(
        [function(names[0][p // len(names[1])], names[1][p % len(names[1])]) for p in distinct], "float64"
    )
    return table[inverse]


def transaction_inputs(
    amount: np.ndarray,
    currency: Values,
    country: Values,
    event_ms: np.ndarray,
    categoricals: dict[str, Values],
) -> dict[str, np.ndarray]:
    """The transaction's own model inputs (TRANSACTION_NUMERIC, then each `<categorical>_code`) from its
    values: billing amount (float64) and currency, merchant country, event time as UTC epoch milliseconds
    (int64), and the categorical columns (channel, merchant_category, country), as lists or Arrow arrays.
    The one definition the training set (`transaction_columns`, the feature rows) and the scoring service
    all call.

    Hour of day counts whole minutes (hour + minute / 60); weekend is Saturday or Sunday in UTC; abroad means
    the merchant's country does not use the card's currency (an unknown country counts as abroad, as in
    gold); an unknown or missing category is code 0."""
    import numpy as np

    rate = _per_value(currency, lambda c: CURRENCY_PER_USD.get(c, np.nan))  # type: ignore[arg-type]
    out: dict[str, np.ndarray] = {"log_amount_usd": np.log1p(np.asarray(amount, dtype="float64") / rate)}
    ms = np.asarray(event_ms, dtype="int64")
    hour = (ms // MS_PER_HOUR) % 24 + ((ms // 60_000) % 60) / 60.0
    out["hour_sin"] = np.sin(2 * np.pi * hour / 24.0)
    out["hour_cos"] = np.cos(2 * np.pi * hour / 24.0)
    out["is_weekend"] = (((ms // MS_PER_DAY) + 3) % 7 >= 5).astype("float64")  # 1970-01-01 was a Thursday
    out["is_foreign"] = _per_pair(
        country, currency, lambda k, c: float((HOME_COUNTRIES.get(k) if k else None) != c)
    )
    out.update(categorical_codes(categoricals))
    return out


def categorical_codes(categoricals: dict[str, Values]) -> dict[str, np.ndarray]:
    """Each categorical column's `<column>_code` (an unknown or missing value is code 0), as the model takes
    it; `categoricals` maps channel, merchant_category and country to their raw values."""
    return {
        f"{column}_code": _per_value(categoricals[column], functools.partial(_code, codes))
        for column, codes in _CODES.items()
    }


def _code(codes: dict[str, int], value: str | None) -> float:
    return codes.get(value, 0) if value else 0


def amount_as_float(amount: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Amounts as float64, each the nearest double to its decimal value, as float(Decimal) gives it: a
    decimal's unscaled integer divided by 10**scale is one correctly rounded division."""
    import decimal

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_decimal(amount.type):
        return np.asarray(amount.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype="float64")
    scale = amount.type.scale
    factor = pa.scalar(decimal.Decimal(10**scale), pa.decimal128(scale + 1, 0))
    unscaled = pc.cast(pc.multiply(amount, factor), pa.int64()).to_numpy(zero_copy_only=False)
    return unscaled / float(10**scale)


def transaction_inputs_of_table(table: pa.Table) -> dict[str, np.ndarray]:
    """`transaction_inputs` of a table of silver transactions (amount, currency, country, event_timestamp,
    and the categorical columns), computed on Arrow without a Python object per row."""
    import pyarrow as pa

    stamps = utc(table.select(["event_timestamp"]), "event_timestamp")["event_timestamp"]
    event_ms = stamps.cast(pa.int64()).to_numpy() // 1000  # microseconds, floored to milliseconds
    return transaction_inputs(
        amount_as_float(table["amount"]),
        table["currency"],
        table["country"],
        event_ms,
        {column: table[column] for column in CATEGORICAL_VOCAB},
    )


def unit_hash(ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A number in [0, 1) per string, from its bytes alone (vectorised; the same on every machine): a
    polynomial hash of the UTF-8 bytes, mixed by splitmix64's finaliser."""
    import numpy as np
    import pyarrow as pa

    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    out = []
    powers = np.cumprod(np.full(256, 0x100000001B3, dtype=np.uint64), dtype=np.uint64)  # wraps mod 2**64
    for chunk in chunks:
        chunk = chunk.cast(pa.large_string())
        for start in range(0, len(chunk), 1_000_000):
            part = chunk.slice(start, 1_000_000)
            if part.null_count:
                raise ModelInputError("transaction_id has nulls; silver should never hold them")
            offsets = np.frombuffer(part.buffers()[1], dtype=np.int64)[
                part.offset : part.offset + len(part) + 1
            ]
            data = np.frombuffer(part.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
            starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
            if lengths.max(initial=0) > len(powers):
                powers = np.cumprod(
                    np.full(int(lengths.max()), 0x100000001B3, dtype=np.uint64), dtype=np.uint64
                )
            position = np.arange(len(data)) - np.repeat(starts, lengths)
            with np.errstate(over="ignore"):
                terms = (data.astype(np.uint64) + np.uint64(1)) * powers[position]
                sums = np.zeros(len(part), dtype=np.uint64)
                filled = lengths > 0
                sums[filled] = np.add.reduceat(terms, starts[filled]) if filled.any() else sums[filled]
                x = sums ^ (sums >> np.uint64(30))
                x = x * np.uint64(0xBF58476D1CE4E5B9)
                x = x ^ (x >> np.uint64(27))
                x = x * np.uint64(0x94D049BB133111EB)
                x = x ^ (x >> np.uint64(31))
            out.append((x >> np.uint64(11)).astype(np.float64) / float(1 << 53))
    return np.concatenate(out) if out else np.zeros(0)
