"""A model card per version: one self-contained HTML page in the version's run artifacts
(`model_card/index.html`), what an approver or a model-risk reviewer reads before answering.

It holds the data window and lineage (training set revision, its as-of date and window, the code commit and
image), the inputs, the holdout metrics with 90% bootstrap intervals, the operating point (threshold,
decline rate, precision and recall at it), the calibration and precision-recall plots (the evaluate step's,
embedded), performance by segment (channel, country, amount band) for the version and the champion at their
own thresholds, the gate's comparison with the champion on the same holdout rows, and the promotion
history's rows about the version (the gate's decision, approvals with who and why). The gate step writes it,
an approval writes it again (its answer added). Everything shown is escaped: tags and comments are written
by people.
"""

from __future__ import annotations

import base64
import html
import logging
import math
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from model_contract.operating_point import decline_rate, precision_recall
from training.metrics import average_precision

if TYPE_CHECKING:
    from core.settings import Settings
    from training.dataset import Holdout
    from training.ledger import Decision
    from training.registry import ModelRegistry

log = logging.getLogger(__name__)

CARD_DIR = "model_card"
CARD_FILE = "index.html"
PLOTS = ("pr_curve.png", "calibration.png", "roc_curve.png", "confusion_matrix.png")
BOOTSTRAP = 100  # resamples for the intervals: a 90% interval's ends move by ~1% of the metric between runs
AMOUNT_BANDS = ((0.0, 10.0), (10.0, 100.0), (100.0, 1000.0), (1000.0, math.inf))  # USD


def card_url(settings: Settings, run: Any) -> str:
    """Where a person opens the card of `run`: MLflow's UI shows a run's HTML artifact (its server hands
    artifacts out as downloads only); without a UI address (the local profile's SQLite registry), the file
    itself, under the run's artifact folder."""
    from urllib.parse import unquote, urlparse

    ui = settings.mlflow_ui_url or settings.mlflow_tracking_uri
    experiment, run_id = run.info.experiment_id, run.info.run_id
    if ui.startswith(("http://", "https://")):
        return f"{ui.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}/artifacts/{CARD_DIR}/{CARD_FILE}"
    location = urlparse(run.info.artifact_uri)
    root = unquote(location.path) if location.scheme in ("", "file") else run.info.artifact_uri
    return f"{root.rstrip('/')}/{CARD_DIR}/{CARD_FILE}"


def write(
    settings: Settings,
    registry: ModelRegistry,
    version: str,
    history: list[Decision],
    holdout: Holdout | None = None,
) -> str:
    """Render the card of `version` and log it to its run; returns where to open it (`card_url`)."""
    import mlflow

    from training.dataset import read_holdout
    from training.tracking import training_set_rev

    model_version = registry.client.get_model_version(registry.name, version)
    run_id = model_version.run_id
    assert run_id, "versions are registered from training runs"
    run = registry.client.get_run(run_id)
    if holdout is None:
        holdout = read_holdout(settings, training_set_rev(settings, run_id))
    page = render(settings, registry, version, run, history, holdout)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / CARD_FILE
        path.write_text(page, encoding="utf-8")
        mlflow.MlflowClient(settings.mlflow_tracking_uri).log_artifact(run_id, str(path), CARD_DIR)
    return card_url(settings, run)


def render(
    settings: Settings,
    registry: ModelRegistry,
    version: str,
    run: Any,
    history: list[Decision],
    holdout: Holdout,
) -> str:
    from training.registry import model_inputs_of, score_holdout

    mine = [row for row in history if row.candidate_version == version]
    gate = next((row for row in reversed(mine) if row.action == "gate"), None)
    champion = gate.champion_before if gate is not None else _champion(history)
    weights = holdout.weights
    model = registry.load(version)
    inputs = model_inputs_of(model)
    scores = score_holdout(model, holdout.matrix(inputs, f"v{version}"))
    threshold = registry.decision_threshold(version, settings.serving.threshold)
    compared: dict[str, tuple[np.ndarray, float]] = {f"v{version}": (scores, threshold)}
    if champion and champion != version:
        try:
            other = registry.load(champion)
            champion_scores = score_holdout(other, holdout.matrix(model_inputs_of(other), f"v{champion}"))
            compared[f"v{champion} (champion)"] = (
                champion_scores,
                registry.decision_threshold(champion, settings.serving.threshold),
            )
        except Exception as exc:  # a champion on inputs this holdout lacks: said, not fatal to the card
            log.warning("model card of v%s: champion v%s not scored: %s", version, champion, exc)
    sections = [
        _head(version, run, holdout, inputs),
        _metrics_section(holdout.y, scores, weights, threshold),
        _point_section(registry, version, threshold, settings),
        _plots_section(registry, run.info.run_id),
        _segments_section(holdout, compared),
        _gate_section(gate, champion),
        _history_section(mine),
    ]
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Model card: fraud-detector v{_e(version)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Model card: fraud-detector v{_e(version)}</h1><p class='muted'>written {stamp}</p>"
        + "".join(sections)
        + "</body></html>"
    )


# --- the sections -----------------------------------------------------------------------------------------


def _head(version: str, run: Any, holdout: Holdout, inputs: tuple[str, ...]) -> str:
    tags = run.data.tags
    rows = [
        ("training run", run.info.run_id),
        ("training set (DVC revision)", holdout.rev),
        ("as of (the data window ends)", tags.get("lineage.as_of") or "-"),
        ("code commit", tags.get("lineage.git_commit") or tags.get("mlflow.source.git.commit") or "-"),
        ("image", tags.get("lineage.image_id") or tags.get("lineage.image") or "-"),
        ("holdout rows", f"{len(holdout.y):,} ({int(holdout.y.sum()):,} fraud)"),
    ]
    if holdout.weights is not None:
        rows.append(("transactions they stand for", f"{float(holdout.weights.sum()):,.0f}"))
    lineage = {k: v for k, v in tags.items() if k.startswith("lineage.")}
    return (
        "<h2>Data and lineage</h2>"
        + _table(["", ""], rows)
        + (_table(["lineage tag", "value"], sorted(lineage.items())) if lineage else "")
        + f"<h2>Inputs ({len(inputs)})</h2><p>{', '.join(_e(name) for name in inputs)}</p>"
    )


def _metrics_section(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None, threshold: float
) -> str:
    figures = {
        "AUC-PR": lambda idx: average_precision(labels[idx], scores[idx], _w(weights, idx)),
        "recall at the threshold": lambda idx: _recall(labels[idx], scores[idx], _w(weights, idx), threshold),
        "precision at the threshold": lambda idx: _precision(
            labels[idx], scores[idx], _w(weights, idx), threshold
        ),
        "decline rate": lambda idx: decline_rate(scores[idx], threshold, _w(weights, idx)),
    }
    every = np.arange(len(labels))
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(labels), len(labels)) for _ in range(BOOTSTRAP)] if len(labels) else []
    rows = []
    for name, figure in figures.items():
        value = figure(every) if len(labels) else float("nan")
        spread = [figure(idx) for idx in draws]
        low, high = np.nanpercentile(spread, [5, 95]) if spread else (math.nan, math.nan)
        rows.append((name, _num(value), f"{_num(low)} - {_num(high)}"))
    return (
        "<h2>Holdout metrics</h2><p>Intervals: 90%, from "
        f"{BOOTSTRAP} bootstrap resamples of the holdout rows.</p>"
        + _table(["metric", "value", "90% interval"], rows)
    )


def _point_section(registry: ModelRegistry, version: str, threshold: float, settings: Settings) -> str:
    point = registry.operating_point(version)
    if point is None:
        return (
            "<h2>Operating point</h2><p>No operating point recorded: the service decides at "
            f"<code>serving.threshold</code> = {_num(threshold)}.</p>"
        )
    rows = [(k.replace("_", " "), _num(v) if isinstance(v, float) else "-") for k, v in asdict(point).items()]
    return (
        "<h2>Operating point</h2><p>Chosen on the holdout to decline at most "
        f"{point.target_decline_rate:.2%} of transactions (<code>training.decline_rate</code>); the service "
        "decides at this threshold for this version.</p>" + _table(["", ""], rows)
    )


def _plots_section(registry: ModelRegistry, run_id: str) -> str:
    images = []
    with tempfile.TemporaryDirectory() as folder:
        for name in PLOTS:
            try:
                local = registry.client.download_artifacts(run_id, f"evaluation/{name}", folder)
            except Exception:  # a run evaluated before a plot existed
                continue
            data = base64.b64encode(Path(local).read_bytes()).decode()
            images.append(f"<figure><img alt='{_e(name)}' src='data:image/png;base64,{data}'>"
                          f"<figcaption>{_e(name)}</figcaption></figure>")  # fmt: skip
    if not images:
        return "<h2>Plots</h2><p>No evaluation plots on the run.</p>"
    return "<h2>Calibration and precision-recall</h2><div class='plots'>" + "".join(images) + "</div>"


def _segments_section(holdout: Holdout, compared: dict[str, tuple[np.ndarray, float]]) -> str:
    segments = _segments(holdout)
    header = ["segment", "rows", "fraud"]
    for who in compared:
        header += [f"{who} AUC-PR", f"{who} recall", f"{who} declined"]
    rows = []
    for name, mask in segments:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            continue
        labels = holdout.y[idx]
        row = [name, f"{idx.size:,}", f"{int(labels.sum()):,}"]
        for scores, threshold in compared.values():
            weights = _w(holdout.weights, idx)
            both = 0 < labels.sum() < len(labels)
            row += [
                _num(average_precision(labels, scores[idx], weights)) if both else "-",
                _num(_recall(labels, scores[idx], weights, threshold)) if labels.sum() else "-",
                f"{decline_rate(scores[idx], threshold, weights):.2%}",
            ]
        rows.append(row)
    return (
        "<h2>Performance by segment</h2><p>Each version at its own threshold, on the same holdout rows "
        "(rows are the holdout's; rates are weighted by the transactions they stand for).</p>"
        + _table(header, rows)
    )


def _gate_section(gate: Decision | None, champion: str | None) -> str:
    if gate is None:
        return "<h2>Comparison with the champion</h2><p>Not gated yet.</p>"
    names = sorted(set(gate.candidate_metrics) | set(gate.champion_metrics))
    rows = [
        (name, _num(gate.candidate_metrics.get(name)), _num(gate.champion_metrics.get(name)))
        for name in names
    ]
    who = f"v{champion}" if champion else "no champion"
    return (
        f"<h2>Comparison with the champion ({_e(who)}), same holdout rows</h2>"
        f"<p>Gate: <b>{_e(gate.decision)}</b>: {_e(gate.reason)}</p>"
        + _table(["metric", f"v{gate.candidate_version}", who], rows)
    )


def _history_section(rows: list[Decision]) -> str:
    body = [
        (
            r.recorded_at,
            r.action,
            r.decision,
            r.decided_by or "-",
            r.triggered_by or "-",
            r.comment or "",
            r.reason,
        )
        for r in rows
    ]
    return "<h2>Promotion history and approvals</h2>" + (
        _table(["recorded", "action", "decision", "decided by", "started by", "comment", "reason"], body)
        if body
        else "<p>No decision recorded about this version yet.</p>"
    )


# --- helpers ------------------------------------------------------------------------------------------------


def _segments(holdout: Holdout) -> list[tuple[str, np.ndarray]]:
    from model_contract.inputs import CATEGORICAL_VOCAB

    found: list[tuple[str, np.ndarray]] = []
    for column in ("channel", "country"):
        try:
            codes = holdout.matrix((f"{column}_code",), "the card")[:, 0].astype(int)
        except Exception:
            continue
        vocab = ("(unknown)", *CATEGORICAL_VOCAB[column])
        for code in np.unique(codes):
            label = vocab[code] if 0 <= code < len(vocab) else str(code)
            found.append((f"{column} = {label}", codes == code))
    try:
        usd = np.expm1(holdout.matrix(("log_amount_usd",), "the card")[:, 0].astype("float64"))
    except Exception:
        return found
    for low, high in AMOUNT_BANDS:
        label = f"amount {low:,.0f}+ USD" if math.isinf(high) else f"amount {low:,.0f}-{high:,.0f} USD"
        found.append((label, (usd >= low) & (usd < high)))
    return found


def _champion(history: list[Decision]) -> str | None:
    from training.ledger import champion_stack

    stack = champion_stack(history)
    return stack[-1] if stack else None


def _w(weights: np.ndarray | None, idx: np.ndarray) -> np.ndarray | None:
    return None if weights is None else weights[idx]


def _recall(labels, scores, weights, threshold) -> float:
    return precision_recall(labels, scores, threshold, weights)[1]


def _precision(labels, scores, weights, threshold) -> float:
    return precision_recall(labels, scores, threshold, weights)[0]


def _num(value: Any) -> str:
    if value is None:
        return "-"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "-" if not math.isfinite(number) else f"{number:.4f}"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _table(header: list[str], rows: list) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:75em}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}"
    ".muted{color:#777}.plots{display:flex;flex-wrap:wrap;gap:1em}img{max-width:30em}"
)
