"""Baselines, each run as a command of its own so that its time and memory are measured alike."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


def csv_floor(rows: int, out: Path) -> None:
    """The floor for writing `rows` transactions as CSV: columns of the same types, drawn in one go and
    written by Arrow's C++ CSV writer, with no modelling and no streaming (all rows held in memory)."""
    rng = np.random.default_rng(0)
    ids = np.char.add("tx", rng.integers(0, 1 << 62, size=rows).astype("U16"))
    table = pa.table(
        {
            "transaction_id": ids,
            "customer_id": np.char.add("c", rng.integers(0, 10**7, size=rows).astype("U7")),
            "merchant_id": np.char.add("m", rng.integers(0, 10**6, size=rows).astype("U6")),
            "amount": np.round(rng.lognormal(4, 1, size=rows), 2),
            "currency": np.full(rows, "EUR"),
            "country": np.full(rows, "DE"),
            "channel": np.full(rows, "online"),
            "merchant_category": np.full(rows, "grocery"),
            "event_timestamp": pa.array(
                rng.integers(0, 86_400_000, size=rows) + 1_767_225_600_000, type=pa.timestamp("ms", tz="UTC")
            ),
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(table, out / "baseline.csv")


def csv_to_parquet(folder: Path, out: Path) -> None:
    """Arrow's CSV-to-Parquet conversion of an arrival's files, typed by an explicit schema, streamed.
    Rows with the wrong number of fields are skipped (Arrow would otherwise stop): the baseline does not
    quarantine, number lines or deduplicate, so it is a floor, not an equivalent."""
    types = {
        "amount": pa.decimal128(12, 2),
        "event_timestamp": pa.timestamp("ms", tz="UTC"),
    }
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = 0
    for index, path in enumerate(sorted(folder.glob("transactions-*.csv"))):
        reader = pacsv.open_csv(
            path,
            parse_options=pacsv.ParseOptions(quote_char=False, invalid_row_handler=lambda row: "skip"),
            convert_options=pacsv.ConvertOptions(column_types=types),
        )
        with pq.ParquetWriter(out / f"part-{index:05d}.parquet", reader.schema, compression="zstd") as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    print(json.dumps({"rows": rows, "convert_seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    if sys.argv[1] == "csv_floor":
        csv_floor(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        csv_to_parquet(Path(sys.argv[2]), Path(sys.argv[3]))
