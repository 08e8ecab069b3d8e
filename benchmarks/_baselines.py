"""Baselines, each run as a command of its own so that its time and memory are measured alike."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv


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


if __name__ == "__main__":
    csv_floor(int(sys.argv[1]), Path(sys.argv[2]))
