"""A model's code in a real local job (process runtime) tries what a hostile model would, through the endpoint
its job gives it: everything outside the job role's grant is refused as AWS refuses it, and the job's own work
still lands. (In the process runtime the model shares this machine's user, so it could find the real endpoint;
the container runtime, `make test-stack`, is the box where the grant is its one way out.)"""

from __future__ import annotations

import json

import boto3
import pytest

from shardline.decision.policy import JobStatus
from tests.support.backend_jobs import job, local_backend, upload_model, wait_terminal  # noqa: F401
from tests.support.helpers import FEATURES_ARG, write_inference_script

ATTACKER_SCRIPT = """\
import json
import os
import urllib.request
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

TARGETS = json.loads(os.environ["TARGETS"])


def _try(name, call, outcomes):
    try:
        call()
        outcomes[name] = "allowed"
    except ClientError as err:
        outcomes[name] = err.response["Error"]["Code"]
    except Exception as err:
        outcomes[name] = f"{type(err).__name__}: {err}"


def model_fn(model_dir):
    s3, ddb, t, outcomes = boto3.client("s3"), boto3.client("dynamodb"), TARGETS, {}
    _try("read another run's outputs", lambda: s3.get_object(Bucket=t["out"], Key="other-run/part-0.parquet"), outcomes)
    marker = t["prefix"] + "_SUCCESS"
    _try("write its _SUCCESS", lambda: s3.put_object(Bucket=t["out"], Key=marker, Body=b"{}"), outcomes)
    _try(
        "write its run report",
        lambda: s3.put_object(Bucket=t["out"], Key=t["prefix"] + "_shardline/reports/x/report.json", Body=b"{}"),
        outcomes,
    )
    _try(
        "forge another pipeline's ledger item",
        lambda: ddb.put_item(TableName=t["table"], Item={"pk": {"S": "RUN#other#r"}, "sk": {"S": "RUN"}}),
        outcomes,
    )
    def reset():
        request = urllib.request.Request(os.environ["AWS_ENDPOINT_URL"] + "/moto-api/reset", method="POST")
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as err:
            raise ClientError({"Error": {"Code": str(err.code)}}, "reset") from None
    _try("reset the emulator", reset, outcomes)
    outcomes["the key it holds"] = os.environ.get("AWS_ACCESS_KEY_ID")
    Path(os.environ["PROBE_DIR"], f"outcomes-{os.getpid()}.json").write_text(json.dumps(outcomes))
    return None


def predict_fn(data, model):
    return data[:, 0]
"""


@pytest.mark.slow
def test_a_hostile_models_calls_are_refused_and_the_jobs_own_work_lands(
    job,  # noqa: F811
    local_backend,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    s3 = boto3.client("s3")
    out = job.buckets["out"]
    s3.put_object(Bucket=out, Key="other-run/part-0.parquet", Body=b"another run's rows")
    model_dir = tmp_path / "attacker"
    write_inference_script(model_dir, ATTACKER_SCRIPT)
    sha = upload_model(s3, model_dir, job.buckets["models"], "attacker/model.tar.gz")
    request = job(run_id="run-attack", model_key="attacker/model.tar.gz", model_sha=sha)
    probe = tmp_path / "probe"
    probe.mkdir()
    table = request["Environment"]["SHARDLINE_LEDGER_TABLE"]
    request["Environment"]["PROBE_DIR"] = str(probe)
    request["Environment"]["TARGETS"] = json.dumps({"out": out, "prefix": "run-attack/", "table": table})
    request["AppSpecification"]["ContainerArguments"] += ["--features", FEATURES_ARG]
    # This machine's own keys (a developer's real ones, say): the model holds placeholders instead.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASUBMITTERSOWNKEY")
    name = local_backend.submit(request)
    assert wait_terminal(local_backend, name).status is JobStatus.COMPLETED
    outcomes = [json.loads(p.read_text()) for p in probe.glob("outcomes-*.json")]
    assert outcomes, "the model never loaded"
    for found in outcomes:
        assert found.pop("the key it holds") == "shardline-job", found
        assert found == {
            "read another run's outputs": "AccessDenied",
            "write its _SUCCESS": "AccessDenied",
            "write its run report": "AccessDenied",
            "forge another pipeline's ledger item": "AccessDeniedException",
            "reset the emulator": "403",
        }, found
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=out, Prefix="run-attack/").get("Contents", [])]
    assert "run-attack/_SUCCESS" not in keys and not any("/reports/" in k for k in keys)
    assert len([k for k in keys if k.endswith(".parquet")]) == 6  # the job's own outputs, all there
    # Its instances' manifests carry the lifecycle rule's tag, set through the grant with each object.
    manifests = [k for k in keys if "/_shardline/instances/" in k]
    assert manifests
    for key in manifests:
        tags = s3.get_object_tagging(Bucket=out, Key=key)["TagSet"]
        assert tags == [{"Key": "shardline-retention", "Value": "metadata"}], (key, tags)
    assert out in [b["Name"] for b in s3.list_buckets()["Buckets"]]  # nothing was reset
    supervisor_log = (local_backend.job_dir(name) / "supervisor.log").read_text()
    assert supervisor_log.count("refused (the job role's grant)") >= 5, supervisor_log[-3000:]
