"""A check in MLflow: one run per checked date in the experiment `fraud-monitoring`, with a metric per
input (`psi.<input>`, `ks.<input>`) and per live figure, a PSI bar plot (psi.png) and an HTML report of the
per-input table (report.html)."""

from __future__ import annotations

import html
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from core.settings import Profile

if TYPE_CHECKING:
    from core.settings import Settings
    from monitoring.check import CheckResult
    from monitoring.drift import InputDrift

EXPERIMENT = "fraud-monitoring"


def experiment_id(settings: Settings) -> str:
    """The monitoring experiment's id, created on first use (artifacts beside the training runs' locally)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    found = client.get_experiment_by_name(EXPERIMENT)
    if found is not None:
        return found.experiment_id
    location = None
    if settings.profile is Profile.LOCAL:
        artifacts = settings.mlflow_dir / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        location = artifacts.as_uri()
    try:
        return client.create_experiment(EXPERIMENT, artifact_location=location)
    except MlflowException:  # created by a parallel check in between
        found = client.get_experiment_by_name(EXPERIMENT)
        if found is None:
            raise
        return found.experiment_id


def psi_plot(inputs: list[InputDrift], threshold: float, path: Path) -> Path:
    """Horizontal PSI bars per input, drifted ones red, the threshold as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    ordered = sorted(inputs, key=lambda i: i.psi)
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(ordered) + 1.2))
    ax.barh(
        [i.name for i in ordered],
        [i.psi for i in ordered],
        color=["#c0392b" if i.drifted else "#7f8c8d" for i in ordered],
    )
    ax.axvline(threshold, linestyle="--", color="black", linewidth=1)
    ax.set(xlabel="PSI against the champion's training reference", title="Input drift (red: drifted)")
    ax.tick_params(axis="y", labelsize=7)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def html_report(result: CheckResult) -> str:
    """A self-contained page: the verdict, the per-input table, the live figures and any rollback."""

    def number(value: float | None, digits: int = 4) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    def row(cells: list[str], tag: str = "td") -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"

    drift = result.drift
    inputs = sorted(drift.inputs, key=lambda i: -i.psi)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>fraud monitoring {result.day}</title>",
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "td:first-child{text-align:left}.drifted td{background:#f6d5d1}</style></head><body>",
        f"<h1>Fraud model monitoring, {result.day}</h1>",
        "<p>"
        + html.escape(
            f"Champion v{result.champion_version}; features from the {result.feature_source}; "
            f"verdict: {drift.verdict}. {drift.reason}"
        )
        + "</p>",
    ]
    parts += [f"<p>{html.escape(note)}</p>" for note in result.notes]
    parts.append("<h2>Inputs</h2><table>")
    parts.append(row(["input", "kind", "PSI", "KS", "drifted", "rows", "null share", "ref null share"], "th"))
    for i in inputs:
        cells = [
            i.name,
            i.kind,
            number(i.psi),
            number(i.ks),
            "yes" if i.drifted else "",
            str(i.rows),
            number(i.null_share, 3),
            number(i.reference_null_share, 3),
        ]
        parts.append(row(cells).replace("<tr>", "<tr class='drifted'>", 1) if i.drifted else row(cells))
    parts.append("</table>")
    performance = result.performance
    parts.append(
        f"<h2>Live performance</h2><p>{html.escape(performance.first.isoformat())} .. "
        f"{html.escape(performance.last.isoformat())}, chargebacks reported by "
        f"{html.escape(performance.labels_as_of.isoformat())}</p><table>"
    )
    parts.append(
        row(["version", "role", "rows", "frauds", "AUC-PR", "recall @1% FPR", "enough frauds"], "th")
    )
    for v in performance.versions:
        parts.append(
            row(
                [
                    f"v{v.version}",
                    v.role,
                    str(v.rows),
                    str(v.frauds),
                    number(v.auc_pr),
                    number(v.recall_at_1pct_fpr),
                    "yes" if v.sufficient else "no",
                ]
            )
        )
    parts.append("</table>")
    done = "rolled back" if result.rollback.rolled_back else "no rollback"
    parts.append(f"<h2>Rollback rule: {done}</h2><p>{html.escape(result.rollback.reason)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def log_check(settings: Settings, result: CheckResult, threshold: float) -> str:
    """Log the check as a run of EXPERIMENT; its run id."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    tags = {
        "monitoring.day": result.day.isoformat(),
        "monitoring.verdict": result.drift.verdict,
        "monitoring.feature_source": result.feature_source,
        "monitoring.champion_version": str(result.champion_version),
        "monitoring.check_id": result.check_id,
        "monitoring.rolled_back": str(result.rollback.rolled_back),
        "mlflow.note.content": f"{result.drift.verdict}: {result.drift.reason}",
    }
    if result.dag_id:
        tags.update({"monitoring.dag_id": result.dag_id, "monitoring.dag_run_id": result.dag_run_id})
    run = client.create_run(experiment_id(settings), run_name=f"monitor-{result.day.isoformat()}", tags=tags)
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric("drift.rows", float(result.drift.rows), now, 0)]
    metrics.append(Metric("drift.inputs_drifted", float(len(result.drift.drifted)), now, 0))
    for i in result.drift.inputs:
        metrics.append(Metric(f"psi.{i.name}", i.psi, now, 0))
        if i.ks is not None:
            metrics.append(Metric(f"ks.{i.name}", i.ks, now, 0))
    for v in result.performance.versions:
        prefix = f"live.{v.role}.v{v.version}"
        metrics.append(Metric(f"{prefix}.rows", float(v.rows), now, 0))
        metrics.append(Metric(f"{prefix}.frauds", float(v.frauds), now, 0))
        if v.auc_pr is not None:
            metrics.append(Metric(f"{prefix}.auc_pr", v.auc_pr, now, 0))
        if v.recall_at_1pct_fpr is not None:
            metrics.append(Metric(f"{prefix}.recall_at_1pct_fpr", v.recall_at_1pct_fpr, now, 0))
    estimated = result.estimate or {}
    figures = {
        "estimate.auc_pr": (estimated.get("estimate") or {}).get("auc_pr"),
        "estimate.auc_pr_spread": (estimated.get("estimate") or {}).get("auc_pr_spread"),
        "estimate.recall_at_threshold": (estimated.get("estimate") or {}).get("recall_at_threshold"),
        "calibration.ece_before": (estimated.get("calibration") or {}).get("ece_before"),
        "calibration.ece_after": (estimated.get("calibration") or {}).get("ece_after"),
        "matured.estimate.auc_pr": ((estimated.get("matured") or {}).get("estimate") or {}).get("auc_pr"),
        "matured.realised.auc_pr": (estimated.get("matured") or {}).get("realised_auc_pr"),
        "matured.estimate_error": (estimated.get("matured") or {}).get("error"),
    }
    metrics += [Metric(name, float(value), now, 0) for name, value in figures.items() if value is not None]
    service = result.service
    if service is not None and service.requests:
        for name, value in (
            ("service.requests", service.requests),
            ("service.error_rate", service.error_rate),
            ("service.refusal_rate", service.refusal_rate),
            ("service.latency_p50_ms", service.latency_p50_ms),
            ("service.latency_p95_ms", service.latency_p95_ms),
            ("service.latency_p99_ms", service.latency_p99_ms),
        ):
            if value is not None:
                metrics.append(Metric(name, float(value), now, 0))
    params = [
        Param("reference.version", str(result.champion_version)),
        Param("reference.rows", str(result.drift.reference_rows)),
        Param("live.first", result.performance.first.isoformat()),
        Param("live.last", result.performance.last.isoformat()),
    ]
    for offset in range(0, len(metrics), 1000):  # the server's batch limit
        client.log_batch(run_id, metrics=metrics[offset : offset + 1000])
    client.log_batch(run_id, params=params)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if result.drift.inputs:
            client.log_artifact(
                run_id, str(psi_plot(list(result.drift.inputs), threshold, folder / "psi.png"))
            )
        (folder / "report.html").write_text(html_report(result))
        client.log_artifact(run_id, str(folder / "report.html"))
    client.set_terminated(run_id)
    return run_id
