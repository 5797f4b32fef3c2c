"""The worker image, run as SageMaker Processing runs it, scores exactly as the host does.

Each job here is planned by the orchestration code and its CreateProcessingJob request made by the
request builder; the local backend then runs that request twice, once with its instances as processes
on this machine and once as containers of the request's image (``SHARDLINE_LOCAL_RUNTIME=docker``):
the image's entrypoint with the request's ContainerArguments and Environment, inputs and model mounted
at the request's LocalPaths, the image's non-root user, an internal network whose only way out is the
AWS endpoint, and each output uploaded by the instance itself, through that endpoint, as its file finishes.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import boto3
import pyarrow.parquet as pq
import pytest

from shardline.backends.local import read_state
from shardline.decision.policy import Action
from shardline.orchestration import services, steps, watch
from tests.support.helpers import FEATURES, write_inference_script
from tests.support.pipelines import parquet_bytes, stage_step

CUSTOM_SCRIPT = """
    import os

    import joblib

    def model_fn(model_dir):
        return joblib.load(os.path.join(model_dir, "model.joblib"))

    def predict_fn(data, model):
        return model.predict_proba(data)[:, 1]
"""

PROBE_SCRIPT = """
    import glob
    import json
    import os
    import pwd

    def model_fn(model_dir):
        found = {"uid": os.getuid(), "home": os.environ.get("HOME"), "environ": {}, "aws_files": []}
        for path in glob.glob("/proc/[0-9]*/environ"):
            try:
                with open(path, "rb") as f:
                    found["environ"][path] = f.read().decode("utf-8", "replace")
            except OSError:
                pass
        homes = {os.path.expanduser("~"), pwd.getpwuid(os.getuid()).pw_dir, *(e.pw_dir for e in pwd.getpwall())}
        for environ in found["environ"].values():  # every other process's HOME it could read
            homes |= {v[5:] for v in environ.split(chr(0)) if v.startswith("HOME=")}
        for home in sorted(h for h in homes if h):
            for name in ("credentials", "config"):
                path = os.path.join(home, ".aws", name)
                try:
                    with open(path) as f:
                        found["aws_files"].append({"path": path, "text": f.read()})
                except OSError:
                    pass
        print("PROBE " + json.dumps(found), flush=True)
        return None

    def input_fn(body, content_type):
        return body.strip().splitlines()

    def predict_fn(data, model):
        return [0.0] * len(data)
"""

FILES = 4
ROWS = 2_000


def _decide(spec, attempt, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while (decision := watch.decide_now(spec, attempt)).action is Action.WAIT:
        assert time.monotonic() < deadline, f"still waiting: {decision.reason}"
        time.sleep(1)
    return decision


def _run(spec, bucket: str, runtime: str, monkeypatch, *, count: int = 2):
    """Plan, submit and wait for one attempt whose instances run as ``runtime``; its decision and outputs."""
    monkeypatch.setenv("SHARDLINE_LOCAL_RUNTIME", runtime)
    attempt = steps.plan(
        spec,
        "score",
        f"run-{runtime}",
        input_prefix=f"s3://{bucket}/in/",
        output_prefix=f"s3://{bucket}/out-{runtime}/",
        model_uri=f"s3://{bucket}/model/model.tar.gz",
        instance_count=count,
    )
    attempt = steps.submit(spec, attempt)
    decision = _decide(spec, attempt)
    job_dir = services.backend_for(spec).job_dir(attempt.job_name)
    assert read_state(job_dir)["runtime"] == runtime
    return attempt, decision, job_dir


def _outputs(bucket: str, runtime: str) -> dict[str, list[dict]]:
    s3 = boto3.client("s3")
    found = {}
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"out-{runtime}/").get("Contents", []):
        key = item["Key"].removeprefix(f"out-{runtime}/")
        if key.endswith(".parquet") and not key.startswith("_"):
            table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()))
            found[key] = sorted(table.to_pylist(), key=lambda row: row["id"])
    return found


@pytest.fixture
def local_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return tmp_path / "local"


@pytest.mark.parametrize("kind", ["scikit-learn", "xgboost", "torch", "inference.py"])
def test_the_worker_image_scores_every_row_as_the_host_does(
    kind, aws_env, ledger_table, local_root, tmp_path, monkeypatch, worker_image, figures, request
):
    model_dir = {
        "scikit-learn": "sklearn_model",
        "xgboost": "xgboost_model",
        "torch": "torch_model",
        "inference.py": "sklearn_model",
    }[kind]
    model_dir = request.getfixturevalue(model_dir).parent
    if kind == "inference.py":
        write_inference_script(model_dir, CUSTOM_SCRIPT)
    try:
        inputs = {f"part-{i}.parquet": parquet_bytes(ROWS, ROWS * i) for i in range(FILES)}
        inputs["corrupt.parquet"] = b"PAR1 this was cut short by a crashed writer"
        # Only the XGBoost model records its feature names: the others are told the training order.
        spec, bucket = stage_step(
            f"image_{kind.replace('.', '_').replace('-', '_')}",
            ledger_table,
            model_dir,
            tmp_path,
            inputs,
            features=None if kind == "xgboost" else FEATURES,
        )
    finally:
        if kind == "inference.py":
            (model_dir / "code" / "inference.py").unlink()
            (model_dir / "code").rmdir()

    _, host_decision, _ = _run(spec, bucket, "process", monkeypatch)
    _, image_decision, job_dir = _run(spec, bucket, "docker", monkeypatch)

    host, image = _outputs(bucket, "process"), _outputs(bucket, "docker")
    assert sorted(host) == sorted(image) == [f"part-{i}.parquet" for i in range(FILES)]
    for key in host:
        assert len(image[key]) == ROWS
        assert image[key] == host[key], f"{kind}: {key} differs between the image and the host"
    # The corrupt file fails alone, with the same outcome in the ledger on both.
    outcome = {(f.input_key, f.error_class, f.error_message) for f in host_decision.failed_files}
    assert outcome == {(f.input_key, f.error_class, f.error_message) for f in image_decision.failed_files}
    assert [f.input_key for f in image_decision.failed_files] == [f"s3://{bucket}/in/corrupt.parquet"]
    assert host_decision.action == image_decision.action
    # It ran in the image, as its own user, from the request's arguments.
    log = (job_dir / "algo-1" / "worker.log").read_text()
    assert "shardline" in log and str(job_dir) not in log  # the container sees /opt/ml paths, not the host's
    figures(**{f"equal_predictions_{kind}": FILES * ROWS})


def test_model_code_in_the_image_finds_no_airflow_secret_and_no_credentials(
    aws_env, ledger_table, local_root, tmp_path, monkeypatch, worker_image, figures
):
    """An inference.py that reads every /proc/*/environ it can and every ~/.aws it can find.

    Beside the job runs a process with Airflow's secrets in its environment, as the scheduler is, and this
    machine's user has AWS credentials in its home. Under the process runtime the probe finds both (the
    control: the probe works); in the image it finds neither."""
    fernet, jwt = "fernet-probe-9f1c2d", "jwt-probe-77ab3e"
    home = tmp_path / "airflow-home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = AKIAPROBEHOMEKEY\naws_secret_access_key = probe-home-secret\n"
    )
    monkeypatch.setenv("HOME", str(home))
    airflow_like = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={
            "AIRFLOW__CORE__FERNET_KEY": fernet,
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt,
            "HOME": str(home),
            "PATH": "/usr/bin:/bin",
        },
    )
    try:
        model_dir = tmp_path / "probe-model"
        model_dir.mkdir()
        write_inference_script(model_dir, PROBE_SCRIPT)
        spec, bucket = stage_step(
            "image_probe", ledger_table, model_dir, tmp_path, {"part-0.parquet": parquet_bytes(50, 0)}
        )
        findings = {}
        for runtime in ("process", "docker"):
            _, _, job_dir = _run(spec, bucket, runtime, monkeypatch, count=1)
            log = (job_dir / "algo-1" / "worker.log").read_text()  # each pool worker loads the model: take one
            findings[runtime], _ = json.JSONDecoder().raw_decode(log, log.index("PROBE {") + len("PROBE "))
    finally:
        airflow_like.kill()
        airflow_like.wait()

    def leaked(found: dict) -> set[str]:
        text = json.dumps(found)
        return {
            name
            for name, secret in (("fernet key", fernet), ("jwt secret", jwt), ("home credentials", "AKIAPROBEHOMEKEY"))
            if secret in text
        }

    assert leaked(findings["process"]) == {"fernet key", "jwt secret", "home credentials"}  # the control
    image = findings["docker"]
    assert leaked(image) == set(), image
    assert image["uid"] == 1000 and image["aws_files"] == []
    assert all("AIRFLOW__" not in environ for environ in image["environ"].values())
    figures(secrets_found_in_image=0)
