"""Request validation by the feeds' data contract (pipelines/contracts.py): the rules ingestion quarantines a
landed row by are the rules a scored transaction must pass, so the service never scores what the lake
would refuse to learn from.

A request item is a JSON object. Every violation is reported, each naming the item, the field, the rule and
the value, so a 422 tells the caller what to change. What ingestion checks on the whole arrival (the
arrival window of event times, uniqueness within silver) is not a property of one request and is not
checked here.
"""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from pipelines.contracts import (
    DECIMAL_TEXT,
    INTEGER_TEXT,
    LABELS_CONTRACT,
    TRANSACTIONS_CONTRACT,
    FieldContract,
    TableContract,
)


def _python_pattern(java: str) -> re.Pattern[str]:
    """The contract's Java regexes end in `\\z` (the very end); Python before 3.14 spells it `\\Z`."""
    return re.compile(java.replace(r"\z", r"\Z"))


_PATTERNS = {
    pattern: _python_pattern(pattern)
    for contract in (TRANSACTIONS_CONTRACT, LABELS_CONTRACT)
    for f in contract.fields
    for pattern in (f.pattern, f.stored_pattern)
    if pattern
}
_DECIMAL = _python_pattern(DECIMAL_TEXT)
_INTEGER = _python_pattern(INTEGER_TEXT)
_INSTANT_PARTS = re.compile(r"^(.{19})(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$")


@dataclass(frozen=True)
class Violation:
    item: int | None  # index in a list request; None for a single object
    field: str
    rule: str
    value: Any = None

    def as_dict(self) -> dict[str, Any]:
        location: list[Any] = ["body"] if self.item is None else ["body", self.item]
        return {"loc": [*location, self.field], "field": self.field, "rule": self.rule, "value": self.value}

    def __str__(self) -> str:
        where = "" if self.item is None else f"item {self.item}: "
        return f"{where}{self.field}: {self.rule} (got {self.value!r})"


class ContractError(ValueError):
    """The request breaks the contract; `violations` says where and how."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations[:5]) + (" ..." if len(violations) > 5 else ""))


SHOWN_CHARACTERS = 80  # of a refused value echoed in the error: never the caller's whole payload
_SHOWN = reprlib.Repr()  # Python 3.11's takes no arguments: its limits are attributes
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, SHOWN_CHARACTERS, SHOWN_CHARACTERS


def _show(value: Any) -> Any:
    """A refused value as the error echoes it: short, and safe for any JSON value (a list nested a thousand
    deep included, which a plain repr answers with RecursionError)."""
    if isinstance(value, bool | int | float) or value is None:  # JSON's numbers: 64 bits at most (orjson)
        return value
    if isinstance(value, str):
        return value if len(value) <= SHOWN_CHARACTERS else value[: SHOWN_CHARACTERS - 3] + "..."
    return _SHOWN.repr(value)[:SHOWN_CHARACTERS]


def _check_field(
    spec: FieldContract, value: Any, item: int | None, stored: bool = False
) -> tuple[Any, list[Violation]]:
    """(parsed value, violations) of one field's value; `stored`: an identifier as bronze onward stores it
    (its pseudonym), not as a caller sends it."""

    def bad(rule: str) -> tuple[Any, list[Violation]]:
        return None, [Violation(item, spec.name, rule, _show(value))]

    if value is None:
        return (None, []) if not spec.required else bad("required: a value is needed")
    if spec.kind == "string":
        if not isinstance(value, str):
            return bad("type: must be a string")
        longest, pattern = (
            (spec.stored_max_length, spec.stored_pattern) if stored else (spec.max_length, spec.pattern)
        )
        if longest is not None and len(value) > longest:
            return bad(f"max_length: at most {longest} characters")
        if pattern and not _PATTERNS[pattern].match(value):
            return bad(f"pattern: must match {pattern}")
        if spec.allowed is not None and value not in spec.allowed:
            return bad(f"allowed: one of {', '.join(spec.allowed)}")
        return value, []
    if spec.kind == "timestamp":
        if not isinstance(value, str):
            return bad("type: must be an ISO 8601 string with an offset, e.g. 2026-01-10T12:30:00Z")
        if spec.pattern and not _PATTERNS[spec.pattern].match(value):
            return bad(f"pattern: an ISO 8601 instant with an offset ({spec.pattern})")
        stem, fraction, offset = _INSTANT_PARTS.match(value).groups()  # type: ignore[union-attr]
        digits = (fraction or ".")[1:]
        if digits[6:].strip("0"):
            return bad("precision: at most microseconds (digits past the 6th must be zeros)")
        offset = "+00:00" if offset == "Z" else offset
        text = f"{stem}.{digits[:6].ljust(6, '0')}{offset}" if digits else f"{stem}{offset}"
        try:
            return datetime.fromisoformat(text).astimezone(UTC), []
        except ValueError:
            return bad("value: not a valid date and time")
        except OverflowError:  # a valid local time whose UTC instant is before year 1 or after 9999
            return bad("range: the instant in UTC must lie in years 0001-9999")
    if spec.kind == "decimal":
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return bad("type: must be a number or a decimal string")
        if isinstance(value, float) and not math.isfinite(value):
            return bad("value: must be finite")
        text = repr(value) if isinstance(value, float) else str(value)
        if isinstance(value, str) and not _DECIMAL.match(value):
            return bad("pattern: a plain decimal number such as 12.50")
        try:
            number = Decimal(text)
        except InvalidOperation:
            return bad("value: not a number")
        if spec.minimum is not None and (
            number <= spec.minimum if spec.min_exclusive else number < spec.minimum
        ):
            return bad(f"range: must lie in {spec.range_text}")
        if spec.maximum is not None and (
            number >= spec.maximum if spec.max_exclusive else number > spec.maximum
        ):
            return bad(f"range: must lie in {spec.range_text}")
        if spec.scale is not None and -number.normalize().as_tuple().exponent > spec.scale:  # type: ignore[operator]
            return bad(f"scale: at most {spec.scale} digits after the point")
        return float(number), []
    # integer
    if isinstance(value, bool) or not isinstance(value, int | str):
        return bad("type: must be an integer")
    if isinstance(value, str) and not _INTEGER.match(value):
        return bad("pattern: an integer such as 1")
    number_int = int(value)
    if (spec.minimum is not None and number_int < spec.minimum) or (
        spec.maximum is not None and number_int > spec.maximum
    ):
        return bad(f"range: must lie in {spec.range_text}")
    return number_int, []


def validate_item(
    contract: TableContract, raw: Any, item: int | None = None, stored: bool = False
) -> tuple[dict[str, Any], list[Violation]]:
    """One request item against `contract`: (parsed values, violations). Unknown fields are violations too:
    a misspelt optional field would otherwise be scored as missing without a word. `stored`: identifiers as
    the lake stores them (pseudonyms: batch scoring reads silver), not as a caller sends them."""
    if not isinstance(raw, dict):
        return {}, [Violation(item, "(item)", "type: each item must be a JSON object", _show(raw))]
    known = {f.name: f for f in contract.fields}
    violations = [
        Violation(
            item,
            name,
            f"unknown field: the {contract.name} contract has {', '.join(known)}",
            _show(raw[name]),
        )
        for name in raw
        if name not in known
    ]
    parsed: dict[str, Any] = {}
    for name, spec in known.items():
        if name not in raw and not spec.required:
            parsed[name] = None
            continue
        if name not in raw:
            violations.append(Violation(item, name, "required: the field is missing"))
            continue
        parsed[name], problems = _check_field(spec, raw[name], item, stored)
        violations += problems
    return parsed, violations


def validate_request(
    contract: TableContract, body: Any, stored: bool = False
) -> tuple[list[dict[str, Any]], bool]:
    """A single object or a list of them -> (parsed items, whether the body was a list). Raises
    ContractError with every violation. `stored`: see validate_item."""
    many = isinstance(body, list)
    items = body if many else [body]
    if many and not items:
        raise ContractError([Violation(None, "(body)", "length: the list is empty")])
    parsed, violations = [], []
    for index, raw in enumerate(items):
        values, problems = validate_item(contract, raw, index if many else None, stored)
        parsed.append(values)
        violations += problems
    if violations:
        raise ContractError(violations)
    return parsed, many
