"""Training and CPU scoring: our loop against a plain torch loop, MLflow's share, ONNX Runtime against torch.

`bench_training(scratch, settings)` runs `python -m benchmarks.training measure` in a process of its own
(thread counts and the loop probes below are process-wide) on tensors from tests/model/tensors.py (a
learnable fraud-like signal, 5% positives) and reports:
  1. throughput of `training.loop.train` against a hand-written loop over the same tensors with the same
     initial weights, batch size, AdamW, BCEWithLogits(pos_weight) and epochs; the plain loop neither
     validates nor checkpoints, ours does both every epoch (and checkpoints every `checkpoint_every`
     steps), so the ratio is given raw, without validation, and for the optimizer steps alone. The split
     comes from one run: the loop's module-level `predict`, `average_precision` and `save_checkpoint` are
     wrapped with timers (it looks them up at call time), so no second run with a tiny validation set is
     needed. Runs alternate plain/ours `repeats` times; a ratio is the median over these back-to-back
     pairs (each pair shares the load of its moment), and throughput is also given by the process's CPU
     time, which other processes on a shared machine move less than the wall clock (training uses one
     thread: see below); the parts of a run are shown for our fastest run;
  2. the time in `MetricBuffer.flush` (log_batch into a real MLflow SQLite store in `scratch`, one flush
     per epoch with that epoch's metrics, as training/steps.py does) as a share of the steps' time;
  3. p50 latency of the trained model in ONNX Runtime (training/export.py) against torch eager
     (`inference_mode`) at batch 1 and 256, one thread each, then both with torch's default thread count;
     int8 dynamic quantization against fp32 ONNX: speedup and AUC-PR drop on the validation rows;
  4. on a CUDA GPU only: bf16 autocast against fp32 throughput, and the data path's share of step time
     (the loop keeps the tensors on the device; its data path is the epoch's shuffle, the copy of the
     order to the device and the per-batch gathers, timed alone with the same shapes).

Training threads default to 1: on a shared 2-core machine two OpenMP threads contend with every other
process and a step can take many times longer (docs/benchmarks.md), which says nothing about the loop.
Pass `--threads 0` for torch's default. The `--sizes` of `python -m benchmarks` (rows per day of the feed)
do not apply here.
Run: `python -m benchmarks --only training` or `python -m benchmarks.training --rows 200000 --epochs 3`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent

THROUGHPUT_GOAL = 0.9  # ours / plain loop
TRACKING_SHARE_GOAL = 0.01  # MetricBuffer.flush / step time
ONNX_BATCH1_GOAL_US = 100.0
ONNX_SPEEDUP_GOAL = 3.0  # torch eager p50 / ONNX p50
DATA_PATH_SHARE_GOAL = 0.05  # GPU


@dataclass(frozen=True)
class TrainingBench:
    rows: int = 200_000
    # 15% validation for 70% train, as training.dataset.SplitFractions splits a training set
    validation_rows: int = 43_000
    batch_size: int = 1024
    epochs: int = 3
    repeats: int = 3
    threads: int = 1  # torch intra-op threads while training; 0: torch's default
    seed: int = 7


class LoopProbe:
    """Seconds spent inside training.loop's validation and checkpoint functions while it is active."""

    WRAPPED = ("predict", "average_precision", "save_checkpoint")

    def __init__(self, synchronize: Callable[[], None] = lambda: None) -> None:
        self.synchronize = synchronize
        self.seconds = dict.fromkeys(self.WRAPPED, 0.0)
        self.cpu_seconds = dict.fromkeys(self.WRAPPED, 0.0)
        self._originals: dict[str, Callable] = {}

    def __enter__(self) -> LoopProbe:
        import training.loop as loop

        for name in self.WRAPPED:
            self._originals[name] = getattr(loop, name)
            setattr(loop, name, self._timed(name, self._originals[name]))
        return self

    def __exit__(self, *exc) -> None:
        import training.loop as loop

        for name, original in self._originals.items():
            setattr(loop, name, original)

    def _timed(self, name: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.synchronize()  # CUDA work is asynchronous: charge it to the call that queued it
                self.seconds[name] += time.perf_counter() - started
                self.cpu_seconds[name] += time.process_time() - cpu_started

        return timed

    @property
    def validation_seconds(self) -> float:
        return self.seconds["predict"] + self.seconds["average_precision"]

    @property
    def excluded_cpu_seconds(self) -> float:
        return sum(self.cpu_seconds.values())


def _fresh_model(train_x, seed: int):
    import torch

    from training.dataset import NUMERIC_FEATURES
    from training.model import FraudMLP

    torch.manual_seed(seed)
    model = FraudMLP()
    model.fit_normalization(train_x[:, : len(NUMERIC_FEATURES)])
    return model


def _synchronizer(device) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def plain_loop(model, train, config, device) -> dict:
    """What anyone would write first: shuffle, gather a batch, forward, backward, step. Nothing else."""
    import torch
    from torch import nn

    from training.loop import FUSED_ADAMW_DEVICES

    synchronize = _synchronizer(device)
    torch.manual_seed(config.seed)
    model.to(device).train()
    x, y = train.x.to(device), train.y.to(device)
    positives = float(y.sum())
    loss_fn = nn.BCEWithLogitsLoss(
        pos_weight=torch.tensor(min(100.0, (len(y) - positives) / positives), device=device)
    )
    # the same update as ours: AdamW's fused kernel where torch has one (training/loop.py)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay,
        fused=device.type in FUSED_ADAMW_DEVICES,
    )  # fmt: skip
    batches = len(y) // config.batch_size

    def autocast():  # the GPU comparison runs both loops in bf16 too (no grad scaler needed for bf16)
        if config.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return nullcontext()

    synchronize()
    started, cpu_started = time.perf_counter(), time.process_time()
    for epoch in range(config.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch)).to(device)
        for b in range(batches):
            index = order[b * config.batch_size : (b + 1) * config.batch_size]
            with autocast():
                loss = loss_fn(model(x[index], logits=True), y[index])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    synchronize()
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "samples": config.epochs * batches * config.batch_size,
    }


def our_loop(model, train, validation, config, checkpoint_dir: Path, tracking) -> dict:
    """`training.loop.train` with per-epoch MLflow logging through MetricBuffer, split into its parts."""
    import torch

    from training.loop import choose_device
    from training.loop import train as train_loop
    from training.tracking import MetricBuffer

    client, experiment_id = tracking
    run_id = client.create_run(experiment_id).info.run_id
    metrics = MetricBuffer(client, run_id)
    epoch_end_seconds = epoch_end_cpu_seconds = 0.0

    def on_epoch_end(epoch: int, record: dict) -> None:  # as training/steps.py logs an epoch
        nonlocal epoch_end_seconds, epoch_end_cpu_seconds
        started, cpu_started = time.perf_counter(), time.process_time()
        metrics.add({k: v for k, v in record.items() if k != "epoch"}, step=epoch)
        metrics.flush()
        epoch_end_seconds += time.perf_counter() - started
        epoch_end_cpu_seconds += time.process_time() - cpu_started

    device = choose_device(config.device)
    with LoopProbe(_synchronizer(device)) as probe:
        started, cpu_started = time.perf_counter(), time.process_time()
        result = train_loop(model, train, validation, config, checkpoint_dir, "bench", on_epoch_end)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    client.set_terminated(run_id)
    if result.epochs_run != config.epochs:
        raise RuntimeError(f"our loop ran {result.epochs_run} of {config.epochs} epochs; raise patience")
    validation_seconds = probe.validation_seconds
    checkpoint_seconds = probe.seconds["save_checkpoint"]
    return {
        "seconds": wall,
        "samples": result.optimizer_steps * config.batch_size * config.accumulation_steps,
        "loop_reported_samples_per_s": result.samples_per_second,
        "validation_seconds": validation_seconds,
        "checkpoint_seconds": checkpoint_seconds,
        "epoch_end_seconds": epoch_end_seconds,
        "flush_seconds": metrics.seconds_logging,
        "flushes": result.epochs_run,
        "step_seconds": wall - validation_seconds - checkpoint_seconds - epoch_end_seconds,
        "cpu_seconds": cpu,
        "step_cpu_seconds": cpu - probe.excluded_cpu_seconds - epoch_end_cpu_seconds,
        "best_validation_auc_pr": result.best_validation_auc_pr,
        "precision": result.precision,
    }


def data_path_seconds(train, bench: TrainingBench, device) -> dict:
    """The loop's data path alone: per epoch a seeded shuffle, its copy to the device, every batch's
    gathers (the tensors themselves are copied to the device once, as the loop does)."""
    import torch

    synchronize = _synchronizer(device)
    synchronize()
    started, cpu_started = time.perf_counter(), time.process_time()
    x, y = train.x.to(device), train.y.to(device)
    batches = len(y) // bench.batch_size
    for epoch in range(bench.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch)).to(device)
        for b in range(batches):
            index = order[b * bench.batch_size : (b + 1) * bench.batch_size]
            x[index], y[index]  # gathered and dropped: the gathers are what is timed
    synchronize()
    return {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started}


def _open_tracking(scratch: Path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}")
    artifacts = scratch / "mlflow-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    experiment_id = client.create_experiment("bench-training", artifact_location=artifacts.as_uri())
    return client, experiment_id


def _train_config(bench: TrainingBench, **overrides):
    from training.loop import TrainConfig

    # patience above the epochs: every run does the same work
    return TrainConfig(
        epochs=bench.epochs,
        batch_size=bench.batch_size,
        seed=bench.seed,
        patience=bench.epochs + 1,
        cpu_threads=bench.threads,  # the thread count the bench set (0: leave torch's default)
        **overrides,
    )


def compare_dropout(bench: TrainingBench, train, initial, device_name: str) -> dict:
    """`repeats` back-to-back pairs of the plain loop with torch's nn.Dropout and with FastDropout, the same
    weights and batches otherwise (the plain loop: only the step's own cost differs)."""
    import copy

    import torch

    from training.model import with_library_dropout

    config = _train_config(bench, device=device_name, precision="fp32")
    device = torch.device(device_name)
    library, fast = [], []
    for repeat in range(bench.repeats):
        for which in ("library", "fast") if repeat % 2 == 0 else ("fast", "library"):
            model = copy.deepcopy(initial)
            if which == "library":
                library.append(plain_loop(with_library_dropout(model), train, config, device))
            else:
                fast.append(plain_loop(model, train, config, device))
    return {"library_runs": library, "fast_runs": fast}


def compare_loops(
    bench: TrainingBench, train, validation, scratch: Path, tracking, device_name: str, precision: str
) -> tuple[list[dict], list[dict], object]:
    """`repeats` back-to-back pairs of plain and ours: every run of each, and our last trained model."""
    import copy

    import torch

    from training.loop import Tensors
    from training.metrics import average_precision

    config = _train_config(bench, device=device_name, precision=precision)
    device = torch.device(device_name)
    initial = _fresh_model(train.x, bench.seed)
    # warm-up: allocator, kernels and lazy initialization are paid before anything is timed
    warm_up = Tensors(train.x[: 20 * bench.batch_size], train.y[: 20 * bench.batch_size])
    plain_loop(copy.deepcopy(initial), warm_up, replace(config, epochs=1), device)
    # the loop's first AUC-PR imports scikit-learn (about a second), once per process, not per epoch
    average_precision(warm_up.y[:256].numpy(), warm_up.x[:256, 0].numpy())
    plain_runs, our_runs = [], []
    model = None
    for repeat in range(bench.repeats):
        model = copy.deepcopy(initial)
        checkpoint_dir = scratch / f"checkpoints-{device_name}-{precision}-{repeat}"  # fresh: no resume
        for which in ("plain", "ours") if repeat % 2 == 0 else ("ours", "plain"):  # first one alternates
            if which == "plain":
                plain_runs.append(plain_loop(copy.deepcopy(initial), train, config, device))
            else:
                our_runs.append(our_loop(model, train, validation, config, checkpoint_dir, tracking))
    return plain_runs, our_runs, model


def scoring(model, validation, scratch: Path, default_threads: int) -> dict:
    """p50 latencies of ONNX Runtime (fp32, int8) and torch eager, one thread, then default threads."""
    import numpy as np
    import torch

    from training.export import INPUT_NAME, latency_us, onnx_scores, quantize, session, to_onnx
    from training.metrics import average_precision

    model = model.to("cpu").eval()
    x = validation.x.numpy()
    labels = validation.y.numpy()
    fp32_path = to_onnx(model, validation.x[:2], scratch / "model.onnx")
    int8_path = quantize(fp32_path, scratch / "model.int8.onnx")
    batches = {1: (x[:1], 3000), 256: (x[:256], 500)}

    def torch_run(batch: torch.Tensor) -> None:
        with torch.inference_mode():
            model(batch)

    def latencies(threads: int) -> dict:
        torch.set_num_threads(threads)
        fp32, int8 = session(fp32_path, threads=threads), session(int8_path, threads=threads)
        out = {}
        for size, (rows, repeats) in batches.items():
            tensor = torch.from_numpy(rows)
            out[f"torch_b{size}"] = latency_us(torch_run, tensor, repeats)
            out[f"onnx_b{size}"] = latency_us(lambda b, s=fp32: s.run(None, {INPUT_NAME: b}), rows, repeats)
            out[f"int8_b{size}"] = latency_us(lambda b, s=int8: s.run(None, {INPUT_NAME: b}), rows, repeats)
        return out

    one_thread = latencies(1)
    default = latencies(default_threads)
    torch.set_num_threads(1)
    with torch.inference_mode():
        torch_scores = model(validation.x).numpy()
    fp32_scores = onnx_scores(session(fp32_path), x).reshape(-1)
    int8_scores = onnx_scores(session(int8_path), x).reshape(-1)
    return {
        "one_thread": one_thread,
        "default_threads": default,
        "default_thread_count": default_threads,
        "parity_max_abs_diff": float(np.max(np.abs(fp32_scores - torch_scores))),
        "auc_pr_fp32": average_precision(labels, fp32_scores),
        "auc_pr_int8": average_precision(labels, int8_scores),
    }


def compression(model, train, validation, holdout, bench: TrainingBench, scratch: Path) -> dict:
    """The export's variants of the trained model (training/export.py export_model with training/compress.py
    compressed_variants, default compression settings, one thread): the table the export logs, on a holdout
    neither fit saw, with the seconds the two fits took and the file the rule serves."""
    import torch

    from core.settings import CompressionSettings
    from training.compress import compressed_variants
    from training.export import export_model
    from training.loop import TrainConfig

    torch.set_num_threads(1)
    config = TrainConfig(batch_size=bench.batch_size, seed=bench.seed, device="cpu", precision="fp32")
    x, y = holdout.x.numpy(), holdout.y.numpy()
    # A candidate's export on the retrain's path: fp32 alone (what every candidate gets now), then the same
    # export with the variants fitted and measured (what every candidate got before issue #35; now only a
    # promoted version, after the decision). Same model, same rows, one after the other.
    started = time.perf_counter()
    export_model(model.to("cpu").eval(), x, y, scratch / "fp32-alone", variants=False)
    fp32_alone_seconds = time.perf_counter() - started
    started = time.perf_counter()
    variants = compressed_variants(model.to("cpu").eval(), train, validation, CompressionSettings(), config)
    fit_seconds = time.perf_counter() - started
    report = export_model(model, x, y, scratch / "compression", compressed=variants)
    with_variants_seconds = time.perf_counter() - started
    return {
        "fit_seconds": fit_seconds,
        "fp32_alone_seconds": fp32_alone_seconds,
        "with_variants_seconds": with_variants_seconds,
        **{k: report[k] for k in ("variants", "serving_file", "int8")},
    }


def measure(bench: TrainingBench, scratch: Path) -> dict:
    import torch

    from tests.model.tensors import make_split

    default_threads = torch.get_num_threads()
    torch.set_num_threads(bench.threads or default_threads)
    train = make_split(bench.rows, bench.seed)
    validation = make_split(bench.validation_rows, bench.seed + 1)
    tracking = _open_tracking(scratch)
    plain_runs, our_runs, model = compare_loops(bench, train, validation, scratch, tracking, "cpu", "fp32")
    figures = {
        "settings": asdict(bench),
        "train_threads": torch.get_num_threads(),
        "plain_runs": plain_runs,
        "our_runs": our_runs,
        "data_path": data_path_seconds(train, bench, torch.device("cpu")),
        "dropout": compare_dropout(bench, train, _fresh_model(train.x, bench.seed), "cpu"),
        "scoring": scoring(model, validation, scratch, default_threads),
        "compression": compression(
            model, train, validation, make_split(bench.validation_rows, bench.seed + 2), bench, scratch
        ),
        "cuda": None,
    }  # fmt: skip
    if torch.cuda.is_available():
        gpu = {"device": torch.cuda.get_device_name(0)}
        for precision in ("fp32", "bf16"):
            gpu_plain, gpu_ours, _ = compare_loops(
                bench, train, validation, scratch, tracking, "cuda", precision
            )
            gpu[precision] = {"plain_runs": gpu_plain, "our_runs": gpu_ours}
        gpu["data_path"] = data_path_seconds(train, bench, torch.device("cuda"))
        figures["cuda"] = gpu
    return figures


def compression_rows(figures: dict) -> list[Row]:
    """Each variant's file size, p50 latency (batch 1 and 256) and holdout AUC-PR against fp32's."""
    from core.settings import CompressionSettings

    tolerance = CompressionSettings().max_auc_pr_drop
    variants = {row["variant"]: row for row in figures["variants"]}
    fp32 = variants["fp32"]
    rows = []
    for name, row in variants.items():
        if name == "fp32":
            continue
        label = f"{name} ({row['hidden']})" if name != "int8" else "int8"
        rows.append(
            Row(f"{label} ONNX bytes", row["bytes"], "B", fp32["bytes"], "fp32", row["bytes"] / fp32["bytes"])
        )
        for size in (1, 256):
            key = f"p50_us_batch{size}"
            rows.append(
                Row(
                    f"{label} p50, batch {size}",
                    row[key],
                    "us",
                    fp32[key],
                    "fp32",
                    fp32[key] / row[key],
                    "x faster",
                )
            )
        drop = fp32["auc_pr"] - row["auc_pr"]
        rows.append(
            Row(f"{label} holdout AUC-PR", row["auc_pr"], "", fp32["auc_pr"], "fp32", drop, "drop",
                goal=f"drop <= {tolerance} to serve", met=drop <= tolerance)
        )  # fmt: skip
    rows.append(
        Row(f"served by the export rule: {figures['serving_file']}",
            note=f"pruned + student fitted in {figures['fit_seconds']:.1f} s; int8 {figures['int8']}")
    )  # fmt: skip
    alone, full = figures["fp32_alone_seconds"], figures["with_variants_seconds"]
    rows.append(
        Row("a candidate's export on the path: fp32 alone", alone, "s", full, "with the variants",
            alone / full, note="the variants now come after the decision, for a promoted version only")
    )  # fmt: skip
    return rows


@dataclass(frozen=True)
class Row:
    """One line of the table: `value` against `baseline` (same unit), their `ratio`, the goal and verdict."""

    figure: str
    value: float | None = None
    unit: str = ""
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    ratio_unit: str = "x"  # x | x faster | % | drop
    goal: str = ""
    met: bool | None = None
    note: str = ""


def fastest(runs: list[dict]) -> dict:
    """The run least disturbed by other processes (lowest wall time): where a run's parts are compared."""
    return min(runs, key=lambda run: run["seconds"])


def paired(plain_runs: list[dict], our_runs: list[dict], plain_clock: str, our_clock: Callable) -> tuple:
    """Median samples/s of ours and of the plain loop, and the median ratio over back-to-back pairs: a
    pair ran under the same load of the moment, so its ratio is steadier than a ratio of two bests."""
    ours = [run["samples"] / our_clock(run) for run in our_runs]
    plain = [run["samples"] / run[plain_clock] for run in plain_runs]
    ratios = [o / p for o, p in zip(ours, plain, strict=True)]
    return statistics.median(ours), statistics.median(plain), statistics.median(ratios)


def table_rows(figures: dict) -> list[Row]:
    from training.export import INT8_MAX_AUC_PR_DROP, INT8_MIN_SPEEDUP

    plain_runs, our_runs = figures["plain_runs"], figures["our_runs"]
    ours = fastest(our_runs)
    rows = []
    for label, plain_clock, our_clock in (
        ("raw (+ validation, checkpoints, MLflow)", "seconds", lambda r: r["seconds"]),
        (
            "without validation and MLflow",
            "seconds",
            lambda r: r["seconds"] - r["validation_seconds"] - r["epoch_end_seconds"],
        ),
        ("optimizer steps only", "seconds", lambda r: r["step_seconds"]),
        # CPU time of this single-threaded process: other processes move it less than the wall clock
        ("by CPU time, raw", "cpu_seconds", lambda r: r["cpu_seconds"]),
        ("by CPU time, optimizer steps only", "cpu_seconds", lambda r: r["step_cpu_seconds"]),
    ):
        rate, plain_rate, ratio = paired(plain_runs, our_runs, plain_clock, our_clock)
        rows.append(
            Row(
                f"throughput, {label}",
                rate,
                "samples/s",
                plain_rate,
                "plain loop",
                ratio,
                goal=f">= {THROUGHPUT_GOAL}x",
                met=ratio >= THROUGHPUT_GOAL,
            )
        )
    for label, seconds in (
        ("validation (predict + AUC-PR)", ours["validation_seconds"]),
        ("checkpoints", ours["checkpoint_seconds"]),
    ):
        rows.append(
            Row(
                f"  of which {label}",
                seconds,
                "s",
                ours["seconds"],
                "our wall",
                seconds / ours["seconds"],
                "%",
            )
        )
    dropout = figures["dropout"]
    rate, library_rate, ratio = paired(
        dropout["library_runs"], dropout["fast_runs"], "seconds", lambda r: r["seconds"]
    )
    rows.append(
        Row("plain loop with FastDropout", rate, "samples/s", library_rate, "torch's nn.Dropout", ratio)
    )
    share = ours["flush_seconds"] / ours["step_seconds"]
    per_flush_ms = ours["flush_seconds"] / ours["flushes"] * 1000
    rows.append(
        Row(
            f"MLflow flush (SQLite), {ours['flushes']} x {per_flush_ms:.0f} ms",
            ours["flush_seconds"],
            "s",
            ours["step_seconds"],
            "our steps",
            share,
            "%",
            goal=f"<= {TRACKING_SHARE_GOAL:.0%}",
            met=share <= TRACKING_SHARE_GOAL,
        )
    )
    data_path_cpu = figures["data_path"]["cpu_seconds"]
    ours_step_cpu = min(r["step_cpu_seconds"] for r in figures["our_runs"])
    rows.append(
        Row(
            "data path (shuffle + gathers), CPU time",
            data_path_cpu,
            "s",
            ours_step_cpu,
            "our steps",
            data_path_cpu / ours_step_cpu,
            "%",
            goal=f"(GPU goal <= {DATA_PATH_SHARE_GOAL:.0%})",
        )
    )

    scoring = figures["scoring"]
    default_label = f"{scoring['default_thread_count']} threads"
    for key, label in (("one_thread", "1 thread"), ("default_threads", default_label)):
        latencies = scoring[key]
        for size in (1, 256):
            onnx, eager = latencies[f"onnx_b{size}"], latencies[f"torch_b{size}"]
            goal, met = "", None
            if key == "one_thread":
                goal = f">= {ONNX_SPEEDUP_GOAL:.0f}x" + (
                    f", <= {ONNX_BATCH1_GOAL_US:.0f} us" if size == 1 else ""
                )
                met = eager / onnx >= ONNX_SPEEDUP_GOAL and (size != 1 or onnx <= ONNX_BATCH1_GOAL_US)
            rows.append(
                Row(
                    f"ONNX fp32 p50, batch {size}, {label}",
                    onnx,
                    "us",
                    eager,
                    "torch eager",
                    eager / onnx,
                    "x faster",
                    goal,
                    met,
                )
            )
    latencies = scoring["one_thread"]
    for size in (1, 256):
        speedup = latencies[f"onnx_b{size}"] / latencies[f"int8_b{size}"]
        rows.append(
            Row(
                f"ONNX int8 p50, batch {size}, 1 thread",
                latencies[f"int8_b{size}"],
                "us",
                latencies[f"onnx_b{size}"],
                "ONNX fp32",
                speedup,
                "x faster",
                goal=f">= {INT8_MIN_SPEEDUP}x (export)" if size == 256 else "",
                met=speedup >= INT8_MIN_SPEEDUP if size == 256 else None,
            )
        )
    drop = scoring["auc_pr_fp32"] - scoring["auc_pr_int8"]
    rows.append(
        Row(
            "ONNX int8 validation AUC-PR",
            scoring["auc_pr_int8"],
            "",
            scoring["auc_pr_fp32"],
            "ONNX fp32",
            drop,
            "drop",
            goal=f"drop <= {INT8_MAX_AUC_PR_DROP} (export)",
            met=drop <= INT8_MAX_AUC_PR_DROP,
        )
    )
    rows.append(Row("ONNX fp32 vs torch, max |score diff|", scoring["parity_max_abs_diff"]))
    rows += compression_rows(figures["compression"])

    gpu = figures["cuda"]
    if gpu is None:
        note = "needs a CUDA GPU"
        rows.append(Row("bf16 autocast vs fp32 steps, GPU", goal="> 1x", note=note))
        rows.append(
            Row("data path share of step time, GPU", goal=f"<= {DATA_PATH_SHARE_GOAL:.0%}", note=note)
        )
        return rows
    fp32_rate, bf16_rate = (
        statistics.median(run["samples"] / run["step_seconds"] for run in gpu[precision]["our_runs"])
        for precision in ("fp32", "bf16")
    )
    bf16 = fastest(gpu["bf16"]["our_runs"])
    rows.append(
        Row(
            f"bf16 autocast steps, {gpu['device']}",
            bf16_rate,
            "samples/s",
            fp32_rate,
            "fp32",
            bf16_rate / fp32_rate,
            goal="> 1x",
            met=bf16_rate > fp32_rate,
        )
    )
    for precision in ("fp32", "bf16"):
        runs = gpu[precision]
        rate, plain_rate, ratio = paired(
            runs["plain_runs"], runs["our_runs"], "seconds", lambda r: r["seconds"]
        )
        rows.append(
            Row(
                f"throughput, GPU {precision}, raw",
                rate,
                "samples/s",
                plain_rate,
                "plain loop",
                ratio,
                goal=f">= {THROUGHPUT_GOAL}x",
                met=ratio >= THROUGHPUT_GOAL,
            )
        )
    share = gpu["data_path"]["seconds"] / bf16["step_seconds"]
    rows.append(
        Row(
            "data path share of step time, GPU bf16",
            gpu["data_path"]["seconds"],
            "s",
            bf16["step_seconds"],
            "our steps",
            share,
            "%",
            goal=f"<= {DATA_PATH_SHARE_GOAL:.0%}",
            met=share <= DATA_PATH_SHARE_GOAL,
        )
    )
    return rows


def bench_training(scratch: Path, bench: TrainingBench = TrainingBench()) -> list[dict]:
    folder = scratch / "training"
    folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.training", "measure", json.dumps(asdict(bench)), str(folder)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:] or out.stdout[-3000:])
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return [{"figures": figures}, *(asdict(row) for row in table_rows(figures))]


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit == "samples/s":
        return f"{value:,.0f} {unit}"
    if unit == "us":
        return f"{value:,.1f} us"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return f"{value:.4g}"


def print_training(console, results: list[dict]) -> None:
    from rich.table import Table

    figures, rows = results[0]["figures"], results[1:]
    s = figures["settings"]
    table = Table(
        "figure",
        "value",
        "baseline",
        "ratio",
        "goal",
        "met?",
        title=f"training ({s['rows']:,} rows, batch {s['batch_size']}, {s['epochs']} epochs, "
        f"validation {s['validation_rows']:,} rows, {figures['train_threads']} torch thread(s), "
        f"{s['repeats']} pairs, median ratio) and CPU scoring",
    )
    for r in rows:
        if r["ratio"] is None:
            ratio = ""
        elif r["ratio_unit"] == "%":
            ratio = f"{r['ratio']:.2%}"
        elif r["ratio_unit"] == "drop":
            ratio = f"{r['ratio']:+.4f} drop"
        else:
            ratio = f"{r['ratio']:.2f}{r['ratio_unit']}"
        baseline = (
            "" if r["baseline"] is None else f"{_number(r['baseline'], r['unit'])} ({r['baseline_label']})"
        )
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        table.add_row(
            r["figure"], r["note"] or _number(r["value"], r["unit"]), baseline, ratio, r["goal"], met
        )
    console.print(table)
    ours = fastest(figures["our_runs"])
    console.print(
        "TrainResult.samples_per_second (its clock includes validation and checkpoints): "
        f"{ours['loop_reported_samples_per_s']:,.0f}; "
        f"best validation AUC-PR {ours['best_validation_auc_pr']:.3f}"
    )


def main() -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m benchmarks.training")
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("measure", help="(internal) measure in this process, print figures as JSON")
    inner.add_argument("settings")
    inner.add_argument("scratch", type=Path)
    defaults = TrainingBench()
    parser.add_argument("--rows", type=int, default=defaults.rows)
    parser.add_argument("--validation-rows", type=int, default=defaults.validation_rows)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--threads", type=int, default=defaults.threads, help="0: torch's default")
    args = parser.parse_args()
    if args.command == "measure":
        print(json.dumps(measure(TrainingBench(**json.loads(args.settings)), args.scratch)))
        return
    from rich.console import Console

    bench = TrainingBench(
        rows=args.rows,
        validation_rows=args.validation_rows,
        batch_size=args.batch_size,
        epochs=args.epochs,
        repeats=args.repeats,
        threads=args.threads,
    )
    with tempfile.TemporaryDirectory(prefix="mlops-bench-") as scratch:
        results = bench_training(Path(scratch), bench)
    print_training(Console(width=170), results)


if __name__ == "__main__":
    main()
