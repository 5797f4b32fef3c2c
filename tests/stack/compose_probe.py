"""Run inside the compose stack's scheduler (``python - < compose_probe.py``): submit one local job whose pinned
``inference.py`` does what a hostile model would, as the scheduler's tasks submit jobs, wait for its end, and
print what the model found as one ``FINDINGS {...}`` line for the stack test to judge.

It imports only what the stack's image holds (shardline, examples), never the tests."""

from __future__ import annotations

import datetime
import io
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import boto3
import pyarrow.parquet as pq

from examples import synthetic
from shardline.backends.local import LocalBackend
from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import take
from shardline.ledger.states import StepStatus
from shardline.ledger.step_writes import set_run_status
from shardline.ledger.table import bind_ledger
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import list_inputs, manifest_body, write_manifest
from shardline.planning.request import build_processing_request
from shardline.spec import parse_spec

HOSTILE = """
import glob
import json
import os
import urllib.error
import urllib.request

import boto3
from botocore.exceptions import ClientError

TARGETS = json.loads(os.environ["TARGETS"])


def _try(call):
    try:
        call()
        return "allowed"
    except ClientError as err:
        return err.response["Error"]["Code"]
    except urllib.error.HTTPError as err:
        return str(err.code)
    except Exception as err:
        return type(err).__name__


def _reset():
    urllib.request.urlopen(
        urllib.request.Request(os.environ["AWS_ENDPOINT_URL"] + "/moto-api/reset", method="POST"), timeout=30
    )


def model_fn(model_dir):
    found = {"uid": os.getuid(), "gid": os.getgid(), "environ": {}, "cmdlines": {}, "links": {}, "attacks": {}}
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                found["environ"][path] = f.read().decode("utf-8", "replace")
        except OSError as err:
            found["environ"][path] = f"unreadable: {type(err).__name__}"
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                found["cmdlines"][path] = f.read().replace(b"\\0", b" ").decode("utf-8", "replace")
        except OSError:
            pass
    # Links from the output folder to what Airflow holds: whoever reads that folder must not follow them.
    import sys

    out = sys.argv[sys.argv.index("--output-dir") + 1]  # the worker's own, as its command line names it
    os.makedirs(out, exist_ok=True)
    for name, target in (
        ("leak-environ.parquet", "/proc/1/environ"),
        ("leak-passwords.parquet", "/opt/airflow/simple_auth_manager_passwords.json"),
        ("leak-config.parquet", "/opt/airflow/airflow.cfg"),
    ):
        try:
            os.symlink(target, os.path.join(out, name))
            found["links"][name] = "made"
        except OSError as err:
            found["links"][name] = type(err).__name__
    s3, ddb, t = boto3.client("s3"), boto3.client("dynamodb"), TARGETS
    attacks = found["attacks"]
    attacks["read another pipeline's outputs"] = _try(lambda: s3.get_object(Bucket=t["bucket"], Key=t["other"]))
    attacks["write its _SUCCESS"] = _try(
        lambda: s3.put_object(Bucket=t["bucket"], Key=t["prefix"] + "_SUCCESS", Body=b"{}")
    )
    attacks["forge another pipeline's ledger item"] = _try(
        lambda: ddb.put_item(TableName=t["table"], Item={"pk": {"S": "RUN#other#r"}, "sk": {"S": "RUN"}})
    )
    attacks["reset the emulator"] = _try(_reset)
    attacks["reach the endpoint itself"] = _try(lambda: urllib.request.urlopen("http://aws:5000/moto-api/", timeout=10))
    print("PROBE " + json.dumps(found), flush=True)
    return None


def predict_fn(data, model):
    return data[:, 0]
"""


def main() -> int:
    root = Path(os.environ["SHARDLINE_LOCAL_ROOT"])
    table = sys.argv[1] if len(sys.argv) > 1 else "shardline-jobs"
    s3 = boto3.client("s3")
    tag = uuid.uuid4().hex[:8]
    bucket = f"probe-{tag}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="other-pipeline/part-0.parquet", Body=b"another pipeline's rows")
    data = io.BytesIO()
    pq.write_table(synthetic.make_table(200), data)
    s3.put_object(Bucket=bucket, Key="in/part-0.parquet", Body=data.getvalue())
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch, "model")
        (model_dir / "code").mkdir(parents=True)
        (model_dir / "code" / "inference.py").write_text(HOSTILE)
        tarball = Path(scratch, "model.tar.gz")
        sha = synthetic.pack(model_dir, tarball)
        s3.upload_file(str(tarball), bucket, "model/model.tar.gz")
    run_id, prefix = f"probe-{tag}", "out/"
    spec = parse_spec(
        {
            "pipeline": "compose_probe",
            "ledger_table": table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "sha256": sha},
                    "input": {"prefix": f"s3://{bucket}/in/", "passthrough": ["id"]},
                    "output": {"prefix": f"s3://{bucket}/{prefix}"},
                    "resources": {"instance_count": 1},
                }
            ],
        },
        "compose_probe.yaml",
    )
    objects = list_inputs(s3, f"s3://{bucket}/in/")
    attempt = Attempt(
        pipeline="compose_probe",
        run_id=run_id,
        step="score",
        number=1,
        input_prefix=f"s3://{bucket}/in/",
        output_prefix=f"s3://{bucket}/{prefix}",
        model_uri=f"s3://{bucket}/model/model.tar.gz",
        requested_instances=1,
        file_count=len(objects),
    )
    write_manifest(s3, attempt.manifest_uri, manifest_body(f"s3://{bucket}/in/", [o.key for o in objects]))
    # What planning writes before a run's first job: the run RUNNING, its step holding the output prefix. The
    # worker asks for both before each upload and, without them, refuses as a zombie would be refused.
    ledger = bind_ledger(table)
    set_run_status(ledger, "compose_probe", run_id, StepStatus.RUNNING)
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    take(ledger, f"s3://{bucket}/{prefix}", StepRef("compose_probe", run_id, "score"), until)
    role = "arn:aws:iam::123456789012:role/probe"
    request = build_processing_request(spec, attempt, image_uri="shardline-worker:local", role_arn=role)
    request["AppSpecification"]["ContainerArguments"] += ["--features", ",".join(synthetic.feature_names())]
    backend = LocalBackend(root)
    job_dir = backend.job_dir(request["ProcessingJobName"])
    targets = {"bucket": bucket, "other": "other-pipeline/part-0.parquet", "prefix": prefix, "table": table}
    request["Environment"]["TARGETS"] = json.dumps(targets)
    name = backend.submit(request)
    deadline = time.monotonic() + 300
    while not (state := backend.describe(name)).status.is_terminal:
        assert time.monotonic() < deadline, f"job {name} still {state.status}"
        time.sleep(1)
    log = (job_dir / "algo-1" / "worker.log").read_text()
    found, _ = json.JSONDecoder().raw_decode(log, log.index("PROBE {") + len("PROBE "))
    objects = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    found["job"] = {
        "status": state.status.value,
        "reason": state.failure_reason,
        "claimed_by": (job_dir / "CLAIMED").read_text() if (job_dir / "CLAIMED").exists() else None,
        "scheduler_host": os.uname().nodename,
        "uploaded": {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().hex() for o in objects},
        "name": name,
        "supervisor_log": (job_dir / "supervisor.log").read_text()[-4000:],
    }
    print("FINDINGS " + json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
