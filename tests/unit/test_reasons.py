"""A decision's reasons (serving/reasons.py) on a real ONNX Runtime session of a known model, where each
input's effect can be worked out by hand, and the export's baseline (training/export.py) read back."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from model_contract.inputs import MODEL_INPUTS
from model_contract.onnx import BASELINE_METADATA, INPUT_NAME, recorded_baseline, session
from serving.models import LoadedModel
from serving.reasons import as_text, explain

pytestmark = pytest.mark.unit

WEIGHTS = np.zeros(len(MODEL_INPUTS), dtype="float32")
WEIGHTS[:3] = (2.0, -1.0, 0.5)  # only the first three inputs matter


def _logistic(folder, baseline: dict | None):
    """score = sigmoid(x . WEIGHTS), as an ONNX graph with the metadata an export writes."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [INPUT_NAME, "w"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["score"]),
        ],
        "logistic",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", len(MODEL_INPUTS)])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor("w", TensorProto.FLOAT, [len(MODEL_INPUTS), 1], WEIGHTS.tolist())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if baseline is not None:
        helper.set_model_props(model, {BASELINE_METADATA: json.dumps(baseline)})
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    sess = session(path)
    return LoadedModel("m", "1", "run", "m.onnx", sess, baseline=recorded_baseline(sess, MODEL_INPUTS))


def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def test_the_reasons_are_the_inputs_whose_value_raised_the_score_most_worked_out_by_hand(tmp_path):
    model = _logistic(tmp_path, {name: 0.0 for name in MODEL_INPUTS})
    x = np.zeros((2, len(MODEL_INPUTS)), dtype="float32")
    x[0, :3] = (1.0, -2.0, 1.0)  # logit 2 + 2 + 0.5: every one of the three raised it
    x[1, :3] = (0.0, 3.0, 0.0)  # logit -3: input 1 lowered it, nothing raised it
    scores = model.score(x)
    reasons = explain(model, x, scores, [0, 1], count=2)
    full = 4.5
    expected = [
        (MODEL_INPUTS[0], _sigmoid(full) - _sigmoid(full - 2.0)),
        (MODEL_INPUTS[1], _sigmoid(full) - _sigmoid(full - 2.0)),
    ]
    got = [(r["input"], r["effect"]) for r in reasons[0]]
    assert [name for name, _ in got] == [name for name, _ in expected]
    assert all(math.isclose(g, e, abs_tol=1e-5) for (_, g), (_, e) in zip(got, expected, strict=True))
    assert reasons[0][0]["value"] == 1.0 and reasons[0][0]["baseline"] == 0.0
    assert reasons[1] == []  # only positive effects are reasons
    assert as_text(reasons[0]).startswith(f"{MODEL_INPUTS[0]}:+0.")


def test_only_the_rows_asked_for_are_explained_and_a_non_finite_score_gets_none(tmp_path):
    model = _logistic(tmp_path, {name: 0.0 for name in MODEL_INPUTS})
    x = np.ones((3, len(MODEL_INPUTS)), dtype="float32")
    scores = model.score(x)
    scores[2] = float("nan")
    assert set(explain(model, x, scores, [1, 2], count=3)) == {1}


def test_a_version_without_a_baseline_explains_nothing_and_still_scores(tmp_path):
    missing_one = {name: 0.0 for name in MODEL_INPUTS[1:]}
    for baseline in (None, missing_one):
        model = _logistic(tmp_path, baseline)
        assert model.baseline is None
        x = np.ones((1, len(MODEL_INPUTS)), dtype="float32")
        assert explain(model, x, model.score(x), [0], count=3) == {}


def test_the_export_records_the_training_mean_and_the_most_frequent_code(tmp_path):
    import torch

    from training.export import export_checked
    from training.model import FraudMLP, ModelConfig

    model = FraudMLP(ModelConfig(hidden=(8,)))
    numeric = model.config.numeric
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, len(MODEL_INPUTS))).astype("float32")
    x[:, numeric:] = 1.0
    x[:50, numeric] = 2.0  # the first code's most frequent value stays 1
    model.fit_normalization(torch.from_numpy(x[:, :numeric]))
    path = tmp_path / "model.onnx"
    export_checked(model.eval(), x, path)
    baseline = recorded_baseline(session(path), model.config.inputs)
    assert baseline is not None
    np.testing.assert_allclose(baseline[:numeric], model.mean.numpy(), rtol=1e-6)
    assert baseline[numeric:] == (1.0,) * (len(MODEL_INPUTS) - numeric)


def test_an_effect_too_small_to_show_is_not_a_reason(tmp_path):
    model = _logistic(tmp_path, {name: 0.0 for name in MODEL_INPUTS})
    x = np.zeros((1, len(MODEL_INPUTS)), dtype="float32")
    x[0, 2] = 1e-6  # raises the score by about 1e-7: shown as +0.000000, so it is no reason
    scores = model.score(x)
    assert explain(model, x, scores, [0], count=3) == {0: []}
