"""The reference lake: a few days of a real feed with every fault kind, built once per test run through the
real steps (ingestion with its GX suites, the features stage: gold, its DVC version, the Feast online store),
cached on disk by a hash of the code and parameters that build it, and handed to each test as its own cheap
copy (docs/testing.md, "Shared set-ups").

What the feed holds, in the order it arrives (`ReferenceLake.events` says it for a test to read):
- events a day late (`late`), exact re-sends (`duplicates`) and rows that fail the contract and are
  quarantined (`wrong_type`);
- a date delivered after the next one (`out_of_order`, seed 5 gives 03-03 before 03-02);
- a date whose chargebacks file comes after the others (UNLABELLED), then arrives;
- a date re-delivered at the end with its last rows withdrawn (REDELIVERED).

Besides the end state, the cache keeps the installation as it stood at each of PHASES (its Parquet files
linked, so a phase costs no copy of data): a check of the end state cannot see an arrival whose mistake a
later rebuild covers, a check of a phase can. `events["records"]` holds every features run's record (its plan
with the reason for each date, the dates rebuilt, the training rows built), in arrival order.

A copy hard-links the Parquet files of the cache (the lake's writers only swap whole files and folders in,
never write one in place: tests/integration/test_reference_lake.py holds that) and copies everything else
(landing files, which tests rewrite; SQLite files, which their writers change in place).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST = date(2026, 3, 2)
DAYS = [FIRST + timedelta(days=i) for i in range(4)]
UNLABELLED = DAYS[3]  # its chargebacks come after the other arrivals
REDELIVERED = DAYS[1]  # delivered again at the end with its last WITHDRAWN rows removed
WITHDRAWN = 30
SPEC = {
    "start": FIRST.isoformat(),
    "days": len(DAYS),
    "rows_per_day": 800,
    "seed": 5,
    "customers": 150,
    "merchants": 40,
    "faults": "late=0.03,duplicates=0.01,wrong_type=0.005,out_of_order=0.35",
    "unlabelled": UNLABELLED.isoformat(),
    "redelivered": REDELIVERED.isoformat(),
    "withdrawn": WITHDRAWN,
}
# Always part of the key beside the files the build read: the installed packages and this module.
ALWAYS = ("requirements.lock", "tests/lake.py")
# Files the build opens that are not inputs: the version control's own and compiled bytecode.
NOT_INPUTS = (".git", "__pycache__", ".venv", "var")
# Files a copy hard-links: written once and only ever replaced whole (a folder or file swapped in).
LINKED_SUFFIXES = (".parquet",)
# Copied files that may name the home's path (configuration and JSON records).
TEXT_SUFFIXES = (".yaml", ".json", "config")
EVENTS_FILE = "reference-lake.json"
# The installation kept as it stood at these points of the build: "arrivals" is after every date's first
# delivery, before the held chargebacks and the re-delivery.
PHASES = ("arrivals",)


@dataclass(frozen=True)
class ReferenceLake:
    """A copy of the reference lake: its MLOPS_HOME and what happened while it was built."""

    home: Path
    events: dict


def code_key(files: list[str]) -> str:
    """A hash of the parameters, the Python version and the content of `files` (paths relative to the
    repository); a file that is gone keys differently from any content."""
    import sys

    digest = hashlib.sha256(json.dumps(SPEC, sort_keys=True).encode())
    digest.update(sys.version.encode())
    for name in sorted(set(files) | set(ALWAYS)):
        path = REPO / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"\0missing\0")
    return digest.hexdigest()[:16]


def _inputs_of(done: Path) -> Path:
    return done.with_name(f"{done.name}.inputs.json")


def find_cached(root: Path) -> Path | None:
    """The cached lake whose recorded inputs still hash to its key (each lake records the files its build
    read, `_inputs_of`), or None: a lake whose inputs changed is stale and never read again."""
    for inputs in sorted(root.glob("lake-*.inputs.json")):
        done = root / inputs.name.removesuffix(".inputs.json")
        files = json.loads(inputs.read_text())["files"]
        key = code_key(files)
        print(f"reference lake: {done.name} recorded {len(files)} input files, which key {key} now")
        if done.name == f"lake-{key}" and (done / EVENTS_FILE).is_file():
            return done
    return None


def cache_root() -> Path:
    """Where built lakes are kept between runs: $MLOPS_TEST_CACHE, else ~/.cache/mlops-tests."""
    if configured := os.environ.get("MLOPS_TEST_CACHE"):
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlops-tests"


def _summary(record: dict) -> dict:
    """What a features run's record says about the run (its timings left out)."""
    return {
        "plan": record["plan"],
        "rebuilt": sorted(record["rebuilt"]),
        "training_rows": record["training_rows"],
    }


def _build(home: Path, phases: Path) -> dict:
    """The feed through the real steps, arrival by arrival, as the ingest and features DAGs run them; the
    installation at each of PHASES linked under `phases`."""
    from core.settings import Settings
    from mlops import chain
    from pipelines.ingest import job as ingest
    from pipelines.synthetic.faults import parse_faults
    from pipelines.synthetic.landing import GenerateRequest, generate_landing

    settings = Settings(home=home)
    settings.ensure_dirs()
    manifests = generate_landing(
        GenerateRequest(
            start=FIRST,
            days=SPEC["days"],
            rows_per_day=SPEC["rows_per_day"],
            seed=SPEC["seed"],
            landing=settings.landing,
            customers=SPEC["customers"],
            merchants=SPEC["merchants"],
            faults=parse_faults(SPEC["faults"]),
        )
    )
    delivered = [m["arrival_date"] for m in manifests]
    held = home / "held-labels"
    held.mkdir()
    for labels in (settings.landing / UNLABELLED.isoformat()).glob("labels-*"):
        shutil.move(labels, held / labels.name)
    records: list[dict] = []

    def features(day: date, kind: str) -> list[str]:
        record = chain.features(settings, day)
        records.append({"arrival": day.isoformat(), "kind": kind, **_summary(record)})
        return record["plan"]["event_dates"]

    built: dict[str, list[str]] = {}
    for arrival in delivered:
        day = date.fromisoformat(arrival)
        ingest.ingest(settings, day, f"reference:{arrival}")
        built[arrival] = features(day, "first")
    _link_tree(home, phases / "arrivals")  # its paths kept: a copy replaces built_at
    for labels in held.iterdir():
        shutil.move(labels, settings.landing / UNLABELLED.isoformat() / labels.name)
    held.rmdir()
    ingest.ingest_labels(settings, UNLABELLED, "reference:labels")
    labels_rebuilt = features(UNLABELLED, "labels")
    data = sorted((settings.landing / REDELIVERED.isoformat()).glob("transactions-*"))[-1]
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:-WITHDRAWN]))
    ingest.ingest(settings, REDELIVERED, "reference:redelivered")
    redelivery_rebuilt = features(REDELIVERED, "redelivery")
    return {
        "spec": SPEC,
        "built_at": str(home),
        "delivered": delivered,
        "records": records,
        "built": built,
        "labels_rebuilt": labels_rebuilt,
        "redelivery_rebuilt": redelivery_rebuilt,
        "late_rows": sum(m["faults"].get("late", 0) for m in manifests),
        "quarantined_rows": sum(m["faults"].get("wrong_type", 0) for m in manifests),
        "duplicate_rows": sum(m["faults"].get("duplicates", 0) for m in manifests),
        "manifests": manifests,
    }


def cached_lake() -> tuple[Path, dict]:
    """The reference lake's home in the cache, built first where none is current; one builder at a time
    across processes (parallel test workers wait for the first one's build).

    The key covers what the build read, not folders of the repository: the build runs in a process of its
    own (`python -m tests.lake`), which records every file of the repository it imported or opened; a lake
    is current while those files, the lock file, this module and SPEC hash to its key (`find_cached`). A
    change elsewhere (training, serving, DAGs, the other tests, docs) keeps the lake; a change to anything
    it read builds a new one."""
    import subprocess
    import sys

    from tests.conftest import child_env, machine_lock

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with machine_lock("reference-lake"):
        done = find_cached(root)
        if done is None:
            evict_stale_lakes(root, KEEP_OTHER_LAKES)
            staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
            subprocess.run(
                [sys.executable, "-m", "tests.lake", str(staging)], cwd=REPO, env=child_env(), check=True
            )
            files = json.loads((staging / "inputs.json").read_text())["files"]
            done = root / f"lake-{code_key(files)}"
            print(f"reference lake: built {done.name} from {len(files)} input files")
            os.rename(staging / "phases", phases_of(done))
            os.rename(staging / "inputs.json", _inputs_of(done))
            os.rename(staging / "home", done)  # last: the events file inside says the build is whole
            staging.rmdir()
    return done, json.loads((done / EVENTS_FILE).read_text())


# Lakes of other code kept beside a new build, newest first: another checkout on this machine (a CI run of a
# clean clone beside a developer's tree) may be reading one now; a lake removed under a running test was
# built again by its next `cached_lake()`, with other pseudonyms, and compared unequal (2026-12-06).
KEEP_OTHER_LAKES = 2


def evict_stale_lakes(root: Path, keep: int) -> list[str]:
    """Remove the cached lakes of other code but the `keep` most recently built (by their inputs record's
    time), each with its phases and record; returns the names removed. Leftover build folders go too."""
    built = sorted(
        (p for p in root.glob("lake-*.inputs.json")), key=lambda p: p.stat().st_mtime, reverse=True
    )
    kept = {p.name.removesuffix(".inputs.json") for p in built[:keep]}
    removed = []
    for path in root.glob("lake-*"):
        name = path.name.removesuffix(".inputs.json").removesuffix("-phases")
        if name in kept:
            continue
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
        removed.append(path.name)
    for leftover in root.glob(".building-*"):  # a build killed midway: never read
        shutil.rmtree(leftover, ignore_errors=True)
    return sorted(removed)


def _build_in_this_process(staging: Path) -> None:
    """`python -m tests.lake STAGING`: the build into STAGING/home and STAGING/phases, and the repository's
    files it read (imported or opened) in STAGING/inputs.json."""
    import sys

    opened: set[str] = set()

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str):
            opened.add(args[0])

    sys.addaudithook(audit)
    events = _build(staging / "home", staging / "phases")
    (staging / "home" / EVENTS_FILE).write_text(json.dumps(events, indent=1, default=str))
    read = opened | {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
    files = sorted({relative for path in read if (relative := _repository_file(path)) is not None})
    (staging / "inputs.json").write_text(json.dumps({"files": files}, indent=1))


def _repository_file(path: str) -> str | None:
    """`path` relative to the repository when it is one of its files and an input of the build."""
    try:
        relative = Path(os.path.abspath(path)).relative_to(REPO)
    except ValueError:
        return None
    if not relative.parts or relative.parts[0] in NOT_INPUTS or "__pycache__" in relative.parts:
        return None
    return str(relative) if (REPO / relative).is_file() else None


def phases_of(done: Path) -> Path:
    """Where the installation at each of PHASES is kept, beside the cached home `done`."""
    return done.with_name(f"{done.name}-phases")


def _link_tree(source: Path, target: Path, built_at: str | None = None) -> None:
    """`source` copied to `target`: Parquet files hard-linked (reflinks are not needed: their writers never
    write one in place), every other file copied, and `built_at` (the home's path, which the installation
    wrote into its configuration and records), when given, replaced by `target` in the copied text files."""

    def link_or_copy(src: str, dst: str) -> str:
        if src.endswith(LINKED_SUFFIXES):
            os.link(src, dst)
            return dst
        done = shutil.copy2(src, dst)
        if built_at is not None and src.endswith(TEXT_SUFFIXES):
            text = Path(dst).read_text()
            if built_at in text:
                Path(dst).write_text(text.replace(built_at, str(target)))
        return done

    shutil.copytree(source, target, copy_function=link_or_copy, symlinks=True)


def copy_home(source: Path, target: Path, built_at: str) -> None:
    """The home `source` copied to `target` (`_link_tree`); Feast's registry, a binary file that names the
    home's path, is applied again."""
    from core.settings import Settings
    from features import repo

    _link_tree(source, target, built_at)
    # Feast's registry names the built home's files (the gold sources, the online store's SQLite file) in a
    # binary file: applied anew here, it names the copy's; the online tables and their rows are kept.
    (target / "feast" / "registry.db").unlink()
    repo.apply(Settings(home=target))


def reference_lake(target: Path, phase: str | None = None) -> ReferenceLake:
    """A copy of the reference lake's installation at `target` (its MLOPS_HOME), as it stood at the end of
    the build or at `phase` (one of PHASES)."""
    source, events = cached_lake()
    if phase is None:
        copy_home(source, target, events["built_at"])
        (target / EVENTS_FILE).unlink()
    elif phase in PHASES:
        copy_home(phases_of(source) / phase, target, events["built_at"])
    else:
        raise ValueError(f"no phase {phase!r} in the reference lake; its phases are {PHASES}")
    return ReferenceLake(home=target, events=events)


def landing_records(path: Path) -> list[dict]:
    """The rows of a landing file that parse (CSV or JSON lines, gzipped or not), as dicts: an independent
    reading with the csv and json modules."""
    import csv
    import gzip
    import io

    with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as handle:
        text = handle.read()
    if ".csv" in path.name:
        return list(csv.DictReader(io.StringIO(text)))
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root`: its content's hash and its mode (a writer that changed a linked file in
    place, or its permissions, shows here)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


if __name__ == "__main__":
    import sys

    _build_in_this_process(Path(sys.argv[1]))
