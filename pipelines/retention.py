"""Retention of the layers above landing: the lake, the training sets and their DVC revisions.

Every date counts back from the newest arrival the lake has ingested (as the raw layers' retention does,
pipelines/privacy.py): the lake's own dates, never a clock.

- **The lake and the training sets** (`retention.lake_days`): every dated entry (a partition `arrival_date=`,
  `event_date=` or `as_of=`, or such a file) older than the cut-off, found by walking the lake, the training
  sets' folder and the DVC files that track them, so a table added later is covered without a list to keep.
  Left to their own settings: the quarantine (`retention.quarantine_days`) and the scoring log
  (`serving.log_retention_days`); never touched: the reconciliation records (counts, no rows: the raw layers'
  retention reads them to know what was ingested). Partitions go as erasure's do: renamed aside under the
  table's lock, no older version kept.
- **DVC revisions** (`retention.dataset_days`): a revision (a gold date's or a training set's manifest) dated
  before the cut-off by the dates its members version is deleted, unless it is in `keep` (the training sets of
  the versions that may serve again: training/retention.py); then every object of the DVC cache and
  remote that no kept revision and no current `.dvc` file uses is deleted, with dvc-data's own `gc`, under the
  repository's lock.

Each has a floor: gold's date D reads silver back to D - LOOKBACK_DAYS and a training set reads `window_days`
of gold after its label maturity, so a retention shorter than what one retrain reads would delete what the
next one needs; such a setting is refused before anything is deleted (`check_retention`, which
pipelines/privacy.py `enforce_retention`, the one caller of both, runs first).
"""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from core.errors import PipelineError
from pipelines.gold.contract import LOOKBACK_DAYS
from pipelines.lake import clear_partitions, table_lock

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

DATED = re.compile(
    r"^(?:arrival_date|event_date|as_of)=(\d{4}-\d{2}-\d{2})(?:\.json|\.parquet|\.rev\.json|\.dvc)?$"
)
# Why a revision in `keep` stays, unless the caller knows better.
MAY_SERVE = "the training set of a version that may serve again"
# Under the lake, what other settings keep, or what is no personal data and is read to know what was ingested.
OWN_RETENTION = ("quarantine", "reconciliation", "scoring_log")


def minimum_days(settings: Settings) -> int:
    """The shortest retention that keeps what the next gold date and the next training set read."""
    reads_back = max(LOOKBACK_DAYS, settings.ingest.dedup_lookback_days)
    return reads_back + settings.training.window_days + settings.training.label_maturity_days


def check_retention(settings: Settings) -> None:
    """A PipelineError naming the setting when a retention is shorter than `minimum_days`."""
    floor = minimum_days(settings)
    for name, days in (
        ("lake_days", settings.retention.lake_days),
        ("dataset_days", settings.retention.dataset_days),
    ):
        if days < floor:
            raise PipelineError(
                f"MLOPS_RETENTION__{name.upper()}={days} is shorter than what one retrain reads "
                f"({floor} days: gold's {LOOKBACK_DAYS}-day lookback or the "
                f"{settings.ingest.dedup_lookback_days}-day dedup, the {settings.training.window_days}-day "
                f"training window, the {settings.training.label_maturity_days}-day label maturity): nothing "
                f"was deleted; raise it to {floor} or more"
            )


def dated_entries(root: Path, skip: tuple[Path, ...] = ()) -> dict[Path, dict[date, list[Path]]]:
    """Every folder under `root` (hidden folders and `skip` left out) holding dated entries: the folder ->
    each date -> its entries (partitions or files). A dated folder is not searched further."""
    found: dict[Path, dict[date, list[Path]]] = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        if here in skip:
            dirs[:] = []
            continue
        entries: dict[date, list[Path]] = {}
        for name in [*dirs, *files]:
            if match := DATED.match(name):
                entries.setdefault(date.fromisoformat(match[1]), []).append(here / name)
        dirs[:] = [d for d in dirs if not d.startswith(".") and not DATED.match(d)]
        if entries:
            found[here] = entries
    return found


def expire_lake(settings: Settings, newest: date) -> list[str]:
    """Delete the lake's, the training sets' and their DVC files' dated entries older than
    `retention.lake_days` before `newest`; their paths relative to MLOPS_HOME, oldest first."""
    cutoff = newest - timedelta(days=settings.retention.lake_days)
    skip = (*(settings.lake / name for name in OWN_RETENTION), settings.scoring_log_dir)
    roots = (settings.lake, settings.home / "training_sets", settings.home / "datasets")
    removed: list[tuple[date, str]] = []
    for root in roots:
        for table, entries in sorted(dated_entries(root, skip).items()):
            old = {day: paths for day, paths in entries.items() if day < cutoff}
            if not old:
                continue
            folders = tuple(p for paths in old.values() for p in paths if p.is_dir())
            if folders:
                clear_partitions(table, folders, retain_s=0)
            with table_lock(table):
                for path in (p for paths in old.values() for p in paths if p.is_file()):
                    path.unlink(missing_ok=True)
            removed += [(day, str(p.relative_to(settings.home))) for day, paths in old.items() for p in paths]
    return [path for _, path in sorted(removed)]


def revision_date(manifest: dict[str, dict]) -> date | None:
    """The newest date a revision's members version (their paths name it), None when none does."""
    days = [date.fromisoformat(m[1]) for member in manifest.values() for part in Path(member["path"]).parts
            if (m := DATED.match(part))]  # fmt: skip
    return max(days, default=None)


def expire_revisions(
    settings: Settings,
    newest: date,
    keep: set[str],
    why: str = "the training set of a version that may serve again",
) -> dict:
    """Delete the DVC revisions dated more than `retention.dataset_days` before `newest` but those in `keep`
    (`why`: the reason the report gives),
    then the objects of the DVC cache and remote that nothing kept uses. What was deleted, and kept though
    old. A kept revision whose listing neither the remote nor the cache holds stops it before any object
    is deleted (a PipelineError naming it)."""
    from dvc.repo import lock_repo
    from dvc_data.hashfile.gc import gc
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    from pipelines.versioning import _repo, remote_url

    cutoff = newest - timedelta(days=settings.retention.dataset_days)
    folder = settings.home / "datasets" / "revisions"
    report: dict = {"revisions_removed": [], "kept": {}, "objects_removed": {}}
    if not folder.is_dir():
        return report
    url = remote_url(settings)
    with _repo(settings) as repo, lock_repo(repo):
        used: dict[str, str] = {}  # a folder's listing -> the revision or DVC file that uses it
        expired = []
        for manifest in sorted(folder.glob("*.json")):
            members = json.loads(manifest.read_text())
            day = revision_date(members)
            if day is not None and day < cutoff:
                if manifest.stem not in keep:
                    expired.append(manifest)
                    continue
                report["kept"][manifest.stem] = why
            used |= {member["md5"]: f"revision {manifest.stem}" for member in members.values()}
        for stage in sorted((settings.home / "datasets").rglob("*.dvc")):
            outs = (yaml.safe_load(stage.read_text()) or {}).get("outs", [])
            used |= {out["md5"]: str(stage.relative_to(settings.home)) for out in outs if "md5" in out}
        cache = repo.cache.local
        remote = repo.cloud.get_remote_odb(None, "gc") if "://" not in url else None
        # Every file of a used folder: its listing read where it was pushed (the remote), else the cache.
        objects = set(used)
        for listing, user in used.items():
            for odb in filter(None, (remote, cache)):
                try:
                    objects |= {
                        h.value for _, _, h in Tree.load(odb, HashInfo("md5", listing)) if h and h.value
                    }
                    break
                except FileNotFoundError:
                    continue
            else:
                raise PipelineError(
                    f"the DVC listing {listing} of {user} is in neither the remote {url} nor the cache: "
                    "nothing was deleted (a retention would lose what that revision still names); restore it "
                    "or delete that revision's manifest"
                )
        for manifest in expired:  # only once every kept listing was found
            manifest.unlink()
            report["revisions_removed"].append(manifest.stem)
        hashes = [HashInfo("md5", value) for value in sorted(objects)]
        report["objects_removed"]["cache"] = gc(cache, hashes, shallow=True)
        if remote is not None:
            report["objects_removed"]["remote"] = gc(remote, hashes, shallow=True)
        else:
            report["kept"]["remote"] = (
                f"the DVC remote {url} is not a folder: its objects follow its own lifecycle"
            )
    return report
