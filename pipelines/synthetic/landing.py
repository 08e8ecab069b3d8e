"""Write synthetic arrival dates into a landing zone: one folder per date, with a manifest.

This is the I/O layer of the generator: it streams batches from `simulate` to disk (no date is held in
memory), injects faults, and moves each finished folder into place with a rename, so a watcher never sees a
half-written arrival. Files whose names start with `_` or `.` (the manifest) are ignored by Spark readers.
It writes only into folders it owns: each carries a `_GENERATED_BY` marker, and a date folder without it
(a producer's delivery) is never overwritten.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from core.errors import PipelineError
from pipelines.contracts import (
    CHANNELS,
    COUNTRIES,
    CURRENCY_PER_USD,
    LABEL_COLUMNS,
    MERCHANT_CATEGORIES,
    REQUIRED_TRANSACTION_COLUMNS,
    TRANSACTION_COLUMNS,
)
from pipelines.synthetic.faults import (
    DELIVERY_FAULTS,
    DRIFT_CHANNEL,
    FILE_FAULTS,
    REPLACING_FAULTS,
    VARIANTS,
    FaultKind,
    corrupt,
    drift_amount,
    format_faults,
    parse_faults,
)
from pipelines.synthetic.simulate import (
    MAX_LABEL_DELAY_DAYS,
    STEALTHY_BURST_SHARE,
    Batch,
    chargebacks_of_day,
    rows_for_day,
    simulate_day,
    transaction_ids,
)
from pipelines.synthetic.world import build_world

if TYPE_CHECKING:
    from core.settings import Settings

GENERATOR_VERSION = 1
MANIFEST_NAME = "_manifest.json"
# The arrival contract: a producer marks a date's folder complete with this empty file, written last.
COMPLETE_MARKER = "_SUCCESS"
# Marks a date folder this generator wrote (written first): it may rewrite it, so reruns are idempotent,
# but never a folder without it, which is a producer's delivery. Ingestion accepts it (CONTROL_FILES).
GENERATED_MARKER = "_GENERATED_BY"
Format = Literal["csv", "json"]

_COUNTRY_NAMES = np.array(COUNTRIES)
_CURRENCY_NAMES = np.array(list(CURRENCY_PER_USD))
_CHANNEL_NAMES = np.array(CHANNELS)
_CATEGORY_NAMES = np.array(MERCHANT_CATEGORIES)
_CLEAN = -1
_DUPLICATE = len(REPLACING_FAULTS)
_DRIFT = _DUPLICATE + 1
_LATE = _DRIFT + 1


@dataclass(frozen=True)
class GenerateRequest:
    start: date
    days: int
    rows_per_day: int
    seed: int
    landing: Path
    fmt: Format = "csv"
    faults: dict[FaultKind, float] = field(default_factory=dict)
    customers: int | None = None
    merchants: int | None = None
    rows_per_file: int = 1_000_000
    # The first date of the feed: chargebacks only refer to transactions from this date on. It makes a
    # date's folder independent of which range is generated (one day at a time, as the DAG does, or all
    # at once). Defaults to `start`.
    feed_start: date | None = None

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ValueError(f"days must be at least 1, got {self.days}")
        if self.rows_per_day < 0:
            raise ValueError(f"rows_per_day must not be negative, got {self.rows_per_day}")
        if self.rows_per_file < 1:
            raise ValueError(f"rows_per_file must be at least 1, got {self.rows_per_file}")
        if self.feed_start and self.feed_start > self.start:
            raise ValueError(f"feed_start {self.feed_start} is after start {self.start}")
        if self.fmt not in ("csv", "json"):
            raise ValueError(f"format must be csv or json, got {self.fmt!r}")

    @property
    def first_feed_date(self) -> date:
        return self.feed_start or self.start

    # Defaults scale with the volume up to a cap, so the world (held in memory) stays bounded at 10M rows.
    @property
    def customer_count(self) -> int:
        return self.customers or min(max(100, self.rows_per_day // 2), 500_000)

    @property
    def merchant_count(self) -> int:
        return self.merchants or min(max(200, self.rows_per_day // 20), 50_000)


def _stealthy_share(request: GenerateRequest) -> float:
    """The share of fraud bursts disguised as the customer's own spending: the `camouflage` fault's rate,
    else the world's usual (the same for the days' transactions and their chargebacks)."""
    return request.faults.get(FaultKind.CAMOUFLAGE, STEALTHY_BURST_SHARE)


def land_synthetic(
    settings: Settings,
    start: date,
    days: int,
    rows_per_day: int,
    seed: int,
    fmt: Format = "csv",
    faults: str | None = None,
    landing: Path | None = None,
    customers: int | None = None,
    merchants: int | None = None,
    rows_per_file: int = 1_000_000,
    feed_start: date | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Write synthetic arrival dates into `landing` (default: the settings' landing zone); return their
    manifests. `faults` is the `KIND=RATE,...` form of `mlops generate --faults`."""
    request = GenerateRequest(
        start=start,
        days=days,
        rows_per_day=rows_per_day,
        seed=seed,
        landing=landing or settings.landing,
        fmt=fmt,
        faults=parse_faults(faults),
        customers=customers,
        merchants=merchants,
        rows_per_file=rows_per_file,
        feed_start=feed_start,
    )
    return generate_landing(request, progress=progress)


def generate_landing(request: GenerateRequest, progress: Callable[[int], None] | None = None) -> list[dict]:
    """Generate every arrival date of `request`; return their manifests in the order they were delivered:
    date order, except that a date hit by `out_of_order` is delivered right after the next date."""
    world = build_world(request.seed, request.customer_count, request.merchant_count)
    request.landing.mkdir(parents=True, exist_ok=True)
    days = [request.start + timedelta(days=offset) for offset in range(request.days)]
    order: list[tuple[date, date | None]] = []  # (date, the date delivered before it out of order)
    index = 0
    while index < len(days):
        day = days[index]
        if index + 1 < len(days) and _delivery_fault(request, day, FaultKind.OUT_OF_ORDER):
            order += [(days[index + 1], None), (day, days[index + 1])]
            index += 2
        else:
            order.append((day, None))
            index += 1
    manifests = []
    for day, after in order:
        manifest = _write_day(request, world, day, progress)
        if after is not None:
            manifest["delivered_after"] = after.isoformat()
        manifests.append(manifest)
    return manifests


def _delivery_fault(request: GenerateRequest, day: date, kind: FaultKind) -> bool:
    assert kind in DELIVERY_FAULTS
    rng = np.random.default_rng([request.seed, day.toordinal(), 0xDE11, DELIVERY_FAULTS.index(kind)])
    return bool(rng.random() < request.faults.get(kind, 0.0))


def _late_lines(request: GenerateRequest, world, day: date, fmt: str, columns: list[str]) -> list[str]:
    """The rows of `day` that the `late` fault held back, rendered clean for the next date's files. The
    day is simulated again (deterministic from the seed), so any date can be generated on its own."""
    if request.faults.get(FaultKind.LATE, 0.0) == 0.0 or day < request.first_feed_date:
        return []
    rows = rows_for_day(request.rows_per_day, day)
    plan = _plan_row_faults(
        np.random.default_rng([request.seed, day.toordinal(), 0xFA17]), rows, request.faults
    )
    lines: list[str] = []
    position = 0
    for batch in simulate_day(world, day, rows, request.seed, stealthy_share=_stealthy_share(request)):
        late = plan[position : position + len(batch)] == _LATE
        position += len(batch)
        if late.any():
            frame = _frame(world, batch)[late]
            clean = np.full(int(late.sum()), _CLEAN, dtype=np.int8)
            lines += _render(frame, clean, np.zeros(len(clean), np.int64), fmt, columns, {})
    return lines


class ProducerFolderError(PipelineError):
    """A date folder the generator would overwrite holds a producer's delivery."""


def _write_day(request, world, day: date, progress) -> dict:
    final = request.landing / day.isoformat()
    _refuse_a_producers_folder(final)
    staging = request.landing / f".{day.isoformat()}.tmp-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        (staging / GENERATED_MARKER).write_text(
            f"mlops generate (synthetic data), generator version {GENERATOR_VERSION}\n"
        )
        manifest = _write_day_files(request, world, day, staging, progress)
        _refuse_a_producers_folder(final)  # again: a producer may have delivered while it was generated
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _swap_into_place(staging, final)
    return manifest


def _write_day_files(request, world, day: date, staging: Path, progress) -> dict:

    rows = rows_for_day(request.rows_per_day, day)
    fault_rng = np.random.default_rng([request.seed, day.toordinal(), 0xFA17])
    plan = _plan_row_faults(fault_rng, rows, request.faults)
    file_faults = {k: fault_rng.random() < request.faults.get(k, 0.0) for k in FILE_FAULTS}
    missing = REQUIRED_TRANSACTION_COLUMNS[day.toordinal() % len(REQUIRED_TRANSACTION_COLUMNS)]
    # Counted per row or file; camouflage changes how fraud is drawn, not a row: its rate is in the spec.
    counts = {k.value: 0 for k in FaultKind if k is not FaultKind.CAMOUFLAGE}
    files: list[dict] = []
    file_fault_records: list[dict] = []
    fraud = 0

    def columns_for(index: int) -> list[str]:
        columns = list(TRANSACTION_COLUMNS)
        if file_faults[FaultKind.MISSING_COLUMN] and index == 0:
            columns.remove(missing)
        return columns

    writer = _PartWriter(staging, request.fmt, "transactions")
    position = 0
    for batch in simulate_day(world, day, rows, request.seed, stealthy_share=_stealthy_share(request)):
        fraud += int(batch.is_fraud.sum())
        kinds = plan[position : position + len(batch)]
        frame = _frame(world, batch)
        variants = fault_rng.integers(0, 1 << 30, size=len(batch))
        start = 0
        while start < len(batch):
            if writer.rows >= request.rows_per_file:
                files.append(writer.close())
            stop = min(start + request.rows_per_file - writer.rows, len(batch))
            columns = columns_for(writer.index)
            writer.ensure_header(columns)
            lines = _render(
                frame.iloc[start:stop], kinds[start:stop], variants[start:stop], request.fmt, columns, counts
            )
            writer.write(lines)
            start = stop
        position += len(batch)
        if progress:
            progress(len(batch))
    late = _late_lines(request, world, day - timedelta(days=1), request.fmt, columns_for(writer.index))
    if late:
        writer.ensure_header(columns_for(writer.index))
        writer.write(late)
    if writer.rows or not files:
        writer.ensure_header(columns_for(writer.index))
        files.append(writer.close())
    if file_faults[FaultKind.MISSING_COLUMN]:
        file_fault_records.append(
            {"kind": FaultKind.MISSING_COLUMN.value, "file": files[0]["name"], "column": missing}
        )
    if file_faults[FaultKind.EMPTY]:
        empty = _PartWriter(staging, request.fmt, "transactions", index=len(files))
        empty.ensure_header(list(TRANSACTION_COLUMNS))
        files.append(empty.close())
        file_fault_records.append({"kind": FaultKind.EMPTY.value, "file": files[-1]["name"]})
    for record in file_fault_records:
        counts[record["kind"]] += 1

    labels_file, labels_later = _write_labels(staging, request, world, day)
    manifest = {
        "arrival_date": day.isoformat(),
        "generator": {
            "version": GENERATOR_VERSION,
            "seed": request.seed,
            "rows_per_day": request.rows_per_day,
            "customers": request.customer_count,
            "merchants": request.merchant_count,
            "format": request.fmt,
            "faults": format_faults(request.faults),
            "feed_start": request.first_feed_date.isoformat(),
        },
        "transactions": {
            "generated": rows,
            "rows_written": sum(f["rows"] for f in files),
            "fraud": fraud,
            "files": files,
        },
        "faults": counts,
        "file_faults": file_fault_records,
        "late_from_previous_date": len(late),
        "labels": {**labels_file, "due_after_this_date": labels_later},
    }
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    (staging / COMPLETE_MARKER).touch()
    return manifest


def _plan_row_faults(rng: np.random.Generator, rows: int, rates: dict[FaultKind, float]) -> np.ndarray:
    """Per row: -1 for clean, else the index of its fault (replacing kinds, duplicate, drift, late)."""
    plan = np.full(rows, _CLEAN, dtype=np.int8)
    order = (*REPLACING_FAULTS, FaultKind.DUPLICATES, FaultKind.DRIFT, FaultKind.LATE)
    wanted = [round(rates.get(kind, 0.0) * rows) for kind in order]
    chosen = rng.choice(rows, size=sum(wanted), replace=False) if sum(wanted) else np.zeros(0, np.int64)
    start = 0
    for code, count in enumerate(wanted):
        plan[chosen[start : start + count]] = code
        start += count
    return plan


def _frame(world, batch: Batch) -> pd.DataFrame:
    stamps = np.datetime_as_string(batch.event_ms.astype("datetime64[ms]"), unit="ms", timezone="UTC")
    return pd.DataFrame(
        {
            "transaction_id": transaction_ids(batch.key),
            "customer_id": np.char.add("c", np.char.zfill(batch.customer.astype("U7"), 7)),
            "merchant_id": np.char.add("m", np.char.zfill(batch.merchant.astype("U6"), 6)),
            "amount": batch.amount,
            "currency": _CURRENCY_NAMES[world.customer_currency[batch.customer]],
            "country": _COUNTRY_NAMES[world.merchant_country[batch.merchant]],
            "channel": _CHANNEL_NAMES[batch.channel],
            "merchant_category": _CATEGORY_NAMES[world.merchant_category[batch.merchant]],
            "event_timestamp": stamps,
        }
    )


def _render(
    frame: pd.DataFrame,
    kinds: np.ndarray,
    variants: np.ndarray,
    fmt: str,
    columns: list[str],
    counts: dict[str, int],
) -> list[str]:
    frame = frame.copy()
    drift = kinds == _DRIFT
    if drift.any():
        frame.loc[drift, "amount"] = drift_amount(frame.loc[drift, "amount"].to_numpy())
        frame.loc[drift, "channel"] = DRIFT_CHANNEL
        counts[FaultKind.DRIFT.value] += int(drift.sum())
    view = frame[columns]
    if fmt == "csv":
        text = view.to_csv(header=False, index=False, float_format="%.2f", lineterminator="\n")
    else:
        text = view.to_json(orient="records", lines=True, double_precision=2)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out: list[str] = []
    for i, line in enumerate(lines):
        code = int(kinds[i])
        if code == _LATE:  # held back: delivered with the next arrival date
            counts[FaultKind.LATE.value] += 1
        elif _CLEAN < code < _DUPLICATE:
            kind = REPLACING_FAULTS[code]
            record = {c: _plain(frame.iat[i, frame.columns.get_loc(c)]) for c in TRANSACTION_COLUMNS}
            out.append(corrupt(kind, int(variants[i]) % VARIANTS[kind], record, fmt, columns))
            counts[kind.value] += 1
        else:
            out.append(line)
            if code == _DUPLICATE:
                out.append(line)
                counts[FaultKind.DUPLICATES.value] += 1
    return out


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def _write_labels(folder: Path, request: GenerateRequest, world, day: date) -> tuple[dict, int]:
    """Write the chargebacks reported on `day`, for transactions made since the feed started; return the
    file's info and how many chargebacks of `day`'s own transactions are reported later."""
    ids, stamps, later = [], [], 0
    first_origin = max(request.first_feed_date, day - timedelta(days=MAX_LABEL_DELAY_DAYS + 1))
    for back in range((day - first_origin).days + 1):
        origin = first_origin + timedelta(days=back)
        keys, label_ms = chargebacks_of_day(
            world, origin, rows_for_day(request.rows_per_day, origin), request.seed, _stealthy_share(request)
        )
        label_day = label_ms.astype("datetime64[ms]").astype("datetime64[D]")
        today = label_day == np.datetime64(day, "D")
        ids.append(transaction_ids(keys[today]))
        stamps.append(label_ms[today])
        if origin == day:
            later = int((label_day > np.datetime64(day, "D")).sum())
    all_ids, all_stamps = np.concatenate(ids), np.concatenate(stamps)
    order = np.lexsort((all_ids, all_stamps))
    frame = pd.DataFrame(
        {
            "transaction_id": all_ids[order],
            "is_fraud": np.ones(len(all_ids), dtype=np.int64),
            "label_timestamp": np.datetime_as_string(
                all_stamps[order].astype("datetime64[ms]"), unit="ms", timezone="UTC"
            ),
        }
    )[list(LABEL_COLUMNS)]
    writer = _PartWriter(folder, request.fmt, "labels")
    writer.ensure_header(list(LABEL_COLUMNS))
    if len(frame):
        text = (
            frame.to_csv(header=False, index=False, lineterminator="\n")
            if request.fmt == "csv"
            else frame.to_json(orient="records", lines=True)
        )
        writer.write(text.rstrip("\n").split("\n"))
    return writer.close(), later


class _PartWriter:
    """Numbered part files (`transactions-00000.csv`, ...) with a running SHA-256 and row count."""

    def __init__(self, folder: Path, fmt: str, stem: str, index: int = 0) -> None:
        self.folder, self.fmt, self.stem, self.index = folder, fmt, stem, index
        self.rows = 0
        self._handle: IO[bytes] | None = None
        self._digest = hashlib.sha256()

    @property
    def name(self) -> str:
        return f"{self.stem}-{self.index:05d}.{'csv' if self.fmt == 'csv' else 'jsonl'}"

    def _open(self) -> IO[bytes]:
        if self._handle is None:
            self._handle = open(self.folder / self.name, "wb")  # noqa: SIM115 - closed in close()
        return self._handle

    def _emit(self, text: str) -> None:
        data = text.encode("utf-8")
        self._digest.update(data)
        self._open().write(data)

    def ensure_header(self, columns: list[str]) -> None:
        if self._handle is None:
            self._open()
            if self.fmt == "csv":
                self._emit(",".join(columns) + "\n")

    def write(self, lines: list[str]) -> None:
        if lines:
            buffer = io.StringIO()
            buffer.write("\n".join(lines))
            buffer.write("\n")
            self._emit(buffer.getvalue())
            self.rows += len(lines)

    def close(self) -> dict:
        self._open().close()
        info = {"name": self.name, "rows": self.rows, "sha256": self._digest.hexdigest()}
        self.index += 1
        self.rows = 0
        self._handle = None
        self._digest = hashlib.sha256()
        return info


def _refuse_a_producers_folder(folder: Path) -> None:
    """Raise unless `folder` is absent, empty or the generator's own. Folders of generator versions
    without the marker are recognised by their manifest."""
    if not folder.is_dir() or (folder / GENERATED_MARKER).is_file():
        return
    names = sorted(path.name for path in folder.iterdir())
    if not names or _is_generator_manifest(folder / MANIFEST_NAME):
        return
    listing = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise ProducerFolderError(
        f"{folder} holds files the synthetic generator did not write ({listing}) and no {GENERATED_MARKER} "
        f"marker: it is a producer's delivery, which synthetic data never overwrites; nothing was written "
        f"into it. Generate other dates or into another landing zone (`mlops generate --landing`), or move "
        f"the folder away first if it really is to be replaced."
    )


def _is_generator_manifest(path: Path) -> bool:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    generator = manifest.get("generator") if isinstance(manifest, dict) else None
    return isinstance(generator, dict) and {"version", "seed", "rows_per_day"} <= generator.keys()


def _swap_into_place(staging: Path, final: Path) -> None:
    if final.exists():
        retired = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(retired)
        staging.rename(final)
        shutil.rmtree(retired)
    else:
        staging.rename(final)


def read_manifest(folder: Path) -> dict:
    """The manifest of one arrival folder, with a clear error when it is missing."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no generator manifest; was this folder written by `mlops generate`?"
        )
    return json.loads(path.read_text())
