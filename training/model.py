"""The fraud model: an MLP over normalized numeric features and embedded categoricals.

The model takes one float32 matrix of its config's inputs, by name (TRAINING_INPUTS when trained now:
numeric features, then categorical codes), and returns the fraud probability, so the same tensor
signature serves MLflow, ONNX and the online scorer.
Normalization statistics are buffers fitted on the train split: the exported model needs nothing else.
Missing feature values (an entity never seen within a view's TTL) arrive as NaN and become 0 after
normalization, with an indicator per numeric column telling the network they were missing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, cast

import torch
from torch import nn

from model_contract.inputs import CATEGORICAL_VOCAB, TRAINING_INPUTS, numeric_width


@dataclass(frozen=True)
class ModelConfig:
    numeric: int = numeric_width(TRAINING_INPUTS)  # the first `numeric` inputs; the codes follow
    # vocabulary size per categorical column, +1 for "unknown" (code 0)
    cardinalities: tuple[int, ...] = tuple(len(v) + 1 for v in CATEGORICAL_VOCAB.values())
    hidden: tuple[int, ...] = (128, 64)
    dropout: float = 0.1
    embedding_dims: tuple[int, ...] = field(default=())
    # The input columns by name, in order: every built input but the deprecated features (TRAINING_INPUTS).
    # A version is served, gated and monitored on these names, never by position.
    inputs: tuple[str, ...] = TRAINING_INPUTS

    def embedding_sizes(self) -> tuple[int, ...]:
        # a common rule of thumb: about the fourth root of the cardinality, times 2, at most 16
        return self.embedding_dims or tuple(min(16, max(2, round(2 * c**0.25))) for c in self.cardinalities)

    def to_dict(self) -> dict:
        return {**asdict(self), "embedding_dims": list(self.embedding_sizes())}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """The config `to_dict` wrote (JSON turns its tuples into lists); unknown keys are refused."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {', '.join(unknown)}")
        kwargs: dict[str, Any] = {key: tuple(v) if isinstance(v, list) else v for key, v in values.items()}
        return cls(**kwargs)


class FastDropout(nn.Module):
    """nn.Dropout's contract (training: each element zeroed with probability p, the rest scaled by 1/(1-p);
    evaluation: the identity) with a cheaper mask. torch draws one random number per element for its mask
    (`bernoulli_`), which took 9.9 s of a 43.7 s epoch loop at 1M rows a day (docs/benchmarks.md); here one
    64-bit draw gives four 16-bit words, each compared with p's threshold, about 2.5x cheaper forward and
    backward on the CPU. p is resolved to 1/65536. The draws come from torch's generator of the input's
    device, so a checkpoint's RNG state replays the same masks. tests/model/test_fast_dropout.py holds it to
    `torch.nn.functional.dropout`'s behaviour; torch is pinned exactly (pyproject.toml)."""

    WORD_BITS = 16

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        # A word w (signed, uniform over [-32768, 32767]) is kept when w >= threshold: P = 1 - p.
        self.threshold = round(p * 2**self.WORD_BITS) - 2 ** (self.WORD_BITS - 1)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0  # every element dropped (keeps the graph, as torch's dropout does)
        words = -(-x.numel() // 4)  # four 16-bit words per 64-bit draw
        draws = torch.randint(-(2**63), 2**63 - 1, (words,), dtype=torch.int64, device=x.device)
        bits = draws.view(torch.int16)[: x.numel()].view(x.shape)
        keep = (bits >= self.threshold).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * keep


def with_library_dropout(model: nn.Module) -> nn.Module:
    """`model` (in place) with torch's own nn.Dropout wherever it has FastDropout: the layer FastDropout
    replaced, which its contract test and the training benchmark hold it against."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, FastDropout):
                setattr(module, name, nn.Dropout(child.p))
    return model


class FraudMLP(nn.Module):
    # Buffers registered in __init__: declared here because register_buffer gives them no static type.
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, config: ModelConfig = ModelConfig()) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("mean", torch.zeros(config.numeric))
        self.register_buffer("std", torch.ones(config.numeric))
        self.embeddings = nn.ModuleList(
            nn.Embedding(card, dim)
            for card, dim in zip(config.cardinalities, config.embedding_sizes(), strict=True)
        )
        width = 2 * config.numeric + sum(config.embedding_sizes())
        layers: list[nn.Module] = []
        for hidden in config.hidden:
            layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU(), FastDropout(config.dropout)]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    @torch.no_grad()
    def fit_normalization(self, numeric: torch.Tensor) -> None:
        """Mean and standard deviation per numeric column over the rows where it is present."""
        present = ~torch.isnan(numeric)
        counts = present.sum(0).clamp(min=1)
        values = torch.where(present, numeric, torch.zeros_like(numeric))
        mean = values.sum(0) / counts
        var = (torch.where(present, numeric - mean, torch.zeros_like(numeric)) ** 2).sum(0) / counts
        self.mean.copy_(mean)
        self.std.copy_(var.sqrt().clamp(min=1e-6))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        n = self.config.numeric
        numeric, codes = x[:, :n], x[:, n:]
        missing = torch.isnan(numeric)
        scaled = torch.where(missing, torch.zeros_like(numeric), (numeric - self.mean) / self.std)
        parts = [scaled, missing.to(scaled.dtype)]
        for index, embedding in enumerate(self.embeddings):
            cardinality = cast(nn.Embedding, embedding).num_embeddings  # a ModuleList yields plain Modules
            code = codes[:, index].long().clamp(0, cardinality - 1)
            parts.append(embedding(code).to(scaled.dtype))
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)

    def forward(self, x: torch.Tensor, logits: bool = False) -> torch.Tensor:
        """Fraud probability per row (the raw logit with `logits=True`, for the loss)."""
        out = self.logits(x)
        return out if logits else torch.sigmoid(out)
