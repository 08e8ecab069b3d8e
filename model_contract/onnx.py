"""The names a model is registered and exported under, which training writes and serving reads: the
registered model and its champion alias (MLflow), the ONNX export's artifact folder, its input tensor and
the tag that names the file to serve, the metadata naming the inputs of the graph, and the ONNX Runtime
session every reader scores with."""

from __future__ import annotations

import json
from pathlib import Path

MODEL_NAME = "fraud-detector"
CHAMPION_ALIAS = "champion"
INPUT_NAME = "features"  # the ONNX graph's input: float32 rows, one column per name of INPUTS_METADATA
# The ONNX model's metadata entry listing its input columns by name (JSON), in the matrix's order: the
# names the version was trained on (ModelConfig.inputs), which every reader selects its columns by.
INPUTS_METADATA = "mlops.model_inputs"
# Each input's reference value (JSON {name: value}): the training mean of a numeric input (what the model's
# normalization centres on), the most frequent code of a categorical one. A decision's reasons are the inputs
# whose own value, put back to this, moves its score most (serving/reasons.py).
BASELINE_METADATA = "mlops.baseline_inputs"
ONNX_DIR = "onnx"  # the run's artifact folder of the export
SERVING_FILE_TAG = f"{ONNX_DIR}.serving_file"  # which file of ONNX_DIR the export chose to serve


def session(path: Path, threads: int = 1):
    """An ONNX Runtime session on the CPU, `threads` threads within an operator, one across."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def recorded_inputs(sess) -> tuple[str, ...] | None:
    """The input names an export recorded in its ONNX metadata (INPUTS_METADATA); None for a file without
    them (exported before the names were recorded)."""
    raw = sess.get_modelmeta().custom_metadata_map.get(INPUTS_METADATA)
    if raw is None:
        return None
    names = json.loads(raw)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"ONNX metadata {INPUTS_METADATA} is not a list of names: {raw[:200]!r}")
    return tuple(names)


def recorded_baseline(sess, inputs: tuple[str, ...]) -> tuple[float, ...] | None:
    """The reference value of each of `inputs` the export recorded (BASELINE_METADATA), in their order;
    None for a file without one (exported before baselines were recorded), or one that is not JSON or misses
    an input: reasons are then not given, the version still serves."""
    raw = sess.get_modelmeta().custom_metadata_map.get(BASELINE_METADATA)
    if raw is None:
        return None
    try:
        values = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(values, dict) or not all(isinstance(values.get(name), int | float) for name in inputs):
        return None
    return tuple(float(values[name]) for name in inputs)


def input_width(sess) -> int | None:
    """The number of columns of the graph's input (None when the graph leaves it symbolic)."""
    shape = sess.get_inputs()[0].shape
    return shape[-1] if len(shape) == 2 and isinstance(shape[-1], int) else None
