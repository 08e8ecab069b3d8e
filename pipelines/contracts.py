"""Data contracts of the landing feeds, shared by the generator, ingestion and validation (row rules and GX
suites are both derived from `TRANSACTIONS_CONTRACT` and `LABELS_CONTRACT`).

Plain Python on purpose: Spark schemas built from these live in the Spark I/O layer, so importing the
contract costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core import pseudonym

CHANNELS: tuple[str, ...] = ("pos", "contactless", "online", "atm")

# Card billing currencies, and units of each per US dollar (fixed reference rates, not market data).
CURRENCY_PER_USD: dict[str, float] = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "CAD": 1.36,
    "AUD": 1.52,
    "CHF": 0.88,
    "SGD": 1.34,
    "NZD": 1.65,
}
# Country (ISO 3166-1 alpha-2) -> home currency, for countries where cardholders live.
HOME_COUNTRIES: dict[str, str] = {
    "US": "USD",
    "GB": "GBP",
    "DE": "EUR",
    "FR": "EUR",
    "ES": "EUR",
    "IT": "EUR",
    "NL": "EUR",
    "CA": "CAD",
    "AU": "AUD",
    "CH": "CHF",
    "SG": "SGD",
    "NZ": "NZD",
}
# Countries with merchants but no cardholders in the synthetic portfolio.
MERCHANT_ONLY_COUNTRIES: tuple[str, ...] = ("BR", "NG", "RO", "ID", "VN", "TH", "MX", "TR")
COUNTRIES: tuple[str, ...] = (*HOME_COUNTRIES, *MERCHANT_ONLY_COUNTRIES)

MERCHANT_CATEGORIES: tuple[str, ...] = (
    "grocery",
    "fuel",
    "restaurant",
    "retail",
    "pharmacy",
    "subscription",
    "electronics",
    "travel",
    "digital_goods",
    "jewelry",
    "cash_withdrawal",
)
# Amounts are billing amounts in the card's currency; anything outside this range is out of range.
AMOUNT_MIN_EXCLUSIVE = 0.0
AMOUNT_MAX = 50_000.0


# --- One data contract per landing table -------------------------------------------------------------------
# Declared once: the row rules of ingestion (pipelines/ingest/transforms.py, a failing row is quarantined
# with a reason) and the GX suites (pipelines/suites.py generates pipelines/expectations/*.json) both derive
# from these. Whatever can be judged on one row is a row rule; the batch expectations (row counts,
# uniqueness) are what the GX gate adds.

FieldKind = Literal["string", "decimal", "timestamp", "integer"]
# Patterns are Java regexes (Spark's rlike, and GX's regex expectations on Spark): they end in `\z`, the
# very end of the value. Java's `$` would also match before a final line break, and Spark's casts trim
# it, so "12.5\n" would land as 12.5: a value changed silently.
# ISO 8601 instant with an offset: `T` between date and time, seconds, up to 9 fractional digits (digits
# past the 6th must be zeros: the lake holds microseconds, and a value is never rounded), `Z` or +hh:mm.
ISO_INSTANT = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})\z"
)
# A plain decimal number, optional sign and exponent, no spaces, no thousands separators: `12.50`, `-3`,
# `+3`, `1e3`; not ` 12.5`, `1,000.00`, `.5`, `5.`. Whether the value fits the column is checked apart.
DECIMAL_TEXT = r"^[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]{1,3})?\z"
INTEGER_TEXT = r"^[+-]?[0-9]{1,9}\z"


@dataclass(frozen=True)
class FieldContract:
    """One column of a landing table as the producer must send it."""

    name: str
    kind: FieldKind
    required: bool = True
    pattern: str | None = None  # a Java/Python regex the whole value must match
    allowed: tuple[str, ...] | None = None
    minimum: float | None = None
    min_exclusive: bool = False
    maximum: float | None = None
    max_exclusive: bool = False
    max_length: int | None = None
    precision: int | None = None  # decimal: total digits
    scale: int | None = None  # decimal: digits after the point
    # timestamp: its UTC date must lie in the arrival window [arrival - late days, arrival]
    in_arrival_window: bool = False
    # An identifier of a person or a business: landing holds it raw (judged by `pattern`), bronze onward its
    # pseudonym (core/pseudonym.py), which the suites of those layers check for instead.
    pseudonym: pseudonym.Kind | None = None

    @property
    def stored_pattern(self) -> str | None:
        """The pattern of the value as bronze onward stores it."""
        return pseudonym.PATTERNS[self.pseudonym] if self.pseudonym else self.pattern

    def raw_token(self) -> str:
        """A regex of the raw value anywhere in a text, not inside a longer word: what finds a landed id in a
        file of any format (the replay, the privacy scan)."""
        body = (self.pattern or "").removeprefix("^").removesuffix(r"\z")
        return rf"(?<![A-Za-z0-9]){body}(?![A-Za-z0-9])"

    @property
    def stored_max_length(self) -> int | None:
        return pseudonym.STORED_LENGTH if self.pseudonym else self.max_length

    @property
    def range_text(self) -> str:
        low = "(" if self.min_exclusive else "["
        high = ")" if self.max_exclusive else "]"
        return f"{low}{self.minimum:g}, {self.maximum:g}{high}"


@dataclass(frozen=True)
class TableContract:
    """A landing table: its fields, and what only the whole batch can tell (GX gate)."""

    name: str
    fields: tuple[FieldContract, ...]
    unique_in_silver: tuple[str, ...] = ()
    # Row-count bounds relative to the previous arrival date, as GX parameters set by the pipeline.
    row_count_bounds: bool = False

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    def field(self, name: str) -> FieldContract:
        return next(f for f in self.fields if f.name == name)


TRANSACTIONS_CONTRACT = TableContract(
    name="transactions",
    fields=(
        FieldContract("transaction_id", "string", pattern=r"^tx[0-9a-f]{16}\z", max_length=18),
        FieldContract("customer_id", "string", pattern=r"^c[0-9]{7}\z", max_length=8, pseudonym="customer"),
        FieldContract("merchant_id", "string", pattern=r"^m[0-9]{6}\z", max_length=7, pseudonym="merchant"),
        FieldContract(
            "amount",
            "decimal",
            minimum=AMOUNT_MIN_EXCLUSIVE,
            min_exclusive=True,
            maximum=AMOUNT_MAX,
            precision=12,
            scale=2,
        ),
        FieldContract("currency", "string", allowed=tuple(CURRENCY_PER_USD)),
        FieldContract("country", "string", required=False, allowed=COUNTRIES),
        FieldContract("channel", "string", required=False, allowed=CHANNELS),
        FieldContract("merchant_category", "string", required=False, allowed=MERCHANT_CATEGORIES),
        FieldContract("event_timestamp", "timestamp", pattern=ISO_INSTANT, in_arrival_window=True),
    ),
    unique_in_silver=("transaction_id",),
    row_count_bounds=True,
)

LABELS_CONTRACT = TableContract(
    name="labels",
    fields=(
        FieldContract("transaction_id", "string", pattern=r"^tx[0-9a-f]{16}\z", max_length=18),
        FieldContract("is_fraud", "integer", minimum=0, maximum=1),
        FieldContract("label_timestamp", "timestamp", pattern=ISO_INSTANT, in_arrival_window=True),
    ),
    unique_in_silver=("transaction_id",),
)

TRANSACTION_COLUMNS: tuple[str, ...] = TRANSACTIONS_CONTRACT.columns
# A transaction without one of these cannot be used at all.
REQUIRED_TRANSACTION_COLUMNS: tuple[str, ...] = TRANSACTIONS_CONTRACT.required
LABEL_COLUMNS: tuple[str, ...] = LABELS_CONTRACT.columns
