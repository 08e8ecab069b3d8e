#!/usr/bin/env bash
# Create or refresh the virtual environment from requirements.lock, then install this project into it.
# torch is pinned to 2.13.0 in the lock: where a CPU build of that version is on pip's find-links (as on
# our CPU machines) pip takes it instead of the CUDA build and its several GB of nvidia packages.
set -euo pipefail
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
if ! command -v "$PYTHON" >/dev/null; then
  echo "bootstrap: $PYTHON not found; install Python 3.11 or run make with PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
start=$(date +%s)
# Bytecode is compiled after the install, on every core at once: pip compiles the files one after another,
# about a third of a bootstrap's time (docs/benchmarks.md, "Test-suite time").
"$VENV/bin/python" -m pip install --quiet --no-compile -r requirements.lock
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# As pip's own compile does, a file that does not compile (a package's Python 2 example) is left without
# bytecode rather than failing the install; compileall reports it and exits 1, hence the `|| true`.
"$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
  || "$VENV/bin/python" -m pip install --quiet --no-deps -e .
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qi '^nvidia-'; then
  echo "bootstrap: warning: CUDA packages were installed; on a CPU machine put a CPU torch 2.13.0 wheel on pip's find-links" >&2
fi
echo "bootstrap: $VENV ready in $(( $(date +%s) - start ))s"
