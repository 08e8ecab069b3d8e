"""Dataset versioning on the real DVC: the cache and the local remote link files instead of copying them,
a rerun of a date replaces its files without touching older versions, any revision comes back by hash, and
the stock `dvc` command reads what the pipeline wrote."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import yaml

from core.errors import LockTimeoutError, PipelineError
from core.settings import Settings
from pipelines.versioning import (
    CACHE_TYPES,
    TrackedFolder,
    fetch,
    record_revision,
    revision_files,
    track,
    track_many,
)
from tests.conftest import wait_for

DAY = "2026-01-07"


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home")


def _partition(settings: Settings, table: str) -> Path:
    return settings.lake / "gold" / table / f"event_date={DAY}"


def _write(folder: Path, seed: int) -> dict[str, bytes]:
    """A partition of two files, written as Spark does on a rerun: the old folder goes, new files come."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    contents = {f"part-{i:05d}.parquet": f"seed {seed} file {i} ".encode() * (1000 + i) for i in range(2)}
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    return contents


def _object(root: Path, data: bytes) -> Path:
    md5 = hashlib.md5(data).hexdigest()
    return root / "files" / "md5" / md5[:2] / md5[2:]


def _dvc(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=settings.home, capture_output=True, text=True, check=True
    )


def _assert_cache_intact(settings: Settings) -> None:
    """Every cache object still hashes to its name (a write through a hard link would break this)."""
    objects = [p for p in (settings.home / ".dvc" / "cache" / "files" / "md5").rglob("*") if p.is_file()]
    assert objects
    for path in objects:
        assert hashlib.md5(path.read_bytes()).hexdigest() == path.parent.name + path.name.removesuffix(".dir")


def test_files_are_linked_into_the_cache_and_the_remote_not_copied(settings):
    folders = {table: _partition(settings, table) for table in ("customer_features", "merchant_features")}
    contents = {table: _write(folder, seed=i) for i, (table, folder) in enumerate(folders.items())}
    members = track_many(settings, [(f"gold/{table}/event_date={DAY}", f) for table, f in folders.items()])

    cache, remote = settings.home / ".dvc" / "cache", settings.dvc_remote
    for member, (table, folder) in zip(members, folders.items(), strict=True):
        stage = yaml.safe_load(
            (settings.home / "datasets" / "gold" / table / f"event_date={DAY}.dvc").read_text()
        )
        assert stage["outs"][0]["md5"] == member.md5 and stage["outs"][0]["hash"] == "md5"
        assert (member.nfiles, member.size) == (2, sum(len(d) for d in contents[table].values()))
        assert (cache / "files" / "md5" / member.md5[:2] / member.md5[2:]).is_file()
        assert (remote / "files" / "md5" / member.md5[:2] / member.md5[2:]).is_file()
        for name, data in contents[table].items():
            workspace = folder / name
            assert workspace.read_bytes() == data
            assert workspace.samefile(_object(cache, data)) and workspace.samefile(_object(remote, data))
            assert stat.S_IMODE(workspace.stat().st_mode) & 0o222 == 0, "DVC leaves linked files read-only"
    assert _dvc(settings, "config", "cache.type").stdout.strip() == CACHE_TYPES


def test_the_same_content_gives_the_same_version_without_rewriting_the_configuration(settings):
    folder = _partition(settings, "customer_features")
    _write(folder, seed=1)
    first = track(settings, "gold/customer_features", folder)
    config = settings.home / ".dvc" / "config"
    written = config.stat().st_mtime_ns
    assert track(settings, "gold/customer_features", folder) == first
    assert config.stat().st_mtime_ns == written


def test_a_rerun_of_a_date_replaces_its_files_and_every_revision_comes_back(settings):
    folder = _partition(settings, "customer_features")
    old = _write(folder, seed=1)
    first = record_revision(
        settings, {"customer_features": track(settings, "gold/customer_features", folder)}
    )
    new = _write(folder, seed=2)  # the linked, read-only files are deleted and written anew
    second = record_revision(
        settings, {"customer_features": track(settings, "gold/customer_features", folder)}
    )
    assert first != second

    for rev, contents in ((first, old), (second, new)):
        restored = fetch(settings, rev, settings.home / "restore" / rev)["customer_features"]
        assert {p.name: p.read_bytes() for p in restored.iterdir()} == contents
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == new
    _assert_cache_intact(settings)


def test_the_dvc_command_restores_a_version_from_the_remote_alone(settings):
    folder = _partition(settings, "merchant_features")
    contents = _write(folder, seed=3)
    member = track(settings, "gold/merchant_features", folder)
    shutil.rmtree(folder)
    shutil.rmtree(settings.home / ".dvc" / "cache")

    _dvc(settings, "pull", "datasets/gold/merchant_features.dvc")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == contents
    assert "up to date" in _dvc(settings, "status", "datasets/gold/merchant_features.dvc").stdout
    rev = record_revision(settings, {"merchant_features": member})
    shutil.rmtree(settings.home / ".dvc" / "cache")
    restored = fetch(settings, rev, settings.home / "restore")["merchant_features"]
    assert {p.name: p.read_bytes() for p in restored.iterdir()} == contents


def test_a_revision_reads_in_place_from_a_read_only_remote_as_dvc_pull_restores_it(settings):
    """What the training pod does (its mount is read-only: tests/integration/test_training_pod_podman.py):
    no DVC repository opened, nothing written. Contract
    test of the in-place reader against DVC's own pull of the same revision, older versions included."""
    folder = _partition(settings, "customer_features")
    nested = folder / "sub"
    old = _write(folder, seed=4)
    nested.mkdir()
    (nested / "deep.bin").write_bytes(b"nested " * 300)
    old["sub/deep.bin"] = b"nested " * 300
    first = record_revision(settings, {"t": track(settings, "gold/t", folder)})
    new = _write(folder, seed=5)
    second = record_revision(settings, {"t": track(settings, "gold/t", folder)})

    pulled = {rev: fetch(settings, rev, settings.home / "restore" / rev)["t"] for rev in (first, second)}
    shutil.rmtree(settings.home / ".dvc")  # no repository, no cache: the remote alone
    shutil.rmtree(settings.lake)
    before = sorted(settings.home.rglob("*"))
    for rev, contents in ((first, old), (second, new)):
        files = revision_files(settings, rev)["t"]
        assert {key: path.read_bytes() for key, path in files.items()} == contents
        restored = {
            str(p.relative_to(pulled[rev])): p.read_bytes() for p in pulled[rev].rglob("*") if p.is_file()
        }
        assert restored == contents
    with pytest.raises(PipelineError, match="unknown dataset revision 'f00d'"):
        revision_files(settings, "f00d")
    assert sorted(settings.home.rglob("*")) == before  # nothing written (the pod's mount is read-only)
    # An object the remote lost is named, not read as an empty file.
    victim = next(iter(revision_files(settings, second)["t"].values()))
    victim.unlink()
    with pytest.raises(PipelineError, match="missing from the DVC remote"):
        revision_files(settings, second)


def test_versions_made_with_the_dvc_commands_before_stay_fetchable(settings):
    """An installation versioned by the earlier `dvc` commands (copying cache, no `hash` field) upgrades."""
    settings.home.mkdir(parents=True)
    _dvc(settings, "init", "--no-scm", "-q")
    _dvc(settings, "remote", "add", "--default", "--force", "storage", str(settings.dvc_remote))
    folder = _partition(settings, "customer_features")
    old = _write(folder, seed=4)
    stage = settings.home / "datasets" / "old.dvc"
    stage.parent.mkdir(parents=True)
    stage.write_text(yaml.safe_dump({"outs": [{"path": os.path.relpath(folder, stage.parent)}]}))
    _dvc(settings, "commit", "--force", "-q", "datasets/old.dvc")
    _dvc(settings, "push", "-q", "datasets/old.dvc")
    out = yaml.safe_load(stage.read_text())["outs"][0]
    before = record_revision(
        settings,
        {"t": TrackedFolder(str(folder.relative_to(settings.home)), out["md5"], out["size"], out["nfiles"])},
    )

    new = _write(folder, seed=5)
    after = record_revision(settings, {"t": track(settings, "gold/customer_features", folder)})
    shutil.rmtree(settings.home / ".dvc" / "cache")
    for rev, contents in ((before, old), (after, new)):
        restored = fetch(settings, rev, settings.home / "restore" / rev)["t"]
        assert {p.name: p.read_bytes() for p in restored.iterdir()} == contents


def test_a_remote_on_another_filesystem_gets_copies(settings, tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test's")
    elsewhere = Path(tempfile.mkdtemp(dir=shm, prefix="mlops-remote-"))
    try:
        settings.home.mkdir(parents=True)
        settings.dvc_remote.symlink_to(elsewhere, target_is_directory=True)
        folder = _partition(settings, "customer_features")
        contents = _write(folder, seed=6)
        track(settings, "gold/customer_features", folder)
        for name, data in contents.items():
            copy = _object(elsewhere, data)
            assert copy.read_bytes() == data and not copy.samefile(folder / name)
    finally:
        shutil.rmtree(elsewhere)


def test_a_missing_folder_is_refused_by_name(settings):
    missing = _partition(settings, "customer_features")
    with pytest.raises(PipelineError, match=f"cannot version {missing}"):
        track(settings, "gold/customer_features", missing)


def test_rewriting_a_training_set_keeps_the_earlier_revision(settings, monkeypatch):
    """The training set's files are hard links to cache objects once versioned: a rebuild of the same
    as-of date must replace them, not write through them into the earlier revision."""
    from training import dataset

    def frame(rows: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "transaction_id": [f"t{i}" for i in range(rows)],
                "event_timestamp": pd.date_range("2026-01-01", periods=rows, freq="h", tz="UTC"),
                dataset.LABEL: [i % 2 for i in range(rows)],
                dataset.SPLIT: [dataset.SPLITS[i % 3] for i in range(rows)],
            }
        )

    revs = {}
    for rows, window in ((6, 30), (9, 7)):
        monkeypatch.setattr(
            dataset,
            "build_training_table",
            lambda *_a, rows=rows, **_k: (pa.Table.from_pandas(frame(rows)), {}),
        )
        record = dataset.write_training_set(settings, date(2026, 1, 10), window_days=window)
        revs[rows] = (record["training_set_rev"], window)
    assert len({rev for rev, _ in revs.values()}) == 2
    for rows, (rev, window) in revs.items():
        restored = dataset.read_training_set(settings, rev)
        assert restored["transaction_id"].tolist() == frame(rows)["transaction_id"].tolist()
        assert restored.attrs["window_days"] == window
        holdout = dataset.read_training_set(settings, rev, "holdout", [dataset.LABEL, dataset.WEIGHT])
        assert list(holdout.columns) == [dataset.LABEL]  # no weight column in this set: not asked for
        assert holdout[dataset.LABEL].tolist() == [i % 2 for i in range(rows) if i % 3 == 2]
    _assert_cache_intact(settings)


def test_reproduce_trains_on_the_recorded_copy_when_the_lake_cannot_give_the_window(settings, monkeypatch):
    """A reproduce pod mounts the lake read-only: when the window's feature rows would have to be written
    first (or the lake's retention took the window), the rebuild is not compared and says why, and the
    version's recorded DVC copy is what it trains on; when the lake gives the same rows, the hashes agree."""
    import errno

    from training import dataset
    from training.reproduce import rebuild_training_set

    table = pa.table(
        {
            "transaction_id": [f"t{i}" for i in range(6)],
            "event_timestamp": pa.array(pd.date_range("2026-01-01", periods=6, freq="h", tz="UTC")),
            dataset.LABEL: [i % 2 for i in range(6)],
            dataset.SPLIT: [dataset.SPLITS[i % 3] for i in range(6)],
        }
    )
    monkeypatch.setattr(dataset, "build_training_table", lambda *_a, **_k: (table, {}))
    record = dataset.write_training_set(settings, date(2026, 1, 10), window_days=30)
    made = {"training_set_rev": record["training_set_rev"], "model_version": "3"}
    same = rebuild_training_set(settings, made, settings.home.parent / "scratch-same")
    assert same["hash_equal"] and same["rebuilt_md5"] == same["recorded_md5"], same

    for why, failure in (
        ("Read-only file system", OSError(errno.EROFS, "Read-only file system", "lake/training_rows")),
        ("no silver transactions", dataset.NothingToTrainError("no silver transactions arrived ...")),
    ):

        def fail(*_a, failure=failure, **_k):
            raise failure

        monkeypatch.setattr(dataset, "build_training_table", fail)
        found = rebuild_training_set(settings, made, settings.home.parent / "scratch-gone")
        assert not found["hash_equal"] and found["rebuilt_md5"] is None, found
        assert why in found["lake_unusable"] and found["recorded_md5"] == same["recorded_md5"]


# Another process holds the DVC repository: through the pipeline's own way in (`_repo`, as version_gold,
# the training set and promotion do), or by DVC's lock alone (as a `dvc` command run by hand does).
HOLDER = """
import sys, time
from pathlib import Path
from dvc.repo import Repo, lock_repo
from core.settings import Settings
from pipelines.versioning import _repo

home, ready, leaving = map(Path, sys.argv[1:4])
seconds, how = float(sys.argv[4]), sys.argv[5]
with (_repo(Settings(home=home)) if how == "pipeline" else Repo(str(home))) as repo, lock_repo(repo):
    ready.touch()
    time.sleep(seconds)
    leaving.touch()
"""


@contextlib.contextmanager
def _held(settings: Settings, tmp_path: Path, seconds: float, how: str = "pipeline") -> Iterator[Path]:
    """Hold the repository in another process for `seconds`; yields the file it writes just before it lets
    go."""
    ready, leaving = tmp_path / "ready", tmp_path / "leaving"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(settings.home), str(ready), str(leaving), str(seconds), how],
        cwd=Path(__file__).resolve().parents[2],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: ready.exists() or holder.poll() is not None, 120, "the holder to take the lock")
        assert ready.exists(), holder.communicate()[1][-2000:]
        yield leaving
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_dvc_operation_waits_while_another_process_holds_the_repository(settings, tmp_path):
    folder = _partition(settings, "customer_features")
    _write(folder, seed=7)
    with _held(settings, tmp_path, seconds=5) as leaving:  # longer than DVC's own 3 s
        member = track(settings, "gold/customer_features", folder)
        assert leaving.exists(), "the operation ran while the other process still held the repository"
    restored = fetch(settings, record_revision(settings, {"t": member}), settings.home / "restore")["t"]
    assert {p.name for p in restored.iterdir()} == {p.name for p in folder.iterdir()}


def test_a_wait_past_its_limit_is_a_retryable_error_naming_the_lock(tmp_path):
    from orchestration.tasks import fail_fast_on_bad_data

    settings = Settings(home=tmp_path / "home", dvc_lock_wait_s=0.5)
    folder = _partition(settings, "customer_features")
    _write(folder, seed=8)
    with (
        _held(settings, tmp_path, seconds=120),
        pytest.raises(LockTimeoutError, match=r"MLOPS_DVC_LOCK_WAIT_S=0\.5") as caught,
    ):
        fail_fast_on_bad_data(lambda: track(settings, "gold/customer_features", folder))
    assert str(settings.home / ".dvc-wait.lock") in str(caught.value)
    assert not isinstance(caught.value, PipelineError), (
        "a busy repository is not bad data: Airflow retries it"
    )


def test_dvcs_own_lock_held_outside_the_pipeline_is_a_retryable_error(settings, tmp_path):
    folder = _partition(settings, "customer_features")
    _write(folder, seed=9)
    track(settings, "gold/customer_features", folder)  # makes the repository
    with (
        _held(settings, tmp_path, seconds=120, how="dvc"),
        pytest.raises(LockTimeoutError, match=r"\.dvc/tmp/lock"),
    ):
        track(settings, "gold/customer_features", folder)


def test_the_revisions_that_hold_a_customer_and_the_versions_trained_on_them_are_named(settings):
    """An erasure's `held_by` (mlops/chain.py): every revision whose Parquet files name the customer, by
    member, read in the remote (a member without the column, a file that is not Parquet, and a revision
    without them are not named); then the registry's versions whose training set is one of those."""
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    from pipelines.versioning import revisions_holding
    from training.registry import ModelRegistry

    def version_of(name: str, tables: dict[str, pa.Table]) -> str:
        folders = []
        for member, table in tables.items():
            folder = settings.home / name / member
            folder.mkdir(parents=True)
            pq.write_table(table, folder / "part-00000.parquet")
            (folder / "notes.json").write_text('{"customer_id": "p-who"}')  # not Parquet: not read
            folders.append((f"{name}/{member}", folder))
        return record_revision(settings, dict(zip(tables, track_many(settings, folders), strict=True)))

    theirs = pa.table({"customer_id": ["p-a", "p-who"], "amount": [1.0, 2.0]})
    others = pa.table({"customer_id": ["p-a", "p-b"], "amount": [1.0, 2.0]})
    merchants = pa.table({"merchant_id": ["p-who"], "count": [3]})  # no customer column: not read
    held = version_of("old", {"customers": theirs, "merchants": merchants})
    clean = version_of("new", {"customers": others, "merchants": merchants})
    training_set = version_of("set", {"training_set": theirs})

    found = revisions_holding(settings, "customer_id", {"p-who"})
    assert found == {held: ["customers"], training_set: ["training_set"]}
    assert clean not in found and revisions_holding(settings, "customer_id", {"p-nobody"}) == {}

    # Two registered versions, one trained on the set that holds them (MLflow's own client records them).
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    # registry_uri too: unset, MLflow takes the process's global one, which an earlier test may have set
    client = MlflowClient(
        tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri
    )
    client.create_registered_model(registry.name)
    for rev in (clean, training_set):
        run = client.create_run(client.create_experiment(f"e-{rev}"))
        client.create_model_version(
            registry.name, f"runs:/{run.info.run_id}/model", run.info.run_id,
            tags={"lineage.training_set_rev": rev},
        )  # fmt: skip
    client.set_registered_model_alias(registry.name, "champion", "2")
    (model,) = registry.trained_on(set(found))
    assert (model["version"], model["training_set_rev"], model["aliases"]) == (
        "2",
        training_set,
        ["champion"],
    )


def test_where_mlflow_cannot_be_imported_the_erasure_names_the_revisions_and_says_why_not_the_versions(
    settings, monkeypatch
):
    """The erase_customer DAG's task runs in the Airflow image, which carries no MLflow."""
    import sys

    import pyarrow.parquet as pq

    from mlops.chain import held_by

    folder = settings.home / "set" / "training_set"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"customer_id": ["p-who"]}), folder / "part-00000.parquet")
    rev = record_revision(settings, {"training_set": track(settings, "set/training_set", folder)})
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError, as in that image
    held = held_by(settings, {"p-who"})
    assert held["dataset_revisions"] == {rev: ["training_set"]} and held["model_versions"] is None
    assert "the model registry cannot be read here" in held["not_read"]
