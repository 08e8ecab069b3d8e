# syntax=docker/dockerfile:1.7
# The Airflow image: the official apache/airflow image of the version in requirements.lock, plus this project
# with its `airflow`, `data` and `cluster` extras (Spark, Great Expectations, DVC, Feast, database clients),
# constrained by requirements.lock, and the DAGs baked in. No torch and no MLflow server: training runs in the
# training image, in its own pod.
#
#   docker build -f infra/docker/airflow.Dockerfile -t $REGISTRY/mlops-fraud-airflow:$TAG .
#
# checkov:skip=CKV_DOCKER_2:the Helm chart gives every Airflow component its own liveness and readiness probes; Kubernetes ignores HEALTHCHECK
FROM apache/airflow:3.3.2-python3.11

# Spark needs a JVM (17 or later); the Debian default JRE of the base image is one.
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# The official image installs Python packages as the airflow user (UID 50000), never as root.
USER airflow
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MLOPS_PROFILE=cluster
WORKDIR /opt/mlops
COPY --chown=airflow:0 pyproject.toml requirements.lock README.md ./
COPY --chown=airflow:0 core ./core
COPY --chown=airflow:0 pipelines ./pipelines
COPY --chown=airflow:0 features ./features
COPY --chown=airflow:0 training ./training
COPY --chown=airflow:0 orchestration ./orchestration
COPY --chown=airflow:0 mlops ./mlops
RUN pip install --constraint requirements.lock ".[airflow,data,cluster]" \
 && pip check
COPY --chown=airflow:0 great_expectations ./great_expectations
COPY --chown=airflow:0 dags /opt/airflow/dags
WORKDIR /opt/airflow
USER 50000
