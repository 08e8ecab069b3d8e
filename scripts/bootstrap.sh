#!/usr/bin/env bash
# Create or refresh the virtual environment from requirements.lock, then install this project into it.
#
# The lock is installed by uv (its version pinned in the lock, installed first by pip): it downloads and
# unpacks on every core at once, where pip works one package after another (a clean clone's bootstrap took
# 333 s with pip; docs/benchmarks.md, "Test-suite time"), and byte-compiles the environment the same way.
# The bytecode must be there ahead: our machines set PYTHONDONTWRITEBYTECODE=1, so Python never writes it at
# import, and without it every Airflow task process compiles Airflow's, Spark's and GX's modules anew.
#
# uv reads no pip configuration, so pip's own (`pip config list` and PIP_* variables: find-links, index URLs,
# constraints, CA bundle) is handed to it by scripts/uv_install.py: torch is pinned to 2.13.0 in the lock,
# and where a CPU build of that version is on pip's find-links (as on our CPU machines) uv must see it too,
# or it takes the CUDA build and its several GB of nvidia packages. Where uv cannot be had, pip installs the
# lock as before (MLOPS_BOOTSTRAP_INSTALLER=pip chooses it).
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

install_with_pip() {
  # Bytecode is compiled after the install, on every core at once: pip compiles the files one after another.
  "$VENV/bin/python" -m pip install --quiet --no-compile -r requirements.lock
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  # As pip's own compile does, a file that does not compile (a package's Python 2 example) is left without
  # bytecode rather than failing the install; compileall reports it and exits 1, hence the `|| true`.
  "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
    || "$VENV/bin/python" -m pip install --quiet --no-deps -e .
}

install_with_uv() {
  # uv's own pin is the lock's (the dev extra declares it)
  "$VENV/bin/python" -m pip install --quiet "$(grep -m1 '^uv==' requirements.lock)" || return 1
  # with pip's configuration (scripts/uv_install.py); uv hard-links from its cache where it can.
  "$VENV/bin/python" scripts/uv_install.py "$VENV/bin/uv" --quiet --python "$VENV/bin/python" \
    --compile-bytecode -r requirements.lock || return 1
  # The project itself, editable; uv keeps the build backend in its cache (pip fetches it every time).
  "$VENV/bin/python" scripts/uv_install.py "$VENV/bin/uv" --quiet --python "$VENV/bin/python" \
    --no-deps --reinstall-package mlops-fraud -e .
}

if [ "${MLOPS_BOOTSTRAP_INSTALLER:-uv}" = pip ]; then
  install_with_pip
elif ! install_with_uv; then
  echo "bootstrap: uv could not install the lock; installing it with pip instead" >&2
  install_with_pip
fi
# nvidia-ml-py (GPU telemetry) is in the lock; CUDA's own packages are not.
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -i '^nvidia-' | grep -qvi '^nvidia-ml-py '; then
  echo "bootstrap: warning: CUDA packages were installed; on a CPU machine put a CPU torch 2.13.0 wheel on pip's find-links" >&2
fi
echo "bootstrap: $VENV ready in $(( $(date +%s) - start ))s"
