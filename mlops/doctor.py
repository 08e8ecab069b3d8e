"""`mlops doctor`: check this machine against the active profile and say how to fix what is wrong."""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

from core.settings import Profile, Settings

MIN_JAVA = 17


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def run_checks(settings: Settings) -> list[Check]:
    checks: list[Callable[[Settings], Check]] = [
        _python, _java, _home, _residency, _spark, _approval, _label_maturity, _dags, _alerts,
    ]  # fmt: skip
    if settings.profile is Profile.LOCAL:
        checks += [_sqlite]
    else:
        checks += [_postgres, _redis, _mlflow_server, _kubernetes]
    return [check(settings) for check in checks]


# Made-up arrivals for a demo: paused on purpose wherever the product runs for real.
DEMO_DAGS = frozenset({"synthetic_landing"})


def product_dag_ids(folder: Path | None = None) -> set[str]:
    """The DAG ids the product's DAG files declare (`dag_id="..."`): the folder Airflow parses
    (AIRFLOW__CORE__DAGS_FOLDER), else this checkout's dags/."""
    configured = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    folder = folder or (Path(configured) if configured else Path(__file__).parents[1] / "dags")
    found = set()
    for path in folder.glob("*.py") if folder.is_dir() else []:
        found |= set(re.findall(r'^\s*dag_id="([^"]+)"', path.read_text(errors="replace"), re.MULTILINE))
    return found


def _dags(settings: Settings) -> Check:
    """Whether the product's DAGs are there and active in Airflow's metadata database: a DAG created paused
    (Airflow's default) runs nothing, and a fresh deployment looked healthy while nothing ran."""
    import sqlalchemy as sa

    product = product_dag_ids() - DEMO_DAGS
    url = settings.airflow_sql_conn
    # In the cluster Airflow's metadata has a database of its own (the chart's metadata Secret, which it hands
    # its pods as Airflow's own setting), not the promotion history's.
    if settings.profile is Profile.CLUSTER and os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        url = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    if url.startswith("sqlite:///"):  # read only: the doctor looks, it creates no database
        database = Path(url.removeprefix("sqlite:///"))
        if not database.is_file():
            return Check(
                "dags",
                Status.WARN,
                f"Airflow has not run here yet: no metadata database at {database}",
                "start Airflow (`make up`) and run this again",
            )
        url = f"sqlite:///file:{database}?mode=ro&uri=true"
    try:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as connection:
                rows = connection.execute(sa.text("SELECT dag_id, is_paused FROM dag")).all()
        finally:
            engine.dispose()
    except Exception as exc:
        return Check(
            "dags",
            Status.WARN,
            f"Airflow's metadata database cannot be read ({_redact(url)}): {str(exc).splitlines()[0][:200]}",
            "start Airflow (`make up`, or the chart in the cluster) and run this again",
        )
    paused = sorted(dag_id for dag_id, is_paused in rows if is_paused and dag_id in product)
    missing = sorted(product - {dag_id for dag_id, _ in rows})
    if paused:
        return Check(
            "dags",
            Status.WARN,
            f"paused, so they run nothing: {', '.join(paused)}",
            "unpause them in the Airflow UI or with `airflow dags unpause <dag_id>`; the cluster chart "
            "creates them active (infra/README.md, step 5)",
        )
    if missing:
        return Check(
            "dags",
            Status.WARN,
            f"not in Airflow yet: {', '.join(missing)}",
            "wait for the DAG processor to parse the DAG folder, or look for import errors in the Airflow UI",
        )
    return Check("dags", Status.OK, f"{len(product)} active: {', '.join(sorted(product))}")


def _alerts(settings: Settings) -> Check:
    """Whether each configured alert channel answers from here: the mail server greets (and offers STARTTLS
    where it is asked for), the webhook's host takes a connection. Nothing is sent. In the cluster the check
    runs in a pod that sends alerts, so a NetworkPolicy that does not admit the channel shows here."""
    import smtplib

    from orchestration.alert_egress import channels

    found = channels(settings.alerts)
    if not found:
        return Check(
            "alerts",
            Status.OK if settings.profile is Profile.LOCAL else Status.WARN,
            "no alert channel configured: alerts are only logged",
            "" if settings.profile is Profile.LOCAL else (
                "set MLOPS_ALERTS__WEBHOOK_URL or MLOPS_ALERTS__EMAIL_TO with MLOPS_ALERTS__SMTP_HOST "
                "(infra/README.md, \"Alerts\")"
            ),
        )  # fmt: skip
    fix = (
        "check the setting; in the cluster render the egress for it "
        '(`mlops alert-egress | kubectl apply -f -`, infra/README.md "Alerts")'
    )
    answered = []
    for channel in found:
        try:
            if channel.kind == "mail":
                with smtplib.SMTP(channel.host, channel.port, timeout=3) as smtp:
                    smtp.ehlo()
                    if settings.alerts.smtp_starttls and not smtp.has_extn("starttls"):
                        return Check(
                            "alerts",
                            Status.FAIL,
                            f"{channel}: the mail server does not offer STARTTLS, which "
                            "MLOPS_ALERTS__SMTP_STARTTLS asks for",
                            "point MLOPS_ALERTS__SMTP_HOST/_SMTP_PORT at the relay's STARTTLS port (587)",
                        )
            else:
                socket.create_connection((channel.host, channel.port), timeout=3).close()
        except (OSError, smtplib.SMTPException) as exc:
            return Check("alerts", Status.FAIL, f"{channel} does not answer: {exc}"[:300], fix)
        answered.append(str(channel))
    return Check("alerts", Status.OK, "answering: " + "; ".join(answered))


def _approval(settings: Settings) -> Check:
    """Who may sign off a gate pass: with approval on and no approvers group, anyone allowed to act on the
    approval DAG may (the run's own starter aside), which model-risk rules do not accept."""
    policy = settings.approval
    if not policy.enabled:
        return Check("approval", Status.OK, "off: a gate pass serves at once (MLOPS_APPROVAL__ENABLED)")
    if not policy.approvers:
        return Check(
            "approval",
            Status.WARN,
            "on, with no approvers group: any user allowed to act on approve_fraud_model may answer",
            'set MLOPS_APPROVAL__APPROVERS to the Airflow user ids who may, e.g. ["risk-officer"]',
        )
    return Check("approval", Status.OK, f"on; approvers: {', '.join(policy.approvers)}")


def _label_maturity(settings: Settings) -> Check:
    """The wait before a transaction's label counts, beside what the feed's chargebacks show (measured up to
    the latest chargeback arrival in the lake): a wait shorter than most chargebacks trains on fraud labelled
    legitimate."""
    from datetime import UTC, date, datetime

    from pipelines.lake import Tables
    from training.label_maturity import MIN_REPORTS, label_maturity

    arrivals = sorted(
        p.name.removeprefix("arrival_date=")
        for p in Tables(settings.lake).silver_labels.glob("arrival_date=*")
    )
    day = date.fromisoformat(arrivals[-1]) if arrivals else datetime.now(UTC).date()
    try:
        found = label_maturity(settings, day, observe=True)
    except Exception as exc:  # an unreadable lake is the ingest checks' business: said, not fatal here
        return Check("label_maturity", Status.WARN, f"the chargebacks could not be read: {exc}")
    said = f"{found.days} days ({found.source})"
    if found.observed_days is None:
        return Check(
            "label_maturity",
            Status.OK,
            f"{said}; {found.reports} fraud chargebacks up to {day}, fewer than {MIN_REPORTS} to measure",
        )
    seen = (
        f"the feed's {found.quantile:.0%} quantile of delays is {found.observed_days:.1f} days over "
        f"{found.reports} fraud chargebacks up to {day}"
    )
    if settings.training.label_maturity_quantile is None and found.observed_days > found.days:
        return Check(
            "label_maturity",
            Status.WARN,
            f"{said}, but {seen}: training counts late-reported fraud as legitimate",
            "MLOPS_TRAINING__LABEL_MATURITY_QUANTILE=0.95 (the wait follows the feed), or "
            f"MLOPS_TRAINING__LABEL_MATURITY_DAYS={math.ceil(found.observed_days)}",
        )
    return Check("label_maturity", Status.OK, f"{said}; {seen}")


def _python(_: Settings) -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] == (3, 11):
        return Check("python", Status.OK, f"Python {version}")
    return Check(
        "python", Status.FAIL, f"Python {version}", "use Python 3.11 (`make demo` builds .venv with it)"
    )


def java_version(java: str) -> int | None:
    result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 else major  # "1.8" means Java 8


def _java(_: Settings) -> Check:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    fix = f"install a JDK {MIN_JAVA}+ (Debian: apt-get install openjdk-17-jre-headless) and put java on PATH"
    if not java or not Path(java).exists():
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "java is not on PATH"
        return Check("java", Status.FAIL, where, fix)
    major = java_version(java)
    if major is None:
        return Check("java", Status.FAIL, f"{java} -version printed no version", fix)
    if major < MIN_JAVA:
        return Check("java", Status.FAIL, f"Java {major} at {java}; Spark 4 needs {MIN_JAVA}+", fix)
    return Check("java", Status.OK, f"Java {major} ({java})")


def _home(settings: Settings) -> Check:
    home = settings.home
    existing = home
    while not existing.exists():
        existing = existing.parent
    if os.access(existing, os.W_OK):
        state = "exists" if home.exists() else "will be created on first use"
        return Check("mlops_home", Status.OK, f"{home} ({state}, writable)")
    return Check(
        "mlops_home",
        Status.FAIL,
        f"{existing} is not writable",
        "point MLOPS_HOME at a writable folder, e.g. export MLOPS_HOME=$PWD/var",
    )


def _residency(settings: Settings) -> Check:
    """Every store of the profile (`Settings.stores`) judged by the storage policy, and the object store's
    region asked of the store itself when it can be reached: a URI's `?region=` is only what its owner
    declared. The doctor says when it could not ask, rather than pass on the URI's word."""
    from core.residency import bucket_region, declared_region, judge, redact

    policy = settings.storage_policy
    region, endpoint = settings.cluster.object_store_region, settings.cluster.object_store_endpoint
    stores = settings.stores
    placed, refused, located = [], [], {}
    for name, uri in stores.items():
        location, reason = judge(uri, policy, default_region=region, default_endpoint=endpoint)
        if reason:
            refused.append(f"{name} ({redact(uri)}): {reason}")
        elif location is not None:
            located[name] = location
            placed.append(f"{name}: {location.kind} {location.place}")
    fix = (
        "move the store into an allowed region or endpoint, or, if its place is approved, add it to "
        "MLOPS_STORAGE_POLICY__ALLOWED_REGIONS / MLOPS_STORAGE_POLICY__ALLOWED_ENDPOINT_HOSTS"
    )
    if refused:
        return Check("residency", Status.FAIL, "; ".join(refused), fix)
    store = stores.get("object store")
    if store is None:
        return Check("residency", Status.OK, "; ".join(placed))
    declared = located["object store"]
    try:
        found, asked = bucket_region(store, region=region, endpoint=endpoint)
    except (OSError, ValueError) as exc:
        return Check(
            "residency",
            Status.WARN,
            f"the object store's region was not verified, only declared ({declared.kind} {declared.place}): "
            f"{exc}; " + "; ".join(placed),
            "run `mlops doctor` where the object store's endpoint can be reached to verify its region",
        )
    said = declared_region(store, region)
    if said is not None and found != said:
        return Check(
            "residency",
            Status.FAIL,
            f"the object store {redact(store)} is declared in {said}, but {asked} says its bucket is in "
            f"{found}",
            "correct the URI's ?region= (or MLOPS_CLUSTER__OBJECT_STORE_REGION) to the bucket's real region; "
            "if that region is not allowed, move the data",
        )
    return Check(
        "residency", Status.OK, f"object store region {found} verified at {asked}; " + "; ".join(placed)
    )


def _spark(settings: Settings) -> Check:
    if settings.spark_remote:
        return _spark_connect(settings.spark_remote)
    master = settings.spark_master
    if master.startswith("spark://"):
        host, port = _host_port(master, 7077)
        if not _port_open(host, port):
            return Check(
                "spark",
                Status.FAIL,
                f"no Spark master answers at {master}",
                "start one (see README: cluster profile) or set MLOPS_CLUSTER__SPARK_MASTER",
            )
    from pyspark.sql import SparkSession  # heavy: only when the check runs

    try:
        spark = (
            SparkSession.builder.master(master if master.startswith("spark://") else "local[1]")
            .appName("mlops-doctor")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "512m")
            .getOrCreate()
        )
        try:
            counted = spark.range(1000).count()
            version = spark.version
        finally:
            spark.stop()
    except Exception as exc:  # the check reports any start failure; it never hides it
        return Check(
            "spark",
            Status.FAIL,
            f"Spark did not start on {master}: {exc}".splitlines()[0],
            "run `mlops doctor` after fixing java; see the Spark driver log above",
        )
    if counted != 1000:
        return Check("spark", Status.FAIL, f"Spark counted {counted} rows of 1000 on {master}")
    return Check("spark", Status.OK, f"Spark {version} ran a job on {master}")


def _spark_connect(remote: str) -> Check:
    """MLOPS_SPARK_REMOTE names a Spark Connect server (the stack's, or one of yours): run a job on it."""
    host, port = _host_port(remote, 15002)
    fix = "start the stack (`make up` starts a Spark Connect server) or unset MLOPS_SPARK_REMOTE"
    if not _port_open(host, port):
        return Check("spark", Status.FAIL, f"no Spark Connect server answers at {remote}", fix)
    from pyspark.sql import SparkSession  # heavy: only when the check runs

    try:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        try:
            counted, version = spark.range(1000).count(), spark.version
        finally:
            spark.stop()
    except Exception as exc:  # the check reports any failure; it never hides it
        return Check("spark", Status.FAIL, f"Spark Connect at {remote}: {exc}".splitlines()[0], fix)
    if counted != 1000:
        return Check("spark", Status.FAIL, f"Spark counted {counted} rows of 1000 on {remote}")
    return Check("spark", Status.OK, f"Spark {version} ran a job on the Spark Connect server {remote}")


def _sqlite(settings: Settings) -> Check:
    with sqlite3.connect(":memory:") as db:
        db.execute("select 1")
    return Check(
        "sqlite",
        Status.OK,
        f"SQLite {sqlite3.sqlite_version} for Airflow, MLflow and the Feast online store under "
        f"{settings.home}",
    )


def _postgres(settings: Settings) -> Check:
    dsn = settings.cluster.postgres_dsn
    fix = "start PostgreSQL (Debian: pg_ctlcluster 15 main start) or set MLOPS_CLUSTER__POSTGRES_DSN"
    try:
        import psycopg2
    except ImportError:
        return Check("postgres", Status.FAIL, "psycopg2 is not installed", "make install (extra: cluster)")
    try:
        with psycopg2.connect(dsn, connect_timeout=3) as conn, conn.cursor() as cur:
            cur.execute("select version()")
            version = cur.fetchone()[0].split(",")[0]
        conn.close()
    except psycopg2.Error as exc:
        return Check("postgres", Status.FAIL, f"{_redact(dsn)}: {str(exc).strip().splitlines()[0]}", fix)
    return Check("postgres", Status.OK, f"{version} at {_redact(dsn)}")


def _redis(settings: Settings) -> Check:
    url = settings.cluster.redis_url
    try:
        import redis
    except ImportError:
        return Check(
            "redis", Status.FAIL, "the redis client is not installed", "make install (extra: cluster)"
        )
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        # redis-py annotates replies for its sync and async clients alike (Awaitable | Any); this one is sync.
        info = cast(dict[str, Any], client.info("server"))
        client.close()
    except redis.RedisError as exc:
        return Check(
            "redis",
            Status.FAIL,
            f"{_redact(url)}: {exc}",
            "start Redis (redis-server --daemonize yes) or set MLOPS_CLUSTER__REDIS_URL",
        )
    return Check("redis", Status.OK, f"Redis {info.get('redis_version')} at {_redact(url)}")


def _mlflow_server(settings: Settings) -> Check:
    uri = settings.cluster.mlflow_tracking_uri
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=3) as response:
            body = response.read(64).decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return Check(
            "mlflow",
            Status.FAIL,
            f"no MLflow tracking server at {uri}: {exc}",
            "start one (`mlflow server --backend-store-uri postgresql://... `) or set "
            "MLOPS_CLUSTER__MLFLOW_TRACKING_URI",
        )
    return Check("mlflow", Status.OK, f"MLflow tracking server at {uri} answers {body.strip()!r}")


def _kubernetes(settings: Settings) -> Check:
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    kubeconfig = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
    if in_cluster or kubeconfig.is_file():
        where = "in-cluster service account" if in_cluster else str(kubeconfig)
        return Check(
            "kubernetes",
            Status.OK,
            f"credentials found ({where}); training pods go to {settings.cluster.kubernetes_namespace}",
        )
    return Check(
        "kubernetes",
        Status.WARN,
        "no kubeconfig and not in a cluster: training will run as a local process",
        "set KUBECONFIG to reach a cluster with GPU nodes (see infra/README.md)",
    )


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or default_port


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
