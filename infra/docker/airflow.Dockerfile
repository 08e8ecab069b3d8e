# syntax=docker/dockerfile:1.7
# The Airflow image: the official apache/airflow image of the version in requirements.lock, plus this project
# with its `airflow`, `data` and `cluster` extras (Spark, Great Expectations, DVC, Feast, database clients),
# constrained by requirements.lock, and the DAGs baked in. No torch and no MLflow server: training runs in the
# training image, in its own pod.
#
#   docker build -f infra/docker/airflow.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) \
#     -t $REGISTRY/mlops-fraud-airflow:$TAG .
#
# The base image is a build argument: the default is what a release builds from; the tests build this same
# file on a Debian bookworm base made with debootstrap (tests/integration/podman.py), which has Python 3.11 in
# /usr/bin, no airflow user and no Java. So every step works on both: the JRE comes from apt, the airflow user
# (UID 50000, GID 0, as in the official image) is created only where it is missing, and the project goes into
# a virtual environment of its own, /opt/venv, first on PATH, with exactly the locked versions (the official
# image's own packages in ~/.local are not seen from it).
# checkov:skip=CKV_DOCKER_2:the Helm chart gives every Airflow component its own liveness and readiness probes; Kubernetes ignores HEALTHCHECK
# checkov:skip=CKV_DOCKER_7:the base image is a build argument, which checkov does not resolve; its default is pinned to a version tag (tests/integration/test_infra_images.py resolves it and refuses latest)
ARG BASE_IMAGE=apache/airflow:3.3.2-python3.11

FROM ${BASE_IMAGE}

# Spark needs a JVM (17 or later); the Debian default JRE of the base image is one.
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends default-jre-headless \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && java -version

# The official image's user: UID 50000, primary group 0 (OpenShift-style arbitrary UIDs stay in group 0).
RUN { getent passwd 50000 >/dev/null \
      || useradd --uid 50000 --gid 0 --create-home --home-dir /home/airflow --shell /bin/bash airflow; } \
 && mkdir -p /opt/airflow /opt/venv /opt/mlops \
 && chown 50000:0 /opt/airflow /opt/venv /opt/mlops \
 && chmod g+rwx /opt/airflow

# Python packages are installed as the airflow user (UID 50000), never as root, as the official image does.
# PIP_USER: the official image sets it (installs go to ~/.local); inside a virtual environment it must be off.
USER 50000:0
ENV PATH=/opt/venv/bin:$PATH \
    PIP_USER=0 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.11 -m venv /opt/venv \
 && python -c "import sys; assert sys.prefix == '/opt/venv' and sys.version_info[:2] == (3, 11), sys.version"
WORKDIR /opt/mlops
COPY --chown=50000:0 pyproject.toml requirements.lock scripts/uv_install.py ./
# The dependencies first, in a layer of their own that only pyproject.toml and the lock decide, so a change
# of the code or the README does not reinstall Airflow and Spark: the project's metadata is built with its
# package folders still empty (and a placeholder README), then uninstalled.
# uv installs them (its version the lock's, removed after): it downloads and unpacks on every core, where pip
# goes one package after another. uv reads no pip configuration, so scripts/uv_install.py hands it pip's (the
# find-links with a CPU torch build, index mirrors, constraints, a proxy's CA bundle), as in the bootstrap.
# Its cache is a build cache mount, outside the image's layers: when the lock changes, this layer is built
# again but only the packages not in the cache are downloaded and unpacked (copied out: --link-mode copy).
RUN --mount=type=cache,id=mlops-fraud-uv-50000,target=/var/cache/uv,uid=50000,gid=0 \
    mkdir core pipelines features model_contract training serving monitoring orchestration mlops \
 && touch README.md \
 && pip install "$(grep -m1 '^uv==' requirements.lock)" \
 && python uv_install.py /opt/venv/bin/uv --cache-dir /var/cache/uv --link-mode copy --compile-bytecode \
      --python /opt/venv/bin/python --constraint requirements.lock ".[airflow,data,cluster]" \
 && pip uninstall --yes mlops-fraud uv \
 && rm uv_install.py
COPY --chown=50000:0 README.md ./
COPY --chown=50000:0 core ./core
COPY --chown=50000:0 pipelines ./pipelines
COPY --chown=50000:0 features ./features
COPY --chown=50000:0 model_contract ./model_contract
COPY --chown=50000:0 training ./training
COPY --chown=50000:0 orchestration ./orchestration
COPY --chown=50000:0 mlops ./mlops
RUN pip install --no-deps --constraint requirements.lock ".[airflow,data,cluster]" \
 && pip check
COPY --chown=50000:0 dags /opt/airflow/dags

# MLOPS_HOME is the shared volume's mount in every pod (orchestration/k8s_contract.py DATA_MOUNT).
ENV AIRFLOW_HOME=/opt/airflow \
    AIRFLOW__CORE__LOAD_EXAMPLES=false \
    MLOPS_PROFILE=cluster \
    MLOPS_HOME=/mlops \
    MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false
# The commit the image was built from, last so that a new commit rebuilds only this layer.
ARG GIT_COMMIT
RUN test -n "${GIT_COMMIT}" || { echo "build with --build-arg GIT_COMMIT=\$(git rev-parse HEAD)" >&2; exit 1; }
ENV MLOPS_GIT_COMMIT=${GIT_COMMIT}
WORKDIR /opt/airflow
USER 50000
