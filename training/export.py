"""CPU scoring export: ONNX for every registered version, with a parity check against torch, and smaller
variants beside it: int8 (dynamic quantization), a structurally pruned copy and a distilled student
(training/compress.py), each measured the same way (file size, p50 latency at batch 1 and 256 on one
thread, holdout AUC-PR by weight, on the same rows).

The export serves the smallest file whose holdout AUC-PR is within `compression.max_auc_pr_drop` of fp32's
(fp32 itself always qualifies; int8 must also be INT8_MIN_SPEEDUP faster, as before). The files that may
serve, export.json and the table of all four go to the version's MLflow run under `onnx/`; the figures
become run metrics and tags of the version, `onnx.serving_file` naming the file the scoring service loads
(serving/models.py) and `onnx.serving_reason` saying why.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from model_contract.onnx import BASELINE_METADATA

# The names training writes and serving reads (model_contract.onnx), also this module's.
from model_contract.onnx import INPUT_NAME as INPUT_NAME
from model_contract.onnx import INPUTS_METADATA as INPUTS_METADATA
from model_contract.onnx import ONNX_DIR as ONNX_DIR
from model_contract.onnx import SERVING_FILE_TAG as SERVING_FILE_TAG
from model_contract.onnx import session as session
from training.metrics import average_precision

if TYPE_CHECKING:
    import torch

    from core.settings import Settings
    from training.model import FraudMLP


OUTPUT_NAME = "fraud_probability"
PARITY_TOLERANCE = 1e-4  # fp32 ONNX against torch eager, max absolute score difference
INT8_MAX_AUC_PR_DROP = 0.005  # the default of compression.max_auc_pr_drop, which the export uses
# int8 must be at least this much faster at batch 1 (online scoring) and at batch 256 to be worth a file
INT8_MIN_SPEEDUP = 1.10

FP32, INT8, PRUNED, STUDENT = "fp32", "int8", "pruned", "student"
# What a candidate's export says of the smaller files until its version is promoted (export_version).
NOT_YET = "not made yet: the int8, pruned and student variants are made once the version is promoted"
# The version tag saying whether its variants were made (`true`) or fp32 alone was exported (`false`).
VARIANTS_TAG = "onnx.variants"
VARIANT_FILES = {
    FP32: "model.onnx",
    INT8: "model.int8.onnx",
    PRUNED: "model.pruned.onnx",
    STUDENT: "model.student.onnx",
}
# The model-version tag naming the file of ONNX_DIR to serve (serving/models.py reads it).
TABLE_FILE = f"{ONNX_DIR}/compression.json"
TABLE_COLUMNS = (
    "variant", "file", "hidden", "bytes", "p50_us_batch1", "p50_us_batch256", "auc_pr", "auc_pr_drop",
    "kept", "serving",
)  # fmt: skip


class ExportError(RuntimeError):
    pass


def to_onnx(model: torch.nn.Module, example: torch.Tensor, path: Path) -> Path:
    """Export with a dynamic batch dimension (TorchScript-based exporter: no extra dependency)."""
    import copy

    import torch

    model = copy.deepcopy(model).to("cpu").eval()  # the caller's model keeps its device and mode
    torch.onnx.export(
        model,
        (example[:2].cpu(),),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return record_inputs(path, model_inputs(model))


def model_inputs(model: torch.nn.Module) -> tuple[str, ...]:
    """The input names a model was trained on (its config's), which its ONNX file records."""
    inputs = getattr(getattr(model, "config", None), "inputs", None)
    if not inputs:
        raise ExportError(f"{type(model).__name__} records no input names (config.inputs): cannot export it")
    return tuple(inputs)


def record_inputs(path: Path, inputs: tuple[str, ...]) -> Path:
    """Write the input names into the ONNX file's metadata (INPUTS_METADATA), so whoever loads the file
    selects its columns by name (serving/models.py, monitoring/reference.py)."""
    return record_metadata(path, {INPUTS_METADATA: json.dumps(list(inputs))})


def record_metadata(path: Path, entries: Mapping[str, str]) -> Path:
    """Set `entries` in the ONNX file's metadata, keeping its other entries."""
    import onnx

    proto = onnx.load(str(path))
    kept = {p.key: p.value for p in proto.metadata_props if p.key not in entries}
    onnx.helper.set_model_props(proto, {**kept, **entries})
    onnx.save(proto, str(path))
    return path


def baseline_inputs(model: torch.nn.Module, x: np.ndarray) -> dict[str, float]:
    """Each input's reference value (BASELINE_METADATA): a numeric input's training mean (the model's own
    normalization mean where it has one, else the mean of `x` where present), a categorical code's most
    frequent value in `x` (the rows the export is checked on, drawn as training's were)."""
    inputs = model_inputs(model)
    numeric = int(getattr(getattr(model, "config", None), "numeric", len(inputs)))
    means = getattr(model, "mean", None)
    baseline: dict[str, float] = {}
    for index, name in enumerate(inputs):
        column = x[:, index] if len(x) else np.zeros(0, dtype="float32")
        present = column[~np.isnan(column)]
        if index < numeric:
            if means is not None and len(means) == numeric:
                baseline[name] = float(means[index])
            else:
                baseline[name] = float(present.mean()) if len(present) else 0.0
        else:
            codes, counts = np.unique(present, return_counts=True)
            baseline[name] = float(codes[np.argmax(counts)]) if len(codes) else 0.0
    return baseline


def onnx_scores(sess, x: np.ndarray, batch: int = 8192) -> np.ndarray:
    return np.concatenate(
        [sess.run(None, {INPUT_NAME: x[i : i + batch]})[0] for i in range(0, len(x), batch)]
    )


def latency_us(run, x: np.ndarray, repeats: int) -> float:
    """Median microseconds of `run(x)`."""
    for _ in range(min(50, repeats)):
        run(x)
    timings = np.empty(repeats)
    for i in range(repeats):
        started = time.perf_counter()
        run(x)
        timings[i] = time.perf_counter() - started
    return float(np.median(timings) * 1e6)


def quantize(source: Path, target: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    import onnx

    # the quantized graph keeps the source's input names and baseline (the quantizer drops metadata)
    ours = {p.key: p.value for p in onnx.load(str(source)).metadata_props if p.key.startswith("mlops.")}
    return record_metadata(target, ours) if ours else target


def export_checked(model: torch.nn.Module, x: np.ndarray, path: Path) -> float:
    """Export `model` to `path` and check that ONNX Runtime scores `x` as torch does; the largest
    absolute difference. Raises ExportError above PARITY_TOLERANCE."""
    import torch

    from training.loop import predict

    to_onnx(model, torch.from_numpy(x[:2]), path)
    record_metadata(path, {BASELINE_METADATA: json.dumps(baseline_inputs(model, x))})
    if not len(x):
        return 0.0
    torch_scores = predict(model, torch.from_numpy(x)).numpy()
    parity = float(np.max(np.abs(onnx_scores(session(path), x).reshape(-1) - torch_scores)))
    if parity > PARITY_TOLERANCE:
        raise ExportError(
            f"{path.name}: the ONNX export differs from torch by {parity:.2e} (tolerance "
            f"{PARITY_TOLERANCE:.0e}) on {len(x)} rows"
        )
    return parity


def measure(
    variant: str, path: Path, x: np.ndarray, labels: np.ndarray, weights: np.ndarray | None
) -> tuple[dict[str, Any], np.ndarray]:
    """One row of the compression table (file size, p50 latency at batch 1 and 256 on one thread, holdout
    AUC-PR by weight), and the file's scores of `x`. Every variant is measured here, on the same rows."""
    scoring = session(path)
    scores = onnx_scores(scoring, x).reshape(-1)

    def run(batch: np.ndarray) -> None:
        scoring.run(None, {INPUT_NAME: batch})

    return {
        "variant": variant,
        "file": path.name,
        "bytes": path.stat().st_size,
        "p50_us_batch1": latency_us(run, x[:1], 300),
        "p50_us_batch256": latency_us(run, x[:256], 100),
        "auc_pr": average_precision(labels, scores, weights),
    }, scores


def _fp32_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    fp32 = next((row for row in rows if row["variant"] == FP32), None)
    if fp32 is None:
        raise ValueError(f"no {FP32} row among {[row['variant'] for row in rows]}: nothing to compare with")
    return fp32


def within_tolerance(rows: list[dict[str, Any]], max_auc_pr_drop: float) -> list[dict[str, Any]]:
    """The rows whose holdout AUC-PR is at least fp32's minus `max_auc_pr_drop`; fp32 always."""
    fp32 = _fp32_row(rows)
    return [row for row in rows if row is fp32 or row["auc_pr"] >= fp32["auc_pr"] - max_auc_pr_drop]


def choose_serving(rows: list[dict[str, Any]], max_auc_pr_drop: float) -> tuple[dict[str, Any], str]:
    """The row to serve and why: among the rows within tolerance (within_tolerance), the smallest file, the
    faster at batch 1 on a tie."""
    fp32 = _fp32_row(rows)
    floor = fp32["auc_pr"] - max_auc_pr_drop
    eligible = within_tolerance(rows, max_auc_pr_drop)
    chosen = min(eligible, key=lambda row: (row["bytes"], row["p50_us_batch1"]))
    reason = (
        f"{chosen['file']} ({chosen['variant']}): the smallest of {len(eligible)} file(s) within "
        f"{max_auc_pr_drop} AUC-PR of fp32, {chosen['bytes']} bytes (fp32 {fp32['bytes']}), AUC-PR "
        f"{chosen['auc_pr']:.4f} (fp32 {fp32['auc_pr']:.4f}), p50 {chosen['p50_us_batch1']:.1f} us at "
        f"batch 1 (fp32 {fp32['p50_us_batch1']:.1f}) and {chosen['p50_us_batch256']:.1f} us at batch 256 "
        f"(fp32 {fp32['p50_us_batch256']:.1f})"
    )
    beyond = [row for row in rows if row not in eligible]
    if beyond:
        reason += "; beyond the tolerance: " + ", ".join(
            f"{row['variant']} (AUC-PR {row['auc_pr']:.4f} < {floor:.4f})" for row in beyond
        )
    return chosen, reason


def _hidden(model: torch.nn.Module) -> str:
    """The hidden layer widths of a FraudMLP, as 128x64."""
    config = getattr(model, "config", None)
    return "x".join(map(str, config.hidden)) if config is not None else ""


def _max_abs_diff(scores: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(scores - reference))) if len(scores) else 0.0


def export_model(
    model: torch.nn.Module,
    x: np.ndarray,
    labels: np.ndarray,
    folder: Path,
    weights: np.ndarray | None = None,
    compressed: Mapping[str, torch.nn.Module] | None = None,
    max_auc_pr_drop: float = INT8_MAX_AUC_PR_DROP,
    parity_rows: int = 20_000,
    variants: bool = True,
) -> dict:
    """Export `model` (fp32), its int8 quantization and the `compressed` models (pruned, student), each
    checked against torch on the first `parity_rows` rows of `x` (int8: quantized, not checked) and measured
    on all of `x` (labels, weights); choose the file to serve (choose_serving). Returns the report; the
    files that may serve stay in `folder`: fp32 always, int8 where it is faster (INT8_MIN_SPEEDUP at batch
    1 and 256) and as accurate, the others where they are as accurate. Without `variants`, fp32 alone:
    checked, measured and served (what every candidate gets; the variants are made once it is promoted)."""
    folder.mkdir(parents=True, exist_ok=True)
    check = x[:parity_rows]
    fp32_path = folder / VARIANT_FILES[FP32]
    parity = export_checked(model, check, fp32_path)
    fp32, fp32_scores = measure(FP32, fp32_path, x, labels, weights)
    fp32.update(hidden=_hidden(model), parity_max_abs_diff=parity)
    fp32_report = {
        "parity_max_abs_diff": parity,
        "rows_checked": len(check),
        "rows_measured": len(x),
        "fp32_p50_us_batch1": fp32["p50_us_batch1"],
        "fp32_p50_us_batch256": fp32["p50_us_batch256"],
        "max_auc_pr_drop": max_auc_pr_drop,
    }
    if not variants:
        fp32.update(auc_pr_drop=0.0, kept=True, serving=True)
        serving = {"serving_file": fp32["file"], "serving_reason": f"{fp32['file']} (fp32): {NOT_YET}"}
        return {**fp32_report, "int8": NOT_YET, "variants": [fp32], **serving}
    int8, int8_scores = measure(INT8, quantize(fp32_path, folder / VARIANT_FILES[INT8]), x, labels, weights)
    int8.update(hidden=_hidden(model), max_abs_diff_vs_fp32=_max_abs_diff(int8_scores, fp32_scores))
    rows = [fp32, int8]
    for variant, variant_model in (compressed or {}).items():
        path = folder / VARIANT_FILES[variant]
        variant_parity = export_checked(variant_model, check, path)
        row, scores = measure(variant, path, x, labels, weights)
        row.update(
            hidden=_hidden(variant_model),
            parity_max_abs_diff=variant_parity,
            max_abs_diff_vs_fp32=_max_abs_diff(scores, fp32_scores),
        )
        rows.append(row)
    for row in rows:
        row["auc_pr_drop"] = fp32["auc_pr"] - row["auc_pr"]

    speedups = (
        fp32["p50_us_batch1"] / int8["p50_us_batch1"],
        fp32["p50_us_batch256"] / int8["p50_us_batch256"],
    )
    if int8["auc_pr_drop"] > max_auc_pr_drop:
        int8_verdict = f"dropped: AUC-PR falls by {int8['auc_pr_drop']:.4f} (> {max_auc_pr_drop})"
    elif min(speedups) < INT8_MIN_SPEEDUP:
        int8_verdict = (
            f"dropped: {speedups[0]:.2f}x / {speedups[1]:.2f}x the fp32 speed at batch 1 / 256 "
            f"(needs >= {INT8_MIN_SPEEDUP}x at both)"
        )
    else:
        int8_verdict = (
            f"kept: >= {min(speedups):.2f}x faster at batch 1 and 256, AUC-PR drop {int8['auc_pr_drop']:.4f}"
        )
    # int8 must also pay in speed; the other variants are smaller networks, not the same one in int8
    candidates = [row for row in rows if row is not int8 or int8_verdict.startswith("kept")]
    chosen, reason = choose_serving(candidates, max_auc_pr_drop)
    eligible = within_tolerance(candidates, max_auc_pr_drop)
    for row in rows:
        row["kept"] = row in eligible
        row["serving"] = row is chosen
        if not row["kept"]:
            (folder / row["file"]).unlink()
    return {
        **fp32_report,
        "int8_max_abs_diff": int8["max_abs_diff_vs_fp32"],
        "int8_auc_pr_drop": int8["auc_pr_drop"],
        "int8_p50_us_batch1": int8["p50_us_batch1"],
        "int8_p50_us_batch256": int8["p50_us_batch256"],
        "int8_speedup_batch1": speedups[0],
        "int8_speedup_batch256": speedups[1],
        "int8": int8_verdict,
        "variants": rows,
        "serving_file": chosen["file"],
        "serving_reason": reason,
    }


def _compressed(settings: Settings, model: FraudMLP, rev: str) -> dict[str, FraudMLP]:
    """The pruned and student variants of `model`, fitted on the train and validation splits of training
    set `rev` (none when compression is off)."""
    if not settings.compression.enabled:
        return {}
    from training.compress import compressed_variants
    from training.dataset import LABEL, SPLIT, read_training_set
    from training.loop import TrainConfig
    from training.steps import split_tensors

    inputs = model_inputs(model)  # the version's own inputs: the variants take what it takes
    columns = [*inputs, LABEL, SPLIT]
    train_data, validation = (
        split_tensors(read_training_set(settings, rev, split, columns), split, inputs)
        for split in ("train", "validation")
    )
    # On the export's CPU: fp32, deterministic, the training run's seed, batch size and learning rate.
    config = TrainConfig.from_settings(settings.training, device="cpu", precision="fp32")
    return compressed_variants(model, train_data, validation, settings.compression, config)


def export_version(settings: Settings, version: str, variants: bool = True) -> dict:
    """Export a registered version, with its compressed variants unless `variants` is off (fp32 alone: what
    every candidate gets before the gate's outcome is known to need more); artifacts to its run (onnx/: the
    files that may serve, export.json, the compression table), figures to the run's metrics and the
    version's tags, the file to serve to the tag `onnx.serving_file`, whether the variants were made to
    VARIANTS_TAG."""
    from mlflow.entities import Metric

    from training.dataset import read_holdout
    from training.registry import ModelRegistry
    from training.tracking import training_set_rev

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, version).run_id
    assert run_id is not None, "versions are registered from training runs"
    rev = training_set_rev(settings, run_id)
    model = cast("FraudMLP", registry.load(version))
    holdout = read_holdout(settings, rev, model_inputs(model))
    compressed = _compressed(settings, model, rev) if variants else {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        report = export_model(
            model,
            holdout.x,
            holdout.y,
            folder,
            weights=holdout.weights,
            compressed=compressed,
            max_auc_pr_drop=settings.compression.max_auc_pr_drop,
            variants=variants,
        )
        (folder / "export.json").write_text(json.dumps(report, indent=2, sort_keys=True))
        for path in sorted(folder.iterdir()):
            registry.client.log_artifact(run_id, str(path), ONNX_DIR)
    table = {column: [row[column] for row in report["variants"]] for column in TABLE_COLUMNS}
    registry.client.log_table(run_id, data=table, artifact_file=TABLE_FILE)
    now = int(time.time() * 1000)
    metrics = [Metric("onnx_parity_max_abs_diff", report["parity_max_abs_diff"], now, 0)]
    metrics += [
        Metric(f"onnx_{row['variant']}_{figure}", float(row[figure]), now, 0)
        for row in report["variants"]
        for figure in ("bytes", "p50_us_batch1", "p50_us_batch256", "auc_pr")
    ]
    registry.client.log_batch(run_id, metrics=metrics)
    for key in ("parity_max_abs_diff", "int8", "fp32_p50_us_batch1", "serving_file", "serving_reason"):
        registry.client.set_model_version_tag(registry.name, version, f"onnx.{key}", str(report[key]))
    registry.client.set_model_version_tag(registry.name, version, VARIANTS_TAG, str(variants).lower())
    return {"model_version": version, **report}
