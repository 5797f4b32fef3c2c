"""What only the local emulator (``shardline.backends.local``) can show: its instances run the real worker as
processes, upload as SageMaker would, stop as a whole process tree, keep MaxRuntimeInSeconds, and hand the model
only its own environment."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import time

import boto3
import psutil
import pyarrow.parquet as pq
import pytest

from shardline.backends.local import LocalBackend
from shardline.decision.policy import JobStatus
from shardline.planning.naming import run_folder
from tests.support.backend_jobs import (  # noqa: F401
    ROWS_PER_FILE,
    job,
    local_backend,
    upload_model,
    uploaded,
    wait_terminal,
    wait_until,
)
from tests.support.helpers import FEATURES_ARG, write_inference_script


@pytest.mark.slow
def test_local_job_shards_by_key_runs_every_instance_and_uploads_outputs(job, tmp_path, aws_env):  # noqa: F811
    backend = LocalBackend(tmp_path / "lb")
    name = backend.submit(job(run_id="run-e2e"))
    assert wait_terminal(backend, name).status is JobStatus.COMPLETED
    s3 = boto3.client("s3")
    out = job.buckets["out"]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=out, Prefix="run-e2e/")["Contents"])
    outputs = [k for k in keys if k.endswith(".parquet")]
    assert outputs == [f"run-e2e/part-{i}.parquet" for i in range(6)]
    # Each attempt's instances upload their own manifests, keyed by run and step: a resubmission never overwrites
    # attempt 1's, and another run of the same output prefix never reads them.
    folder = f"run-e2e/_shardline/instances/{run_folder('run-e2e')}/score/attempt-0001"
    assert {f"{folder}/manifest-algo-1.json", f"{folder}/manifest-algo-2.json"} <= set(keys)
    ids = []
    for key in outputs:
        table = pq.read_table(io.BytesIO(s3.get_object(Bucket=out, Key=key)["Body"].read()))
        ids.extend(table.column("id").to_pylist())
    assert sorted(ids) == list(range(6 * ROWS_PER_FILE))  # no row lost or duplicated
    manifests = [
        json.loads(s3.get_object(Bucket=out, Key=f"{folder}/manifest-{h}.json")["Body"].read())
        for h in ("algo-1", "algo-2")
    ]
    assert [m["files"] for m in manifests] == [3, 3]  # ShardedByS3Key: keys[i::2]
    assert not any(".shardline-tmp" in k for k in keys)
    # What was staged for the instances (inputs, model) is gone once the job ended, as an instance's volume is on
    # SageMaker: a retry needs room for its own files only. The instances' logs stay.
    job_dir = tmp_path / "lb" / "jobs" / name
    assert [p for p in job_dir.rglob("*") if p.is_file() and "input" in p.relative_to(job_dir).parts] == []
    assert all((job_dir / host / "worker.log").exists() for host in ("algo-1", "algo-2"))


# Runs until stopped: with one pool process per instance, each process's first file ends and its
# second waits until MARKS_DIR/release exists (never, unless a test makes it). MARKS_DIR, from the
# request's Environment, also records each call as PID-CALL.
ENDLESS_SCRIPT = """\
import os
import time
from pathlib import Path

_calls = 0


def model_fn(model_dir):
    return None


def predict_fn(data, model):
    global _calls
    _calls += 1
    marks = Path(os.environ["MARKS_DIR"])
    (marks / f"{os.getpid()}-{_calls}").touch()
    while _calls > 1 and not (marks / "release").exists():
        time.sleep(0.05)
    return data[:, 0]
"""


@pytest.fixture
def endless_job(job, tmp_path):  # noqa: F811
    """A request builder like ``job``'s, for the endless model, one pool process per instance."""
    model_dir = tmp_path / "endless-model"
    write_inference_script(model_dir, ENDLESS_SCRIPT)
    sha = upload_model(boto3.client("s3"), model_dir, job.buckets["models"], "endless/model.tar.gz")
    marks = tmp_path / "marks"
    marks.mkdir()

    def build(run_id):
        request = job(run_id=run_id, model_key="endless/model.tar.gz", model_sha=sha)
        request["AppSpecification"]["ContainerArguments"] += ["--workers", "1", "--features", FEATURES_ARG]
        request["Environment"]["MARKS_DIR"] = str(marks)
        return request

    build.marks = marks
    build.blocked = lambda: len({m.name.split("-")[0] for m in marks.glob("*-2")}) == 2  # both instances
    return build


def _process_group(pgid):
    """Live processes of a process group: the supervisor, the workers and their pool children."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


@pytest.mark.slow
def test_local_stop_kills_the_whole_process_tree(endless_job, local_backend):  # noqa: F811
    name = local_backend.submit(endless_job(run_id="run-kill"))
    # Both instances' pool processes are blocked in their second file: every level of the tree is up.
    wait_until(endless_job.blocked, "both instances to block in their second file")
    pgid = json.loads((local_backend.job_dir(name) / "state.json").read_text())["pid"]
    assert len(_process_group(pgid)) >= 5  # supervisor + 2 workers + their pool processes
    local_backend.stop(name)
    state = local_backend.describe(name)
    assert state.status is JobStatus.STOPPED, state
    # stop() sends SIGKILL to what outlives its grace period; the kernel then ends those on its own time.
    wait_until(lambda: not _process_group(pgid), "the job's process group to be gone")


@pytest.mark.slow
def test_local_max_runtime_stops_the_job_and_keeps_only_complete_outputs(endless_job, local_backend, job):  # noqa: F811
    request = endless_job(run_id="run-timeout")
    request["StoppingCondition"]["MaxRuntimeInSeconds"] = 5
    name = local_backend.submit(request)
    state = wait_terminal(local_backend, name, timeout=120)
    assert state.status is JobStatus.STOPPED, state
    assert "MaxRuntimeInSeconds (5) exceeded" in state.failure_reason
    # Each output went up as its file ended (a stopped job keeps them); the file still in the model did not.
    outputs = [k for k in uploaded(job.buckets["out"], "run-timeout/") if k.endswith(".parquet")]
    assert len(outputs) <= 2 and not any(".shardline-tmp" in k for k in outputs), outputs
    for key in outputs:
        body = boto3.client("s3").get_object(Bucket=job.buckets["out"], Key=key)["Body"].read()
        assert pq.read_table(io.BytesIO(body)).num_rows == ROWS_PER_FILE


def _exited(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_local_job_whose_end_is_seen_past_max_runtime_is_stopped_not_completed(endless_job, local_backend, job):  # noqa: F811
    """The flaky case made certain: the workers end before the limit, the supervisor sees it only after."""
    request = endless_job(run_id="run-late")
    request["StoppingCondition"]["MaxRuntimeInSeconds"] = 10
    name = local_backend.submit(request)
    job_dir = local_backend.job_dir(name)
    wait_until(endless_job.blocked, "both instances to block in their second file")
    seen = time.monotonic()  # the job started before this, so its limit falls before seen + 10
    supervisor = json.loads((job_dir / "state.json").read_text())["pid"]
    workers = [int(p) for p in re.findall(r"worker pid (\d+)", (job_dir / "supervisor.log").read_text())]
    os.kill(supervisor, signal.SIGSTOP)  # it polls no more: the workers' end goes unseen
    try:
        (endless_job.marks / "release").touch()
        wait_until(lambda: all(_exited(p) for p in workers), "the released workers to exit")
        wait_until(lambda: time.monotonic() > seen + 10, "the job's limit to pass")
    finally:
        os.kill(supervisor, signal.SIGCONT)
    state = wait_terminal(local_backend, name)
    assert state.status is JobStatus.STOPPED, state
    assert state.failure_reason == "MaxRuntimeInSeconds (10) exceeded"
    # Every file ended (released) before the limit passed, each output uploaded as it ended: the Stopped job
    # keeps them all (with EndOfJob uploads it kept none).
    outputs = [k for k in uploaded(job.buckets["out"], "run-late/") if k.endswith(".parquet")]
    assert outputs == [f"run-late/part-{i}.parquet" for i in range(6)], outputs


# Dumps the environment of the model's process, and of the supervisor above it (readable by the
# model's code in /proc), to PROBE_DIR, which only the request's own Environment names.
ENV_PROBE_SCRIPT = """\
import json
import os
from pathlib import Path


def _environ(pid):
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.decode().split("=", 1) for e in raw.split(b"\\0") if e)


def _supervisor():
    pid = os.getpid()
    while pid > 1:
        if b"shardline.backends.local_supervisor" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no supervisor above this process")


def model_fn(model_dir):
    dump = {"model": dict(os.environ), "supervisor": _environ(_supervisor())}
    Path(os.environ["PROBE_DIR"], f"env-{os.getpid()}.json").write_text(json.dumps(dump))
    return None


def predict_fn(data, model):
    return data[:, 0]
"""


SECRETS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:db-password-1@db/airflow",
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key-2",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-3",
    "SHARDLINE_AIRFLOW_PASSWORD": "admin-password-4",
    "MY_SECRET": "my-secret-5",
}


@pytest.mark.slow
def test_local_job_gives_the_model_no_airflow_secret_only_its_own_environment(
    job,  # noqa: F811
    local_backend,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    for secret, value in SECRETS.items():
        monkeypatch.setenv(secret, value)  # as in the Airflow process that submits the job
    model_dir = tmp_path / "env-probe"
    write_inference_script(model_dir, ENV_PROBE_SCRIPT)
    sha = upload_model(boto3.client("s3"), model_dir, job.buckets["models"], "probe/model.tar.gz")
    request = job(run_id="run-env", model_key="probe/model.tar.gz", model_sha=sha)
    probe = tmp_path / "probe"
    probe.mkdir()
    request["Environment"]["PROBE_DIR"] = str(probe)
    name = local_backend.submit(request)
    assert wait_terminal(local_backend, name).status is JobStatus.COMPLETED
    dumps = [json.loads(p.read_text()) for p in probe.glob("env-*.json")]
    assert dumps, "the model never loaded"
    for dump in dumps:
        for env in (dump["model"], dump["supervisor"]):
            assert not set(SECRETS) & set(env), sorted(set(SECRETS) & set(env))
            assert not [v for v in SECRETS.values() if v in json.dumps(env)]
            assert env["PATH"] == os.environ["PATH"]
        assert dump["supervisor"]["AWS_ENDPOINT_URL"] == os.environ["AWS_ENDPOINT_URL"]
        # The model reaches AWS only through its job's grant: another endpoint on loopback, for every service.
        proxy = dump["model"]["AWS_ENDPOINT_URL"]
        assert proxy.startswith("http://127.0.0.1:") and proxy != os.environ["AWS_ENDPOINT_URL"]
        assert dump["model"]["AWS_ENDPOINT_URL_S3"] == dump["model"]["AWS_ENDPOINT_URL_DYNAMODB"] == proxy
        assert {k: dump["model"].get(k) for k in request["Environment"]} == request["Environment"]


def test_an_unpinned_model_is_refused_as_a_process_unless_the_developer_allows_it(job, tmp_path, monkeypatch):  # noqa: F811
    """Without Docker an instance runs as the submitting user: an unpinned model's code (whoever can write the
    model prefix chooses it) is refused there, with the setting to change, and nothing is started."""
    from shardline.backends.local_container import ContainerRuntimeError

    request = job(run_id="run-unpinned")
    args = request["AppSpecification"]["ContainerArguments"]
    del args[args.index("--model-sha256") : args.index("--model-sha256") + 2]
    backend = LocalBackend(tmp_path / "unpinned")
    monkeypatch.delenv("SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS", raising=False)
    with pytest.raises(ContainerRuntimeError) as refused:
        backend.submit(request)
    assert "model.sha256 or model.versions" in str(refused.value) and "Docker" in str(refused.value)
    assert not backend.job_dir(request["ProcessingJobName"]).exists()

    monkeypatch.setenv("SHARDLINE_LOCAL_ALLOW_UNPINNED_PROCESS", "1")
    name = backend.submit(request)
    assert wait_terminal(backend, name).status is JobStatus.COMPLETED
