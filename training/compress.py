"""Smaller models of a trained FraudMLP for CPU scoring: a student distilled from its scores, and a copy
structurally pruned to fewer hidden units. The export (training/export.py) builds both for every version,
measures them beside fp32 and int8, and serves the smallest one that is as accurate.

Both are fitted to the teacher's probabilities (soft targets) by the training loop itself (training/loop.py:
seeded, early stopping on validation AUC-PR, the best epoch kept), on at most `max_rows` rows of the train
split and for a few epochs: they run inside every export, on the CPU of the export task.

Pruning removes units physically: each hidden layer keeps its most important units (the L2 norm of the
unit's incoming weights, times its LayerNorm gain, times the L2 norm of its outgoing weights: how much
signal the unit can carry from the layer below to the layer above), and the kept rows of the Linear, the
LayerNorm's entries and the next Linear's columns are copied into a FraudMLP with narrower `hidden`. Zeroing
weights (torch.nn.utils.prune's masks) leaves the matrices, the ONNX file and the scoring time as they were.
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from training.export import PRUNED, STUDENT
from training.loop import Tensors, TrainConfig, TrainResult, predict, train
from training.model import FraudMLP

if TYPE_CHECKING:
    from core.settings import CompressionSettings


def sample_rows(data: Tensors, max_rows: int, seed: int) -> Tensors:
    """At most `max_rows` rows of `data`, drawn without replacement by `seed`, in their original order."""
    if len(data) <= max_rows:
        return data
    index = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:max_rows].sort().values
    return Tensors(data.x[index], data.y[index])


def soft_targets(teacher: nn.Module, data: Tensors, label_weight: float = 0.0) -> Tensors:
    """`data` with the teacher's probabilities as labels, mixed with the true labels by `label_weight`."""
    if not 0.0 <= label_weight <= 1.0:
        raise ValueError(f"label_weight must lie in [0, 1], not {label_weight}")
    device = next(teacher.parameters()).device
    probabilities = predict(teacher, data.x.to(device)).cpu().to(data.y.dtype)
    return Tensors(data.x, (1.0 - label_weight) * probabilities + label_weight * data.y)


def fit_to_teacher(
    student: FraudMLP,
    teacher: nn.Module,
    train_data: Tensors,
    validation: Tensors,
    config: TrainConfig,
    label_weight: float = 0.0,
) -> TrainResult:
    """Train `student` in place on the teacher's probabilities (binary cross-entropy on logits against
    them); early stopping on the validation split's AUC-PR against its true labels."""
    targets = soft_targets(teacher, train_data, label_weight)
    # No positive weighting: the targets are the teacher's probabilities, already what it learned with its
    # own weighting, and the student should reproduce them. Each fit is short: no resumable checkpoints.
    config = replace(config, pos_weight=1.0, checkpoint_every=10**9, stop_after_steps=None)
    # One thread: these networks are too small to share out, and on a busy 2-core machine two threads made a
    # fit 5 to 20 times slower than one (measured); the process's setting is restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="mlops-compress-") as scratch:
            return train(student, targets, validation, config, Path(scratch), data_identity="compress")
    finally:
        torch.set_num_threads(threads)


def _fit_sampled(
    student: FraudMLP,
    teacher: nn.Module,
    train_data: Tensors,
    validation: Tensors,
    config: TrainConfig,
    max_rows: int,
    label_weight: float = 0.0,
) -> TrainResult:
    """fit_to_teacher on at most `max_rows` rows of each split (seeded by the config's seed)."""
    return fit_to_teacher(
        student,
        teacher,
        sample_rows(train_data, max_rows, config.seed),
        sample_rows(validation, max_rows, config.seed + 1),
        config,
        label_weight,
    )


def distill(
    teacher: FraudMLP,
    train_data: Tensors,
    validation: Tensors,
    hidden: tuple[int, ...] = (32,),
    epochs: int = 3,
    max_rows: int = 200_000,
    label_weight: float = 0.0,
    config: TrainConfig | None = None,
) -> FraudMLP:
    """A FraudMLP with `hidden` layers trained to reproduce `teacher`'s scores. It takes the same inputs and
    starts from the teacher's normalization and embeddings (the inputs' representation is the teacher's;
    only the layers above are smaller)."""
    config = replace(config or TrainConfig(device="cpu"), epochs=epochs)
    torch.manual_seed(config.seed)
    student = FraudMLP(replace(teacher.config, hidden=tuple(hidden)))
    own = student.state_dict()
    student.load_state_dict(
        {**own, **{k: v for k, v in teacher.state_dict().items() if not k.startswith("mlp.")}}
    )
    _fit_sampled(student, teacher, train_data, validation, config, max_rows, label_weight)
    return student.to("cpu").eval()


def _hidden_layers(model: FraudMLP) -> tuple[list[int], list[int]]:
    """Positions in `model.mlp` of the Linear layers (every hidden one, then the output) and of the
    LayerNorms (one per hidden layer)."""
    linears = [i for i, layer in enumerate(model.mlp) if isinstance(layer, nn.Linear)]
    norms = [i for i, layer in enumerate(model.mlp) if isinstance(layer, nn.LayerNorm)]
    if len(linears) != len(model.config.hidden) + 1 or len(norms) != len(model.config.hidden):
        raise ValueError(
            f"unexpected FraudMLP layout: {len(linears)} Linear and {len(norms)} LayerNorm layers for "
            f"hidden={model.config.hidden}"
        )
    return linears, norms


@torch.no_grad()
def unit_importance(model: FraudMLP) -> list[torch.Tensor]:
    """Per hidden layer, each unit's importance: the L2 norm of its incoming weights (its row of the Linear)
    times its LayerNorm gain's magnitude times the L2 norm of its outgoing weights (its column of the next
    Linear)."""
    linears, norms = _hidden_layers(model)
    importance = []
    for layer, (linear, norm) in enumerate(zip(linears, norms, strict=False)):
        incoming = cast(nn.Linear, model.mlp[linear]).weight.norm(p=2, dim=1)
        gain = cast(nn.LayerNorm, model.mlp[norm]).weight.abs()
        outgoing = cast(nn.Linear, model.mlp[linears[layer + 1]]).weight.norm(p=2, dim=0)
        importance.append((incoming * gain * outgoing).detach().cpu())
    return importance


def units_to_keep(importance: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """Indices (ascending) of the ceil(keep_fraction * units) most important units, at least one."""
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must lie in (0, 1], not {keep_fraction}")
    count = max(1, math.ceil(keep_fraction * len(importance) - 1e-9))
    return torch.topk(importance, count).indices.sort().values


@torch.no_grad()
def prune_units(model: FraudMLP, keep_fraction: float) -> tuple[FraudMLP, list[torch.Tensor]]:
    """A copy of `model` holding only the most important `keep_fraction` of every hidden layer's units (not
    fine-tuned), and the indices of the units each layer kept."""
    linears, norms = _hidden_layers(model)
    kept = [units_to_keep(importance, keep_fraction) for importance in unit_importance(model)]
    state = {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}
    previous: torch.Tensor | None = None  # units kept in the layer below (None: every input column)
    for linear, norm, units in zip(linears, norms, kept, strict=False):
        weight = state[f"mlp.{linear}.weight"][units]
        state[f"mlp.{linear}.weight"] = weight if previous is None else weight[:, previous]
        state[f"mlp.{linear}.bias"] = state[f"mlp.{linear}.bias"][units]
        state[f"mlp.{norm}.weight"] = state[f"mlp.{norm}.weight"][units]
        state[f"mlp.{norm}.bias"] = state[f"mlp.{norm}.bias"][units]
        previous = units
    output = linears[-1]
    state[f"mlp.{output}.weight"] = state[f"mlp.{output}.weight"][:, previous]
    pruned = FraudMLP(replace(model.config, hidden=tuple(len(units) for units in kept)))
    pruned.load_state_dict(state)
    return pruned.eval(), kept


def prune(
    model: FraudMLP,
    keep_fraction: float,
    train_data: Tensors,
    validation: Tensors,
    fine_tune_epochs: int = 3,
    max_rows: int = 200_000,
    config: TrainConfig | None = None,
) -> FraudMLP:
    """`model` with `keep_fraction` of each hidden layer's units (prune_units), then fine-tuned for
    `fine_tune_epochs` on the original model's scores (0: not fine-tuned)."""
    pruned, _ = prune_units(model, keep_fraction)
    if fine_tune_epochs > 0:
        config = replace(config or TrainConfig(device="cpu"), epochs=fine_tune_epochs)
        _fit_sampled(pruned, model, train_data, validation, config, max_rows)
    return pruned.to("cpu").eval()


def compressed_variants(
    model: FraudMLP,
    train_data: Tensors,
    validation: Tensors,
    settings: CompressionSettings,
    config: TrainConfig,
) -> dict[str, FraudMLP]:
    """The pruned and the student variants of `model`, as the compression settings ask; `config` gives the
    seed, batch size and learning rate (the epochs are the settings')."""
    teacher = copy.deepcopy(model).to("cpu").eval()  # the caller's model keeps its device and mode
    return {
        PRUNED: prune(
            teacher,
            settings.prune_keep_fraction,
            train_data,
            validation,
            fine_tune_epochs=settings.epochs,
            max_rows=settings.max_rows,
            config=config,
        ),
        STUDENT: distill(
            teacher,
            train_data,
            validation,
            hidden=tuple(settings.student_hidden),
            epochs=settings.epochs,
            max_rows=settings.max_rows,
            config=config,
        ),
    }
