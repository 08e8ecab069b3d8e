#!/usr/bin/env bash
# Stop what scripts/up.sh started, by the PID files in $MLOPS_HOME/run/: TERM to each component's process
# group (the component and its workers), KILL after a grace period (MLOPS_DOWN_GRACE, 30 s), then remove
# the PID files. Safe to run twice; a PID file whose process is gone (or is now another program) is
# only removed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY="$REPO/${VENV:-.venv}/bin/python"
GRACE=${MLOPS_DOWN_GRACE:-30}
# The scoring service first (it flushes its scoring log on TERM, and nothing depends on it); the API and the
# Spark Connect server last: task processes report their final state to the API and may still be finishing
# a Spark job.
COMPONENTS=(serving scheduler triggerer dag-processor mlflow api-server spark-connect)

[ -x "$PY" ] || { echo "down: $PY not found: run 'make install' first" >&2; exit 1; }
home=$("$PY" -c 'from core.settings import get_settings; print(get_settings().home)') \
  || { echo "down: could not read the settings (core/settings.py); the error is above" >&2; exit 1; }
RUN="$home/run"

alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $state != Z* ]]
}

# The PID file's process, if it is still the program up.sh started (a PID may be reused).
ours() {
  local args
  args=$(ps -o args= -p "$2" 2>/dev/null) || return 1
  case $1 in
    mlflow) [[ $args == *mlflow* ]] ;;
    spark-connect) [[ $args == *SparkConnectServer* ]] ;;
    serving) [[ $args == *"mlops serve"* ]] ;;
    scheduler) [[ $args == *orchestration.scheduler* || $args == *airflow* ]] ;;
    *) [[ $args == *airflow* ]] ;;
  esac
}

# up.sh starts each component as the leader of its own process group; signal the group when it is one.
signal() {
  local sig=$1 pid=$2 pgid
  pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ') || pgid=
  if [ "$pgid" = "$pid" ]; then
    kill "-$sig" -- "-$pid" 2>/dev/null || true
  else
    kill "-$sig" "$pid" 2>/dev/null || true
  fi
}

group_alive() {
  # any member of the group still running (zombies excluded)
  ps -eo pgid=,stat= 2>/dev/null | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {found = 1} END {exit !found}'
}

stopping=()
for name in "${COMPONENTS[@]}"; do
  file="$RUN/$name.pid"
  [ -f "$file" ] || continue
  pid=$(cat "$file")
  if [ -n "$pid" ] && alive "$pid" && ours "$name" "$pid"; then
    signal TERM "$pid"
    stopping+=("$name:$pid")
  else
    echo "down: $name was not running (stale PID file removed)"
    rm -f "$file"
  fi
done

if [ ${#stopping[@]} -eq 0 ]; then
  echo "down: nothing to stop (no running component has a PID file in $RUN)"
  exit 0
fi

deadline=$((SECONDS + GRACE))
for entry in "${stopping[@]}"; do
  name=${entry%%:*} pid=${entry##*:}
  while (alive "$pid" || group_alive "$pid") && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
  if alive "$pid" || group_alive "$pid"; then
    signal KILL "$pid"
    for _ in 1 2 3 4 5 6 7 8 9 10; do (alive "$pid" || group_alive "$pid") && sleep 0.5; done
    if alive "$pid" || group_alive "$pid"; then
      echo "down: $name (pid $pid) survived KILL; check 'ps -g $pid'" >&2
      continue
    fi
    echo "down: stopped $name (pid $pid) with KILL after ${GRACE}s"
  else
    echo "down: stopped $name (pid $pid)"
  fi
  rm -f "$RUN/$name.pid"
done
