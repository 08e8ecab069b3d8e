"""Typed settings: the single composition root reads them once.

`MLOPS_PROFILE` picks the profile (`local`, the embedded default, or `cluster`); every other field can be
overridden by an `MLOPS_<FIELD>` variable (nested ones with `__`, e.g. `MLOPS_CLUSTER__REDIS_URL`).
Importing this module does nothing but define classes: no folder is made, no service is contacted.
Folders are created by `Settings.ensure_dirs()`, called by the commands that write.
"""

from __future__ import annotations

import functools
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.residency import StoragePolicy, check_storage_uris, object_store_child

REPO_ROOT = Path(__file__).resolve().parent.parent


class Profile(StrEnum):
    LOCAL = "local"
    CLUSTER = "cluster"


def web_address(setting: str, url: str | None) -> str | None:
    """An http(s) URL setting: None when empty; a clear error naming the setting otherwise."""
    if url and not url.startswith(("http://", "https://")):
        raise ValueError(f"{setting} must be an http:// or https:// URL, not {url!r}")
    return url or None


class ClusterServices(BaseModel):
    """Addresses of the services the cluster profile uses (defaults: the services on this machine)."""

    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis_url: str = "redis://127.0.0.1:6379/0"
    spark_master: str = "spark://127.0.0.1:7077"
    mlflow_tracking_uri: str = "http://127.0.0.1:5000"
    kubernetes_namespace: str = "mlops-training"
    # How pod tasks reach the Kubernetes API, on the worker and in the triggerer's deferred wait alike. Unset:
    # from inside the cluster, with the pod's service account (in_cluster); the triggerer has no kubeconfig
    # and the provider does not fall back to in-cluster by itself. Set: the Airflow connection to use (an
    # Airflow outside the cluster it launches pods in).
    kubernetes_conn_id: str | None = None
    # The address Spark executors use to reach the driver (this machine's, as the cluster sees it).
    spark_driver_host: str = "127.0.0.1"
    # Object storage for the lake, DVC remote and MLflow artifacts (s3://bucket/prefix), and where it is.
    object_store_uri: str | None = None
    object_store_region: str | None = None
    object_store_endpoint: str | None = None


class IngestSettings(BaseModel):
    """How strict ingestion is."""

    max_quarantine_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="fail above this share")
    # Chargeback files are small (dozens of rows a day): their own limit, so one broken line of twenty
    # can be allowed without loosening the transactions' gate.
    max_label_quarantine_rate: float = Field(
        default=0.10, ge=0.0, le=1.0, description="fail a labels arrival above this share"
    )
    # A transaction_id already in the bronze of an arrival this many days earlier is a resend (duplicate).
    dedup_lookback_days: int = Field(default=30, ge=0, description="dedup across arrivals this far back")
    fail_on_empty_arrival: bool = False
    late_event_days: int = Field(default=1, ge=0, description="events may be this many days older")
    row_count_min_ratio: float = Field(default=0.5, gt=0.0, description="vs the previous arrival date")
    row_count_max_ratio: float = Field(default=2.0, gt=0.0)
    # fnmatch globs of files an arrival folder may hold beside its data files and `_SUCCESS`; any other
    # file or subfolder fails the date. Default: hidden files (.DS_Store, upload temporaries) and `_`
    # control files (manifests, markers), the names Spark and Hadoop readers skip too. Data files
    # (transactions-*, labels-*) are never ignored. From the environment, a JSON list that replaces the
    # default: MLOPS_INGEST__IGNORE_FILES='[".*", "_*", "*.md5"]'.
    ignore_files: list[str] = [".*", "_*"]
    # An arrival without data rows normally never clears a date the lake holds rows of (its files were
    # lost); set it true to rerun such a date when the producer really retracted the day.
    allow_empty_overwrite: bool = False


class TrainingSettings(BaseModel):
    """Defaults of a retraining run (each can be overridden on the command line)."""

    window_days: int = Field(default=30, ge=1, description="transactions that arrived in the last N days")
    # Chargebacks come a median 2.5 days after the transaction: younger ones are mostly unlabeled fraud.
    label_maturity_days: int = Field(default=3, ge=0, description="leave out the last N days' transactions")
    # Set (0.95: the wait by which 95% of the feed's fraud chargebacks arrived): the wait is read from the
    # chargebacks themselves instead (training/label_maturity.py), the constant above until 30 are seen.
    label_maturity_quantile: float | None = Field(default=None, gt=0.0, lt=1.0, description="e.g. 0.95")
    # Each version's operating point (model_contract/operating_point.py): its threshold is chosen on the
    # holdout so that it declines at most this share of transactions (an alert budget: 0.01 = 10 per 1,000),
    # and the service decides at it. review_rate > 0: a review band below it, at most that further share.
    decline_rate: float = Field(default=0.01, gt=0.0, lt=1.0, description="target share of declines")
    review_rate: float = Field(default=0.0, ge=0.0, lt=1.0, description="share sent to review; 0: none")
    # Train + validation rows at most: above it, legitimate transactions are sampled by a hash of their id
    # (every fraud kept; the holdout never sampled). 30 days of 1M transactions are ~23M such rows.
    max_fit_rows: int | None = Field(default=2_000_000, ge=1, description="None: no sampling")
    epochs: int = Field(default=15, ge=1)
    batch_size: int = Field(default=512, ge=1)
    learning_rate: float = Field(default=2e-3, gt=0)
    accumulation_steps: int = Field(default=1, ge=1)
    patience: int = Field(default=3, ge=1, description="epochs without validation gain before stopping")
    checkpoint_every: int = Field(default=50, ge=1, description="optimizer steps between checkpoints")
    cpu_threads: int = Field(default=1, ge=0, description="torch threads training on the CPU; 0: one a core")
    seed: int = 7
    weight_decay: float = Field(default=1e-4, ge=0.0, description="AdamW's decoupled weight decay")
    # The MLP's hidden layer widths and dropout (training/model.py). With tuning.use_best_params, the
    # latest finished study's best values replace these and learning_rate, batch_size, weight_decay
    # (training/tuning.py).
    hidden: list[int] = Field(default=[128, 64], min_length=1, description="hidden layer widths")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    # Where the retrain DAG's train task runs: "kubernetes" (a GPU pod) or "local" (a child process of the
    # task). Unset: kubernetes in the cluster profile, local in the local one (Settings.training_runner).
    runner: Literal["kubernetes", "local"] | None = None
    # The training image the cluster profile runs (the Helm values set MLOPS_TRAINING__IMAGE).
    image: str = "mlops-fraud-training:0.1.0"  # pinned: a moving tag would train different code
    gpus: int = Field(default=1, ge=1)
    node_selector: dict[str, str] = {"nvidia.com/gpu.present": "true"}
    tolerations: list[dict[str, str]] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # Kubernetes Secret whose keys become the pod's environment (MLflow and object-store credentials).
    credentials_secret: str = "mlops-training-credentials"
    # The same for the pods that write the promotion history (the gate's decision, an approval, the monitor's
    # rollback): a database login that may append to it, which the other pods' login may not (separated
    # duties: infra/README.md).
    promotion_credentials_secret: str = "mlops-promotion-credentials"
    # PersistentVolumeClaim for checkpoints, so a retried pod resumes where the last one stopped.
    checkpoint_claim: str = "mlops-training-checkpoints"
    startup_timeout_seconds: int = Field(default=900, ge=30)
    execution_timeout_minutes: int = Field(default=360, ge=1)
    # Local profile only: the train task's child process (and everything it started) is stopped after this
    # long; the task's Airflow execution_timeout is this plus the time to stop it (training_task.py).
    local_timeout_minutes: int = Field(default=360, ge=1, description="local training process time limit")


class TuningSettings(BaseModel):
    """Hyperparameter search: an Optuna study whose trials are mapped tasks of the tune_fraud_model DAG
    (training/tuning.py, `mlops tune`)."""

    trials: int = Field(default=8, ge=1, le=1000, description="trials per study (one mapped task each)")
    parallelism: int = Field(default=2, ge=1, le=64, description="trials running at once")
    epochs: int = Field(default=6, ge=1, description="most epochs of one trial (a pruner may stop it sooner)")
    # The median pruner stops a trial whose validation AUC-PR after an epoch is below the median of the trials
    # before it at that epoch, once this many trials finished and after this many epochs of its own.
    pruner_startup_trials: int = Field(default=2, ge=0)
    pruner_warmup_epochs: int = Field(default=1, ge=0)
    study_prefix: str = Field(default="fraud-mlp", min_length=1, description="study name: <prefix>-<as-of>")
    seed: int = 7
    # A retrain trains with the best trial of the latest finished study (instead of the training settings'
    # learning_rate, batch_size, weight_decay, hidden, dropout); its run records which study and trial.
    use_best_params: bool = True


class GateSettings(BaseModel):
    """The champion/challenger gate (see training/registry.py)."""

    margin: float = Field(default=0.005, ge=0.0, description="AUC-PR gain needed over the champion")
    floor: float = Field(default=0.10, ge=0.0, le=1.0, description="AUC-PR the first champion needs")
    max_roc_auc_drop: float = Field(default=0.02, ge=0.0)
    max_recall_drop: float = Field(default=0.05, ge=0.0, description="on recall at 1% false positives")
    max_latency_ms: float = Field(default=20.0, gt=0.0, description="median CPU scoring time, one row")
    # The candidate's decline rate at its own threshold against the champion's at its own, on the same
    # holdout transactions: a promotion may not move it by more than this (absolute share).
    max_decline_rate_change: float = Field(default=0.02, ge=0.0, le=1.0, description="absolute share")


class ApprovalSettings(BaseModel):
    """A person's sign-off before a gate pass serves (dags/approve_fraud_model.py, training/registry.py)."""

    enabled: bool = Field(default=False, description="a gate pass waits for approval in the Airflow UI")
    timeout_hours: float = Field(default=24.0, gt=0, le=168, description="no answer then: nothing promoted")
    # The approvers group: the Airflow user ids (a user name under the simple auth manager) who alone may
    # answer (the approval task's assigned users; the ledger refuses anyone else too). Empty: any user
    # allowed to act on the DAG may answer, which `mlops doctor` and the approval's alert say.
    approvers: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description='JSON list of Airflow user ids, e.g. ["risk-officer"]'
    )


class CompressionSettings(BaseModel):
    """The export's smaller variants of a version (training/compress.py, training/export.py): a student
    distilled from its scores and a structurally pruned copy, each exported to ONNX beside fp32 and int8.
    The export serves the smallest file whose holdout AUC-PR is within `max_auc_pr_drop` of fp32's."""

    enabled: bool = Field(default=True, description="build the pruned and student variants at export")
    max_auc_pr_drop: float = Field(
        default=0.005, ge=0.0, le=1.0, description="holdout AUC-PR a served variant may lose against fp32"
    )
    # hidden layer widths of the distilled student (the champion's are ModelConfig.hidden, (128, 64))
    student_hidden: list[Annotated[int, Field(ge=1)]] = Field(default=[32], min_length=1)
    # share of the units of every hidden layer the pruned variant keeps (by importance)
    prune_keep_fraction: float = Field(default=0.5, gt=0.0, le=1.0)
    # Both variants are fitted inside every export, on the export's CPU: few epochs on a bounded sample.
    epochs: int = Field(default=3, ge=1, le=50, description="epochs of distilling and of fine-tuning")
    max_rows: int = Field(default=200_000, ge=1, description="train rows sampled for distillation")


class RetentionSettings(BaseModel):
    """How long the raw layers are kept (pipelines/privacy.py, the `enforce_retention` DAG), in days before
    the newest arrival the lake has ingested. The scoring log's is `serving.log_retention_days`."""

    landing_days: int = Field(default=90, ge=1, description="landing folders (raw files, raw identifiers)")
    quarantine_days: int = Field(default=90, ge=1, description="quarantined rows (raw records)")
    # The layers above (pipelines/retention.py): the lake's dated partitions (bronze, silver, gold, their
    # states, the training rows, batch decisions) and the training sets; at least what one retrain reads.
    lake_days: int = Field(default=400, ge=1, description="lake partitions and training sets")
    # DVC revisions of gold dates and training sets, and the objects only they use; the training sets of the
    # versions an alias names are kept.
    dataset_days: int = Field(default=400, ge=1, description="DVC revisions and their objects")
    # MLflow: the artifacts (model files, ONNX, plots, card) of versions no alias names whose training data
    # is older than this (training/retention.py); the run and the version stay, tagged, for the history.
    model_days: int = Field(default=400, ge=1, description="artifacts of versions no alias names")


class PrivacySettings(BaseModel):
    """Pseudonyms of customer and merchant ids past landing (core/pseudonym.py, docs/privacy.md)."""

    # The cluster profile mounts a Secret here (infra/); the local profile, unset, makes one under
    # $MLOPS_HOME/secrets on first use. Every process that ingests or scores must read the same key.
    key_file: Path | None = Field(default=None, description="the pseudonym key (a mounted Secret's file)")


class LineageSettings(BaseModel):
    """OpenLineage events of every stage (core/lineage.py, docs/lineage.md): always written as files under
    $MLOPS_HOME/lineage (what `mlops lineage` reads), and posted to `url` when it is set."""

    enabled: bool = Field(default=True, description="emit OpenLineage events")
    url: str | None = Field(
        default=None, description="an OpenLineage consumer (Marquez: http://marquez:5000)"
    )
    endpoint: str = Field(default="api/v1/lineage", description="the consumer's path for events")
    namespace: str = Field(default="mlops-fraud", min_length=1, description="the jobs' namespace")
    timeout_s: float = Field(default=5.0, gt=0, description="how long a post may take")
    retries: int = Field(
        default=2, ge=0, le=10, description="a failed post's retries (0.3 s back-off, doubling)"
    )
    pause_s: float = Field(default=60.0, ge=0, description="after a failed post, how long none is tried")

    @field_validator("url")
    @classmethod
    def _a_web_address(cls, url: str | None) -> str | None:
        return web_address("lineage.url", url)


class ServingSettings(BaseModel):
    """The scoring service (`mlops serve`, serving/)."""

    host: str = Field(default="127.0.0.1", description="address the service listens on")
    port: int = Field(default=8000, ge=1, le=65535)
    # A score at or above the threshold is declined ("decline"), below it approved ("approve").
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0, description="decision threshold on the score")
    # Dynamic micro-batching: concurrent transactions are scored together, up to this many per model call,
    # waiting at most this long for company after the first one arrives. 0: no waiting; what queued while
    # the scorer was busy goes in the next batch, so batches grow with the load by themselves, and a lone
    # request pays no wait (a 1 ms wait was most of its median at 500 requests/s: docs/benchmarks.md).
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    max_wait_ms: float = Field(default=0.0, ge=0.0, le=1000.0)
    # A request with more transactions than this is refused with 413.
    max_request_items: int = Field(default=1000, ge=1)
    # Admission: requests handled at once, and scoring requests waiting for the scorer; past either, a
    # request is answered 503 with Retry-After at once (serving/auth.py, serving/scorer.py).
    max_in_flight: int = Field(default=512, ge=1)
    max_queued_requests: int = Field(default=256, ge=1)
    # How often the champion (the promotion history's) and the challenger are read; a new one loads beside the
    # old one, then swaps (no request fails or waits on the load).
    reload_interval_s: float = Field(default=5.0, gt=0.0)
    # Where the service reads the promotion history, to serve only the champion it records
    # (serving/models.py): a read-only login in the cluster (infra/README.md, Secret fraud-scoring-ledger).
    # Unset: the profile's promotion history (promotion_ledger_url), the database the promotions write.
    ledger_url: str | None = Field(default=None, description="read-only URL of the promotion history")
    shadow: bool = Field(default=True, description="score the latest challenger in shadow (logged only)")
    # A decision's reasons (serving/reasons.py): the inputs whose own value moved its score most, measured
    # against the version's baseline. One model call per input per explained transaction, so by default only
    # the transactions not approved are explained (a few percent of traffic; docs/benchmarks.md has the cost).
    reasons: Literal["not_approved", "all", "off"] = Field(
        default="not_approved", description="which decisions carry reasons"
    )
    reason_count: int = Field(default=3, ge=1, le=10, description="reasons per explained decision, at most")
    # Several replicas with one exact live state (serving/replication.py): each applies the same ordered log
    # of observations, a Redis stream on `cluster.redis_url`. Off: one process, its own state.
    replicated: bool = Field(default=False, description="replicas share one ordered observation log")
    replication_key: str = Field(
        default="mlops:scoring:observations", min_length=1, description="the Redis stream of the log"
    )
    # Batches kept (Redis trims the oldest, roughly): enough for those since the last landing, which a
    # starting replica needs (docs/serving.md, "Replicas").
    replication_max_entries: int = Field(default=2_000_000, ge=1_000)
    # How often a replica applies what the others appended while it scores nothing (an erasure reaches an
    # idle replica within it), and how long `mlops erase` waits for every replica to have forgotten the person
    # before it rewrites the files (serving/replication.py).
    replication_poll_s: float = Field(default=2.0, gt=0.0, le=60.0)
    erasure_wait_s: float = Field(default=60.0, ge=0.0, le=3600.0)
    # The scoring log: Parquet under $MLOPS_HOME/scoring_log/date=YYYY-MM-DD, written by a background thread
    # in files of up to this many rows, or what came in this many seconds.
    scoring_log: bool = Field(default=True, description="write the scoring log (monitoring reads it)")
    log_flush_rows: int = Field(default=5000, ge=1)
    log_flush_interval_s: float = Field(default=5.0, gt=0.0)
    # Rows waiting for the disk at most (past it they are dropped, counted, and readiness is red), and how
    # many days of scoring dates the log keeps (serving/scoring_log.py).
    log_max_pending_rows: int = Field(default=200_000, ge=1)
    log_retention_days: int = Field(default=90, ge=1)
    # Keep each entity's state current as transactions are scored (written through to the online store).
    live_state: bool = Field(default=True, description="update entity state as transactions are scored")
    # The memory the live state may take: at start, the history it would load is sized (rows x bytes per
    # transaction) and the service refuses to turn ready past this, saying why (3 GiB of the pod's 4).
    max_state_bytes: int = Field(default=3 * 1024**3, ge=1)
    # Where the live state's history from the lake ends and scoring takes over: unset, the time the service
    # starts. Set it to replay a past day (the lake then holds that day's silver, which must not count twice).
    live_from: datetime | None = None
    # The window of event and label times the service takes, around its own clock (serving/clock.py): a
    # time further ahead than the skew or further back than the lateness is refused (422), never scored or
    # kept. Lateness + skew within one ingest.late_event_days keeps every admitted transaction within
    # the history the live state keeps (docs/serving.md, "Event time").
    max_future_skew_s: float = Field(default=300.0, ge=0.0, le=86_400.0)
    max_lateness_s: float = Field(default=86_100.0, ge=0.0, le=604_800.0)
    # Callers (serving/auth.py): every route but health wants a bearer token of the tokens file (unset:
    # $MLOPS_HOME/serving/tokens.json, generated by the local profile on first start), with the route's
    # role; `public_read` opens /status, /docs and the metadata to all; a Host outside `allowed_hosts` is
    # refused ("*": any).
    auth: bool = Field(default=True, description="callers present a bearer token with the route's role")
    tokens_file: Path | None = None
    public_read: bool = Field(default=False, description="/status, /docs and metadata without a token")
    allowed_hosts: list[str] = Field(default=["127.0.0.1", "localhost", "::1"], min_length=1)
    # TLS: the service answers HTTPS with this certificate (chain, PEM) and key (in the cluster, files of a
    # kubernetes.io/tls Secret mounted into the pod). Both or neither.
    tls_cert_file: Path | None = Field(default=None, description="PEM certificate (chain) for HTTPS")
    tls_key_file: Path | None = Field(default=None, description="PEM private key for HTTPS")

    @model_validator(mode="after")
    def _tls_pair(self) -> ServingSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "serving.tls_cert_file and serving.tls_key_file go together: set both "
                "(MLOPS_SERVING__TLS_CERT_FILE, MLOPS_SERVING__TLS_KEY_FILE) for HTTPS, or neither"
            )
        return self


class MonitoringSettings(BaseModel):
    """The monitoring DAG: drift against the champion's training reference and live performance."""

    psi_threshold: float = Field(default=0.2, gt=0.0, description="PSI above this: the feature drifted")
    ks_threshold: float = Field(default=0.1, gt=0.0, le=1.0, description="KS statistic above this: drifted")
    # A retrain is requested when at least this many inputs (features or the score) drifted on both tests.
    min_drifted: int = Field(default=2, ge=1)
    min_rows: int = Field(default=500, ge=1, description="fewer scored or arrived rows: no verdict")
    bins: int = Field(default=10, ge=2, le=100, description="quantile bins of the reference for PSI")
    # Live performance on scored traffic whose labels have matured (training.label_maturity_days).
    min_labelled_frauds: int = Field(default=20, ge=1, description="fewer known frauds: no verdict")
    # The champion is rolled back when its live AUC-PR is below the previous champion's (on the same
    # traffic, scored in shadow or from the previous champion's own live window) by more than this.
    max_live_auc_pr_drop: float = Field(default=0.05, ge=0.0)
    # ... and only when the drop is significant: the lower end of the paired bootstrap's interval of the
    # drop (this many resamples of the same rows, two-sided at `rollback_confidence`) is above zero.
    bootstrap_resamples: int = Field(default=300, ge=50, le=10_000)
    rollback_confidence: float = Field(default=0.9, gt=0.5, lt=1.0)
    # No rollback this soon after any alias move (a promotion or a rollback, the promotion history's time).
    rollback_cooldown_hours: float = Field(default=12.0, ge=0.0)
    # Label completeness: the chargebacks reported so far for the matured window against what the history
    # (transactions of the `label_history_days` before it, at the same age) says should have been; a
    # ratio under `min_label_ratio` (a late or partial chargeback feed) gives no verdict.
    label_history_days: int = Field(default=28, ge=1, le=365)
    min_label_ratio: float = Field(default=0.6, gt=0.0, le=1.0)
    window_days: int = Field(default=1, ge=1, le=90, description="days of scoring log per check")
    # The scoring service's objectives per day (monitoring/service.py): server-side latency of a scored
    # transaction (the scoring log's), and of the scoring routes' responses, the share of errors (5xx but
    # 503) and of refusals (4xx and 503: bad input, auth, overload, loading); fewer requests: no verdict.
    # The label-free estimate (monitoring/estimate.py): recalibrate above this expected calibration error;
    # draws of labels per estimate; alert when the estimated AUC-PR is this much below the holdout's.
    max_calibration_error: float = Field(default=0.02, ge=0.0, le=1.0)
    estimate_samples: int = Field(default=100, ge=10, le=10_000)
    max_estimated_auc_pr_drop: float = Field(default=0.1, ge=0.0, le=1.0)
    max_implied_fraud_rate_ratio: float = Field(default=1.5, gt=1.0)
    max_latency_p99_ms: float = Field(default=25.0, gt=0)
    max_error_rate: float = Field(default=0.001, ge=0.0, le=1.0)
    max_refusal_rate: float = Field(default=0.02, ge=0.0, le=1.0)
    min_requests: int = Field(default=100, ge=1)


class AlertSettings(BaseModel):
    """Where alerts go (core/alerts.py): task failures, drift, rollbacks, label lag, estimate drops, service
    objectives. No channel set: alerts are only logged."""

    webhook_url: str | None = Field(default=None, description="each alert POSTed here as JSON")
    email_to: list[str] = Field(default_factory=list, description="addresses each alert is mailed to")
    email_from: str = "mlops@localhost"
    smtp_host: str | None = Field(default=None, description="the mail server; needed with email_to")
    smtp_port: int = Field(default=25, ge=1, le=65535)
    # A mail server that wants TLS and a login (most relays do): STARTTLS on the plain port, then the login.
    # The password comes from the environment (in the cluster, a Secret: infra/README.md), never a file here.
    smtp_starttls: bool = Field(default=False, description="upgrade the mail connection with STARTTLS")
    smtp_username: str | None = Field(default=None, description="the mail server's login (needs STARTTLS)")
    smtp_password: SecretStr | None = None
    # The CA that signed the mail server's certificate, where it is not one the system trusts.
    smtp_ca_file: Path | None = None
    # A webhook that wants a credential: the Authorization header's value (e.g. "Bearer <token>").
    webhook_authorization: SecretStr | None = None
    timeout_s: float = Field(default=10.0, gt=0, description="per channel and alert")
    # An alert of the same kind and subject is sent once a period, the rest counted (core/alert_log.py);
    # 0 sends every one.
    repeat_period_s: int = Field(default=86_400, ge=0, description="repeats of an alert held back this long")

    @model_validator(mode="after")
    def _mail_needs_a_server(self) -> AlertSettings:
        if self.email_to and not self.smtp_host:
            raise ValueError(
                "alerts.email_to is set but alerts.smtp_host is not: name the mail server "
                "(MLOPS_ALERTS__SMTP_HOST) or leave email_to empty"
            )
        if (self.smtp_username is None) != (self.smtp_password is None):
            raise ValueError(
                "alerts.smtp_username and alerts.smtp_password go together: set both "
                "(MLOPS_ALERTS__SMTP_USERNAME, MLOPS_ALERTS__SMTP_PASSWORD) or neither"
            )
        if self.smtp_username is not None and not self.smtp_starttls:
            raise ValueError(
                "alerts.smtp_username is set without alerts.smtp_starttls: the password would cross the "
                "network in clear; set MLOPS_ALERTS__SMTP_STARTTLS=true"
            )
        return self

    @field_validator("webhook_url")
    @classmethod
    def _http_only(cls, url: str | None) -> str | None:
        return web_address("alerts.webhook_url", url)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MLOPS_", env_nested_delimiter="__", extra="ignore")

    profile: Profile = Profile.LOCAL
    home: Path = Field(default=REPO_ROOT / "var", description="all state of this installation")
    landing_dir: Path | None = Field(default=None, description="defaults to $MLOPS_HOME/landing")
    spark_driver_memory: str = "2g"
    # A Spark Connect server (sc://host:port) that `make up` starts: tasks then share its warm JVM instead
    # of starting one each and warming its JIT (measured: see docs/benchmarks.md). Unset: a driver in this
    # process.
    spark_remote: str | None = None
    spark_shuffle_partitions: int = Field(default=4, ge=1)
    # More JVM options for Spark's driver (or Connect server) and executors, after the ones we set. On a small
    # feed a JVM's CPU goes mostly to its JIT: "-XX:TieredStopAtLevel=1" (the client compiler only) cut a
    # small feed's Spark CPU-seconds by 30% (docs/benchmarks.md, "Test-suite time"); the e2e tests' stacks
    # set it. A long-lived driver or a day of production size repays the server compiler: no default.
    spark_java_options: str = Field(default="", description="extra JVM options for Spark's JVMs")
    # No setting for the GX suites: they are package data of `pipelines` (see pipelines/suites.py for why).
    # DVC operations (version_gold, training_set, promote's fetch) take turns on the repository; one waits
    # this long for the others, then fails with a retryable LockTimeoutError.
    dvc_lock_wait_s: float = Field(default=600.0, gt=0, description="wait for another DVC operation")
    # The features DAG's `materialize` runs beside the retrain it started (off the critical path); on a
    # machine they share (the local profile, an Airflow worker) it runs at this niceness, so the training
    # set, train and the gate get the cores first and the online load takes what they leave. 0: no change.
    materialize_niceness: int = Field(default=10, ge=0, le=19, description="CPU niceness of the online load")
    # Where people open MLflow's UI: the links an approver follows to a candidate's run and plots. Unset:
    # the tracking URI when it is http(s) (the cluster's server); `make up` sets it to the MLflow server it
    # starts, since the local profile tracks straight into SQLite.
    mlflow_ui_url: str | None = Field(default=None, description="MLflow's UI for people (links)")

    @field_validator("mlflow_ui_url")
    @classmethod
    def _a_web_address(cls, url: str | None) -> str | None:
        return web_address("mlflow_ui_url", url)

    ingest: IngestSettings = IngestSettings()
    training: TrainingSettings = TrainingSettings()
    tuning: TuningSettings = TuningSettings()
    gate: GateSettings = GateSettings()
    compression: CompressionSettings = CompressionSettings()
    serving: ServingSettings = ServingSettings()
    retention: RetentionSettings = RetentionSettings()
    privacy: PrivacySettings = PrivacySettings()
    lineage: LineageSettings = LineageSettings()
    monitoring: MonitoringSettings = MonitoringSettings()
    alerts: AlertSettings = AlertSettings()
    approval: ApprovalSettings = ApprovalSettings()
    cluster: ClusterServices = ClusterServices()
    # Data residency: every configured storage location must lie in an allowed region or endpoint.
    storage_policy: StoragePolicy = StoragePolicy()

    @model_validator(mode="after")
    def _storage_is_where_it_may_be(self) -> Settings:
        check_storage_uris(
            self.storage_uris,
            self.storage_policy,
            default_region=self.cluster.object_store_region,
            default_endpoint=self.cluster.object_store_endpoint,
        )
        return self

    @property
    def storage_uris(self) -> list[str]:
        uris = [str(self.home), str(self.landing)]
        if self.cluster.object_store_uri:
            uris.append(self.cluster.object_store_uri)
        return uris

    @property
    def stores(self) -> dict[str, str]:
        """Every place the active profile keeps data, by name, as a URI: what `mlops doctor`'s residency
        check judges (the startup check above judges the paths and the object store)."""
        cluster = self.profile is Profile.CLUSTER
        store = self.cluster.object_store_uri if cluster else None
        stores = {
            "home (lake, scoring log, monitoring, checkpoints, feature files)": str(self.home),
            "landing": str(self.landing),
            "DVC remote": object_store_child(store, "dvc") if store else str(self.dvc_remote),
        }
        if not cluster:
            return stores | {
                "MLflow backend and registry": self.mlflow_tracking_uri,
                "MLflow artifacts": str(self.mlflow_dir / "artifacts"),
                "promotion history and tuning studies": str(self.mlflow_dir),
                "feature store (registry, online store)": str(self.feast_dir),
            }
        stores |= {
            "PostgreSQL (Airflow, promotion history, tuning studies)": self.cluster.postgres_dsn,
            "Redis (online store, live entity state)": self.cluster.redis_url,
            "MLflow tracking server (backend and registry)": self.cluster.mlflow_tracking_uri,
            # The server writes artifacts to the object store when there is one (scripts/up.sh).
            "MLflow artifacts": object_store_child(store, "mlflow/artifacts")
            if store
            else str(self.mlflow_dir / "artifacts"),
        }
        if store:
            stores["object store"] = store
        return stores

    @field_validator("home", "landing_dir", mode="after")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    # Locations. Every path of the installation is derived here, so tests isolate a run with MLOPS_HOME.
    @property
    def landing(self) -> Path:
        return self.landing_dir or self.home / "landing"

    @property
    def lake(self) -> Path:
        return self.home / "lake"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def mlflow_dir(self) -> Path:
        return self.home / "mlflow"

    @property
    def feast_dir(self) -> Path:
        return self.home / "feast"

    @property
    def dvc_remote(self) -> Path:
        return self.home / "dvc-remote"

    @property
    def dvc_remote_url(self) -> str:
        """Where DVC pushes: the object store's `dvc/` in the cluster profile when it has one, else the
        folder `dvc_remote`."""
        if self.cluster.object_store_uri and self.profile is Profile.CLUSTER:
            return object_store_child(self.cluster.object_store_uri, "dvc")
        return str(self.dvc_remote)

    @property
    def spark_master(self) -> str:
        return "local[*]" if self.profile is Profile.LOCAL else self.cluster.spark_master

    @property
    def training_runner(self) -> Literal["kubernetes", "local"]:
        if self.training.runner:
            return self.training.runner
        return "kubernetes" if self.profile is Profile.CLUSTER else "local"

    @property
    def airflow_sql_conn(self) -> str:
        if self.profile is Profile.LOCAL:
            return f"sqlite:///{self.airflow_home / 'airflow.db'}"
        return self.cluster.postgres_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)

    @property
    def mlflow_tracking_uri(self) -> str:
        if self.profile is Profile.LOCAL:
            return f"sqlite:///{self.mlflow_dir / 'mlflow.db'}"
        return self.cluster.mlflow_tracking_uri

    @property
    def promotion_ledger_url(self) -> str:
        """Where the append-only promotion history lives (beside the MLflow registry)."""
        if self.profile is Profile.LOCAL:
            return f"sqlite:///{self.mlflow_dir / 'promotions.db'}"
        return self.cluster.postgres_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)

    @property
    def serving_ledger_url(self) -> str:
        """Where the scoring service reads the promotion history (`serving.ledger_url`, else the
        profile's)."""
        url = self.serving.ledger_url or self.promotion_ledger_url
        return url.replace("postgresql://", "postgresql+psycopg2://", 1)

    @property
    def tuning_storage_url(self) -> str:
        """Optuna's study storage: the profile's database (trials of parallel tasks share it)."""
        if self.profile is Profile.LOCAL:
            return f"sqlite:///{self.mlflow_dir / 'optuna.db'}"
        return self.cluster.postgres_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)

    @property
    def scoring_log_dir(self) -> Path:
        """The scoring service's log: one Parquet folder per date (serving/scoring_log.py)."""
        return self.home / "scoring_log"

    @property
    def monitoring_dir(self) -> Path:
        """The monitoring DAG's results table and reports (monitoring/)."""
        return self.home / "monitoring"

    @property
    def checkpoints_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def online_store(self) -> str:
        return "sqlite" if self.profile is Profile.LOCAL else "redis"

    def ensure_dirs(self) -> None:
        for path in (self.landing, self.lake, self.airflow_home, self.mlflow_dir, self.feast_dir):
            path.mkdir(parents=True, exist_ok=True)


@functools.cache
def get_settings() -> Settings:
    """The settings of this process, read from the environment once."""
    return Settings()


# Settings that hold credentials (a DSN or URL with a password): a pod gets them from a Kubernetes Secret,
# never as a plain value in a pod spec or Helm values.
SECRET_SETTINGS = frozenset({"MLOPS_CLUSTER__POSTGRES_DSN", "MLOPS_CLUSTER__REDIS_URL"})


def setting_env_names(model: type[BaseModel] = Settings, prefix: str = "MLOPS_") -> list[str]:
    """The environment variable of every leaf setting (`MLOPS_TRAINING__GPUS`, ...), in field order. A field
    whose type is a settings group (a BaseModel) is expanded; dicts and lists are leaves (JSON values)."""
    names: list[str] = []
    for field_name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += setting_env_names(annotation, f"{prefix}{field_name.upper()}__")
        else:
            names.append(f"{prefix}{field_name.upper()}")
    return names


def settings_as_env(settings: Settings, *, include_secrets: bool = False) -> dict[str, str]:
    """`settings` as the environment that makes another process read the same settings: one variable per
    leaf setting whose value is not None (None is each such field's default: "not set"), lists and dicts
    as JSON. Credentials (SECRET_SETTINGS, and every SecretStr setting, an optional one such as the alerts'
    logins) are left out unless asked for: they travel in Secrets."""
    import json

    values = settings.model_dump(mode="json")
    env: dict[str, str] = {}
    for name in setting_env_names():
        if name in SECRET_SETTINGS and not include_secrets:
            continue
        value: object = values
        held: object = settings
        for part in name.removeprefix("MLOPS_").lower().split("__"):
            value = value[part]  # type: ignore[index]
            held = getattr(held, part)
        if value is None:
            continue
        if isinstance(held, SecretStr):  # the dump holds "**********", never the value
            if not include_secrets:
                continue
            value = held.get_secret_value()
        env[name] = value if isinstance(value, str) else json.dumps(value)
    return env
