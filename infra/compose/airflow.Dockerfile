# Shardline's Airflow image for the local compose stack (docker-compose.yaml at the repo root).
#
#   docker compose build          # or: docker build -f infra/compose/airflow.Dockerfile -t shardline-airflow:local .
#
# Build context: the repo root (airflow.Dockerfile.dockerignore beside this file keeps .venv and .env out).
#
# What goes in: the Shardline wheel (built here, as the worker image builds it) with its `airflow`, `worker`,
# `local` and `tables` extras, pinned by the repo's constraints.txt (the same tree as `make venv`). `worker`: the
# `local` backend runs each instance as `python -m shardline.worker`, a process of the task's container
# (there is no Docker inside the stack). `local`: the `aws` service is moto's server from this image. `tables`:
# pyiceberg, with which a step's end commits its `output.table` (its SQL catalog in the stack's Postgres, through
# the image's psycopg2).
# torch only with --build-arg INSTALL_TORCH=true (the CPU build, from TORCH_INDEX_URL).
# The installed wheel registers the provider (`airflow providers list`) and the on-call page's plugin;
# PYTHONPATH puts src/ (and examples/, for seed_demo.py) first, which compose bind-mounts over the copies baked in
# here, so every process (the DAG parser, the task, the local job's supervisor and its workers) imports the
# same, live source.

# Stage 1: the distribution's wheel, built by the standard PEP 517 front end.
FROM python:3.11-slim-bookworm AS wheel
# SOURCE_DATE_EPOCH: the same sources give the same wheel, byte for byte, so the layers after it stay cached.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 SOURCE_DATE_EPOCH=315532800
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src/ src/
RUN pip wheel --no-deps --wheel-dir /dist .

FROM apache/airflow:3.3.2-python3.11

USER root
# libgomp: the OpenMP runtime xgboost and scikit-learn use (as in inference_container/Dockerfile).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
# The uid local jobs run under (compose's shardline-jobs service): not Airflow's. It shares group 0 with airflow,
# as the image's files do, so both reach the jobs' folders on the shared volume, and nothing else of each other's.
RUN useradd --system --uid 50001 --gid 0 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
        shardline-job
USER airflow

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --chown=airflow:0 constraints.txt /opt/shardline/
COPY --from=wheel --chown=airflow:0 /dist/ /opt/shardline/dist/
RUN pip install -c /opt/shardline/constraints.txt "apache-airflow==${AIRFLOW_VERSION}" \
        "$(ls /opt/shardline/dist/shardline-*.whl)[airflow,worker,local,tables]"

ARG INSTALL_TORCH=false
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN if [ "${INSTALL_TORCH}" = "true" ]; then \
        torch_pin="$(grep -E '^torch==' /opt/shardline/constraints.txt)" \
        && pip install -c /opt/shardline/constraints.txt --extra-index-url "${TORCH_INDEX_URL}" "${torch_pin}"; \
    fi

COPY --chown=airflow:0 src/ /opt/shardline/src/
COPY --chown=airflow:0 examples/ /opt/shardline/examples/
COPY --chown=airflow:0 dags/ /opt/airflow/dags/
COPY --chown=airflow:0 infra/compose/init_stack.py infra/compose/write_auth_passwords.py infra/compose/seed_demo.py /opt/shardline/compose/

# The local backend's job root: created here so the named volume mounted on it starts owned by airflow, and
# writable by its group, which the job runner's uid is in.
ENV PYTHONPATH=/opt/shardline/src:/opt/shardline \
    SHARDLINE_LOCAL_ROOT=/opt/airflow/shardline-local
# The grants folder: written by Airflow's processes only, read by the grant service (group 0), never mounted in
# the job runner. The aws service's state folder (its volume starts owned by airflow, readable by no one else).
RUN mkdir -p "${SHARDLINE_LOCAL_ROOT}/jobs" /opt/shardline/grants /opt/shardline/aws-state \
    && chmod -R 2775 "${SHARDLINE_LOCAL_ROOT}" \
    && chmod 2750 /opt/shardline/grants \
    && chmod 700 /opt/shardline/aws-state
