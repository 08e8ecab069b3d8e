# syntax=docker/dockerfile:1.7
# The training image: CUDA runtime, Python 3.11, and this project with its `training` extra (torch, MLflow,
# ONNX), every version constrained by requirements.lock. No Airflow, no Spark: the retrain DAG launches it
# through KubernetesPodOperator and the container runs the training CLI, nothing else.
#
#   docker build -f infra/docker/training.Dockerfile -t $REGISTRY/mlops-fraud-training:$TAG .
#
# The CUDA base has Python 3.12 only, so a standalone CPython 3.11 (installed by uv, copied whole into the
# final stage) runs the project. torch's wheels ship their own CUDA libraries; the runtime base supplies the
# NVIDIA container-toolkit environment and the CUDA libraries other native wheels expect.
# checkov:skip=CKV_DOCKER_2:a batch job has no service to probe; Kubernetes ignores HEALTHCHECK and tracks the pod by exit code
ARG PYTHON_VERSION=3.11.13

FROM ghcr.io/astral-sh/uv:0.8.0 AS uv

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS build
ARG PYTHON_VERSION
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN uv python install "${PYTHON_VERSION}" \
 && uv venv --seed --python "${PYTHON_VERSION}" /opt/venv
WORKDIR /src
# Only what the wheel is built from; the packages list is pyproject.toml's [tool.hatch.build.targets.wheel].
COPY pyproject.toml requirements.lock README.md ./
COPY core ./core
COPY pipelines ./pipelines
COPY features ./features
COPY training ./training
COPY orchestration ./orchestration
COPY mlops ./mlops
RUN /opt/venv/bin/pip install --constraint requirements.lock ".[training]" \
 && /opt/venv/bin/pip check

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
# A fixed non-root UID, the one the pod spec's securityContext names (orchestration/k8s_contract.py TRAINING_UID).
RUN groupadd --gid 10001 trainer \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin trainer
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MLOPS_PROFILE=cluster
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "training"]
