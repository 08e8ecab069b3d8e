"""`mlops reproduce <version>`: rebuild a registered model version from what it recorded, and say how close
the rebuild came (docs/lineage.md, "Reproducing a version").

1. Resolve the version: its run, the commit and image it was trained from (`lineage.*` tags; the image's
   digest where the cluster recorded one), its training set's DVC revision and as-of date, its training
   configuration (`train.*` parameters: tuned hyperparameters and the seed among them).
2. Refuse, before any work, when this checkout is not that commit, or when the retrain's identity (code with
   any uncommitted change, configuration, image, training_set: training/steps.py retrain_identity) differs.
3. Rebuild the training set from the lake, as of the same date with the same window and sampling (its
   versioned metadata), into a scratch folder, and compare its DVC hash with the recorded member's: equal
   means the lake still holds the same data (later arrivals do not change a point-in-time set; a retention,
   an erasure or a re-delivery of a date in its window does). When they differ, the DVC copy the version
   recorded is what is left of its data: the rebuild goes on from it, and the record says so
   (`training_set.source`, the reason).
4. Retrain on the recorded revision with the recorded configuration and a fresh checkpoint folder, evaluate
   it on the same holdout, and compare each holdout metric with the registered run's within `tolerance`. A
   recorded revision the DVC remote no longer holds (its retention) stops it, naming the revision.

The rebuilt run stays in MLflow (tagged `reproduce.of_version`), never registered; the scratch folder is
removed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import tempfile
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from core.errors import PipelineError

if TYPE_CHECKING:
    from core.settings import Settings
    from training.loop import TrainConfig

# The holdout metrics compared, each within the tolerance (absolute): the gate's and the monitoring's.
COMPARED = ("holdout_auc_pr", "holdout_roc_auc", "holdout_recall_at_1pct_fpr")
DEFAULT_TOLERANCE = 0.02


class ReproduceError(PipelineError):
    """The version cannot be reproduced here: the message says why and what to do."""


def _config(params: dict[str, str]) -> TrainConfig:
    """The TrainConfig the run logged as `train.<field>` parameters (MLflow keeps them as strings)."""
    from training.loop import TrainConfig

    hints = get_type_hints(TrainConfig)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(TrainConfig):
        raw = params.get(f"train.{field.name}")
        if raw is None:
            continue  # a field added since: its default
        values[field.name] = raw if hints[field.name] is str else ast.literal_eval(raw)
    if isinstance(values.get("hidden"), list):
        values["hidden"] = tuple(values["hidden"])
    return TrainConfig(**values)


def resolve(settings: Settings, version: str) -> dict[str, Any]:
    """What version `version` was made from, as its registry entry and run recorded it."""
    from training.registry import ModelRegistry

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    try:
        found = registry.version(version)
    except LookupError as exc:
        raise ReproduceError(str(exc)) from exc
    if not found.run_id:
        raise ReproduceError(
            f"v{version} was not registered from a training run: nothing records how it was made"
        )
    run = registry.client.get_run(found.run_id)
    tags = run.data.tags
    missing = [
        t for t in ("lineage.training_set_rev", "lineage.git_commit", "lineage.as_of") if t not in tags
    ]
    if missing:
        raise ReproduceError(
            f"v{version}'s run {found.run_id} lacks {', '.join(missing)}: it cannot be rebuilt"
        )
    return {
        "model_version": str(version),
        "run_id": found.run_id,
        "git_commit": tags["lineage.git_commit"],
        "image": tags.get("lineage.image", ""),
        "image_digest": tags.get("lineage.image_digest"),
        "image_id": tags.get("lineage.image_id"),
        "training_set_rev": tags["lineage.training_set_rev"],
        "as_of": tags["lineage.as_of"],
        "retrain_key": tags.get("lineage.retrain_key", ""),
        "tuning_source": tags.get("tuning.source", "settings"),
        "config": _config(run.data.params),
        "metrics": {k: run.data.metrics[k] for k in COMPARED if k in run.data.metrics},
    }


def image_by_digest(made: dict[str, Any]) -> str:
    """The image the version was trained in, by digest (`repository@sha256:...`): what a reproduce pod runs,
    since a tag can be pushed again with other contents. The node's own report of the image where the version
    recorded it (`lineage.image_id`), else the recorded image's repository with its digest. A version the
    local runner trained has neither: a ReproduceError says what to run instead."""
    reference = str(made.get("image_id") or "").split("://", 1)[-1]  # docker-pullable://repo@sha256:...
    if "@sha256:" in reference:
        return reference
    if not made.get("image_digest"):
        raise ReproduceError(
            f"v{made['model_version']} recorded no image digest (its image: {made['image'] or 'none'}): it "
            f"was not trained in a pod; rebuild it from a checkout of commit {made['git_commit']} with "
            f"`mlops reproduce {made['model_version']}`"
        )
    name, _, tag = made["image"].rpartition(":")
    repository = name if name and "/" not in tag else made["image"]
    return f"{repository}@{made['image_digest']}"


def check_checkout(settings: Settings, made: dict[str, Any]) -> None:
    """Refuse when this checkout (or image) would not train the same way: another commit, uncommitted
    changes to code, another image or configuration than the version's retrain identity."""
    from training.steps import retrain_identity, retrain_key
    from training.tracking import code_identity, git_commit

    here = git_commit()
    if here != made["git_commit"]:
        raise ReproduceError(
            f"v{made['model_version']} was trained from commit {made['git_commit']}, and this checkout is at "
            f"{here}: check out that commit (`git worktree add ../v{made['model_version']} "
            f"{made['git_commit']}`) and run `mlops reproduce {made['model_version']}` there"
        )
    identity = retrain_identity(settings, made["training_set_rev"], made["config"])
    if made["retrain_key"] and retrain_key(identity) != made["retrain_key"]:
        code = code_identity()
        why = (
            f"the checkout has uncommitted changes ({code}): commit or stash them"
            if code != here
            else f"the image differs ({identity['image']} here, {made['image']} recorded)"
            if identity["image"] != made["image"]
            else "its configuration or image differs from the recorded one"
        )
        raise ReproduceError(f"v{made['model_version']} cannot be rebuilt as it was made: {why}")


def _folder_hash(folder: Path) -> str:
    """DVC's md5 of a folder (its `.dir` listing's), with DVC's own object layer, nothing committed."""
    import tempfile

    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db.local import LocalHashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    with tempfile.TemporaryDirectory() as scratch:
        odb = LocalHashFileDB(LocalFileSystem(), scratch)
        _, _, tree = build(odb, str(folder), odb.fs, "md5")
        assert tree.hash_info.value is not None
        return tree.hash_info.value


def rebuild_training_set(settings: Settings, made: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """The training set as of the version's date, rebuilt from the lake with its recorded window and sampling
    into `scratch`, and its DVC hash against the recorded one."""
    from pipelines.versioning import revision_files, revision_manifest
    from training.dataset import (
        METADATA_FILE,
        TRAINING_SET_MEMBER,
        NothingToTrainError,
        as_written,
        build_training_table,
        training_set_metadata,
        write_training_folder,
    )

    rev = made["training_set_rev"]
    try:
        recorded = revision_manifest(settings, rev)[TRAINING_SET_MEMBER]
        metadata = json.loads(revision_files(settings, rev)[TRAINING_SET_MEMBER][METADATA_FILE].read_text())
    except PipelineError as exc:
        raise ReproduceError(
            f"the training set {rev} of v{made['model_version']} is no longer whole in the DVC remote (its "
            "retention, MLOPS_RETENTION__DATASET_DAYS, or a deletion by hand): nothing to rebuild from "
            f"({exc})"
        ) from exc
    day = date.fromisoformat(metadata["as_of"])
    try:
        table, sampling = build_training_table(
            settings,
            day,
            metadata["window_days"],
            metadata["label_maturity_days"],
            max_fit_rows=metadata.get("max_fit_rows"),
        )
    except (NothingToTrainError, OSError) as exc:
        # The lake cannot give the window any more (its retention took it), or not here: feature rows a date
        # lacks would have to be written first, and a reproduce pod mounts the lake read-only. The recorded
        # copy is what the version learnt from either way; the record says why the lake was not compared.
        return {
            "as_of": day.isoformat(),
            "rows": None,
            "recorded_md5": recorded["md5"],
            "rebuilt_md5": None,
            "hash_equal": False,
            "lake_unusable": f"{type(exc).__name__}: {exc}",
        }
    metadata_written = training_set_metadata(
        metadata["window_days"], metadata["label_maturity_days"], sampling
    )
    write_training_folder(scratch, day, as_written(table), metadata_written)
    found = _folder_hash(scratch)
    return {
        "as_of": day.isoformat(),
        "rows": table.num_rows,
        "recorded_md5": recorded["md5"],
        "rebuilt_md5": found,
        "hash_equal": found == recorded["md5"],
    }


def reproduce(settings: Settings, version: str, tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """Resolve, check, rebuild the training set and retrain version `version`; the comparison."""
    import mlflow

    from training import steps

    made = resolve(settings, version)
    check_checkout(settings, made)
    # Scratch outside MLOPS_HOME: a reproduce pod mounts the shared filesystem read-only.
    work = Path(tempfile.mkdtemp(prefix=f"reproduce-v{version}-"))
    try:
        data = rebuild_training_set(settings, made, work / "training_set")
        record: dict[str, Any] = {
            **{k: v for k, v in made.items() if k not in ("config", "metrics")},
            "config": dataclasses.asdict(made["config"]),
            "training_set": data,
            "tolerance": tolerance,
        }
        # Trained on the recorded revision either way: the DVC copy the version was trained on. When the lake
        # no longer rebuilds it, that copy is what is left of the data, and the record says so.
        data["source"] = "lake" if data["hash_equal"] else "recorded DVC copy"
        trained = steps.train(
            settings, made["training_set_rev"], made["config"], checkpoint_dir=work / "checkpoints"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if trained.get("status") != "trained":
        raise ReproduceError(f"the retrain of v{version} did not finish: {trained}")
    mlflow.MlflowClient(settings.mlflow_tracking_uri).set_tag(
        trained["run_id"], "reproduce.of_version", str(version)
    )
    holdout = steps.evaluate(settings, trained["run_id"])["holdout"]
    comparison = {}
    for metric, registered in made["metrics"].items():
        value = holdout.get(metric.removeprefix("holdout_"))
        comparison[metric] = {
            "registered": registered,
            "rebuilt": value,
            "difference": None if value is None else abs(value - registered),
            "within": value is not None and abs(value - registered) <= tolerance,
        }
    within = bool(comparison) and all(c["within"] for c in comparison.values())
    data = record["training_set"]
    rev = made["training_set_rev"]
    recorded_copy = f"; rebuilt from the DVC copy of the training set it recorded ({rev}): "
    if data["hash_equal"]:
        source = ""
    elif data["rebuilt_md5"] is None:
        source = (
            f"{recorded_copy}the lake could not rebuild {data['as_of']}'s window here "
            f"({data['lake_unusable']}), so it was not compared"
        )
    else:
        source = (
            f"{recorded_copy}the lake no longer holds the data of {data['as_of']}'s window as it was (its "
            f"rebuild hashes to {data['rebuilt_md5']}, not {data['recorded_md5']}: a retention, an erasure "
            "or a re-delivery since)"
        )
    record.update(
        status="reproduced" if within else "metrics_differ",
        rebuilt_run_id=trained["run_id"],
        metrics=comparison,
        reason=(
            f"every holdout metric within {tolerance} of v{version}'s"
            if within
            else f"holdout metrics beyond {tolerance}: "
            + ", ".join(
                f"{m} {c['registered']} -> {c['rebuilt']}" for m, c in comparison.items() if not c["within"]
            )
        )
        + source,
    )
    return record
