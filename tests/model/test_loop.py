"""The training loop for real on tiny tensors: learning, resume after a kill, DDP with gloo, checkpoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import wait_for
from tests.model.tensors import make_split
from training.dataset import NUMERIC_FEATURES
from training.loop import (
    CHECKPOINT_FILE,
    TrainConfig,
    choose_precision,
    load_checkpoint,
    predict,
    save_checkpoint,
    train,
)
from training.metrics import average_precision
from training.model import FraudMLP

REPO = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, "-m", "tests.model.train_worker"]


def _worker(checkpoint_dir: Path, *extra: str) -> dict:
    done = subprocess.run(
        [*WORKER, str(checkpoint_dir), *extra], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    return _worker(tmp_path_factory.mktemp("straight"), "--epochs", "4")


def test_training_learns_the_signal(uninterrupted):
    # base rate 5%: a model that learned nothing scores about 0.05
    assert uninterrupted["holdout_auc_pr"] > 0.4
    assert uninterrupted["interrupted"] is False
    assert uninterrupted["resumed_from_step"] is None


def test_killed_run_resumes_from_its_checkpoint_and_ends_like_an_uninterrupted_one(tmp_path, uninterrupted):
    checkpoint = tmp_path / CHECKPOINT_FILE
    process = subprocess.Popen([*WORKER, str(tmp_path), "--epochs", "4"], cwd=REPO, stdout=subprocess.PIPE)
    wait_for(lambda: checkpoint.exists() or process.poll() is not None, 300, "the run's first checkpoint")
    assert process.poll() is None, "the run ended before it was killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    # The kill may have hit a write: its temporary file stays behind, the checkpoint is the last one whole.
    left = {path.name for path in tmp_path.iterdir()}
    assert CHECKPOINT_FILE in left and left - {CHECKPOINT_FILE} <= {f".{CHECKPOINT_FILE}.{process.pid}.tmp"}
    saved = load_checkpoint(checkpoint)
    assert saved is not None and saved["fingerprint"] and saved["state"]["step"] > 0

    resumed = _worker(tmp_path, "--epochs", "4")
    assert resumed["resumed_from_step"] is not None
    assert 0 < resumed["resumed_from_step"] < uninterrupted["optimizer_steps"]
    assert resumed["optimizer_steps"] == uninterrupted["optimizer_steps"]
    assert resumed["holdout_auc_pr"] == pytest.approx(uninterrupted["holdout_auc_pr"], abs=1e-4)
    assert resumed["weights_sum"] == pytest.approx(uninterrupted["weights_sum"], rel=1e-5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ddp_with_two_gloo_processes_matches_one_process(tmp_path, uninterrupted):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
         "-m", "tests.model.train_worker", str(tmp_path), "--epochs", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 2
    # each process takes half of every epoch: half the optimizer steps of one process
    assert result["optimizer_steps"] == pytest.approx(uninterrupted["optimizer_steps"] / 2, abs=2)
    assert result["holdout_auc_pr"] == pytest.approx(uninterrupted["holdout_auc_pr"], abs=0.05)


def _tiny_model() -> FraudMLP:
    torch.manual_seed(0)
    return FraudMLP()


def test_rerun_with_other_arguments_does_not_resume_a_foreign_checkpoint(tmp_path):
    train_data, validation = make_split(2_000, seed=1), make_split(500, seed=2)
    first = train(
        _tiny_model(), train_data, validation, TrainConfig(epochs=1, batch_size=256), tmp_path, "data-a"
    )
    assert first.resumed_from_step is None
    same = train(
        _tiny_model(), train_data, validation, TrainConfig(epochs=1, batch_size=256), tmp_path, "data-a"
    )
    assert same.resumed_from_step == first.optimizer_steps
    other_data = train(
        _tiny_model(), train_data, validation, TrainConfig(epochs=1, batch_size=256), tmp_path, "b"
    )
    assert other_data.resumed_from_step is None
    other_lr = train(
        _tiny_model(),
        train_data,
        validation,
        TrainConfig(epochs=1, batch_size=256, learning_rate=1e-2),
        tmp_path,
        "b",
    )
    assert other_lr.resumed_from_step is None


def test_cpu_training_runs_on_its_thread_count_with_the_fused_optimizer_and_restores_the_threads(tmp_path):
    """The speed settings of CPU training (docs/benchmarks.md, Training): `cpu_threads` while it trains and
    the caller's thread count afterwards; AdamW's fused kernel (its flag is in the checkpoint's state)."""
    train_data, validation = make_split(1_024, seed=1), make_split(300, seed=2)
    before = torch.get_num_threads()
    wanted = 3 if before != 3 else 2
    seen: list[int] = []
    config = TrainConfig(epochs=2, batch_size=256, device="cpu", precision="fp32", cpu_threads=wanted)
    train(
        _tiny_model(),
        train_data,
        validation,
        config,
        tmp_path,
        "t",
        lambda *_: seen.append(torch.get_num_threads()),
    )
    assert seen == [wanted, wanted]
    assert torch.get_num_threads() == before
    groups = load_checkpoint(tmp_path / CHECKPOINT_FILE)["optimizer"]["param_groups"]
    assert groups and all(group["fused"] is True for group in groups)
    # the thread count is not the model's: a checkpoint of another count resumes
    again = train(
        _tiny_model(),
        train_data,
        validation,
        TrainConfig(epochs=2, batch_size=256, device="cpu", precision="fp32", cpu_threads=1),
        tmp_path,
        "t",
    )
    assert again.resumed_from_step is not None


def test_gradient_accumulation_takes_one_step_per_accumulated_batches(tmp_path):
    train_data, validation = make_split(4_096, seed=1), make_split(500, seed=2)
    plain = train(
        _tiny_model(), train_data, validation, TrainConfig(epochs=1, batch_size=256), tmp_path / "a", "d"
    )
    accumulated = train(
        _tiny_model(), train_data, validation, TrainConfig(epochs=1, batch_size=256, accumulation_steps=4),
        tmp_path / "b", "d",
    )  # fmt: skip
    assert plain.optimizer_steps == 16
    assert accumulated.optimizer_steps == 4


def test_checkpoints_are_written_atomically_and_load_weights_only(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    save_checkpoint(path, {"model": {"w": torch.ones(2)}, "state": {"step": 3}})
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]
    assert load_checkpoint(path)["state"]["step"] == 3
    # a checkpoint carrying an arbitrary object (code on load) is refused
    torch.save({"payload": _Arbitrary()}, path)
    with pytest.raises(Exception, match=r"[Ww]eights only load failed"):
        load_checkpoint(path)


class _Arbitrary:
    pass


# Writes a checkpoint at step 3, then dies (SIGKILL) halfway through writing the one of step 6.
KILLED_WHILE_WRITING = textwrap.dedent(
    """
    import io, os, signal, sys
    from pathlib import Path

    import torch

    from training import loop

    path = Path(sys.argv[1])
    loop.save_checkpoint(path, {"state": {"step": 3}})
    real_save = torch.save

    def save_half_then_die(payload, target):
        whole = io.BytesIO()
        real_save(payload, whole)
        with open(target, "wb") as out:
            out.write(whole.getvalue()[: len(whole.getvalue()) // 2])
            out.flush()
            os.fsync(out.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    loop.torch.save = save_half_then_die
    loop.save_checkpoint(path, {"state": {"step": 6}, "model": {"w": torch.ones(1000)}})
    """
)


def test_a_kill_in_the_middle_of_a_write_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WHILE_WRITING, str(path)], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    _, stderr = writer.communicate(timeout=120)
    assert writer.returncode == -signal.SIGKILL, stderr[-2000:]
    # the half-written file is the writer's temporary one; the checkpoint is the one before, whole
    assert {p.name for p in tmp_path.iterdir()} == {CHECKPOINT_FILE, f".{CHECKPOINT_FILE}.{writer.pid}.tmp"}
    assert load_checkpoint(path)["state"]["step"] == 3


def test_precision_is_fp32_on_cpu_and_half_precision_needs_a_gpu():
    assert choose_precision("auto", torch.device("cpu")) == "fp32"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        choose_precision("bf16", torch.device("cpu"))


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory) -> tuple[FraudMLP, torch.Tensor]:
    train_data, validation = make_split(8_000, seed=1), make_split(2_000, seed=2)
    model = _tiny_model()
    model.fit_normalization(train_data.x[:, : len(NUMERIC_FEATURES)])
    train(
        model,
        train_data,
        validation,
        TrainConfig(epochs=3, batch_size=256),
        tmp_path_factory.mktemp("m"),
        "t",
    )
    return model.eval(), validation.x


def test_scores_are_probabilities_even_with_missing_values(trained_model):
    model, x = trained_model
    x = x.clone()
    x[:, : len(NUMERIC_FEATURES)] = float("nan")
    scores = predict(model, x)
    assert torch.isfinite(scores).all()
    assert ((scores >= 0) & (scores <= 1)).all()


def test_direction_more_of_the_fraud_signal_raises_the_score(trained_model):
    model, x = trained_model
    higher = x.clone()
    higher[:, 0] += 2.0  # the signal column of tensors.make_split
    assert predict(model, higher).mean() > predict(model, x).mean() + 0.05


def test_invariance_an_unrelated_column_barely_moves_the_score(trained_model):
    model, x = trained_model
    shifted = x.clone()
    shifted[:, 20] += 0.5  # not part of the signal
    assert (predict(model, shifted) - predict(model, x)).abs().mean() < 0.05


def test_normalization_ignores_missing_values():
    model = FraudMLP()
    numeric = torch.tensor(
        [[1.0] * len(NUMERIC_FEATURES), [3.0] * len(NUMERIC_FEATURES), [float("nan")] * len(NUMERIC_FEATURES)]
    )
    model.fit_normalization(numeric)
    assert torch.allclose(model.mean, torch.full((len(NUMERIC_FEATURES),), 2.0))
    assert torch.allclose(model.std, torch.full((len(NUMERIC_FEATURES),), 1.0))


def test_average_precision_of_a_perfect_and_a_useless_ranking():
    labels = torch.tensor([0, 0, 1, 1]).numpy()
    assert average_precision(labels, torch.tensor([0.1, 0.2, 0.8, 0.9]).numpy()) == pytest.approx(1.0)
    assert average_precision(labels * 0, torch.tensor([0.1, 0.2, 0.8, 0.9]).numpy()) == 0.0


def test_a_diverging_run_stops_at_the_first_non_finite_loss(tmp_path):
    from training.loop import TrainingDivergedError

    torch.manual_seed(0)
    model = FraudMLP()
    train_split, validation = make_split(2000, seed=1), make_split(500, seed=2)
    model.fit_normalization(train_split.x[:, : len(NUMERIC_FEATURES)])
    seen: list[dict] = []
    config = TrainConfig(epochs=5, batch_size=100, learning_rate=1e6, device="cpu", precision="fp32")
    with pytest.raises(TrainingDivergedError) as raised:
        train(model, train_split, validation, config, tmp_path, "diverge", lambda e, r: seen.append(r))
    message = str(raised.value)
    assert "epoch 0" in message and "after optimizer step" in message and "micro-batch" in message
    assert "MLOPS_TRAINING__LEARNING_RATE" in message
    assert not seen, "no epoch may end (and be reported) once the loss is not finite"
