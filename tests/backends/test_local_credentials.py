"""What credentials a local job's instances hold: behind the grant proxy, the endpoint's placeholders; against AWS
itself, the request's role assumed for the job (STS on moto_server, over HTTP), never the submitter's; and never a
way to the submitter's own (a profile, a web identity, a container-credentials endpoint)."""

from __future__ import annotations

import boto3
import pytest

from shardline.backends import local_supervisor
from tests.support.backend_jobs import job  # noqa: F401


def test_behind_the_grant_proxy_the_instances_hold_placeholders_never_this_machines_keys(job, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIADEVELOPERSOWNKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-developers-own-secret")
    monkeypatch.delenv("SHARDLINE_GRANT_ENDPOINT", raising=False)
    held = local_supervisor.instance_credentials(job(), proxied=True)
    assert held == {k: "shardline-job" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    # Behind a grant service (compose) the key is the job's name, which the supervisor set as its own.
    monkeypatch.setenv("SHARDLINE_GRANT_ENDPOINT", "http://grant:5000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sl-job-a1")
    assert local_supervisor.instance_credentials(job(), proxied=True)["AWS_ACCESS_KEY_ID"] == "sl-job-a1"


@pytest.mark.slow
def test_against_aws_itself_the_instances_hold_the_jobs_role_session(aws_env, job):  # noqa: F811
    request = job(run_id="run-a")
    held = local_supervisor.instance_credentials(request, proxied=False, sts=boto3.client("sts"))
    assert held["AWS_ACCESS_KEY_ID"] != aws_env["AWS_ACCESS_KEY_ID"] and held["AWS_SESSION_TOKEN"]
    identity = boto3.client(
        "sts",
        aws_access_key_id=held["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=held["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=held["AWS_SESSION_TOKEN"],
    ).get_caller_identity()
    assert f"/{request['ProcessingJobName']}" in identity["Arn"] and ":assumed-role/" in identity["Arn"]


def test_no_source_of_the_submitters_credentials_reaches_a_worker(monkeypatch, tmp_path, job):  # noqa: F811
    sources = {
        "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
        "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/airflow",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/var/run/secrets/pods.eks.amazonaws.com/token",
    }
    for name, value in sources.items():
        monkeypatch.setenv(name, value)
    env = local_supervisor.worker_environment(job(), tmp_path / "algo-1")
    assert not set(sources) & set(env), sorted(set(sources) & set(env))
