"""The export of a registered version with its compressed variants, against a real MLflow (SQLite registry)
and a training set versioned by the pipeline's writer (DVC): the compression table with its four rows, the
run metrics, the files that may serve, the version's `onnx.serving_file` tag; and the scoring service's
loader serving the file that tag names, or saying which file is missing."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from core.settings import CompressionSettings, Settings
from serving.models import ModelSource, ModelUnavailableError
from tests.integration.training_sets import versioned_training_set
from training.artifacts import log_model
from training.dataset import MODEL_INPUTS, NUMERIC_FEATURES, read_holdout, read_training_set
from training.export import (
    SERVING_FILE_TAG,
    TABLE_COLUMNS,
    TABLE_FILE,
    VARIANT_FILES,
    export_version,
    quantize,
    to_onnx,
)
from training.ledger import Ledger
from training.loop import TrainConfig, train
from training.metrics import average_precision
from training.model import FraudMLP, ModelConfig
from training.registry import ModelRegistry, promote_manually
from training.steps import split_tensors
from training.tracking import configure

pytestmark = pytest.mark.integration

VARIANTS = ["fp32", "int8", "pruned", "student"]
FIGURES = ("bytes", "p50_us_batch1", "p50_us_batch256", "auc_pr")


def _teacher(settings: Settings, rev: str) -> FraudMLP:
    frame = read_training_set(settings, rev)
    train_data, validation = split_tensors(frame, "train"), split_tensors(frame, "validation")
    torch.manual_seed(3)
    model = FraudMLP(ModelConfig(hidden=(32, 16)))
    model.fit_normalization(train_data.x[:, : len(NUMERIC_FEATURES)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network, a busy test machine
    try:
        config = TrainConfig(epochs=3, batch_size=128, seed=3, device="cpu")
        train(model, train_data, validation, config, settings.home / "teacher-checkpoints", rev)
    finally:
        torch.set_num_threads(threads)
    return model.to("cpu").eval()


def _registered(settings: Settings, rev: str, model: FraudMLP) -> tuple[str, str]:
    """A training run of `model` on `rev` (as the train step logs it), registered: (run id, version)."""
    experiment_id = configure(settings)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.set_tag("lineage.training_set_rev", rev)
        log_model(model, name="model", pip_requirements=[])
    return run.info.run_id, ModelRegistry(settings.mlflow_tracking_uri).register(run.info.run_id)


@pytest.fixture(scope="module")
def installation(tmp_path_factory):
    """A versioned training set and a trained model on it; compression in a few seconds, and a tolerance
    of 1.0 AUC-PR so that every variant qualifies and the smallest file must serve."""
    settings = Settings(
        home=tmp_path_factory.mktemp("home"),
        compression=CompressionSettings(epochs=2, max_rows=5_000, student_hidden=[8], max_auc_pr_drop=1.0),
    )
    settings.ensure_dirs()
    rev = versioned_training_set(settings)
    yield settings, rev, _teacher(settings, rev)
    mlflow.set_tracking_uri(None)


@pytest.fixture(scope="module")
def exported(installation):
    settings, rev, model = installation
    run_id, version = _registered(settings, rev, model)
    return settings, run_id, version, export_version(settings, version)


def _table(settings: Settings, run_id: str, folder: Path) -> list[dict]:
    path = MlflowClient(settings.mlflow_tracking_uri).download_artifacts(run_id, TABLE_FILE, str(folder))
    table = json.loads(Path(path).read_text())  # MLflow's table format: columns and rows
    return [dict(zip(table["columns"], values, strict=True)) for values in table["data"]]


def test_the_export_logs_the_table_of_the_four_variants(exported, tmp_path):
    settings, run_id, _, report = exported
    rows = _table(settings, run_id, tmp_path)
    assert [row["variant"] for row in rows] == VARIANTS == [row["variant"] for row in report["variants"]]
    assert set(rows[0]) == set(TABLE_COLUMNS)
    assert [row["file"] for row in rows] == [VARIANT_FILES[v] for v in VARIANTS]
    assert [row["hidden"] for row in rows] == ["32x16", "32x16", "16x8", "8"]
    for row in rows:
        assert row["bytes"] > 0 and row["p50_us_batch1"] > 0 and row["p50_us_batch256"] > 0
        assert 0.0 <= row["auc_pr"] <= 1.0
    fp32 = rows[0]
    pruned, student = rows[2], rows[3]
    assert student["bytes"] < pruned["bytes"] < fp32["bytes"], "fewer units, smaller files"
    assert [row["file"] for row in rows if row["serving"]] == [report["serving_file"]]

    metrics = MlflowClient(settings.mlflow_tracking_uri).get_run(run_id).data.metrics
    for row in rows:
        for figure in FIGURES:
            assert metrics[f"onnx_{row['variant']}_{figure}"] == pytest.approx(row[figure])
    assert "onnx_parity_max_abs_diff" in metrics


def test_the_smallest_file_within_the_tolerance_is_tagged_kept_and_served(exported, tmp_path):
    settings, run_id, version, report = exported
    rows = _table(settings, run_id, tmp_path)
    client = MlflowClient(settings.mlflow_tracking_uri)
    listed = {Path(a.path).name for a in client.list_artifacts(run_id, "onnx")}
    kept = [row for row in rows if row["kept"]]
    # a tolerance of 1.0: every variant qualifies, int8 only where it is also faster
    assert {row["variant"] for row in kept} >= {"fp32", "pruned", "student"}
    assert listed == {row["file"] for row in kept} | {"export.json", "compression.json"}
    smallest = min(kept, key=lambda row: row["bytes"])
    assert report["serving_file"] == smallest["file"] != VARIANT_FILES["fp32"]

    tags = client.get_model_version(ModelRegistry(settings.mlflow_tracking_uri).name, version).tags
    assert tags[SERVING_FILE_TAG] == smallest["file"]
    assert tags["onnx.serving_reason"].startswith(f"{smallest['file']} ({smallest['variant']})")
    assert float(tags["onnx.parity_max_abs_diff"]) < 1e-4

    loaded = ModelSource(settings.mlflow_tracking_uri, cache_dir=tmp_path / "cache").load(version)
    assert loaded.file == smallest["file"]
    # the service scores with the measured file: its holdout AUC-PR is the table's
    holdout = read_holdout(settings, client.get_run(run_id).data.tags["lineage.training_set_rev"])
    assert average_precision(holdout.y, loaded.score(holdout.x), holdout.weights) == pytest.approx(
        smallest["auc_pr"], abs=1e-6
    )


def test_each_variant_passed_the_parity_check(exported):
    _, _, _, report = exported
    for row in report["variants"]:
        if row["variant"] != "int8":  # quantized: compared with fp32's scores, not checked against torch
            assert row["parity_max_abs_diff"] < 1e-4, row["variant"]
        else:
            assert "max_abs_diff_vs_fp32" in row


def test_with_compression_off_the_table_holds_fp32_and_int8(installation, tmp_path):
    settings, rev, model = installation
    settings = settings.model_copy(update={"compression": CompressionSettings(enabled=False)})
    run_id, version = _registered(settings, rev, model)
    report = export_version(settings, version)
    rows = _table(settings, run_id, tmp_path)
    assert [row["variant"] for row in rows] == ["fp32", "int8"] == [r["variant"] for r in report["variants"]]
    assert report["serving_file"] in {VARIANT_FILES["fp32"], VARIANT_FILES["int8"]}
    assert (
        ModelSource(settings.mlflow_tracking_uri, cache_dir=tmp_path).load(version).file
        == (report["serving_file"])
    )


# --- a candidate's export, and the variants after its promotion ---------------------------------------------


def test_a_candidates_export_is_fp32_alone_and_its_variants_wait_for_a_promotion(installation, tmp_path):
    """The retrain's export step makes fp32 for every candidate (checked, measured, served); compress makes
    nothing for a version the gate did not promote, the variants for one it did, and nothing again."""
    from training import steps
    from training.export import NOT_YET, VARIANTS_TAG

    settings, rev, model = installation
    run_id, version = _registered(settings, rev, model)
    exported = steps.export(settings, version)
    table = _table(settings, run_id, tmp_path / "one")
    assert [row["variant"] for row in exported["variants"]] == ["fp32"] == [r["variant"] for r in table]
    assert exported["serving_file"] == VARIANT_FILES["fp32"] and exported["int8"] == NOT_YET
    client = MlflowClient(settings.mlflow_tracking_uri)
    tags = client.get_model_version("fraud-detector", version).tags
    assert tags[SERVING_FILE_TAG] == "model.onnx" and tags[VARIANTS_TAG] == "false"
    listed = {Path(a.path).name for a in client.list_artifacts(run_id, "onnx")}
    assert listed == {"model.onnx", "export.json", "compression.json"}

    skipped = steps.compress(settings, version, "rejected")
    assert skipped["compressed"] is False and "not promoted (rejected)" in skipped["reason"]
    assert client.get_model_version("fraud-detector", version).tags[VARIANTS_TAG] == "false"

    made = steps.compress(settings, version, "promoted")
    assert made["compressed"] is True
    assert [row["variant"] for row in made["variants"]] == VARIANTS
    tags = client.get_model_version("fraud-detector", version).tags
    assert tags[VARIANTS_TAG] == "true" and tags[SERVING_FILE_TAG] == made["serving_file"] != "model.onnx"
    assert "stage_seconds.compress" in client.get_run(run_id).data.metrics

    again = steps.compress(settings, version, "promoted")  # a rollback to it, a manual promotion
    assert again["compressed"] is False and "made before" in again["reason"]
    assert again["serving_file"] == made["serving_file"]


def test_the_service_follows_its_champions_serving_file_when_the_variants_come(installation, tmp_path):
    """Promoted with fp32 alone, the champion serves model.onnx; once compress tags a smaller file, the next
    refresh loads it, with no new version and no restart."""
    from serving.models import Models
    from training import steps

    settings, rev, model = installation
    _run_id, version = _registered(settings, rev, model)
    steps.export(settings, version)
    _promote(settings.mlflow_tracking_uri, settings.promotion_ledger_url, version)
    source = ModelSource(
        settings.mlflow_tracking_uri, cache_dir=tmp_path, ledger_url=settings.serving_ledger_url
    )
    models = Models(source, shadow=False)
    first = models.refresh().champion
    assert first is not None and (first.version, first.file) == (version, "model.onnx")
    assert models.refresh().champion is first  # nothing moved: nothing reloaded
    made = steps.compress(settings, version, "promoted")
    after = models.refresh().champion
    assert after is not None and (after.version, after.file) == (version, made["serving_file"])
    assert models.reloads == 2


def _promote(tracking_uri: str, ledger_url: str, version: str) -> None:
    """`version` made champion as `mlops promote` does it: a history row (what the service serves),
    then the alias."""
    ledger = Ledger(ledger_url)
    try:
        promote_manually(ModelRegistry(tracking_uri), ledger, version, "the export test", actor="tester")
    finally:
        ledger.dispose()


# --- the scoring service's loader ---------------------------------------------------------------------------


# A model trained before a feature was declared, or on another order: its numeric inputs are today's but one,
# reversed (the categorical codes stay last: the network embeds its trailing columns).
OWN_NUMERIC = tuple(reversed(NUMERIC_FEATURES[:-1]))
OWN_INPUTS = (*OWN_NUMERIC, *MODEL_INPUTS[len(NUMERIC_FEATURES) :])
UNDECLARED = "customer_max_amount_24h"  # a feature no declaration has (yet)


def _small(inputs: tuple[str, ...], seed: int) -> FraudMLP:
    torch.manual_seed(seed)
    numeric = len(inputs) - (len(MODEL_INPUTS) - len(NUMERIC_FEATURES))
    model = FraudMLP(ModelConfig(numeric=numeric, hidden=(8,), inputs=inputs)).eval()
    with torch.no_grad():  # away from the defaults (0, 1), so that a column taken for another one shows
        model.mean.copy_(torch.linspace(-1.0, 1.0, numeric))
        model.std.copy_(torch.linspace(0.5, 2.0, numeric))
    return model


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory) -> dict[str, Path]:
    """An fp32 file, its int8 quantization, a file that is not ONNX, a model on other inputs (OWN_INPUTS),
    one taking an input nothing declares, and an fp32 file whose metadata lost its input names."""
    import onnx

    folder = tmp_path_factory.mktemp("onnx")
    example = torch.zeros(2, len(MODEL_INPUTS))
    fp32 = to_onnx(_small(MODEL_INPUTS, 1), example, folder / "a")
    garbage = folder / "garbage"
    garbage.write_bytes(b"not an onnx model")
    own = to_onnx(_small(OWN_INPUTS, 2), example[:, : len(OWN_INPUTS)], folder / "own")
    undeclared = to_onnx(_small((UNDECLARED, *MODEL_INPUTS[1:]), 3), example, folder / "undeclared")
    unnamed = onnx.load(str(fp32))
    del unnamed.metadata_props[:]
    onnx.save(unnamed, str(folder / "unnamed"))
    return {
        "fp32": fp32,
        "int8": quantize(fp32, folder / "b"),
        "garbage": garbage,
        "own": own,
        "undeclared": undeclared,
        "unnamed": folder / "unnamed",
    }


def _version_with(tracking_uri: str, files: dict[str, str], tag: str | None, folder: Path) -> str:
    """A registered version whose run's onnx/ holds `files` (name in the run: which of onnx_files)."""
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    experiment = client.get_experiment_by_name("loader-test")
    experiment_id = (
        experiment.experiment_id
        if experiment
        else client.create_experiment("loader-test", artifact_location=(folder / "artifacts").as_uri())
    )
    run = client.create_run(experiment_id)
    for name, source in files.items():
        staged = folder / run.info.run_id / name
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(Path(source).read_bytes())
        client.log_artifact(run.info.run_id, str(staged), "onnx")
    name = ModelRegistry(tracking_uri).name
    if not client.search_registered_models(f"name='{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, run.info.artifact_uri, run_id=run.info.run_id).version
    if tag is not None:
        client.set_model_version_tag(name, str(version), SERVING_FILE_TAG, tag)
    return str(version)


@pytest.mark.parametrize(
    ("files", "tag", "expected"),
    [
        pytest.param(
            {"model.onnx": "fp32", "model.int8.onnx": "int8", "model.student.onnx": "fp32"},
            "model.student.onnx",
            "model.student.onnx",
            id="the tagged file",
        ),
        pytest.param(
            {"model.onnx": "fp32", "model.int8.onnx": "int8"},
            "model.onnx",
            "model.onnx",
            id="the tag over the int8 rule",
        ),
        pytest.param(
            {"model.onnx": "fp32", "model.int8.onnx": "int8"},
            None,
            "model.int8.onnx",
            id="an export before the tag: int8 where kept",
        ),
        pytest.param({"model.onnx": "fp32"}, None, "model.onnx", id="an export before the tag: fp32"),
    ],
)
def test_the_loader_serves_the_file_the_export_chose(tmp_path, onnx_files, files, tag, expected):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sources = {name: str(onnx_files[kind]) for name, kind in files.items()}
    version = _version_with(tracking_uri, sources, tag, tmp_path)
    loaded = ModelSource(tracking_uri, cache_dir=tmp_path / "cache").load(version)
    assert loaded.file == expected
    x = np.zeros((3, len(MODEL_INPUTS)), dtype="float32")
    assert loaded.score(x).shape == (3,)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        pytest.param(
            {"model.onnx": "fp32", "model.int8.onnx": "int8"},
            "its export chose onnx/model.student.onnx (tag onnx.serving_file) but run",
            id="missing",
        ),
        pytest.param(
            {"model.onnx": "fp32", "model.student.onnx": "garbage"},
            "onnx/model.student.onnx cannot be loaded",
            id="not ONNX",
        ),
    ],
)
def test_a_tagged_file_that_is_missing_or_broken_is_named(tmp_path, onnx_files, files, message):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sources = {name: str(onnx_files[kind]) for name, kind in files.items()}
    version = _version_with(tracking_uri, sources, "model.student.onnx", tmp_path)
    with pytest.raises(ModelUnavailableError, match=f"v{version}") as error:
        ModelSource(tracking_uri, cache_dir=tmp_path / "cache").load(version)
    assert message in str(error.value)


def test_champion_and_shadow_on_other_inputs_each_take_their_own_columns_by_name(tmp_path, onnx_files):
    """The service builds every declared input once; the champion (today's inputs) and the shadow (trained on
    other inputs, in another order) are each scored on their own columns of it, picked by the names their
    files record: the same scores as each model's torch weights on its own inputs."""
    from serving.models import Models

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    champion = _version_with(tracking_uri, {"model.onnx": str(onnx_files["fp32"])}, "model.onnx", tmp_path)
    shadow = _version_with(tracking_uri, {"model.onnx": str(onnx_files["own"])}, "model.onnx", tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'promotions.db'}"
    _promote(tracking_uri, ledger_url, champion)
    source = ModelSource(tracking_uri, cache_dir=tmp_path / "cache", ledger_url=ledger_url)
    loaded = Models(source, shadow=True).refresh()
    assert loaded.champion is not None and loaded.shadow is not None, "both load"
    assert (loaded.champion.version, loaded.shadow.version) == (champion, shadow)
    assert loaded.champion.inputs == MODEL_INPUTS and loaded.shadow.inputs == OWN_INPUTS

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, len(MODEL_INPUTS))).astype("float32")
    x[:, len(NUMERIC_FEATURES) :] = rng.integers(0, 3, size=(64, len(MODEL_INPUTS) - len(NUMERIC_FEATURES)))
    own = x[:, [MODEL_INPUTS.index(name) for name in OWN_INPUTS]]
    with torch.no_grad():
        expected_champion = _small(MODEL_INPUTS, 1)(torch.from_numpy(x)).numpy().reshape(-1)
        expected_shadow = _small(OWN_INPUTS, 2)(torch.from_numpy(own)).numpy().reshape(-1)
    np.testing.assert_allclose(loaded.champion.score(x), expected_champion, atol=1e-5)
    np.testing.assert_allclose(loaded.shadow.score(x), expected_shadow, atol=1e-5)
    # by position (the first columns) the shadow would score other values: the names are what pick
    positional = loaded.shadow.score_own(np.ascontiguousarray(x[:, : len(OWN_INPUTS)]))
    assert np.abs(positional - expected_shadow).max() > 1e-3


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        pytest.param("undeclared", f"not ready to serve: fraud-detector v1 takes 1 input(s) that are not "
                     f"built from today's declarations: {UNDECLARED}", id="an input nothing declares"),
        pytest.param("unnamed", "records no input names", id="a file without the names"),
    ],
)  # fmt: skip
def test_a_champion_whose_inputs_the_service_cannot_build_is_refused_with_the_names(
    tmp_path, onnx_files, kind, message
):
    """Refused at load, never scored on a guess: the service is not ready, and says which names it lacks."""
    from serving.models import Models

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = _version_with(tracking_uri, {"model.onnx": str(onnx_files[kind])}, "model.onnx", tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'promotions.db'}"
    _promote(tracking_uri, ledger_url, version)
    with pytest.raises(ModelUnavailableError) as error:
        ModelSource(tracking_uri, cache_dir=tmp_path / "cache").load(version)
    assert message in str(error.value)
    models = Models(
        ModelSource(tracking_uri, cache_dir=tmp_path / "cache2", ledger_url=ledger_url), shadow=False
    )
    assert models.refresh().champion is None
    assert models.problem is not None and message in models.problem


def test_the_feature_catalog_reads_each_versions_inputs_and_role_from_the_registry(tmp_path, onnx_files):
    """`mlops features list`: the versions taking each feature come from their `lineage.model_inputs` tags,
    the champion and the shadow (the newest above it) named; a version without the tag takes none."""
    from mlops.feature_catalog import INPUTS_TAG, catalog, registered_versions

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    name = ModelRegistry(tracking_uri).name
    numbers = [
        _version_with(tracking_uri, {"model.onnx": str(onnx_files["fp32"])}, None, tmp_path) for _ in range(3)
    ]
    client.set_model_version_tag(name, numbers[1], INPUTS_TAG, json.dumps(list(OWN_INPUTS)))
    client.set_model_version_tag(name, numbers[2], INPUTS_TAG, json.dumps(list(MODEL_INPUTS)))
    ModelRegistry(tracking_uri).set_champion(numbers[1])
    versions = registered_versions(tracking_uri)
    assert [(v.number, v.role, v.inputs) for v in versions] == [
        (numbers[2], "shadow", MODEL_INPUTS),
        (numbers[1], "champion", OWN_INPUTS),
        (numbers[0], "", None),
    ]
    dropped = NUMERIC_FEATURES[-1]  # OWN_INPUTS lacks it
    entries = {e.feature.name: e for e in catalog(Settings(home=tmp_path / "home"), versions)}
    assert [v.number for v in entries[dropped].used_by] == [numbers[2]]
    assert [v.number for v in entries[OWN_NUMERIC[0]].used_by] == [numbers[2], numbers[1]]
    assert entries[dropped].online_until is None  # nothing materialized in this home


# --- the model card (training/model_card.py), on this module's training set and model -----------------------


def test_each_gated_version_has_a_model_card_and_an_approval_is_added_to_it(installation):
    """The gate step writes the version's card (lineage, inputs, metrics with intervals, operating point,
    plots, segments, the comparison with the champion on the same rows); an approval writes it again with
    who answered and why, escaped: a comment is a person's text."""
    from training import steps

    installed, rev, model = installation
    # the same model twice, a champion and a candidate compared with it: no margin to beat
    settings = installed.model_copy(update={"gate": installed.gate.model_copy(update={"margin": 0.0})})
    versions = []
    for _ in range(2):
        experiment_id = configure(settings)
        with mlflow.start_run(experiment_id=experiment_id) as run:
            mlflow.set_tag("lineage.training_set_rev", rev)
            log_model(model, name="model", pip_requirements=[])
        assert steps.evaluate(settings, run.info.run_id)["operating_point"]["threshold"] > 0
        versions.append(steps.register(settings, run.info.run_id)["model_version"])
    steps.promote_by_hand(settings, versions[0], "the card's champion", actor="tester")
    gated = steps.promote(settings, versions[1], actor="tester", require_approval=True)
    assert gated["decision"] == "awaiting_approval", gated
    page = Path(gated["model_card"]).read_text()
    for heading in (
        "Data and lineage",
        "Holdout metrics",
        "90% interval",
        "Operating point",
        "Calibration and precision-recall",
        "Performance by segment",
        "Comparison with the champion",
        "Promotion history and approvals",
    ):
        assert heading in page, heading
    assert (
        rev in page
        and "data:image/png;base64," in page
        and "channel = " in page
        and "amount 0-10 USD" in page
    )
    assert f"v{versions[0]} (champion) AUC-PR" in page and "awaiting_approval" in page
    comment = "<script>alert('card')</script> matches v1 on every segment"
    answered = steps.approve(settings, versions[1], "Approve", "risk-officer", comment, ("ml-engineer",))
    assert answered["decision"] == "promoted" and answered["model_card"] == gated["model_card"]
    page = Path(answered["model_card"]).read_text()
    assert "risk-officer" in page and "&lt;script&gt;alert(&#x27;card&#x27;)&lt;/script&gt;" in page
    assert "<script>" not in page
