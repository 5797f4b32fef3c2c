"""Many jobs behind one grant endpoint (compose's ``grant`` service): each request is checked against the grant of
the job whose name signs it, filed where only the submitter writes; a name with no grant filed gets nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import boto3
import pytest
from botocore.exceptions import ClientError

from shardline.backends import local_runner
from shardline.backends.local import LocalBackend
from shardline.grant import book
from shardline.grant.proxy import GrantProxy
from shardline.grant.requests import Unreadable, access_key_of
from tests.support.backend_jobs import job  # noqa: F401


def test_the_access_key_is_read_from_either_signature():
    signed = {
        "authorization": "AWS4-HMAC-SHA256 Credential=sl-job-a1/20261128/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=0af3"
    }
    assert access_key_of("/bucket/key", signed) == "sl-job-a1"
    presigned = "/bucket/key?X-Amz-Credential=sl-job-b2%2F20261128%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=1"
    assert access_key_of(presigned, {}) == "sl-job-b2"
    with pytest.raises(Unreadable):
        access_key_of("/bucket/key", {})


def test_a_grant_is_found_only_by_its_own_jobs_name_and_never_through_a_link(tmp_path, job):  # noqa: F811
    request = job(run_id="run-a")
    filed = book.file_grant(tmp_path / "grants", request)
    name = request["ProcessingJobName"]
    assert filed.name == f"{name}.json"
    grants = book.GrantBook(tmp_path / "grants", {})
    assert grants.grant_for(name) is not None
    assert grants.grant_for("sl-no-such-job") is None
    assert grants.grant_for("../grants/" + name) is None  # not a job name
    # A file whose content names another job, and a link, are not that job's grant.
    (tmp_path / "grants" / "sl-renamed.json").write_text(filed.read_text())
    os.symlink(filed, tmp_path / "grants" / "sl-linked.json")
    assert grants.grant_for("sl-renamed") is None and grants.grant_for("sl-linked") is None
    with pytest.raises(ValueError, match="no SageMaker job name"):
        book.file_grant(tmp_path / "grants", {**request, "ProcessingJobName": "../escape"})


def test_each_job_signing_as_itself_gets_its_own_grant_and_no_other(tmp_path, aws_env, job):  # noqa: F811
    first, second = job(run_id="run-a"), job(run_id="run-b")
    for request in (first, second):
        book.file_grant(tmp_path / "grants", request)
    grants = book.GrantBook(tmp_path / "grants", os.environ)
    endpoint = aws_env["AWS_ENDPOINT_URL"]
    refusals: list[str] = []
    out = job.buckets["out"]
    with GrantProxy(
        None, {"s3": endpoint, "dynamodb": endpoint}, grant_for=grants.grant_for, on_refusal=refusals.append
    ) as proxy:

        def client(key: str):
            return boto3.client("s3", endpoint_url=proxy.url, aws_access_key_id=key, aws_secret_access_key="x")

        a, b = client(first["ProcessingJobName"]), client(second["ProcessingJobName"])
        a.put_object(Bucket=out, Key="run-a/part-0.parquet", Body=b"a's rows")
        b.put_object(Bucket=out, Key="run-b/part-0.parquet", Body=b"b's rows")
        for writer, key in ((a, "run-b/part-1.parquet"), (b, "run-a/part-1.parquet")):
            with pytest.raises(ClientError) as refused:
                writer.put_object(Bucket=out, Key=key, Body=b"into the other job's output")
            assert refused.value.response["Error"]["Code"] == "AccessDenied"
        with pytest.raises(ClientError) as unknown:
            client("sl-never-submitted").get_object(Bucket=out, Key="run-a/part-0.parquet")
        assert unknown.value.response["Error"]["Code"] == "AccessDenied"
    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=out).get("Contents", []))
    assert [k for k in keys if "_shardline" not in k] == ["run-a/part-0.parquet", "run-b/part-0.parquet"]
    assert any(first["ProcessingJobName"] in r for r in refusals)  # each refusal names the job
    assert any("no job's grant is filed" in r for r in refusals)


def test_a_handed_off_submit_files_its_grant_before_the_job_is_visible(
    tmp_path,
    monkeypatch,
    job,  # noqa: F811
):
    monkeypatch.setenv(local_runner.RUNNER_ENV, local_runner.RUNNER_SERVICE)
    monkeypatch.setenv(book.GRANTS_ENV, str(tmp_path / "grants"))
    request = job(run_id="run-a")
    LocalBackend(tmp_path / "root").submit(request)
    assert book.GrantBook(tmp_path / "grants", os.environ).grant_for(request["ProcessingJobName"]) is not None


def test_the_service_refuses_to_start_in_front_of_aws_itself(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(sys.path),
        "AWS_ENDPOINT_URL": "https://s3.us-east-1.amazonaws.com",
    }
    ran = subprocess.run(
        [sys.executable, "-m", "shardline.grant.book", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 2 and "not emulated" in ran.stderr
