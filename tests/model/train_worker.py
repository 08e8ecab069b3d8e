"""Train on the tiny data of tensors.py and print the result as JSON: run by tests as a child process
(killed midway to test resume) and by torchrun (two processes, gloo) to test DDP.

usage: python -m tests.model.train_worker CHECKPOINT_DIR [--epochs N] [--rows N] [--checkpoint-every N]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from tests.model.tensors import make_split
from training.dataset import NUMERIC_FEATURES
from training.loop import TrainConfig, predict, train
from training.metrics import average_precision
from training.model import FraudMLP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--stop-after-steps", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train_data, validation = make_split(args.rows, seed=1), make_split(args.rows // 4, seed=2)
    holdout = make_split(args.rows // 4, seed=3)
    torch.manual_seed(0)
    model = FraudMLP()
    model.fit_normalization(train_data.x[:, : len(NUMERIC_FEATURES)])
    config = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        checkpoint_every=args.checkpoint_every,
        patience=100,
        seed=11,
        stop_after_steps=args.stop_after_steps,
    )
    result = train(model, train_data, validation, config, args.checkpoint_dir, "tiny-v1")
    if int(os.environ.get("RANK", "0")) != 0:
        return
    scores = predict(model, holdout.x).numpy()
    print(
        json.dumps(
            {
                "holdout_auc_pr": average_precision(holdout.y.numpy(), scores),
                "best_validation_auc_pr": result.best_validation_auc_pr,
                "optimizer_steps": result.optimizer_steps,
                "resumed_from_step": result.resumed_from_step,
                "interrupted": result.interrupted,
                "world_size": result.world_size,
                "epochs_run": result.epochs_run,
                "weights_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
