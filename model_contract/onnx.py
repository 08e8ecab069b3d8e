"""The names a model is registered and exported under, which training writes and serving reads: the
registered model and its champion alias (MLflow), the ONNX export's artifact folder, its input tensor and
the tag that names the file to serve, and the ONNX Runtime session every reader scores with."""

from __future__ import annotations

from pathlib import Path

MODEL_NAME = "fraud-detector"
CHAMPION_ALIAS = "champion"
INPUT_NAME = "features"  # the ONNX graph's input: float32 rows in model_contract.inputs.MODEL_INPUTS order
ONNX_DIR = "onnx"  # the run's artifact folder of the export
SERVING_FILE_TAG = f"{ONNX_DIR}.serving_file"  # which file of ONNX_DIR the export chose to serve


def session(path: Path, threads: int = 1):
    """An ONNX Runtime session on the CPU, `threads` threads within an operator, one across."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
