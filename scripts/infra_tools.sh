#!/usr/bin/env bash
# Create or refresh .venv-infra: checkov and kubernetes-validate for the infra tests.
# They live apart from .venv because checkov pins packages (packaging, boto3, networkx) that clash with the
# project lock. Idempotent: a stamp named after the hash of infra/tools-requirements.txt marks a finished
# install, so a second run costs one hash; a changed requirements file rebuilds the venv from scratch so no
# package of the old set lingers. Concurrent runs (two pytest sessions) serialise on a lock file.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=${INFRA_VENV:-.venv-infra}
REQUIREMENTS=infra/tools-requirements.txt

if ! command -v "$PYTHON" >/dev/null; then
  echo "infra_tools: $PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

digest=$(sha256sum "$REQUIREMENTS" | cut -c1-16)
stamp="$VENV/.installed-$digest"

install() {
  if [ -f "$stamp" ]; then
    return 0
  fi
  start=$(date +%s)
  # Empty the venv but keep the lock file that this process holds.
  find "$VENV" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
  echo "infra_tools: creating $VENV with $($PYTHON --version) from $REQUIREMENTS" >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --no-input -r "$REQUIREMENTS"
  "$VENV/bin/python" -m pip check >&2
  touch "$stamp"
  echo "infra_tools: $VENV ready in $(( $(date +%s) - start ))s" >&2
}

mkdir -p "$VENV"
if command -v flock >/dev/null; then
  exec 9>"$VENV/.lock"
  flock 9
fi
install
