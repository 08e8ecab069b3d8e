"""The training loop: tensors on the device, batched indexing, mixed precision, gradient accumulation,
early stopping, atomic checkpoints with resume, and DistributedDataParallel under torchrun.

Reproducibility: each epoch's order comes from a generator seeded by (seed, epoch), and a checkpoint holds
the model, optimizer, scaler, position in the epoch and the torch RNG states, so a run killed after a
checkpoint and started again with the same arguments continues exactly where it was: the same batches
in the same order with the same dropout masks. Only torch RNGs are used (numpy and `random` are not), so
the checkpoint holds only tensors and plain values and loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from core.errors import PipelineError
from training.metrics import average_precision

if TYPE_CHECKING:
    from core.settings import TrainingSettings

T = TypeVar("T")


def _pick(value: T | None, default: T) -> T:
    return default if value is None else value


log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # device types with a fused AdamW kernel in torch


class TrainingDivergedError(PipelineError):
    """The loss or the validation scores became non-finite: the run cannot recover by itself, and a retry with
    the same settings diverges the same way (so it fails its task without retries)."""


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 15
    batch_size: int = 512
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    accumulation_steps: int = 1
    seed: int = 7
    patience: int = 3
    checkpoint_every: int = 50  # optimizer steps
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    pos_weight: float | None = None  # None: negatives / positives of the train split, at most 100
    # The model's architecture (training/model.py ModelConfig): part of the fingerprint, so a checkpoint of
    # another architecture is never resumed.
    hidden: tuple[int, ...] = (128, 64)
    dropout: float = 0.1
    # Where tuned hyperparameters came from ("" when from the settings); recorded, not part of the result.
    tuned_from: str = ""
    # For tests and drills: stop (as if killed) after this many optimizer steps, checkpoint kept.
    stop_after_steps: int | None = None
    # torch's intra-op threads while training on the CPU outside torchrun (0: torch's default, a thread per
    # core); restored afterwards. Not part of the fingerprint: it changes the speed, not the model.
    cpu_threads: int = 1

    @classmethod
    def from_settings(
        cls,
        defaults: TrainingSettings,
        *,
        tuned: Mapping[str, Any] | None = None,
        tuned_from: str = "",
        epochs: int | None = None,
        batch_size: int | None = None,
        learning_rate: float | None = None,
        accumulation_steps: int | None = None,
        seed: int | None = None,
        patience: int | None = None,
        checkpoint_every: int | None = None,
        device: str = "auto",
        precision: str = "auto",
        stop_after_steps: int | None = None,
    ) -> TrainConfig:
        """The options given (None: not given); for the rest, `tuned` hyperparameters (a study's best trial,
        training/tuning.py) where it has them, else the settings' training defaults."""
        tuned = tuned or {}
        return cls(
            epochs=_pick(epochs, defaults.epochs),
            batch_size=_pick(batch_size, tuned.get("batch_size", defaults.batch_size)),
            learning_rate=_pick(learning_rate, tuned.get("learning_rate", defaults.learning_rate)),
            weight_decay=tuned.get("weight_decay", defaults.weight_decay),
            hidden=tuple(tuned.get("hidden", defaults.hidden)),
            dropout=tuned.get("dropout", defaults.dropout),
            tuned_from=tuned_from if tuned else "",
            accumulation_steps=_pick(accumulation_steps, defaults.accumulation_steps),
            seed=_pick(seed, defaults.seed),
            patience=_pick(patience, defaults.patience),
            checkpoint_every=_pick(checkpoint_every, defaults.checkpoint_every),
            device=device,
            precision=precision,
            stop_after_steps=stop_after_steps,
            cpu_threads=defaults.cpu_threads,
        )

    def fingerprint(self, data_identity: str) -> str:
        """What a checkpoint must match to be resumed: every argument that changes the result."""
        ignored = {"checkpoint_every", "stop_after_steps", "tuned_from", "cpu_threads"}
        relevant = {k: v for k, v in asdict(self).items() if k not in ignored}
        canonical = json.dumps({"config": relevant, "data": data_identity}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tensors:
    """One split: features (float32, MODEL_INPUTS order) and labels (float32, 0/1)."""

    x: torch.Tensor
    y: torch.Tensor

    def to(self, device: torch.device) -> Tensors:
        return Tensors(self.x.to(device, non_blocking=True), self.y.to(device, non_blocking=True))

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass
class TrainResult:
    best_epoch: int
    best_validation_auc_pr: float
    epochs_run: int
    optimizer_steps: int
    samples_per_second: float
    device: str
    precision: str
    world_size: int
    resumed_from_step: int | None
    stopped_early: bool
    interrupted: bool = False
    history: list[dict] = field(default_factory=list)


class Distributed:
    """The process group torchrun sets up (WORLD_SIZE > 1), or a single process."""

    def __init__(self) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world_size > 1

    def start(self, device: torch.device) -> None:
        """Join the group on `device`. On GPUs each rank first makes its own GPU the current one, then
        binds NCCL to it (`device_id`): without both, every rank's communicator and collectives use cuda:0."""
        if not self.enabled or dist.is_initialized():
            return
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl", device_id=device)
        else:
            dist.init_process_group(backend="gloo")

    def stop(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def choose_device(requested: str, local_rank: int = 0) -> torch.device:
    """The device of the process with this local rank: "auto" is a GPU when there is one, else the CPU; a
    GPU named without an index ("auto", "cuda") is the rank's own, local_rank modulo the GPUs visible."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type == "cuda" and device.index is None:
        visible = torch.cuda.device_count()
        return torch.device("cuda", local_rank % visible if visible else local_rank)
    return device


def choose_precision(requested: str, device: torch.device) -> str:
    """bf16 where the GPU supports it, fp16 (with a grad scaler) on older GPUs, fp32 on CPU."""
    if requested != "auto":
        if requested in {"bf16", "fp16"} and device.type != "cuda":
            raise ValueError(f"--precision {requested} needs a CUDA device; this run is on {device}")
        return requested
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write to a temporary file in the same folder, then rename: a reader sees the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(payload, temporary)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load_checkpoint(path: Path) -> dict | None:
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    """Fraud probabilities in fp32, in batches (evaluation mode)."""
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    was_training = module.training
    module.eval()
    scores = torch.cat([module(x[i : i + batch_size]).float() for i in range(0, x.shape[0], batch_size)])
    module.train(was_training)
    return scores


def _positive_weight(config: TrainConfig, y: torch.Tensor) -> float:
    if config.pos_weight is not None:
        return config.pos_weight
    positives = float(y.sum())
    if positives == 0:
        raise ValueError("the train split has no positive rows: nothing to learn from")
    return min(100.0, (len(y) - positives) / positives)


def _diverged(
    config: TrainConfig, what: str, epoch: int, state: dict, position: int | None
) -> TrainingDivergedError:
    where = f"epoch {epoch}, after optimizer step {state['step']}"
    if position is not None:
        where += f" (micro-batch {position} of the epoch)"
    return TrainingDivergedError(
        f"training diverged: {what} at {where}, learning rate {config.learning_rate:g}, batch size "
        f"{config.batch_size}. A rerun with the same settings diverges again: lower the learning rate "
        "(MLOPS_TRAINING__LEARNING_RATE or --learning-rate; the default is 2e-3) and train again."
    )


def train(
    model: nn.Module,
    train_data: Tensors,
    validation: Tensors,
    config: TrainConfig,
    checkpoint_dir: Path,
    data_identity: str,
    on_epoch_end: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Train `model` in place; at the end it holds the weights of the best validation epoch."""
    group = Distributed()
    device = choose_device(config.device, group.local_rank)
    precision = choose_precision(config.precision, device)
    group.start(device)
    threads = torch.get_num_threads()
    if device.type == "cpu" and group.enabled:
        # Processes share the cores: one thread each avoids oversubscription.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // group.world_size))
    elif device.type == "cpu" and config.cpu_threads:
        # An MLP of this size trains faster on one thread than on two: its ops are too small to split, and
        # a second thread contends with the task beside it (docs/benchmarks.md, Training).
        torch.set_num_threads(config.cpu_threads)
    try:
        return _train(model, train_data, validation, config, checkpoint_dir, data_identity, on_epoch_end,
                      group, device, precision)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
        group.stop()


def _train(model, train_data, validation, config, checkpoint_dir, data_identity, on_epoch_end, group, device,
           precision) -> TrainResult:  # fmt: skip
    torch.manual_seed(config.seed)
    model.to(device)
    train_data, validation = train_data.to(device), validation.to(device)
    network = nn.parallel.DistributedDataParallel(model) if group.enabled else model
    # The fused kernel updates every parameter in one call, where the default loops over them tensor by
    # tensor: faster on this small MLP (docs/benchmarks.md, Training); the same update up to rounding.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay,
        fused=device.type in FUSED_ADAMW_DEVICES,
    )  # fmt: skip
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    loss_fn = nn.BCEWithLogitsLoss(
        pos_weight=torch.tensor(_positive_weight(config, train_data.y), device=device)
    )
    fingerprint = config.fingerprint(data_identity)
    checkpoint_path = checkpoint_dir / CHECKPOINT_FILE

    # Every rank takes an equal share of each epoch's permutation, in whole micro-batches.
    per_rank = len(train_data) // group.world_size
    micro_batches = max(1, per_rank // config.batch_size)
    steps_per_epoch = max(1, micro_batches // config.accumulation_steps)
    micro_batches = steps_per_epoch * config.accumulation_steps

    state: dict[str, Any] = {
        "epoch": 0,
        "position": 0,  # micro-batches done in the current epoch
        "step": 0,
        "best_metric": -1.0,
        "best_epoch": -1,
        "bad_epochs": 0,
        "history": [],
        "best_state": None,
    }
    resumed_from = None
    checkpoint = load_checkpoint(checkpoint_path)
    if checkpoint is not None and checkpoint.get("fingerprint") == fingerprint:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        state = checkpoint["state"]
        _set_rng_state(checkpoint["rng"], device)
        resumed_from = state["step"]
        log.info("resuming from %s at epoch %d, step %d", checkpoint_path, state["epoch"], state["step"])
    elif checkpoint is not None:
        log.warning(
            "ignoring %s: it belongs to other arguments or data (fingerprint differs)", checkpoint_path
        )

    def checkpoint_now() -> None:
        if group.is_main:
            save_checkpoint(
                checkpoint_path,
                {
                    "fingerprint": fingerprint,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "state": state,
                    "rng": _rng_state(device),
                },
            )
        if group.enabled:
            dist.barrier()

    network.train()
    samples = 0
    started = time.perf_counter()
    interrupted = stopped_early = False
    while state["epoch"] < config.epochs and not stopped_early:
        epoch = state["epoch"]
        order = torch.randperm(
            len(train_data), generator=torch.Generator().manual_seed(config.seed * 10_007 + epoch)
        )
        mine = order[group.rank * per_rank : (group.rank + 1) * per_rank].to(device)
        # carried in the checkpoint, so a resumed epoch reports the loss of all its batches
        epoch_loss = torch.tensor(state.get("epoch_loss", 0.0), device=device)
        while state["position"] < micro_batches:
            position = state["position"]
            index = mine[position * config.batch_size : (position + 1) * config.batch_size]
            last_of_step = (position + 1) % config.accumulation_steps == 0
            sync = nullcontext() if (last_of_step or not group.enabled) else network.no_sync()
            with sync:
                with _autocast(device, precision):
                    # forward() (not .logits()) so DDP's gradient hooks run
                    loss = loss_fn(network(train_data.x[index], logits=True), train_data.y[index])
                if not torch.isfinite(loss):  # before backward: stop at the first bad batch, weights intact
                    value = float(loss.detach())
                    raise _diverged(config, f"the training loss is {value}", epoch, state, position)
                scaler.scale(loss / config.accumulation_steps).backward()
            epoch_loss += loss.detach()
            samples += index.shape[0]
            state["position"] = position + 1
            if last_of_step:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                if config.stop_after_steps is not None and state["step"] >= config.stop_after_steps:
                    state["epoch_loss"] = float(epoch_loss)
                    checkpoint_now()
                    interrupted = True
                    break
                if state["step"] % config.checkpoint_every == 0:
                    state["epoch_loss"] = float(epoch_loss)
                    checkpoint_now()
        if interrupted:
            break
        scores = predict(model, validation.x)
        if not bool(torch.isfinite(scores).all()):
            bad = int((~torch.isfinite(scores)).sum())
            raise _diverged(
                config, f"{bad} of {len(validation)} validation scores are not finite", epoch, state, None
            )
        metric = average_precision(validation.y.cpu().numpy(), scores.cpu().numpy())
        record = {
            "epoch": epoch,
            "train_loss": float(epoch_loss) / micro_batches,
            "validation_auc_pr": metric,
        }
        state["history"].append(record)
        if metric > state["best_metric"] + 1e-6:
            state.update(best_metric=metric, best_epoch=epoch, bad_epochs=0)
            state["best_state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        else:
            state["bad_epochs"] += 1
        stopped_early = state["bad_epochs"] >= config.patience
        state.update(epoch=epoch + 1, position=0, epoch_loss=0.0)
        if on_epoch_end is not None and group.is_main:
            on_epoch_end(epoch, record)
        checkpoint_now()

    elapsed = time.perf_counter() - started
    if state["best_state"] is not None and not interrupted:
        model.load_state_dict(state["best_state"])
    return TrainResult(
        best_epoch=state["best_epoch"],
        best_validation_auc_pr=state["best_metric"],
        epochs_run=state["epoch"],
        optimizer_steps=state["step"],
        samples_per_second=samples * group.world_size / elapsed if elapsed > 0 else 0.0,
        device=str(device),
        precision=precision,
        world_size=group.world_size,
        resumed_from_step=resumed_from,
        stopped_early=stopped_early,
        interrupted=interrupted,
        history=list(state["history"]),
    )
