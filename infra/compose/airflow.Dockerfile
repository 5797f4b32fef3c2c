# syntax=docker/dockerfile:1
# Shardline's Airflow image for the local compose stack (docker-compose.yaml at the repo root).
#
#   docker compose build          # or: docker build -f infra/compose/airflow.Dockerfile -t shardline-airflow:local .
#
# Build context: the repo root (airflow.Dockerfile.dockerignore beside this file keeps .venv and .env out).
#
# What goes in, and why not `pip install -r requirements.txt`: that file also pins the dev tools (moto,
# pytest, ruff, matplotlib) and torch, which is a large download only TorchScript models need. This image
# installs, pinned by the repo's constraints.txt (the same tree as `make venv`):
#   * the Airflow side: apache-airflow (the base image's version), the Amazon provider, pydantic, PyYAML,
#     boto3 and pynamodb;
#   * the inference worker's own requirements (inference_container/requirements.txt), because the `local`
#     backend runs `python -m shardline_worker` as a subprocess of the task, inside the scheduler container;
#   * torch only with --build-arg INSTALL_TORCH=true (CPU wheels from TORCH_INDEX_URL).
# The code is not pip-installed: PYTHONPATH points at plugins/ and inference_container/, which compose
# bind-mounts over the copies baked in here, so every process (the DAG parser, the task, the local job's
# supervisor and its workers) imports the same, live source.
FROM apache/airflow:3.3.2-python3.11

USER root
# libgomp: the OpenMP runtime xgboost and scikit-learn use (as in inference_container/Dockerfile).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
USER airflow

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --chown=airflow:0 requirements.txt constraints.txt /opt/shardline/
COPY --chown=airflow:0 inference_container/requirements.txt /opt/shardline/inference_container/requirements.txt
RUN pip install \
        -c /opt/shardline/constraints.txt \
        "apache-airflow==${AIRFLOW_VERSION}" \
        apache-airflow-providers-amazon \
        pydantic \
        PyYAML \
        boto3 \
        pynamodb \
        -r /opt/shardline/inference_container/requirements.txt

ARG INSTALL_TORCH=false
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN if [ "${INSTALL_TORCH}" = "true" ]; then \
        torch_pin="$(grep -E '^torch==' /opt/shardline/requirements.txt)" \
        && pip install --index-url "${TORCH_INDEX_URL}" "${torch_pin}"; \
    fi

COPY --chown=airflow:0 inference_container/shardline_worker/ /opt/shardline/inference_container/shardline_worker/
COPY --chown=airflow:0 inference_container/shardline_ledger/ /opt/shardline/inference_container/shardline_ledger/
COPY --chown=airflow:0 plugins/ /opt/airflow/plugins/
COPY --chown=airflow:0 dags/ /opt/airflow/dags/
COPY --chown=airflow:0 infra/compose/init_stack.py infra/compose/write_auth_passwords.py infra/compose/seed_demo.py /opt/shardline/compose/

# The local backend's job root: created here so the named volume mounted on it starts owned by airflow.
ENV PYTHONPATH=/opt/airflow/plugins:/opt/shardline/inference_container \
    SHARDLINE_LOCAL_ROOT=/opt/airflow/shardline-local
RUN mkdir -p "${SHARDLINE_LOCAL_ROOT}"
