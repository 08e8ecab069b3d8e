"""Pseudonyms of the identifiers that name people and businesses: a keyed hash (HMAC-SHA256) replaces each
customer and merchant id at the boundary, so nothing past landing holds a raw identifier.

Where it is applied:
- ingestion, landing -> bronze (pipelines/ingest/transforms.py `to_bronze`): the row rules judge the raw value
  (a malformed id is quarantined with its raw record, as before), and the rows that pass are written to bronze
  with pseudonyms. Silver, gold, Feast, the training sets, MLflow's artifacts and the lineage follow from
  bronze, so they never see a raw id;
- the scoring service (serving/app.py), on arrival: a request's raw ids are replaced before anything looks
  them up or records them (the live state, the online store, the scoring log).

The same key gives the same pseudonym everywhere, so the joins (features by customer, by merchant) and the
parity of service and batch hold. Without the key a pseudonym cannot be turned back into an id, nor an id
into its pseudonym: a pseudonym is 80 bits of HMAC-SHA256(key, "<kind>:<id>"), the kind keeping a customer's
and a merchant's namespaces apart.

The key is a file: in the cluster profile a Kubernetes Secret mounted into the pods and the service
(`privacy.key_file`, infra/), required there; in the local profile, unset, it is
$MLOPS_HOME/secrets/pseudonym.key, made once (32 random bytes, mode 0600) by the first process that needs it.
Its id, a hash of the key that reveals nothing of it, is in lineage (ingest_to_bronze's run facet and the
reconciliation record) and on the service's /status, so a pseudonym can be traced to the key that made it.
Rotating the key changes every pseudonym: rebuild the lake from landing (kept raw for
`retention.landing_days`) under the new key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from core.settings import Settings

Kind = Literal["customer", "merchant"]
KINDS: tuple[Kind, ...] = ("customer", "merchant")
# The columns that hold each kind, in every table and request that carries them.
COLUMNS: dict[str, Kind] = {"customer_id": "customer", "merchant_id": "merchant"}
PREFIX: dict[Kind, str] = {"customer": "pc", "merchant": "pm"}
HEX_DIGITS = 20  # 80 bits: no collision is expected among billions of ids
# The stored form, as Java/Python regexes (GX suites on Spark, the service): what bronze onward must hold.
PATTERNS: dict[Kind, str] = {kind: rf"^{PREFIX[kind]}[0-9a-f]{{{HEX_DIGITS}}}\z" for kind in KINDS}
STORED_LENGTH = len("pc") + HEX_DIGITS
KEY_BYTES = 32  # a new key's size; a configured key must have at least MIN_KEY_BYTES
MIN_KEY_BYTES = 16
KEY_FILE_NAME = "pseudonym.key"
# Ids of published keys: params.yaml's example key, which dvc.yaml's pipeline on synthetic data uses so that
# its outputs reproduce anywhere. The cluster profile refuses them (tests/unit/test_pseudonym.py holds this
# set to params.yaml).
EXAMPLE_KEY_IDS = frozenset({"62dca71bcd88"})


class PseudonymKeyError(RuntimeError):
    """The key is missing, unreadable or too short: nothing may be written past landing without it."""


def python_pattern(kind: Kind) -> re.Pattern[str]:
    return re.compile(PATTERNS[kind].replace(r"\z", r"\Z"))


@dataclass(frozen=True)
class Pseudonymiser:
    """Turns raw ids into pseudonyms with one key. It holds the key: never log or print it (its repr
    leaves it out)."""

    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) < MIN_KEY_BYTES:
            raise PseudonymKeyError(
                f"the pseudonym key has {len(self.key)} bytes; at least {MIN_KEY_BYTES} are needed "
                f"(make one with `head -c {KEY_BYTES} /dev/urandom | xxd -p -c 64`)"
            )

    @property
    def key_id(self) -> str:
        """Names the key without revealing it: the first 12 hex digits of HMAC(key, "key-id")."""
        return hmac.new(self.key, b"key-id", hashlib.sha256).hexdigest()[:12]

    def of(self, kind: Kind, raw: str) -> str:
        digest = hmac.new(self.key, f"{kind}:{raw}".encode(), hashlib.sha256).hexdigest()
        return PREFIX[kind] + digest[:HEX_DIGITS]

    def customer(self, raw: str) -> str:
        return self.of("customer", raw)

    def merchant(self, raw: str) -> str:
        return self.of("merchant", raw)

    def many(self, kind: Kind, values: Iterable[str | None]) -> list[str | None]:
        """Pseudonyms of `values` (None stays None), each distinct id hashed once."""
        seen: dict[str, str] = {}
        out: list[str | None] = []
        for value in values:
            if value is None:
                out.append(None)
                continue
            pseudonym = seen.get(value)
            if pseudonym is None:
                pseudonym = seen[value] = self.of(kind, value)
            out.append(pseudonym)
        return out

    def replace_in(self, items: Iterable[dict]) -> None:
        """Replace the ids of each record (a request's transactions) by their pseudonyms, in place."""
        for item in items:
            for column, kind in COLUMNS.items():
                value = item.get(column)
                if value is not None:
                    item[column] = self.of(kind, value)

    def series_function(self, kind: Kind) -> Callable:
        """A pandas Series -> Series function for a Spark pandas UDF. The key travels inside the pickled
        function to the Python workers: it is never a literal in a query plan, so neither `explain()` nor
        Spark's event log nor the UI shows it."""
        import pandas as pd

        many = self.many

        def pseudonymise(values: pd.Series) -> pd.Series:
            return pd.Series(many(kind, values.where(values.notna(), None).tolist()), index=values.index)

        pseudonymise.__name__ = f"pseudonymise_{kind}"
        # Spark reads the UDF's kind from real type hints (this module's annotations are strings)
        pseudonymise.__annotations__ = {"values": pd.Series, "return": pd.Series}
        return pseudonymise


def read_key(path: Path) -> Pseudonymiser:
    """The key in `path`: hex text (a Secret's usual form) or raw bytes."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PseudonymKeyError(
            f"cannot read the pseudonym key {path}: {err.strerror or err}. Set privacy.key_file "
            "(MLOPS_PRIVACY__KEY_FILE) to the mounted Secret's file; see docs/privacy.md"
        ) from err
    text = data.strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = data
    try:
        return Pseudonymiser(key)
    except PseudonymKeyError as err:
        raise PseudonymKeyError(f"{path}: {err}") from None


def make_key(path: Path) -> None:
    """Write a new random key to `path` (mode 0600) unless one is there: the first of several processes
    that race here wins, the others read its key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(KEY_BYTES) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(staged, path)  # never replaces a key another process made first
    finally:
        staged.unlink(missing_ok=True)


def load(key_file: Path | None, home: Path, *, create: bool) -> Pseudonymiser:
    """The installation's pseudonymiser: `key_file` when set; else $MLOPS_HOME/secrets/pseudonym.key, made
    first when `create` (the local profile) and missing."""
    path = key_file or home / "secrets" / KEY_FILE_NAME
    if key_file is None and create and not path.exists():
        make_key(path)
    return read_key(path)


def for_settings(settings: Settings) -> Pseudonymiser:
    """The pseudonymiser of the installation `settings` describe (the local profile makes its key when
    missing; the cluster profile requires the mounted Secret)."""
    from core.settings import Profile

    local = settings.profile is Profile.LOCAL
    pseudonyms = _cached(settings.privacy.key_file, settings.home, local)
    if not local and pseudonyms.key_id in EXAMPLE_KEY_IDS:
        raise PseudonymKeyError(
            f"{settings.privacy.key_file} holds the published example key of params.yaml (key id "
            f"{pseudonyms.key_id}): anyone can compute its pseudonyms. Mount a key of your own "
            '(docs/privacy.md, "The key")'
        )
    return pseudonyms


@functools.lru_cache(maxsize=8)
def _cached(key_file: Path | None, home: Path, create: bool) -> Pseudonymiser:
    return load(key_file, home, create=create)


def customer_id(customer: str) -> str:
    """`customer` as an id (surrounding blanks dropped), or a ValueError naming it: ids are letters, digits,
    `_` and `-`, so one can never be a path or a pattern."""
    customer = customer.strip()
    if not customer or not re.fullmatch(r"[\w-]+", customer):
        raise ValueError(f"{customer!r} is not a customer id (letters, digits, _ and - only)")
    return customer
