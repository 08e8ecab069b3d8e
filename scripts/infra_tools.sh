#!/usr/bin/env bash
# Create or reuse the infra tools' venv: checkov and kubernetes-validate for the infra tests.
# They live apart from .venv because checkov pins packages (packaging, boto3, networkx) that clash with the
# project lock. The venv lives outside the clone, in the user's cache ($MLOPS_CACHE, default
# ${XDG_CACHE_HOME:-~/.cache}/mlops-fraud), in a folder named after its key: the hash of the requirements
# file and the interpreter's version. A clean clone reuses it; a changed requirements file or Python is a
# new key, so a new venv is built from nothing (no package of the old set lingers) and the old one is left
# for `make clean-cache`. A stamp marks a finished install, so a half-built venv is rebuilt. Concurrent runs
# (two pytest sessions) serialise on a lock file. The key goes to stderr, the venv's path to stdout.
# INFRA_VENV=path overrides the location (no key); INFRA_REQUIREMENTS=file overrides the requirements.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
REQUIREMENTS=${INFRA_REQUIREMENTS:-infra/tools-requirements.txt}
CACHE=${MLOPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlops-fraud}

if ! command -v "$PYTHON" >/dev/null; then
  echo "infra_tools: $PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

key=$( { cat "$REQUIREMENTS"; "$PYTHON" --version; } | sha256sum | cut -c1-16)
VENV=${INFRA_VENV:-$CACHE/venv-infra-$key}
stamp="$VENV/.installed-$key"
echo "infra_tools: key $key ($REQUIREMENTS, $($PYTHON --version)) -> $VENV" >&2

install() {
  if [ -f "$stamp" ]; then
    echo "infra_tools: reusing $VENV" >&2
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
echo "$VENV"
