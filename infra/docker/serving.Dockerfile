# syntax=docker/dockerfile:1.7
# The scoring image: Python 3.11 and this project with its `serving` and `cluster` extras (FastAPI on uvicorn,
# the ONNX runtime, the MLflow client that resolves the champion alias and downloads its ONNX artifacts from
# the tracking server, Feast with Redis for the online store, pyarrow for the lake's silver tables and the
# scoring log), every version constrained by requirements.lock. No torch, no full MLflow, no Airflow, no
# Spark: the service runs the exported ONNX model, nothing else. The container runs `mlops serve`.
#
#   docker build -f infra/docker/serving.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) \
#     -t $REGISTRY/mlops-fraud-scoring:$TAG .
#
# The base image is a build argument: the default is what a release builds from; any Debian bookworm with
# Python 3.11 and its venv module builds the same file (the tests' debootstrap base, tests/integration/
# podman.py, has it in /usr/bin, the official image in /usr/local/bin).
# checkov:skip=CKV_DOCKER_2:Kubernetes ignores HEALTHCHECK; the fraud-scoring Deployment probes /v2/health/live and /v2/health/ready itself
# checkov:skip=CKV_DOCKER_7:the base image is a build argument, which checkov does not resolve; its default is pinned to a version tag (tests/integration/test_infra_images.py resolves it and refuses latest)
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.11 -m venv /opt/venv \
 && /opt/venv/bin/python -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version"
WORKDIR /src
COPY pyproject.toml requirements.lock scripts/uv_install.py ./
# The dependencies first, in a layer of their own that only pyproject.toml and the lock decide, so a change
# of the code or the README does not reinstall them: the project's metadata is built with its package folders
# still empty (and a placeholder README), then uninstalled. The lock is a constraints file: it pins what the
# two extras pull in and installs nothing else, so torch (pinned there for the training image) stays out;
# the check after the install fails the build if a dependency ever brings it (or Airflow, or Spark) in.
# uv installs them (its version the lock's, removed after): it downloads and unpacks on every core, where pip
# goes one package after another. uv reads no pip configuration, so scripts/uv_install.py hands it pip's (the
# find-links with a CPU torch build, index mirrors, constraints, a proxy's CA bundle), as in the bootstrap.
# Its cache is a build cache mount, outside the image's layers: when the lock changes, this layer is built
# again but only the packages not in the cache are downloaded and unpacked (copied out: --link-mode copy).
RUN --mount=type=cache,id=mlops-fraud-uv,target=/var/cache/uv \
    mkdir core pipelines features model_contract training serving monitoring orchestration mlops \
 && touch README.md \
 && /opt/venv/bin/pip install "$(grep -m1 '^uv==' requirements.lock)" \
 && /opt/venv/bin/python uv_install.py /opt/venv/bin/uv --cache-dir /var/cache/uv --link-mode copy --compile-bytecode \
      --python /opt/venv/bin/python --constraint requirements.lock ".[serving,cluster]" \
 && /opt/venv/bin/pip uninstall --yes mlops-fraud uv \
 && /opt/venv/bin/python -c "import importlib.util as u, sys; \
found = [m for m in ('torch', 'airflow', 'pyspark') if u.find_spec(m)]; \
sys.exit(f'the scoring image must not carry {found}' if found else 0)"
# Only what the wheel is built from; the packages list is pyproject.toml's [tool.hatch.build.targets.wheel].
COPY README.md ./
COPY core ./core
COPY pipelines ./pipelines
COPY features ./features
COPY model_contract ./model_contract
COPY training ./training
COPY serving ./serving
COPY monitoring ./monitoring
COPY orchestration ./orchestration
COPY mlops ./mlops
RUN /opt/venv/bin/pip install --no-deps --constraint requirements.lock ".[serving,cluster]" \
 && /opt/venv/bin/pip check

FROM ${BASE_IMAGE}
COPY --from=build /opt/venv /opt/venv
# A fixed non-root UID, the one the Deployment's securityContext names (infra/k8s/base/serving).
RUN groupadd --gid 10001 scoring \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin scoring
# Read-only root filesystem: nothing is written outside /tmp (HOME, an emptyDir in the pod) and
# $MLOPS_HOME/scoring_log (the shared filesystem); bytecode was compiled at install time.
# MLOPS_HOME is the shared volume's mount in every pod (orchestration/k8s_contract.py DATA_MOUNT).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MLOPS_PROFILE=cluster \
    MLOPS_HOME=/mlops \
    MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false \
    GIT_PYTHON_REFRESH=quiet
# The commit the image was built from, last so that a new commit rebuilds only this layer.
ARG GIT_COMMIT
RUN test -n "${GIT_COMMIT}" || { echo "build with --build-arg GIT_COMMIT=\$(git rev-parse HEAD)" >&2; exit 1; }
ENV MLOPS_GIT_COMMIT=${GIT_COMMIT}
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
CMD ["mlops", "serve", "--host", "0.0.0.0", "--port", "8000"]
