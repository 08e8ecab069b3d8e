"""Fault kinds the generator can inject, and how each one corrupts a record.

Row faults replace a clean row by a broken one (each row carries at most one fault, so counts by kind
reconcile exactly); `duplicates` adds exact copies of clean rows (a producer retrying); `drift` shifts the
values of clean rows while keeping them valid; file faults hit a whole file of an arrival date.

| kind           | unit            | what it writes                                                    |
|----------------|-----------------|-------------------------------------------------------------------|
| malformed      | row             | unparseable: truncated row, unbalanced quote / broken JSON, noise |
| wrong_type     | row             | amount not a number, or event_timestamp not a timestamp          |
| nulls          | row             | one required field empty (CSV) or null (JSON)                     |
| out_of_range   | row             | amount <= 0 or above the maximum, or a timestamp a year off       |
| extra_column   | row             | one token (CSV) or key (JSON) more than the header                |
| duplicates     | row (added)     | an exact copy of a clean row, right after it                      |
| drift          | row             | valid but shifted: amount x2.5 and channel online                 |
| camouflage     | fraud burst     | fraud disguised as the customer's own spending (home merchant,    |
|                |                 | usual amount and channel): the share of bursts, 0.25 without it;  |
|                |                 | a model trained before it misses them (a degradation, not drift)  |
| late           | row (moved)     | a clean row held back and delivered with the next arrival date    |
| missing_column | arrival date    | the date's first file lacks one required column                   |
| empty          | arrival date    | an extra file with a header only (JSON: zero bytes)               |
| out_of_order   | arrival date    | the date's folder is delivered after the next date's              |

For row kinds RATE is the share of the date's transactions; for file kinds, the chance per arrival date.
"""

from __future__ import annotations

import json
from enum import StrEnum

import numpy as np

from pipelines.contracts import AMOUNT_MAX, REQUIRED_TRANSACTION_COLUMNS


class FaultKind(StrEnum):
    MALFORMED = "malformed"
    WRONG_TYPE = "wrong_type"
    NULLS = "nulls"
    OUT_OF_RANGE = "out_of_range"
    EXTRA_COLUMN = "extra_column"
    DUPLICATES = "duplicates"
    DRIFT = "drift"
    CAMOUFLAGE = "camouflage"
    MISSING_COLUMN = "missing_column"
    EMPTY = "empty"
    LATE = "late"
    OUT_OF_ORDER = "out_of_order"


# The `drift` fault: a valid row, shifted as a changed population would shift it.
DRIFT_AMOUNT_FACTOR = 2.5
DRIFT_CHANNEL = "online"


def drift_amount(amount: np.ndarray) -> np.ndarray:
    """Amounts of drifted rows: scaled and rounded to cents (the contract's scale)."""
    return np.round(np.asarray(amount, dtype="float64") * DRIFT_AMOUNT_FACTOR, 2)


# Faults that replace a row, in the order positions are handed out.
REPLACING_FAULTS = (
    FaultKind.MALFORMED,
    FaultKind.WRONG_TYPE,
    FaultKind.NULLS,
    FaultKind.OUT_OF_RANGE,
    FaultKind.EXTRA_COLUMN,
)
ROW_FAULTS = (*REPLACING_FAULTS, FaultKind.DUPLICATES, FaultKind.DRIFT, FaultKind.LATE)
FILE_FAULTS = (FaultKind.MISSING_COLUMN, FaultKind.EMPTY)
# Faults of delivery, drawn from their own random stream so they change nothing else of a date.
DELIVERY_FAULTS = (FaultKind.OUT_OF_ORDER,)
VARIANTS = {
    FaultKind.MALFORMED: 3,
    FaultKind.WRONG_TYPE: 2,
    FaultKind.NULLS: len(REQUIRED_TRANSACTION_COLUMNS),
    FaultKind.OUT_OF_RANGE: 3,
    FaultKind.EXTRA_COLUMN: 1,
}


class FaultSpecError(ValueError):
    pass


def parse_faults(spec: str | None) -> dict[FaultKind, float]:
    """Parse `KIND=RATE,...`; an unknown kind or a rate outside [0, 1] is an error that says so."""
    rates: dict[FaultKind, float] = {}
    if not spec:
        return rates
    known = ", ".join(k.value for k in FaultKind)
    for item in spec.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise FaultSpecError(f"fault '{item.strip()}' has no rate: write KIND=RATE, e.g. malformed=0.01")
        try:
            kind = FaultKind(name.strip())
        except ValueError:
            raise FaultSpecError(f"unknown fault kind '{name.strip()}'; known kinds: {known}") from None
        try:
            rate = float(value)
        except ValueError:
            raise FaultSpecError(f"fault {kind.value}: rate '{value}' is not a number") from None
        if not 0.0 <= rate <= 1.0:
            raise FaultSpecError(f"fault {kind.value}: rate {rate} is outside [0, 1]")
        if kind in rates:
            raise FaultSpecError(f"fault {kind.value} is given twice")
        rates[kind] = rate
    row_share = sum(rates.get(k, 0.0) for k in ROW_FAULTS)
    if row_share > 1.0:
        raise FaultSpecError(f"row fault rates add up to {row_share:.3f}; they must not exceed 1")
    return rates


def format_faults(rates: dict[FaultKind, float]) -> str:
    return ",".join(f"{k.value}={v:g}" for k, v in rates.items())


def corrupt(kind: FaultKind, variant: int, record: dict[str, object], fmt: str, columns: list[str]) -> str:
    """The line that replaces a clean `record` (all columns) for a replacing fault kind; only `columns`
    are written, so a file that lacks a column lacks it in broken rows too."""
    rec = dict(record)
    if kind is FaultKind.MALFORMED:
        clean = render_record(rec, fmt, columns)
        if variant == 0:
            return clean[: len(clean) // 2]  # truncated mid-record
        if variant == 1:
            return '"' + clean if fmt == "csv" else "{" + clean  # unbalanced quote / broken JSON
        return "\x1b~~garbled record~~"
    if kind is FaultKind.WRONG_TYPE:
        if variant == 0:
            rec["amount"] = "twelve.5O"
        else:
            rec["event_timestamp"] = "31/13/2026 25:61"
    elif kind is FaultKind.NULLS:
        rec[REQUIRED_TRANSACTION_COLUMNS[variant]] = None
    elif kind is FaultKind.OUT_OF_RANGE:
        if variant == 0:
            rec["amount"] = -abs(float(rec["amount"]))  # type: ignore[arg-type]
        elif variant == 1:
            rec["amount"] = AMOUNT_MAX * 200
        else:
            stamp = str(rec["event_timestamp"])
            rec["event_timestamp"] = f"{int(stamp[:4]) + 1}{stamp[4:]}"
    elif kind is FaultKind.EXTRA_COLUMN:
        line = render_record(rec, fmt, columns)
        return line + ",PROMO10" if fmt == "csv" else line[:-1] + ',"promo_code":"PROMO10"}'
    else:
        raise ValueError(f"{kind.value} does not replace rows")
    return render_record(rec, fmt, columns)


def render_record(record: dict[str, object], fmt: str, columns: list[str]) -> str:
    if fmt == "csv":
        return ",".join(_csv_field(record[c]) for c in columns)
    return json.dumps({c: record[c] for c in columns}, separators=(",", ":"))


def _csv_field(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
