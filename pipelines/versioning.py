"""Dataset versions with DVC: content-hashed snapshots pushed to a DVC remote, fetched back by version.

The DVC repository is $MLOPS_HOME itself (`dvc init --no-scm`: the data's history is its content hashes,
not git commits). A tracked folder stays where the pipeline wrote it; its `.dvc` file lives under
`$MLOPS_HOME/datasets/`, outside the Parquet tables, so Spark never sees it. A dataset revision names a set
of folder hashes; `fetch` restores any of them from the remote by hash alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pipelines.errors import PipelineError

if TYPE_CHECKING:
    from mlops.settings import Settings

REMOTE_NAME = "storage"


@dataclass(frozen=True)
class TrackedFolder:
    path: str  # relative to $MLOPS_HOME
    md5: str
    size: int
    nfiles: int


def _dvc(settings: Settings, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=settings.home, capture_output=True, text=True, timeout=3600
    )
    if done.returncode:
        raise PipelineError(
            f"`dvc {' '.join(args)}` failed in {settings.home} (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done.stdout


def remote_url(settings: Settings) -> str:
    if settings.cluster.object_store_uri and settings.profile.value == "cluster":
        return settings.cluster.object_store_uri.rstrip("/") + "/dvc"
    return str(settings.dvc_remote)


def ensure_repo(settings: Settings) -> None:
    """Make $MLOPS_HOME a DVC repository with the profile's remote as default (idempotent)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    if not (settings.home / ".dvc").is_dir():
        _dvc(settings, "init", "--no-scm", "-q")
        _dvc(settings, "config", "core.analytics", "false")
    _dvc(settings, "remote", "add", "--default", "--force", REMOTE_NAME, remote_url(settings))
    if remote_url(settings) == str(settings.dvc_remote):
        settings.dvc_remote.mkdir(parents=True, exist_ok=True)


def track(settings: Settings, name: str, folder: Path) -> TrackedFolder:
    """Hash `folder` into the DVC cache, push it to the remote, and return its version."""
    ensure_repo(settings)
    if not folder.is_dir():
        raise PipelineError(f"cannot version {folder}: it does not exist")
    stage = settings.home / "datasets" / f"{name}.dvc"
    stage.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(folder, stage.parent)
    stage.write_text(yaml.safe_dump({"outs": [{"path": relative}]}))
    _dvc(settings, "commit", "--force", "-q", str(stage.relative_to(settings.home)))
    _dvc(settings, "push", "-q", str(stage.relative_to(settings.home)))
    out = yaml.safe_load(stage.read_text())["outs"][0]
    return TrackedFolder(
        path=str(folder.relative_to(settings.home)), md5=out["md5"], size=out["size"], nfiles=out["nfiles"]
    )


def record_revision(settings: Settings, members: dict[str, TrackedFolder]) -> str:
    """A revision id for a set of tracked folders (a content hash of their hashes), kept with its members."""
    canonical = json.dumps({k: asdict(v) for k, v in sorted(members.items())}, sort_keys=True)
    rev = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    manifest = settings.home / "datasets" / "revisions" / f"{rev}.json"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(canonical + "\n")
    return rev


def fetch(settings: Settings, rev: str, destination: Path) -> dict[str, Path]:
    """Restore every folder of revision `rev` from the DVC remote under `destination` (inside
    $MLOPS_HOME), by content hash; returns where each member landed."""
    manifest = settings.home / "datasets" / "revisions" / f"{rev}.json"
    if not manifest.is_file():
        raise PipelineError(f"unknown dataset revision {rev!r}: no manifest at {manifest}")
    ensure_repo(settings)
    restored = {}
    for name, member in json.loads(manifest.read_text()).items():
        target = destination / name
        stage = settings.home / "datasets" / "_fetch" / f"{member['md5'].removesuffix('.dir')}.dvc"
        stage.parent.mkdir(parents=True, exist_ok=True)
        out = {"path": os.path.relpath(target, stage.parent), "md5": member["md5"], "hash": "md5"}
        stage.write_text(yaml.safe_dump({"outs": [out]}))
        _dvc(settings, "pull", "-q", str(stage.relative_to(settings.home)))
        restored[name] = target
    return restored
