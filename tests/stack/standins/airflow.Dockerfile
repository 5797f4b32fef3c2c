# Stand-in for apache/airflow:3.3.2-python3.11, for machines with no registry (make test-stack builds
# it only when that tag is missing and cannot be pulled). What infra/compose/airflow.Dockerfile and
# docker-compose.yaml rely on is laid out as in the official image: the `airflow` user (uid 50000,
# group 0) whose pip installs land in its own environment, AIRFLOW_HOME=/opt/airflow, AIRFLOW_VERSION,
# curl for healthchecks, the postgres provider, and an entrypoint that runs `bash ...`/`python ...`
# as given and anything else as an `airflow` subcommand.
FROM python:3.11-slim-bookworm

ARG AIRFLOW_VERSION=3.3.2
ENV AIRFLOW_VERSION=${AIRFLOW_VERSION} \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW_USER_HOME_DIR=/home/airflow \
    PATH=/home/airflow/.local/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

RUN useradd --uid 50000 --gid 0 --home-dir /home/airflow --create-home --shell /bin/bash airflow \
    && mkdir -p /opt/airflow/dags /opt/airflow/logs /opt/airflow/plugins \
    && chown -R airflow:0 /opt/airflow && chmod -R g+rwX /opt/airflow
COPY airflow-entrypoint.sh /entrypoint
COPY constraints.txt /tmp/constraints.txt

USER airflow
WORKDIR /opt/airflow
RUN python -m venv /home/airflow/.local \
    && pip install -c /tmp/constraints.txt "apache-airflow[postgres]==${AIRFLOW_VERSION}" psycopg2-binary

ENTRYPOINT ["/entrypoint"]
CMD []
