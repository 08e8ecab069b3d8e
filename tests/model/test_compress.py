"""Compression for real on tiny tensors: structured pruning removes units (smaller model, smaller ONNX file)
and keeps exactly the units torch's own L2 structured pruning would; a distilled student reproduces its
teacher's scores with fewer parameters; both are deterministic for a seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from tests.model.tensors import make_split
from training.compress import distill, prune, prune_units, soft_targets, unit_importance, units_to_keep
from training.dataset import NUMERIC_FEATURES
from training.export import to_onnx
from training.loop import Tensors, TrainConfig, predict, train
from training.metrics import average_precision
from training.model import FraudMLP, ModelConfig

FIT = TrainConfig(batch_size=128, seed=3, device="cpu", learning_rate=5e-3, patience=100)


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _model(hidden: tuple[int, ...], seed: int = 0) -> FraudMLP:
    torch.manual_seed(seed)
    model = FraudMLP(ModelConfig(hidden=hidden))
    model.fit_normalization(make_split(500, seed=9).x[:, : len(NUMERIC_FEATURES)])
    with torch.no_grad():  # LayerNorm gains of 1 everywhere would rank units by their weights alone
        for layer in model.mlp:
            if isinstance(layer, nn.LayerNorm):
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.1, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def data() -> tuple[Tensors, Tensors, Tensors]:
    return make_split(4_000, seed=1), make_split(1_000, seed=2), make_split(2_000, seed=3)


@pytest.fixture(scope="module")
def teacher(data, tmp_path_factory) -> FraudMLP:
    train_data, validation, _ = data
    model = _model((64, 32), seed=5)
    model.fit_normalization(train_data.x[:, : len(NUMERIC_FEATURES)])
    config = TrainConfig(epochs=4, batch_size=256, seed=5, device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network: one thread, as compress fits it (fast on a busy machine)
    try:
        train(model, train_data, validation, config, tmp_path_factory.mktemp("teacher"), "compress-test")
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _linears(model: FraudMLP) -> list[nn.Linear]:
    return [layer for layer in model.mlp if isinstance(layer, nn.Linear)]


def _norms(model: FraudMLP) -> list[nn.LayerNorm]:
    return [layer for layer in model.mlp if isinstance(layer, nn.LayerNorm)]


@pytest.mark.parametrize(
    ("keep_fraction", "hidden"), [(0.5, (32, 16)), (0.25, (16, 8)), (0.3, (20, 10)), (0.01, (1, 1))]
)
def test_pruning_removes_units_parameters_and_onnx_bytes(tmp_path, keep_fraction, hidden):
    model = _model((64, 32))
    pruned, kept = prune_units(model, keep_fraction)
    assert pruned.config.hidden == hidden == tuple(len(units) for units in kept)
    assert [layer.out_features for layer in _linears(pruned)] == [*hidden, 1]
    assert _parameters(pruned) < _parameters(model)
    example = make_split(4, seed=4).x
    original_file = to_onnx(model, example, tmp_path / "model.onnx")
    pruned_file = to_onnx(pruned, example, tmp_path / "model.pruned.onnx")
    assert pruned_file.stat().st_size < original_file.stat().st_size
    assert model.config.hidden == (64, 32), "the input model is not changed"


def test_keeping_every_unit_changes_nothing():
    model = _model((64, 32))
    pruned, kept = prune_units(model, 1.0)
    x = make_split(300, seed=4).x
    assert [units.tolist() for units in kept] == [list(range(64)), list(range(32))]
    assert torch.equal(predict(pruned, x), predict(model, x))


def test_the_kept_units_carry_their_own_weights_into_the_smaller_model():
    """Before any fine-tuning each kept unit computes exactly what it computed in the original model: its
    pre-activations are the original's at the kept positions, its LayerNorm entries and outgoing weights are
    the original's."""
    model = _model((64, 32))
    pruned, (first, second) = prune_units(model, 0.5)
    x = make_split(300, seed=4).x
    inputs = _first_layer_inputs(model, x)
    with torch.no_grad():
        assert torch.equal(pruned.mlp[0](inputs), model.mlp[0](inputs)[:, first])
    original, smaller = _linears(model), _linears(pruned)
    assert torch.equal(smaller[1].weight, original[1].weight[second][:, first])
    assert torch.equal(smaller[1].bias, original[1].bias[second])
    assert torch.equal(smaller[2].weight, original[2].weight[:, second])
    assert torch.equal(smaller[2].bias, original[2].bias)
    for norm, big, units in zip(_norms(pruned), _norms(model), (first, second), strict=True):
        assert torch.equal(norm.weight, big.weight[units]) and torch.equal(norm.bias, big.bias[units])
    assert torch.equal(pruned.mean, model.mean) and torch.equal(pruned.std, model.std)
    for small_embedding, big_embedding in zip(pruned.embeddings, model.embeddings, strict=True):
        assert torch.equal(small_embedding.weight, big_embedding.weight)


def _first_layer_inputs(model: FraudMLP, x: torch.Tensor) -> torch.Tensor:
    """What the first Linear sees: the model's forward pass up to the MLP."""
    captured: list[torch.Tensor] = []
    handle = model.mlp[0].register_forward_hook(lambda _m, args, _out: captured.append(args[0]))
    try:
        predict(model, x)
    finally:
        handle.remove()
    return torch.cat(captured)


@pytest.mark.parametrize("keep_fraction", [0.5, 0.25, 0.75])
def test_the_ranking_keeps_the_units_torchs_l2_structured_pruning_keeps(keep_fraction):
    """torch.nn.utils.prune.ln_structured(n=2, dim=0) keeps the rows of largest L2 norm. A unit's importance
    here is its incoming row's norm times its LayerNorm gain times its outgoing column's norm, which is the
    L2 norm of its incoming row scaled by the other two: the rows torch keeps of that scaled matrix must be
    the units prune_units keeps."""
    model = _model((64, 32), seed=2)
    _, kept = prune_units(model, keep_fraction)
    linears, norms = _linears(model), _norms(model)
    for layer, units in enumerate(kept):
        scale = norms[layer].weight.abs() * linears[layer + 1].weight.norm(p=2, dim=0)
        probe = nn.Linear(linears[layer].in_features, linears[layer].out_features)
        with torch.no_grad():
            probe.weight.copy_(linears[layer].weight * scale[:, None])
        torch_prune.ln_structured(probe, "weight", amount=1.0 - keep_fraction, n=2, dim=0)
        torch_kept = probe.weight_mask.sum(dim=1).nonzero().flatten()
        assert units.tolist() == torch_kept.tolist(), f"hidden layer {layer}"


def test_a_single_layers_ranking_by_its_rows_is_torchs():
    layer = nn.Linear(12, 40)
    torch_prune.ln_structured(layer, "weight", amount=0.5, n=2, dim=0)
    kept = units_to_keep(layer.weight_orig.detach().norm(p=2, dim=1), 0.5)
    assert kept.tolist() == layer.weight_mask.sum(dim=1).nonzero().flatten().tolist()


def test_importance_follows_the_outgoing_weights():
    """A unit whose outgoing weights are zero carries nothing upward: it ranks last and is the one dropped."""
    model = _model((8,))
    with torch.no_grad():
        _linears(model)[1].weight[:, 5] = 0.0
    (importance,) = unit_importance(model)
    assert importance[5] == 0 and int(importance.argmin()) == 5
    _, (kept,) = prune_units(model, 7 / 8)
    assert 5 not in kept.tolist() and len(kept) == 7


@pytest.mark.parametrize("keep_fraction", [0.0, -0.5, 1.5])
def test_a_keep_fraction_outside_0_1_is_refused(keep_fraction):
    with pytest.raises(ValueError, match="keep_fraction"):
        prune_units(_model((8,)), keep_fraction)


def test_fine_tuning_brings_the_pruned_model_back_towards_its_original(data, teacher):
    train_data, validation, holdout = data
    before, _ = prune_units(teacher, 0.25)
    after = prune(teacher, 0.25, train_data, validation, fine_tune_epochs=3, config=FIT)
    assert after.config.hidden == before.config.hidden == (16, 8)
    reference = predict(teacher, holdout.x).numpy()

    def distance(model: FraudMLP) -> float:
        return float(np.mean(np.abs(predict(model, holdout.x).numpy() - reference)))

    assert distance(after) < 0.7 * distance(before)


def test_the_student_learns_its_teacher_with_fewer_parameters(data, teacher):
    train_data, validation, holdout = data
    student = distill(teacher, train_data, validation, hidden=(8,), epochs=10, config=FIT)
    assert student.config.hidden == (8,) and not student.training
    assert _parameters(student) < _parameters(teacher) / 4
    teacher_scores = predict(teacher, holdout.x).numpy()
    student_scores = predict(student, holdout.x).numpy()
    untrained_scores = predict(FraudMLP(student.config), holdout.x).numpy()
    assert np.corrcoef(student_scores, teacher_scores)[0, 1] > 0.85
    assert np.corrcoef(untrained_scores, teacher_scores)[0, 1] < 0.5  # the check can tell
    labels = holdout.y.numpy()
    base_rate = float(labels.mean())
    teacher_auc_pr = average_precision(labels, teacher_scores)
    assert teacher_auc_pr > 3 * base_rate
    assert average_precision(labels, student_scores) > teacher_auc_pr - 0.1
    # the student's inputs are the teacher's: normalization and embeddings copied
    assert torch.equal(student.mean, teacher.mean) and torch.equal(student.std, teacher.std)


def test_distillation_and_pruning_are_deterministic_for_a_seed(data, teacher):
    train_data, validation, _ = data
    config = FIT
    students = [distill(teacher, train_data, validation, hidden=(4,), epochs=2, config=config) for _ in "ab"]
    pruned = [prune(teacher, 0.5, train_data, validation, fine_tune_epochs=1, config=config) for _ in "ab"]
    for first, second in (students, pruned):
        for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
            assert torch.equal(a, b), name


def test_distillation_reads_at_most_max_rows_of_the_train_split(data, teacher, monkeypatch):
    import training.compress as compress

    seen: list[int] = []
    fit = compress.fit_to_teacher

    def spy(student, teacher, train_data, validation, config, label_weight=0.0):
        seen.append(len(train_data))
        return fit(student, teacher, train_data, validation, config, label_weight)

    monkeypatch.setattr(compress, "fit_to_teacher", spy)
    train_data, validation, _ = data
    distill(teacher, train_data, validation, hidden=(4,), epochs=1, max_rows=700, config=FIT)
    assert seen == [700] and len(train_data) == 4_000


def test_the_inputs_are_not_changed(data, teacher):
    train_data, validation, _ = data
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    x, y = train_data.x.clone(), train_data.y.clone()
    distill(teacher, train_data, validation, hidden=(4,), epochs=1, config=FIT)
    prune(teacher, 0.5, train_data, validation, fine_tune_epochs=1, config=FIT)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())
    assert torch.equal(train_data.x.nan_to_num(-7), x.nan_to_num(-7)) and torch.equal(train_data.y, y)
    assert not teacher.training


def test_an_onnx_export_of_a_student_is_a_file_of_its_own(tmp_path, data, teacher):
    train_data, validation, _ = data
    student = distill(teacher, train_data, validation, hidden=(4,), epochs=1, config=FIT)
    example = train_data.x[:4]
    small = to_onnx(student, example, tmp_path / "student.onnx")
    big = to_onnx(teacher, example, tmp_path / "teacher.onnx")
    assert Path(small).stat().st_size < Path(big).stat().st_size / 2


@pytest.mark.parametrize("label_weight", [0.0, 0.3, 1.0])
def test_the_targets_are_the_teachers_probabilities_mixed_with_the_labels(data, teacher, label_weight):
    train_data, _, _ = data
    targets = soft_targets(teacher, train_data, label_weight)
    expected = (1 - label_weight) * predict(teacher, train_data.x) + label_weight * train_data.y
    assert torch.allclose(targets.y, expected) and targets.x is train_data.x
    assert float(targets.y.min()) >= 0.0 and float(targets.y.max()) <= 1.0


def test_a_label_weight_outside_0_1_is_refused(data, teacher):
    with pytest.raises(ValueError, match="label_weight"):
        soft_targets(teacher, data[0], 1.5)
