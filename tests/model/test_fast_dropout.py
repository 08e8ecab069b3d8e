"""FastDropout (training/model.py) against the library call it replaces, torch.nn.functional.dropout: the same
contract element by element, the same drop rate, the same gradient, and the same model out of evaluation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from training.model import FastDropout, FraudMLP, ModelConfig, with_library_dropout

ROWS, WIDTH = 512, 130  # 66,560 elements: not a multiple of four, so the last draw is used in part


def _ratios(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out / x  # x has no zeros (drawn away from 0 below)


def _input(seed: int, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(ROWS, WIDTH, generator=generator) + 0.5
    return x.to(dtype)


@pytest.mark.parametrize("p", [0.05, 0.1, 0.3, 0.5])
def test_each_element_is_dropped_or_scaled_at_the_library_rate(p: float) -> None:
    x = _input(1)
    torch.manual_seed(3)
    ours = _ratios(FastDropout(p).train()(x), x)
    library = _ratios(nn.functional.dropout(x, p, training=True), x)
    scale = 1.0 / (1.0 - p)
    for ratios in (ours, library):  # what the library does, ours does: 0 or 1/(1-p), nothing else
        assert torch.all((ratios == 0) | torch.isclose(ratios, torch.tensor(scale)))
    n = x.numel()
    tolerance = 5 * math.sqrt(p * (1 - p) / n)  # five standard deviations of a binomial rate
    dropped_ours = (ours == 0).float().mean().item()
    dropped_library = (library == 0).float().mean().item()
    assert abs(dropped_ours - p) < tolerance
    assert abs(dropped_library - p) < tolerance
    # The mask is not one pattern repeated: rows differ, and the four words of a draw are independent.
    mask = (ours != 0).reshape(-1)[: (n // 4) * 4].reshape(-1, 4).float()
    assert abs(torch.corrcoef(mask.T)[0, 1].item()) < 0.05
    assert not torch.equal(ours[0], ours[1])


def test_the_gradient_is_the_mask_times_the_scale_as_the_library_gives() -> None:
    p = 0.2
    for layer in (FastDropout(p), nn.Dropout(p)):
        x = _input(2).requires_grad_()
        torch.manual_seed(4)
        out = layer.train()(x)
        out.sum().backward()
        assert x.grad is not None
        # d(out)/dx is the scaled mask: 1/(1-p) where the element was kept, 0 where it was dropped
        kept = out.detach() != 0
        assert 0.7 < kept.float().mean().item() < 0.9
        assert torch.equal(x.grad != 0, kept)
        assert torch.allclose(x.grad[kept], torch.tensor(1.0 / (1.0 - p)))


def test_evaluation_p_zero_and_p_one_match_the_library() -> None:
    x = _input(5)
    for p in (0.0, 0.1, 1.0):
        assert torch.equal(FastDropout(p).eval()(x), nn.functional.dropout(x, p, training=False))
    assert torch.equal(FastDropout(0.0).train()(x), nn.functional.dropout(x, 0.0, training=True))
    assert torch.equal(FastDropout(1.0).train()(x), nn.functional.dropout(x, 1.0, training=True))
    with pytest.raises(ValueError, match="between 0 and 1"):
        FastDropout(1.5)


def test_the_masks_replay_from_the_generator_state_and_keep_the_input_dtype() -> None:
    layer = FastDropout(0.1).train()
    x = _input(6, torch.bfloat16)
    torch.manual_seed(11)
    first = layer(x)
    torch.manual_seed(11)
    assert torch.equal(first, layer(x))  # a checkpoint's RNG state replays the same masks
    assert first.dtype == torch.bfloat16  # under bf16 autocast the activations stay bf16


def test_the_model_has_the_same_parameters_and_state_as_with_the_library_dropout() -> None:
    """A checkpoint or a registered model's state dict from before this layer loads unchanged, and the
    model in evaluation gives the same scores as with nn.Dropout in its place."""
    config = ModelConfig(dropout=0.1)
    ours = FraudMLP(config)
    library = with_library_dropout(FraudMLP(config))
    assert [type(m) for m in library.modules() if isinstance(m, nn.Dropout | FastDropout)] == [
        nn.Dropout
    ] * len(config.hidden)
    library.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == library.state_dict().keys()
    x = torch.randn(64, len(config.inputs))
    x[:, config.numeric :] = 1.0  # valid categorical codes
    assert torch.equal(ours.eval()(x), library.eval()(x))
