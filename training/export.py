"""CPU scoring export: ONNX for every registered version, with a parity check against torch, and an int8
(dynamic quantization) variant kept only where it is both faster and within the accuracy tolerance.

The artifacts go to the version's MLflow run under `onnx/`; the figures become tags of the version, so a
scorer can pick the file and see why int8 was kept or dropped.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from training.metrics import average_precision

if TYPE_CHECKING:
    import torch

    from core.settings import Settings

INPUT_NAME = "features"
OUTPUT_NAME = "fraud_probability"
PARITY_TOLERANCE = 1e-4  # fp32 ONNX against torch eager, max absolute score difference
INT8_MAX_AUC_PR_DROP = 0.005
# int8 must be at least this much faster at batch 1 (online scoring) and at batch 256 to be worth a file
INT8_MIN_SPEEDUP = 1.10


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
    return path


def session(path: Path, threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


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
    return target


def export_model(model: torch.nn.Module, x: np.ndarray, labels: np.ndarray, folder: Path) -> dict:
    """Export `model`, check parity on `x`, try int8; returns the report (files in `folder`)."""
    import torch

    from training.loop import predict

    folder.mkdir(parents=True, exist_ok=True)
    fp32_path = to_onnx(model, torch.from_numpy(x[:2]), folder / "model.onnx")
    torch_scores = predict(model, torch.from_numpy(x)).numpy()
    fp32 = session(fp32_path)
    fp32_scores = onnx_scores(fp32, x).reshape(-1)
    parity = float(np.max(np.abs(fp32_scores - torch_scores))) if len(x) else 0.0
    if parity > PARITY_TOLERANCE:
        raise ExportError(
            f"ONNX export differs from torch by {parity:.2e} (tolerance {PARITY_TOLERANCE:.0e}) "
            f"on {len(x)} rows"
        )
    batch256 = x[:256]
    report: dict[str, Any] = {
        "parity_max_abs_diff": parity,
        "rows_checked": len(x),
        "fp32_p50_us_batch1": latency_us(lambda b: fp32.run(None, {INPUT_NAME: b}), x[:1], 300),
        "fp32_p50_us_batch256": latency_us(lambda b: fp32.run(None, {INPUT_NAME: b}), batch256, 100),
    }
    int8_path = quantize(fp32_path, folder / "model.int8.onnx")
    int8 = session(int8_path)
    int8_scores = onnx_scores(int8, x).reshape(-1)
    auc_drop = average_precision(labels, fp32_scores) - average_precision(labels, int8_scores)
    report.update(
        int8_max_abs_diff=float(np.max(np.abs(int8_scores - fp32_scores))) if len(x) else 0.0,
        int8_auc_pr_drop=float(auc_drop),
        int8_p50_us_batch1=latency_us(lambda b: int8.run(None, {INPUT_NAME: b}), x[:1], 300),
        int8_p50_us_batch256=latency_us(lambda b: int8.run(None, {INPUT_NAME: b}), batch256, 100),
    )
    report["int8_speedup_batch1"] = report["fp32_p50_us_batch1"] / report["int8_p50_us_batch1"]
    report["int8_speedup_batch256"] = report["fp32_p50_us_batch256"] / report["int8_p50_us_batch256"]
    speedup = min(report["int8_speedup_batch1"], report["int8_speedup_batch256"])
    if auc_drop > INT8_MAX_AUC_PR_DROP:
        report["int8"] = f"dropped: AUC-PR falls by {auc_drop:.4f} (> {INT8_MAX_AUC_PR_DROP})"
    elif speedup < INT8_MIN_SPEEDUP:
        report["int8"] = (
            f"dropped: {report['int8_speedup_batch1']:.2f}x / {report['int8_speedup_batch256']:.2f}x "
            f"the fp32 speed at batch 1 / 256 (needs >= {INT8_MIN_SPEEDUP}x at both)"
        )
    else:
        report["int8"] = f"kept: >= {speedup:.2f}x faster at batch 1 and 256, AUC-PR drop {auc_drop:.4f}"
    if not report["int8"].startswith("kept"):
        int8_path.unlink()
    return report


def export_version(settings: Settings, version: str) -> dict:
    """Export a registered version; artifacts to its run (onnx/), figures to the version's tags."""
    from training.dataset import read_holdout
    from training.registry import ModelRegistry
    from training.tracking import training_set_rev

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, version).run_id
    assert run_id is not None, "versions are registered from training runs"
    holdout = read_holdout(settings, training_set_rev(settings, run_id))
    model = registry.load(version)
    x = holdout.x[:20_000]  # parity and speed: the first rows, unweighted
    labels = holdout.y[:20_000]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        report = export_model(model, x, labels, folder)
        (folder / "export.json").write_text(json.dumps(report, indent=2, sort_keys=True))
        for path in sorted(folder.iterdir()):
            registry.client.log_artifact(run_id, str(path), "onnx")
    registry.client.log_metric(run_id, "onnx_parity_max_abs_diff", report["parity_max_abs_diff"])
    for key in ("parity_max_abs_diff", "int8", "fp32_p50_us_batch1"):
        registry.client.set_model_version_tag(registry.name, version, f"onnx.{key}", str(report[key]))
    return {"model_version": version, **report}
