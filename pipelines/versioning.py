"""Dataset versions with DVC: content-hashed snapshots pushed to a DVC remote, fetched back by version.

The DVC repository is $MLOPS_HOME itself (`dvc init --no-scm`: the data's history is its content hashes,
not git commits). A tracked folder stays where the pipeline wrote it; its `.dvc` file lives under
`$MLOPS_HOME/datasets/`, outside the Parquet tables, so Spark never sees it. A dataset revision names a set
of folder hashes; `fetch` restores any of them from the remote by hash alone.

Versioning costs one read of the data (DVC's md5) and no copy:
  - DVC runs in this process through its Python API (`dvc.repo.Repo`), not as `dvc` commands: each command
    was a Python start and a DVC import (about a second), several per date.
  - The cache links files instead of copying them (`cache.type = hardlink,copy`; copy only where the cache
    and the data sit on different filesystems): a tracked file and its cache object are one inode. DVC makes
    such files read-only, and nothing may write into a tracked file in place (as root, the mode does not
    stop it, and the cache object would change under its hash): writers replace files (Spark writes new
    files and deletes the old partition; the training set is written to a temporary name and renamed).
  - Objects go to the remote with DVC's own transfer, allowed to hard-link: the local profile's remote is a
    folder in $MLOPS_HOME, on the cache's filesystem, so it gets links too. It still keeps every version
    when the lake or the cache is deleted or a partition is rewritten, but it is not a second physical copy
    of the bytes; a remote on another filesystem or in object storage (the cluster profile) gets copies.

Reading a revision needs no DVC repository, lock or write: `revision_files` resolves each member's files
in the remote by content hash with DVC's own object layer (dvc-data) and returns their paths there. The
training pod mounts the shared volume read-only and reads its training set that way, with no `dvc` in its
image; `fetch` (a `dvc pull`, which writes a working copy and takes the repository) remains for folders a
caller wants restored as a tree.

DVC operations take turns: DVC's own repository lock gives up after 3 s, while gold versioning, the
training-set build and promotion's fetch of a holdout routinely overlap. So each operation first takes our
lock, `$MLOPS_HOME/.dvc-wait.lock`, for its whole length, waiting up to `dvc_lock_wait_s`
(MLOPS_DVC_LOCK_WAIT_S); past that, or when DVC's own lock is held by a process outside the pipeline (a
`dvc` command), it fails with LockTimeoutError, which Airflow retries (it is not a data problem).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from core.errors import LockTimeoutError, PipelineError

if TYPE_CHECKING:
    from dvc.repo import Repo

    from core.settings import Settings

REMOTE_NAME = "storage"
CACHE_TYPES = "hardlink,copy"
# Beside `.dvc`, not in `.dvc/tmp`: the lock also covers making the repository (`dvc init` wants no `.dvc`).
WAIT_LOCK = ".dvc-wait.lock"
LOCK_POLL_S = 0.2


@dataclass(frozen=True)
class TrackedFolder:
    path: str  # relative to $MLOPS_HOME
    md5: str
    size: int
    nfiles: int


def remote_url(settings: Settings) -> str:
    return settings.dvc_remote_url


@contextmanager
def _wait_for_repository(settings: Settings) -> Iterator[None]:
    """Hold the installation's DVC repository for one operation, waiting up to `dvc_lock_wait_s` while
    another operation of the pipeline holds it (an fcntl lock: the kernel releases it when its holder dies,
    so a killed task never leaves it stuck)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    path = settings.home / WAIT_LOCK
    started = time.monotonic()
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= settings.dvc_lock_wait_s:
                    raise _busy(settings, path, waited) from None
                time.sleep(min(LOCK_POLL_S, settings.dvc_lock_wait_s - waited))
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _busy(settings: Settings, path: Path, waited: float) -> LockTimeoutError:
    return LockTimeoutError(
        f"the DVC repository {settings.home} stayed busy: another DVC operation (gold versioning, a "
        f"training-set build or a promotion) held {path} for the {waited:.0f} s this one may wait "
        f"(MLOPS_DVC_LOCK_WAIT_S={settings.dvc_lock_wait_s:g}). The task retries by itself; if it keeps "
        f"failing, find the process that holds it (`fuser {path}`) or raise MLOPS_DVC_LOCK_WAIT_S."
    )


@contextmanager
def _repo(settings: Settings) -> Iterator[Repo]:
    """The installation's DVC repository, opened in this process once no other operation holds it (a bounded
    wait, `_wait_for_repository`); made, and configured with the linked cache and the profile's remote as
    default, where it is not yet (the configuration is written only when it differs). DVC's errors become
    PipelineError, except a lock DVC could not get: LockTimeoutError, retryable."""
    from dvc.exceptions import DvcException
    from dvc.lock import LockError
    from dvc.repo import Repo

    # Importing dvc installs INFO handlers on stdout; its messages would mix with a command's --json output.
    logging.getLogger("dvc").setLevel(logging.WARNING)
    url = remote_url(settings)
    if url == str(settings.dvc_remote):
        settings.dvc_remote.mkdir(parents=True, exist_ok=True)
    try:
        with _wait_for_repository(settings):
            if not (settings.home / ".dvc").is_dir():
                Repo.init(str(settings.home), no_scm=True).close()
            repo = Repo(str(settings.home))
            try:
                if not _configured(repo, url):
                    with repo.config.edit("repo") as config:
                        config["core"]["analytics"] = False
                        config["core"]["remote"] = REMOTE_NAME
                        config["cache"]["type"] = CACHE_TYPES
                        config["remote"][REMOTE_NAME] = {**config["remote"].get(REMOTE_NAME, {}), "url": url}
                    repo.close()
                    # The cache reads its link types when the repository opens.
                    repo = Repo(str(settings.home))
                yield repo
            finally:
                repo.close()
    except LockError as exc:
        lock = settings.home / ".dvc" / "tmp" / "lock"
        raise LockTimeoutError(
            f"DVC's own lock of the repository {settings.home} ({lock}) is held by a process outside the "
            f"pipeline, such as a `dvc` command run by hand ({exc}). The task retries by itself; if it keeps "
            "failing, wait for that process or end it."
        ) from exc
    except DvcException as exc:
        raise PipelineError(f"DVC failed in the repository {settings.home}: {exc}") from exc


def _configured(repo: Repo, url: str) -> bool:
    current = repo.config.read("repo")
    return (
        str(current["core"].get("analytics")).lower() == "false"
        and current["core"].get("remote") == REMOTE_NAME
        and current["cache"].get("type") == CACHE_TYPES
        and current["remote"].get(REMOTE_NAME, {}).get("url") == url
    )


def ensure_repo(settings: Settings) -> None:
    """Make $MLOPS_HOME a DVC repository with the linked cache and the profile's remote (idempotent)."""
    with _repo(settings):
        pass


def track(settings: Settings, name: str, folder: Path) -> TrackedFolder:
    """Hash `folder` into the DVC cache, push it to the remote, and return its version."""
    return track_many(settings, [(name, folder)])[0]


def track_many(settings: Settings, folders: list[tuple[str, Path]]) -> list[TrackedFolder]:
    """Version several folders at once, each `(name, folder)` with its `.dvc` file at `datasets/<name>.dvc`:
    all are committed to the cache in one DVC session and pushed in one transfer. Returns their versions in
    order."""
    missing = [str(folder) for _, folder in folders if not folder.is_dir()]
    if missing:
        raise PipelineError(f"cannot version {', '.join(missing)}: not a folder (was the step before run?)")
    stages = []
    for name, folder in folders:
        stage = settings.home / "datasets" / f"{name}.dvc"
        stage.parent.mkdir(parents=True, exist_ok=True)
        # `hash: md5` says the output is DVC 3's plain md5; without it DVC takes the entry for a 2.x one and
        # hashes every file twice (the legacy text-normalizing md5 first).
        out = {"path": os.path.relpath(folder, stage.parent), "hash": "md5"}
        stage.write_text(yaml.safe_dump({"outs": [out]}))
        stages.append(stage)
    from dvc.repo import lock_repo

    # One hold of the repository's lock for all commits and the push (what each DVC command takes for
    # itself): no other DVC process comes in between, and DVC's state database is closed (synced) once.
    with _repo(settings) as repo, lock_repo(repo):
        outs = [repo.commit(str(stage), force=True)[0].outs[0] for stage in stages]
        _push(repo, [out.hash_info for out in outs])
    return [
        TrackedFolder(
            path=str(folder.relative_to(settings.home)),
            md5=out.hash_info.value,
            size=out.meta.size,
            nfiles=out.meta.nfiles,
        )
        for (_, folder), out in zip(folders, outs, strict=True)
    ]


def _push(repo: Repo, objects: list) -> None:
    """What `dvc push` does for these objects (directory listings and every file in them, `.dir` last, only
    what the remote lacks), except that objects may be hard-linked into a remote on the cache's filesystem
    (`dvc push` only reflinks or copies). No remote index: it lists every `.dir` ever pushed and checks each
    on every push, a cost that grows with the history, to save existence checks of this push's few objects."""
    cache = repo.cache.local
    remote = repo.cloud.get_remote_odb(None, "push")
    result = repo.cloud.transfer(cache, remote, objects, hardlink=True, shallow=False, cache_odb=cache)
    if result.failed:
        raise PipelineError(
            f"{len(result.failed)} objects were not pushed to the DVC remote {remote.path} "
            f"(e.g. {sorted(h.value for h in result.failed)[:3]}); the cache in {repo.root_dir} holds them: "
            "check the remote is writable and version again"
        )


def record_revision(settings: Settings, members: dict[str, TrackedFolder]) -> str:
    """A revision id for a set of tracked folders (a content hash of their hashes), kept with its members."""
    canonical = json.dumps({k: asdict(v) for k, v in sorted(members.items())}, sort_keys=True)
    rev = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    manifest = settings.home / "datasets" / "revisions" / f"{rev}.json"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(canonical + "\n")
    return rev


def revision_manifest(settings: Settings, rev: str) -> dict[str, dict]:
    """The members of revision `rev` (name -> its TrackedFolder fields), as `record_revision` wrote them."""
    manifest = settings.home / "datasets" / "revisions" / f"{rev}.json"
    if not manifest.is_file():
        raise PipelineError(
            f"unknown dataset revision {rev!r}: no manifest at {manifest}. The revision comes from the "
            "training_set task of the same DAG run; in a pod, check that MLOPS_HOME is the shared volume "
            "that task wrote to"
        )
    return json.loads(manifest.read_text())


def revision_files(settings: Settings, rev: str) -> dict[str, dict[str, Path]]:
    """Every file of revision `rev`, read in place from the DVC remote by content hash, without a DVC
    repository and without writing anything: member name -> {path inside the folder: object file}. The
    object files are the data (read them; never write them). Needs the remote to be a folder (the local
    profile's, or the shared volume's on Kubernetes); a remote in object storage goes through `fetch`."""
    from dvc_data.hashfile.db.local import LocalHashFileDB
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree
    from dvc_objects.fs.local import LocalFileSystem

    url = remote_url(settings)
    if "://" in url:
        raise PipelineError(
            f"revision {rev!r}: the DVC remote {url} is not a folder; reading a revision in place needs the "
            "remote on a mounted filesystem (infra/README.md, Storage). Use pipelines.versioning.fetch, "
            "which needs `dvc` with the remote's plugin and a writable MLOPS_HOME"
        )
    # DVC 3 keeps its md5 objects under files/md5/ of the remote (the 2.x layout had no prefix).
    odb = LocalHashFileDB(LocalFileSystem(), os.path.join(url, "files", "md5"))
    members: dict[str, dict[str, Path]] = {}
    for name, member in revision_manifest(settings, rev).items():
        listing = Path(odb.oid_to_path(member["md5"]))
        if not listing.is_file():
            raise PipelineError(
                f"revision {rev!r}: member {name!r} ({member['path']}) has no listing {listing} in the DVC "
                f"remote {url}: the remote lost objects or is not the one this revision was pushed to"
            )
        files: dict[str, Path] = {}
        for key, _meta, hash_info in Tree.load(odb, HashInfo("md5", member["md5"])):
            assert hash_info is not None and hash_info.value is not None
            path = Path(odb.oid_to_path(hash_info.value))
            if not path.is_file():
                raise PipelineError(
                    f"revision {rev!r}: file {'/'.join(key)} of {member['path']} is missing from the DVC "
                    f"remote {url} (object {path})"
                )
            files["/".join(key)] = path
        members[name] = files
    return members


def fetch(settings: Settings, rev: str, destination: Path) -> dict[str, Path]:
    """Restore every folder of revision `rev` from the DVC remote under `destination` (inside
    $MLOPS_HOME), by content hash; returns where each member landed."""
    restored, stages = {}, []
    for name, member in revision_manifest(settings, rev).items():
        target = destination / name
        stage = settings.home / "datasets" / "_fetch" / f"{member['md5'].removesuffix('.dir')}.dvc"
        stage.parent.mkdir(parents=True, exist_ok=True)
        out = {"path": os.path.relpath(target, stage.parent), "md5": member["md5"], "hash": "md5"}
        stage.write_text(yaml.safe_dump({"outs": [out]}))
        stages.append(str(stage))
        restored[name] = target
    with _repo(settings) as repo:
        repo.pull(targets=stages)
    return restored


def revisions_with_member(settings: Settings, member: str) -> set[str]:
    """The dataset revisions (their manifests under datasets/revisions/) with a member of that name."""
    folder = settings.home / "datasets" / "revisions"
    return {p.stem for p in folder.glob("*.json") if member in json.loads(p.read_text())}


def revisions_holding(settings: Settings, column: str, values: set[str]) -> dict[str, list[str]]:
    """Each dataset revision of this installation (gold dates, training sets: their manifests under
    datasets/revisions/) with a member whose Parquet files hold one of `values` in `column`: revision -> those
    members, oldest manifest first. Read in place in the DVC remote, that one column only, each object once
    however many revisions share it. A revision whose objects the remote lost is a PipelineError naming it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = settings.home / "datasets" / "revisions"
    manifests = sorted(folder.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name)) if values else []
    wanted = list(values)
    seen: dict[Path, bool] = {}

    def holds(path: Path) -> bool:
        if path not in seen:
            held = False
            if column in pq.read_schema(path).names:
                read = pq.read_table(path, columns=[column]).column(column)
                held = bool(pc.any(pc.is_in(read, value_set=pa.array(wanted, pa.string()))).as_py())
            seen[path] = held
        return seen[path]

    found: dict[str, list[str]] = {}
    for manifest in manifests:
        rev = manifest.stem
        members = revision_files(settings, rev)
        holding = [
            name
            for name, files in sorted(members.items())
            if any(holds(path) for key, path in files.items() if key.endswith(".parquet"))
        ]
        if holding:
            found[rev] = holding
    return found
