# syntax=docker/dockerfile:1.7
# The training image: CUDA runtime, Python 3.11, and this project with its `training` and `cluster` extras
# (torch, MLflow, ONNX, dvc-data to read training sets by revision, the PostgreSQL client of the promotion
# history), every version constrained by requirements.lock. No Airflow, no Spark: the retrain DAG launches
# it through KubernetesPodOperator, for `train` on a GPU node and for evaluate, register, promote and export
# on CPU nodes, and the container runs the training CLI, nothing else.
#
#   docker build -f infra/docker/training.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) \
#     -t $REGISTRY/mlops-fraud-training:$TAG .
#
# The base images are build arguments: the defaults are what a release builds from; the tests build this same
# file on a Debian bookworm base made with debootstrap (tests/integration/podman.py), which has Python 3.11
# itself. The CUDA base has Python 3.12 only, so there a standalone CPython 3.11 (installed by uv, copied whole
# into the final stage) runs the project. torch's wheels ship their own CUDA libraries; the runtime base
# supplies the NVIDIA container-toolkit environment and the CUDA libraries other native wheels expect.
# checkov:skip=CKV_DOCKER_2:a batch job has no service to probe; Kubernetes ignores HEALTHCHECK and tracks the pod by exit code
# checkov:skip=CKV_DOCKER_7:the base images are build arguments, which checkov does not resolve; their defaults are pinned to version tags (tests/integration/test_infra_images.py resolves them and refuses latest)
ARG PYTHON_VERSION=3.11.13
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.8.0
# CUDA 13.0: the build of torch requirements-gpu.lock pins (its torch.version.cuda), so the container toolkit
# refuses a node whose driver is too old for it, before any training starts.
ARG BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
# Which build of torch: `cuda` (a release) takes PyPI's CUDA build and the exact nvidia-*, cuda-* and triton
# wheels requirements-gpu.lock pins by sha256, and no find-links (where a machine keeps a CPU build); `cpu`
# (the tests' images, on machines without a GPU) takes the CPU build the build machine's pip finds. Either
# way the build checks torch.version.cuda against what it asked for.
ARG TORCH_BUILD=cuda

FROM ${UV_IMAGE} AS uv

FROM ${BASE_IMAGE} AS build
ARG PYTHON_VERSION
ARG TORCH_BUILD
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The base's own CPython 3.11 where it has one; otherwise a standalone build of PYTHON_VERSION from uv.
RUN --mount=type=bind,from=uv,source=/,target=/mnt/uv \
    mkdir -p /opt/python \
 && if command -v python3.11 >/dev/null; then \
        python3.11 -m venv /opt/venv; \
    else \
        UV_PYTHON_INSTALL_DIR=/opt/python /mnt/uv/uv python install "${PYTHON_VERSION}" \
        && UV_PYTHON_INSTALL_DIR=/opt/python /mnt/uv/uv venv --seed --python "${PYTHON_VERSION}" /opt/venv; \
    fi \
 && /opt/venv/bin/python -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version"
WORKDIR /src
COPY pyproject.toml requirements.lock requirements-gpu.lock scripts/uv_install.py ./
# The dependencies first, in a layer of their own that only pyproject.toml and the lock decide, so a change
# of the code or the README does not reinstall torch: the project's metadata is built with its package
# folders still empty (and a placeholder README), then uninstalled.
# uv installs them (its version the lock's, removed after): it downloads and unpacks on every core, where pip
# goes one package after another. uv reads no pip configuration, so scripts/uv_install.py hands it pip's (the
# find-links with a CPU torch build, index mirrors, constraints, a proxy's CA bundle), as in the bootstrap.
# Its cache is a build cache mount, outside the image's layers: when the lock changes, this layer is built
# again but only the packages not in the cache are downloaded and unpacked (copied out: --link-mode copy).
RUN --mount=type=cache,id=mlops-fraud-uv,target=/var/cache/uv \
    mkdir core pipelines features model_contract training serving monitoring orchestration mlops \
 && touch README.md \
 && case "$TORCH_BUILD" in \
      cuda) torch_build="--without-find-links --requirement requirements-gpu.lock" \
            cuda=$(sed -n 's/^# torch.version.cuda = //p' requirements-gpu.lock) ;; \
      cpu) torch_build="" cuda=None ;; \
      *) echo "TORCH_BUILD must be cuda or cpu, not '$TORCH_BUILD'" >&2; exit 1 ;; \
    esac \
 && /opt/venv/bin/pip install "$(grep -m1 '^uv==' requirements.lock)" \
 && /opt/venv/bin/python uv_install.py /opt/venv/bin/uv $torch_build --cache-dir /var/cache/uv --link-mode copy --compile-bytecode \
      --python /opt/venv/bin/python --constraint requirements.lock ".[training,cluster]" \
 && /opt/venv/bin/python -c 'import sys, torch; built = str(torch.version.cuda); \
assert built == sys.argv[1], f"torch {torch.__version__} is built for CUDA {built}, not {sys.argv[1]}"' "$cuda" \
 && /opt/venv/bin/pip uninstall --yes mlops-fraud uv
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
RUN /opt/venv/bin/pip install --no-deps --constraint requirements.lock ".[training,cluster]" \
 && /opt/venv/bin/pip check

FROM ${BASE_IMAGE}
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
# A fixed non-root UID, the one the pod spec's securityContext names (orchestration/k8s_contract.py TRAINING_UID).
RUN groupadd --gid 10001 trainer \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin trainer
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MLOPS_PROFILE=cluster \
    MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false \
    GIT_PYTHON_REFRESH=quiet
# The commit the image was built from: every MLflow run it makes carries it (tag lineage.git_commit). Last,
# so that a new commit rebuilds only this layer.
ARG GIT_COMMIT
RUN test -n "${GIT_COMMIT}" || { echo "build with --build-arg GIT_COMMIT=\$(git rev-parse HEAD)" >&2; exit 1; }
ENV MLOPS_GIT_COMMIT=${GIT_COMMIT}
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "training"]
