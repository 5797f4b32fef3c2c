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

from shardline.backends import local_container
from shardline.backends.local import read_state
from shardline.decision.policy import Action
from shardline.orchestration import services
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
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
    attempt = step_plan.plan(
        spec,
        "score",
        step_plan.PlanRequest(
            f"run-{runtime}",
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out-{runtime}/",
            model_uri=f"s3://{bucket}/model/model.tar.gz",
            instance_count=count,
        ),
    )
    attempt = step_jobs.submit(spec, attempt).attempt
    decision = _decide(spec, attempt)
    job_dir = services.backend_for(spec).job_dir(attempt.job_name)
    assert read_state(job_dir)["runtime"] == runtime
    if runtime == "docker":  # its instances ran on a network of the job's own, gone with the job
        log = (job_dir / "supervisor.log").read_text()
        network = local_container.job_network_name(attempt.job_name)
        assert "network " + network in log, log[-2000:]
        inspected = subprocess.run(["docker", "network", "inspect", network], capture_output=True, check=False)
        assert inspected.returncode != 0, f"the job's network {network} outlived it"
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
    # The corrupt file fails alone, with the same record in the ledger on both.
    failures = {(f.input_key, f.error_class, f.error_message) for f in host_decision.failed_files}
    assert failures == {(f.input_key, f.error_class, f.error_message) for f in image_decision.failed_files}
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


CONTAINER_ATTACKER = """\
import json
import os
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import boto3
from botocore.exceptions import ClientError

BUCKET, OUT, TABLE, MOTO_PORT = {targets!r}


def _try(name, call, outcomes):
    try:
        call()
        outcomes[name] = "allowed"
    except ClientError as err:
        outcomes[name] = err.response["Error"]["Code"]
    except urllib.error.HTTPError as err:
        outcomes[name] = str(err.code)
    except OSError as err:
        outcomes[name] = "unreachable"


def model_fn(model_dir):
    s3, ddb, outcomes = boto3.client("s3"), boto3.client("dynamodb"), {{}}
    proxy = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    _try("write its _SUCCESS", lambda: s3.put_object(Bucket=BUCKET, Key=OUT + "_SUCCESS", Body=b"{{}}"), outcomes)
    _try("read the model bucket whole", lambda: s3.list_objects_v2(Bucket=BUCKET), outcomes)
    _try(
        "forge another pipeline's ledger item",
        lambda: ddb.put_item(TableName=TABLE, Item={{"pk": {{"S": "RUN#other#r"}}, "sk": {{"S": "RUN"}}}}),
        outcomes,
    )
    reset = urllib.request.Request(f"http://{{proxy.netloc}}/moto-api/reset", method="POST")
    _try("reset the emulator", lambda: urllib.request.urlopen(reset, timeout=10), outcomes)
    for host in (proxy.hostname, "127.0.0.1", "host.docker.internal"):
        direct = f"http://{{host}}:{{MOTO_PORT}}/moto-api/data.json"
        _try(f"the endpoint itself at {{host}}", lambda: urllib.request.urlopen(direct, timeout=5), outcomes)
    print("ATTACKS " + json.dumps(outcomes), flush=True)
    return None


def input_fn(body, content_type):
    return body.strip().splitlines()


def predict_fn(data, model):
    return [0.0] * len(data)
"""


def test_a_hostile_model_in_the_image_reaches_aws_only_through_its_jobs_grant(
    aws_env, ledger_table, local_root, tmp_path, monkeypatch, worker_image, figures
):
    """In the container runtime the job's grant proxy, on the internal network's gateway, is the one way out:
    what the job role may not do is refused as AWS refuses it, and the endpoint itself is out of reach."""
    import uuid
    from urllib.parse import urlsplit

    model_dir = tmp_path / "attacker"
    model_dir.mkdir()
    bucket = f"b-{uuid.uuid4().hex[:8]}"  # named here, so that the model's code knows it
    moto_port = urlsplit(aws_env["AWS_ENDPOINT_URL"]).port
    write_inference_script(
        model_dir, CONTAINER_ATTACKER.format(targets=(bucket, "out-docker/", ledger_table, moto_port))
    )
    spec, staged = stage_step(
        "image_attack",
        ledger_table,
        model_dir,
        tmp_path,
        {"part-0.parquet": parquet_bytes(50, 0)},
        features=FEATURES,
        bucket=bucket,
    )
    assert staged == bucket
    _, decision, job_dir = _run(spec, bucket, "docker", monkeypatch, count=1)
    log = (job_dir / "algo-1" / "worker.log").read_text()
    found, _ = json.JSONDecoder().raw_decode(log, log.index("ATTACKS {") + len("ATTACKS "))
    assert found.pop("write its _SUCCESS") == "AccessDenied", found
    assert found.pop("read the model bucket whole") == "AccessDenied", found
    assert found.pop("forge another pipeline's ledger item") == "AccessDeniedException", found
    assert found.pop("reset the emulator") == "403", found
    assert set(found.values()) == {"unreachable"}, found  # the endpoint itself, at every address tried
    assert decision.action is Action.ADVANCE, decision  # and the job's own work landed
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert "out-docker/_SUCCESS" not in keys
    figures(hostile_calls_refused_in_image=4)


LISTENER = """
import socket, sys
server = socket.create_server(("0.0.0.0", 8000))
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"reached")
    connection.close()
"""

DIALER = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        print(s.recv(16).decode() or "reached")
except OSError as err:
    print(type(err).__name__)
"""


def test_no_traffic_crosses_between_containers_on_the_jobs_network(worker_image, tmp_path):
    """Every job's instances share one internal network with traffic between containers off: an instance cannot
    reach another's listening port, another job's or its own job's, while the gateway (where its job's grant
    proxy listens) answers it (the control: the dialer and its network work)."""
    import socket
    import threading
    import uuid

    gateway = local_container.ensure_job_network()
    tag = uuid.uuid4().hex[:8]
    listener = f"shardline-icc-listener-{tag}"
    run = ["docker", "run", "--rm", "--network", local_container.JOB_NETWORK, "--entrypoint", "python"]
    started = subprocess.Popen([*run, "--name", listener, worker_image, "-c", LISTENER], stdout=subprocess.PIPE)
    host_side = socket.create_server((gateway, 0))
    threading.Thread(target=lambda: host_side.accept()[0].sendall(b"reached"), daemon=True).start()
    try:
        assert started.stdout.readline().strip() == b"listening"
        address = subprocess.run(
            ["docker", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", listener],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

        def dial(host: str, port: int) -> str:
            done = subprocess.run(
                [*run, worker_image, "-c", DIALER, host, str(port)], capture_output=True, text=True, check=True
            )
            return done.stdout.strip()

        assert dial(gateway, host_side.getsockname()[1]) == "reached"  # the control
        assert dial(address, 8000) in ("TimeoutError", "ConnectionRefusedError", "OSError"), address
    finally:
        subprocess.run(["docker", "rm", "-f", listener], capture_output=True, check=False)
        started.wait(timeout=60)
        host_side.close()
