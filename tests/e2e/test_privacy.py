"""No raw identifier past landing: every store the demo wrote, scanned for the customer and merchant ids its
landing files hold (#36). Landing and the quarantine keep raw records on purpose (under retention, and
erased by `mlops erase`); everything else must hold pseudonyms only (core/pseudonym.py).

The scan reads each file as its format holds text: Parquet column by column (its pages are compressed),
gzip and zstd frames decompressed, anything else (SQLite databases and their journals, logs, JSON
records, DVC's cache and remote, MLflow's artifacts, GX's data docs, lineage events) as bytes. The local
profile's stores are all files under MLOPS_HOME (Redis and PostgreSQL are the cluster profile's).
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core import pseudonym
from pipelines.contracts import TRANSACTIONS_CONTRACT

# Where raw ids may be: the landing files and the quarantine's raw records.
RAW_ALLOWED = ("landing", "lake/quarantine")


def _id_token(column: str) -> re.Pattern[bytes]:
    """A raw id of `column` anywhere in a text: its contract pattern, not inside a longer word."""
    return re.compile(TRANSACTIONS_CONTRACT.field(column).raw_token().encode())


TOKENS = [_id_token(column) for column in pseudonym.COLUMNS]


def _texts(path: Path) -> Iterator[bytes]:
    """What `path` holds as text: Parquet's values, a compressed frame's content, or its bytes."""
    data = path.read_bytes()
    if data[:4] == b"PAR1" and data[-4:] == b"PAR1":
        table = pq.read_table(io.BytesIO(data))
        for column in table.columns:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                yield "\n".join(v for v in column.to_pylist() if v is not None).encode()
            elif pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
                yield b"\n".join(v for v in column.to_pylist() if v is not None)
        yield data  # its footer and any uncompressed page
    elif data[:2] == b"\x1f\x8b":
        yield gzip.decompress(data)
    elif data[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        yield zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    else:
        yield data


def raw_ids_in(root: Path, skip: tuple[str, ...] = ()) -> tuple[dict[str, set[str]], int]:
    """{file relative to root: the raw ids found in it}, and how many files were read."""
    found: dict[str, set[str]] = {}
    read = 0
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or path.is_symlink() or relative.startswith(skip):
            continue
        read += 1
        for text in _texts(path):
            ids = {m.decode() for token in TOKENS for m in token.findall(text)}
            if ids:
                found.setdefault(relative, set()).update(ids)
    return found, read


@pytest.fixture(scope="module")
def landed(demo_stack) -> set[str]:
    in_landing, _ = raw_ids_in(demo_stack.home / "landing")
    ids = set().union(*in_landing.values())
    assert len(ids) > 100, "the demo's landing files hold the customers and merchants of three days"
    return ids


def test_no_store_the_demo_wrote_holds_a_raw_id_past_landing(demo_stack, landed):
    home = demo_stack.home
    found, read = raw_ids_in(home, skip=RAW_ALLOWED)
    leaks = {path: sorted(ids & landed)[:5] for path, ids in found.items() if ids & landed}
    assert leaks == {}, f"raw ids past landing in {len(leaks)} files: {dict(list(leaks.items())[:10])}"
    # The scan read the stores that hold entities, and they hold pseudonyms of the landed ids.
    stores = {
        "silver": "lake/silver/transactions",
        "gold": "lake/gold",
        "online store": "feast",
        "MLflow": "mlflow",
        "DVC remote": "dvc-remote",
        "scoring log": "scoring_log",
        "Airflow": "airflow",
    }
    for name, folder in stores.items():
        assert any(p.is_file() for p in (home / folder).rglob("*")), f"the demo wrote no {name} ({folder})"
    assert read > 100, f"only {read} files were read"
    pseudonyms = pseudonym.for_settings(_settings(demo_stack))
    wanted = {pseudonyms.of(kind, raw) for raw in landed for kind in pseudonym.KINDS}
    for name, folder in (("silver", "lake/silver/transactions"), ("scoring log", "scoring_log")):
        values = set()
        for path in (home / folder).rglob("*.parquet"):
            columns = [c for c in pq.read_schema(path).names if c in pseudonym.COLUMNS]
            # the scoring log's ids, not its per-minute counts
            for column in pq.read_table(path, columns=columns).columns:
                values.update(column.to_pylist())
        assert values and values <= wanted | {None}, f"{name} holds ids that are no pseudonym of a landed id"


def test_the_scan_finds_raw_ids_where_they_are_kept(demo_stack, landed):
    """The scan can fail: it finds the ids in landing (every format the generator writes) and in the
    quarantine's raw records, the two places that keep them."""
    found, _ = raw_ids_in(demo_stack.home / "lake" / "quarantine")
    quarantined = set().union(*found.values()) if found else set()
    in_landing, _ = raw_ids_in(demo_stack.home / "landing")
    assert set().union(*in_landing.values()) == landed
    assert quarantined <= landed
    assert any(path.endswith(".parquet") for path in found), "the demo's feed quarantines rows"


def _settings(demo_stack):
    from core.settings import Settings

    return Settings(home=demo_stack.home)


def test_every_arrival_names_the_key_its_pseudonyms_were_made_with(demo_stack):
    """The key's id (never the key) in each bronze write's lineage event and reconciliation record: a
    pseudonym can be traced to its key, and a key that changed between arrivals shows."""
    import json

    from core.lineage import read_events

    settings = _settings(demo_stack)
    key_id = pseudonym.for_settings(settings).key_id
    bronze = [e for e in read_events(settings) if e["job"]["name"] == "ingest_to_bronze"]
    assert len(bronze) >= 3, "one per demo arrival at least"
    assert {e["run"]["facets"]["mlops"]["pseudonym_key_id"] for e in bronze} == {key_id}
    records = sorted((demo_stack.home / "lake" / "reconciliation" / "transactions").glob("*.json"))
    assert records and {json.loads(p.read_text())["pseudonym_key_id"] for p in records} == {key_id}
