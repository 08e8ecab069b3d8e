#!/usr/bin/env bash
# Start Airflow (api-server, scheduler, dag-processor, triggerer), the MLflow UI and the scoring service
# (`mlops serve`) in the background, wait until they answer, and print their URLs and the login. Idempotent:
# what already runs is left alone.
#
# Locations and database URIs come from the active profile's settings (core/settings.py), so the UI shows
# exactly what `mlops ...` and the DAGs write. Logs and PID files: $MLOPS_HOME/run/<component>.{log,pid}.
# Stop everything with scripts/down.sh (make down).
#
# Environment: MLOPS_PROFILE (local | cluster), MLOPS_HOME, MLOPS_AIRFLOW_PORT (8080),
# MLOPS_MLFLOW_PORT (5000, or the tracking URI's port in the cluster profile), MLOPS_SERVING__PORT (8000,
# the scoring service's own setting; it listens on 127.0.0.1 here), MLOPS_UP_TIMEOUT (180 s),
# MLOPS_AIRFLOW_API_WORKERS (1); other AIRFLOW__* variables pass through (parallelism defaults to 4),
# MLOPS_MLFLOW_BACKEND_STORE_URI (cluster profile only: defaults to the `mlflow` database on the
# cluster's PostgreSQL; MLflow and Airflow both keep an `alembic_version` table, so they cannot share one).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
BIN="$REPO/${VENV:-.venv}/bin"
PY="$BIN/python"
AIRFLOW_PORT=${MLOPS_AIRFLOW_PORT:-8080}
SPARK_CONNECT_PORT=${MLOPS_SPARK_CONNECT_PORT:-15002}
TIMEOUT=${MLOPS_UP_TIMEOUT:-180}

die() {
  echo "up: $*" >&2
  exit 1
}

[ -x "$PY" ] || die "$PY not found: run 'make install' first"

# Everything the profile decides, read once from the typed settings (shell-quoted assignments).
resolved=$("$PY" - <<'EOF'
import shlex
from urllib.parse import urlsplit, urlunsplit

from core.settings import Profile, get_settings
from pipelines.spark import connect_server_args

s = get_settings()
# The Spark Connect server is the driver of every task: it gets the driver's static settings.
spark_args = connect_server_args(s)
tracking = urlsplit(s.mlflow_tracking_uri)
local_artifacts = (s.mlflow_dir / "artifacts").as_uri()
if s.profile is Profile.LOCAL:
    backend, manage_mlflow, mlflow_port = s.mlflow_tracking_uri, 1, ""
    artifact_root = artifacts_destination = local_artifacts
else:
    # Training pods cannot write to this machine's disk: new experiments store artifacts through the
    # server's proxy (mlflow-artifacts:/), which writes them to the object store when there is one.
    artifact_root = ""
    store = s.cluster.object_store_uri
    artifacts_destination = local_artifacts
    if store:  # the policy's ?region= is ours, not the store's: boto3 takes the region from AWS_* settings
        bucket = urlsplit(store)
        path = f"{bucket.path.rstrip('/')}/mlflow/artifacts"
        artifacts_destination = urlunsplit((bucket.scheme, bucket.netloc, path, "", ""))
    # The cluster profile talks to a tracking server; start one only if it is meant to be on this machine.
    dsn = urlsplit(s.cluster.postgres_dsn)
    backend = urlunsplit(("postgresql+psycopg2", dsn.netloc, "/mlflow", dsn.query, ""))  # our driver
    local = tracking.hostname in ("127.0.0.1", "localhost", "::1")
    manage_mlflow = int(tracking.scheme in ("http", "https") and local)
    mlflow_port = tracking.port or ""
values = {
    "MLOPS_HOME": s.home,
    "PROFILE": s.profile.value,
    "AIRFLOW_HOME": s.airflow_home,
    "AIRFLOW_SQL_CONN": s.airflow_sql_conn,
    "MLFLOW_TRACKING_URI": s.mlflow_tracking_uri,
    "MLFLOW_DEFAULT_BACKEND": backend,
    "MLFLOW_DIR": s.mlflow_dir,
    "MANAGE_MLFLOW": manage_mlflow,
    "MLFLOW_ARTIFACT_ROOT": artifact_root,
    "MLFLOW_ARTIFACTS_DESTINATION": artifacts_destination,
    "PROFILE_MLFLOW_PORT": mlflow_port,
    "SPARK_MASTER": s.spark_master,
    "SERVING_PORT": s.serving.port,
}
for name, value in values.items():
    print(f"{name}={shlex.quote(str(value))}")
print(f"SPARK_CONNECT_ARGS=({shlex.join(spark_args)})")
EOF
) || die "could not read the settings (core/settings.py); the error is above"
eval "$resolved"

MLFLOW_PORT=${MLOPS_MLFLOW_PORT:-${PROFILE_MLFLOW_PORT:-5000}}
MLFLOW_BACKEND=${MLOPS_MLFLOW_BACKEND_STORE_URI:-$MLFLOW_DEFAULT_BACKEND}
RUN="$MLOPS_HOME/run"
PASSWORD_FILE="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"

export MLOPS_HOME AIRFLOW_HOME
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="$AIRFLOW_SQL_CONN"
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
# Two people: admin runs the pipeline; risk-officer (role user) answers approvals (approve_fraud_model), since
# the person who started a retrain may not approve its candidate.
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin,risk-officer:user}
# The approvers group: risk-officer alone may answer (Airflow refuses admin's answer; docs/operations.md).
export MLOPS_APPROVAL__APPROVERS=${MLOPS_APPROVAL__APPROVERS:-'["risk-officer"]'}
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$PASSWORD_FILE"
# Task processes report to the execution API on the port actually used (the default assumes 8080).
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$AIRFLOW_PORT/execution/"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="$AIRFLOW_PORT"
# The LocalExecutor forks `parallelism` workers up front (default 32); the Spark and training tasks use
# every core anyway, and each DAG runs one date at a time.
export AIRFLOW__CORE__PARALLELISM=${AIRFLOW__CORE__PARALLELISM:-4}
# The scheduler sleeps this long after a loop that found nothing to do (default 1 s), which is every loop
# while a task runs: a task that ends waits up to that long before its downstream task is scheduled, on every
# step of the chain. At 0.2 s the scheduler takes about 8% of a core more (docs/benchmarks.md, "Orchestration
# latencies", with the demo's and the end-to-end benchmark's figures).
export AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=${AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME:-0.2}
# SQLite has one writer at a time: wait up to 30 s for the lock instead of 5 (mlops/airflow_db.py says why).
if [[ $AIRFLOW_SQL_CONN == sqlite* ]]; then
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS=${AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS:-mlops.airflow_db.SQLITE_CONNECT_ARGS}
fi
# Every task's Spark work goes to the Connect server (pipelines/spark.py), unless one is given.
MANAGE_SPARK=0
if [ -z "${MLOPS_SPARK_REMOTE:-}" ]; then
  MANAGE_SPARK=1
  export MLOPS_SPARK_REMOTE="sc://127.0.0.1:$SPARK_CONNECT_PORT"
fi
# MLflow's server runs GenAI jobs (scorers, optimizers) in seven consumer processes; this loop has none.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}

pid_of() { cat "$RUN/$1.pid" 2>/dev/null || true; }

# Running, and still the program we started (a PID may be reused after a reboot).
running() {
  local pid state args
  pid=$(pid_of "$1")
  [ -n "$pid" ] || return 1
  state=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [[ $state != Z* ]] || return 1
  args=$(ps -o args= -p "$pid" 2>/dev/null) || return 1
  case $1 in
    mlflow) [[ $args == *mlflow* ]] ;;
    spark-connect) [[ $args == *SparkConnectServer* ]] ;;
    serving) [[ $args == *"mlops serve"* ]] ;;
    scheduler) [[ $args == *orchestration.scheduler* || $args == *airflow* ]] ;;
    *) [[ $args == *airflow* ]] ;;
  esac
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Own process group per component (set -m), so down.sh stops it with all its workers in one signal.
start() {
  local name=$1
  shift
  : >"$RUN/$name.log"
  set -m
  nohup "$@" >>"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  set +m
  echo "up: started $name (pid $!, log $RUN/$name.log)"
}

# Airflow 3 also opens its metadata database with an async driver, derived from the URI's scheme.
if [[ $AIRFLOW_SQL_CONN == postgresql* && -z ${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC:-} ]] \
  && ! "$PY" -c 'import asyncpg' 2>/dev/null; then
  die "Airflow 3 on PostgreSQL needs the asyncpg driver, which is not installed in ${VENV:-.venv}: add it to \
the cluster extra in pyproject.toml and run 'make lock install', or set AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"
fi

mkdir -p "$RUN" "$AIRFLOW_HOME" "$MLFLOW_DIR/artifacts"

wanted=()
[ "$MANAGE_SPARK" = 1 ] && wanted+=(spark-connect)
wanted+=(api-server scheduler dag-processor triggerer)
[ "$MANAGE_MLFLOW" = 1 ] && wanted+=(mlflow)
# The scoring service reads the same settings (registry, online store, lake); it answers /v2/health/live as
# soon as it runs, and is ready only once a champion exists, which up.sh does not wait for.
wanted+=(serving)
missing=()
for name in "${wanted[@]}"; do
  if running "$name"; then
    echo "up: $name is already running (pid $(pid_of "$name"))"
  else
    rm -f "$RUN/$name.pid"
    missing+=("$name")
  fi
done

if [ "$MANAGE_MLFLOW" = 1 ]; then MLFLOW_URL="http://127.0.0.1:$MLFLOW_PORT"; else MLFLOW_URL=$MLFLOW_TRACKING_URI; fi
# The links people follow (an approval's link to the candidate's MLflow run): the server started here.
export MLOPS_MLFLOW_UI_URL=${MLOPS_MLFLOW_UI_URL:-$MLFLOW_URL}

if [ ${#missing[@]} -gt 0 ]; then
  for name in "${missing[@]}"; do
    port=
    case $name in
      api-server) port=$AIRFLOW_PORT var=MLOPS_AIRFLOW_PORT ;;
      spark-connect) port=$SPARK_CONNECT_PORT var=MLOPS_SPARK_CONNECT_PORT ;;
      mlflow) port=$MLFLOW_PORT var=MLOPS_MLFLOW_PORT ;;
      serving) port=$SERVING_PORT var=MLOPS_SERVING__PORT ;;
    esac
    if [ -n "$port" ] && port_in_use "$port"; then
      die "port $port (for $name) is taken by another program; stop it or set $var to a free port"
    fi
  done

  echo "up: profile $PROFILE, MLOPS_HOME=$MLOPS_HOME"
  echo "up: migrating the Airflow metadata database (log $RUN/airflow-db-migrate.log)"
  "$BIN/airflow" db migrate >"$RUN/airflow-db-migrate.log" 2>&1 \
    || die "airflow db migrate failed; read $RUN/airflow-db-migrate.log"

  for name in "${missing[@]}"; do
    case $name in
      # PYSPARK_PYTHON: Python workers (ingestion's pseudonym UDF) run in this environment.
      spark-connect) start spark-connect env PYSPARK_PYTHON="$PY" SPARK_LOCAL_IP=127.0.0.1 "$BIN/spark-submit" \
        "${SPARK_CONNECT_ARGS[@]}" --conf spark.connect.grpc.binding.address=127.0.0.1 \
        --conf "spark.connect.grpc.binding.port=$SPARK_CONNECT_PORT" ;;
      api-server) start api-server "$BIN/airflow" api-server --host 127.0.0.1 --port "$AIRFLOW_PORT" \
        --workers "${MLOPS_AIRFLOW_API_WORKERS:-1}" ;;
      # The scheduler imports torch and MLflow once, for the task processes it forks (orchestration/scheduler.py).
      scheduler) start scheduler env PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m orchestration.scheduler ;;
      dag-processor | triggerer) start "$name" "$BIN/airflow" "$name" ;;
      mlflow) start mlflow "$BIN/mlflow" server --backend-store-uri "$MLFLOW_BACKEND" \
        ${MLFLOW_ARTIFACT_ROOT:+--default-artifact-root "$MLFLOW_ARTIFACT_ROOT"} \
        --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION" \
        --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 ;;
      serving) ;;  # below, once the rest answers
    esac
  done
fi

AIRFLOW_URL="http://127.0.0.1:$AIRFLOW_PORT"
SCORING_URL="http://127.0.0.1:$SERVING_PORT"

# Ready means: Airflow's health endpoint reports the database, scheduler, dag-processor and triggerer
# healthy (they heartbeat into the metadata database), MLflow's /health answers OK, and the scoring service
# is live (/v2/health/live; not /v2/health/ready, which waits for a champion). A component that exits while
# we wait fails at once, with the end of its log.
await_ready() {
  SPARK_CONNECT_PORT=$SPARK_CONNECT_PORT SCORING_URL=$SCORING_URL "$PY" - "$TIMEOUT" "$RUN" "$AIRFLOW_URL" \
    "$MLFLOW_URL" "$@" <<'EOF'
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

timeout, run, airflow_url, mlflow_url, *components = sys.argv[1:]
run = Path(run)


def get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except (urllib.error.URLError, OSError):
        return None


def airflow_unready() -> list[str]:
    if "api-server" not in components:
        return []
    body = get(f"{airflow_url}/api/v2/monitor/health")
    if body is None:
        return ["api-server"]
    health = json.loads(body)
    parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
    return [part for part in parts if health.get(part, {}).get("status") != "healthy"]


def mlflow_unready() -> list[str]:
    body = get(f"{mlflow_url}/health")
    return [] if body is not None and body.strip() == b"OK" else [f"mlflow ({mlflow_url}/health)"]


def spark_unready() -> list[str]:
    try:
        socket.create_connection(("127.0.0.1", int(os.environ["SPARK_CONNECT_PORT"])), timeout=2).close()
        return []
    except OSError:
        return ["spark-connect"]


def serving_unready() -> list[str]:
    url = f"{os.environ['SCORING_URL']}/v2/health/live"
    return [] if get(url) is not None else [f"serving ({url})"]


def log_tail(name: str, lines: int = 25) -> str:
    try:
        tail = (run / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"  (no log: {exc})"
    return "\n".join(f"  | {line}" for line in tail) or "  (the log is empty)"


def exited(name: str) -> bool:
    pid = int((run / f"{name}.pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")  # a zombie still answers kill(0)
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


deadline = time.monotonic() + float(timeout)
waiting: list[str] = []
while time.monotonic() < deadline:
    for name in components:
        if exited(name):
            log = run / f"{name}.log"
            sys.exit(f"up: {name} exited while starting; the end of {log}:\n{log_tail(name)}")
    waiting = airflow_unready() + (mlflow_unready() if "mlflow" in components else [])
    waiting += spark_unready() if "spark-connect" in components else []
    waiting += serving_unready() if "serving" in components else []
    if not waiting:
        sys.exit(0)
    time.sleep(1)
logs = ", ".join(str(run / f"{name}.log") for name in components)
sys.exit(f"up: not ready after {timeout}s: {', '.join(waiting)}; read the logs: {logs}")
EOF
}

rest=()
for name in "${wanted[@]}"; do [ "$name" = serving ] || rest+=("$name"); done
await_ready "${rest[@]}" || exit 1
# The scoring service starts once the rest answers: in the local profile it opens the MLflow registry's
# SQLite database, which the MLflow server creates (and migrates) as it starts; two processes creating the
# same database at once could collide.
if [[ " ${missing[*]} " == *" serving "* ]]; then
  start serving "$BIN/mlops" serve --host 127.0.0.1 --port "$SERVING_PORT"
fi
await_ready serving || exit 1

login="see $PASSWORD_FILE"
if [ -s "$PASSWORD_FILE" ]; then
  login=$("$PY" -c 'import json, sys
passwords = json.load(open(sys.argv[1]))
users = [entry.split(":")[0] for entry in sys.argv[2].split(",")]
print(", ".join(user + " / " + passwords[user] for user in users if user in passwords))' \
    "$PASSWORD_FILE" "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS") || login="see $PASSWORD_FILE"
fi

echo
echo "Airflow:  $AIRFLOW_URL   (login: $login; password file $PASSWORD_FILE)"
echo "MLflow:   $MLFLOW_URL$([ "$MANAGE_MLFLOW" = 1 ] || echo '   (not managed here: the profile points at it)')"
echo "Spark:    $MLOPS_SPARK_REMOTE   (Spark Connect on $SPARK_MASTER$([ "$MANAGE_SPARK" = 1 ] || echo ', not managed here'); \
MLOPS_SPARK_REMOTE=$MLOPS_SPARK_REMOTE sends 'mlops' commands to it too)"
TOKENS_FILE=${MLOPS_SERVING__TOKENS_FILE:-$MLOPS_HOME/serving/tokens.json}
echo "Scoring:  $SCORING_URL   (POST /score, /v2/models/<name>/infer, /docs; ready once a champion exists: \
/v2/health/ready; callers send Authorization: Bearer <token>, tokens by role in $TOKENS_FILE)"
echo "Logs:     $RUN/*.log      Stop: make down"
echo "DAGs are paused when first parsed: unpause them in the UI or with '$BIN/airflow dags unpause <dag_id>'."
