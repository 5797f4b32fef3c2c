"""Endpoint outages injected for real, in the middle of a real local job.

Each test has a moto_server of its own (the session's one is never disturbed): one is frozen
with SIGSTOP for 30 s; in the others every client, or only the job, reaches it through a TCP
proxy that refuses connections and cuts the open ones. The step is then driven to its end the
way the watch task does, and every input row must come out exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import io
import textwrap
import time
import uuid
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.backends.local import LocalBackend
from shardline.decision.policy import Action, Decision, decide
from shardline.ledger.keys import StepRef
from shardline.ledger.states import FileStatus
from shardline.ledger.step_reads import FILE_ATTRIBUTES
from shardline.ledger.table import create_ledger_table
from shardline.orchestration import services
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from shardline.orchestration.step.files import latest_attempt, read_step_files
from shardline.spec import PipelineSpec, load_spec
from tests.conftest import AWS_TEST_ENV
from tests.support.faults import MotoServer, TcpProxy, moto_server
from tests.support.pipelines import parquet_bytes

pytestmark = pytest.mark.slow

STEP = "score"
FILES = 8
ROWS_PER_FILE = 60_000
FREEZE_SECONDS = 30
STEP_DEADLINE_SECONDS = 900  # safety net only: nothing here may wait forever
JOB_END_DEADLINE_SECONDS = 900
POLL_SECONDS = 1.0


# -- fixtures and helpers -------------------------------------------------------------------------------------


@pytest.fixture
def own_moto(tmp_path):
    with moto_server(tmp_path / "moto") as server:
        yield server


@pytest.fixture
def local_root(tmp_path, monkeypatch):
    """The local backend's root for this test; whatever job is still running at the end is stopped."""
    root = tmp_path / "local"
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(root))
    yield root
    backend = LocalBackend(root)
    for job_dir in sorted((root / "jobs").glob("sl-*")):
        if not backend.describe(job_dir.name).status.is_terminal:
            backend.stop(job_dir.name)


def point_aws_at(monkeypatch, tmp_path: Path, url: str) -> None:
    """This process, and every job it submits (they inherit it), reach AWS at ``url`` only."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        **AWS_TEST_ENV,
        "AWS_ENDPOINT_URL": url,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }.items():
        monkeypatch.setenv(name, value)


def summing_model(directory: Path, wait: str) -> Path:
    """A SageMaker-style ``code/inference.py`` that sums each row's features, after running ``wait`` (one
    line of Python) for each (one-batch) file."""
    code = directory / "code"
    code.mkdir(parents=True)
    (code / "inference.py").write_text(
        textwrap.dedent("""
        import io
        import os
        import time

        import numpy as np

        def model_fn(model_dir):
            return None

        def input_fn(body, content_type):
            return np.loadtxt(io.StringIO(body), delimiter=",", ndmin=2)

        def predict_fn(data, model):
            WAIT
            return data.sum(axis=1)
    """).replace("WAIT", wait)
    )
    return directory


def slow_model(directory: Path, seconds_per_file: float) -> Path:
    """Takes ``seconds_per_file`` over each file."""
    return summing_model(directory, f"time.sleep({seconds_per_file})")


def stalling_model(directory: Path, files_before_stalling: int) -> Path:
    """Each worker process finishes its first ``files_before_stalling`` files, then hangs on the next: the test
    knows which files an instance finished before it is lost, without racing it."""
    return summing_model(
        directory,
        f"globals().setdefault('DONE', [0])[0] += 1\n    while DONE[0] > {files_before_stalling}: time.sleep(1)",
    )


def stalling_until(directory: Path, files_before_stalling: int, gate: Path) -> Path:
    """:func:`stalling_model` whose workers go on once the file ``gate`` exists."""
    return summing_model(
        directory,
        f"globals().setdefault('DONE', [0])[0] += 1\n"
        f"    while DONE[0] > {files_before_stalling} and not os.path.exists({str(gate)!r}): time.sleep(0.05)",
    )


def gated_model(directory: Path, gate: Path) -> Path:
    """Predicts nothing until the file ``gate`` exists: the test decides when the job's first file can
    finish, so it can cut the endpoint off first without racing the job."""
    return summing_model(directory, f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)")


def stage(
    tmp_path: Path, url: str, model_dir: Path, *, rows_per_file: int = ROWS_PER_FILE, **step_settings
) -> tuple[Path, PipelineSpec, str, int]:
    """A ledger table, a bucket with FILES parquet inputs and the packed model, and a spec file over them.

    Returns (spec path, spec, bucket, total input rows). Row ids are 0 .. total-1, each once.
    """
    table = f"shardline-faults-{uuid.uuid4().hex[:12]}"
    create_ledger_table(table, "us-east-1", url)
    s3 = boto3.client("s3")
    bucket = f"faults-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    for i in range(FILES):
        s3.put_object(
            Bucket=bucket, Key=f"in/part-{i:02d}.parquet", Body=parquet_bytes(rows_per_file, i * rows_per_file)
        )
    tarball = tmp_path / "model.tar.gz"
    sha = synthetic.pack(model_dir, tarball)
    s3.upload_file(str(tarball), bucket, "model/model.tar.gz")
    step = {
        "name": STEP,
        "model": {"uri": f"s3://{bucket}/model/model.tar.gz", "sha256": sha},
        "input": {"prefix": f"s3://{bucket}/in/", "passthrough": ["id"], "features": synthetic.feature_names()},
        "output": {"prefix": f"s3://{bucket}/out/"},
        "resources": {"instance_count": 2, "workers_per_instance": 1},
        "retry": {"max_attempts": 5, "backoff_seconds": 0},
    }
    for name, value in step_settings.items():
        step[name] = {**step[name], **value} if isinstance(value, dict) else value
    data = {"pipeline": "faults", "ledger_table": table, "poll_interval_seconds": POLL_SECONDS, "steps": [step]}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, load_spec(path), bucket, FILES * rows_per_file


def plan_and_submit(
    spec: PipelineSpec, bucket: str, run_id: str, *, job_endpoint: str | None = None, monkeypatch=None
) -> dict:
    """Plan attempt 1 and submit its job; with ``job_endpoint``, the job (only) reaches AWS there."""
    attempt = step_plan.plan(
        spec,
        STEP,
        step_plan.PlanRequest(
            run_id,
            input_prefix=f"s3://{bucket}/in/",
            output_prefix=f"s3://{bucket}/out/",
            model_uri=f"s3://{bucket}/model/model.tar.gz",
            instance_count=spec.step(STEP).resources.instance_count,
        ),
    )
    assert attempt is not None and attempt.file_count == FILES
    if job_endpoint is None:
        return step_jobs.submit(spec, attempt).attempt
    with monkeypatch.context() as m:  # the job inherits the environment of the process that submits it
        m.setenv("AWS_ENDPOINT_URL", job_endpoint)
        return step_jobs.submit(spec, attempt).attempt


def file_items(spec: PipelineSpec, run_id: str) -> list:
    """The step's files as the watch task and on-call see them: FILE items, and planned inputs not yet claimed."""
    records = read_step_files(
        spec, StepRef(spec.pipeline, run_id, STEP), file_attributes=[*FILE_ATTRIBUTES, "output_key"]
    )
    return records.files


def wait_until_a_file_is_claimed(spec: PipelineSpec, attempt: dict, run_id: str) -> list:
    deadline = time.monotonic() + JOB_END_DEADLINE_SECONDS
    while True:
        files = file_items(spec, run_id)
        if any(f.status != FileStatus.PENDING for f in files):
            return files
        state = services.backend_for(spec).describe(attempt.job_name)
        assert not state.status.is_terminal, f"job ended ({state}) before any file was claimed"
        assert time.monotonic() < deadline, "no file was claimed (safety deadline)"
        time.sleep(0.2)


def drive_to_the_end(spec: PipelineSpec, attempt: dict) -> tuple[dict, list[str]]:
    """What the watch task does: poll, resubmit on RESUBMIT, stop on ADVANCE; anything else fails the test."""
    deadline = time.monotonic() + STEP_DEADLINE_SECONDS
    history: list[str] = []
    while True:
        decision: Decision = watch.decide_now(spec, attempt)
        if decision.action is Action.ADVANCE:
            history.append(f"attempt {attempt.number}: ADVANCE: {decision.reason}")
            return attempt, history
        if decision.action is Action.RESUBMIT:
            history.append(f"attempt {attempt.number}: RESUBMIT: {decision.reason}")
            time.sleep(decision.delay_seconds)
            attempt = step_jobs.resubmit(spec, attempt, list(decision.retry_files)).attempt
            continue
        if decision.action is not Action.WAIT:
            pytest.fail(f"attempt {attempt.number}: {decision.action.value}: {decision.reason}; so far: {history}")
        assert time.monotonic() < deadline, (
            f"the step did not end within {STEP_DEADLINE_SECONDS}s (safety "
            f"deadline): {decision.reason}; so far: {history}"
        )
        time.sleep(POLL_SECONDS)


def wait_for_job_end(spec: PipelineSpec, job_name: str):
    backend = services.backend_for(spec)
    deadline = time.monotonic() + JOB_END_DEADLINE_SECONDS
    while not (state := backend.describe(job_name)).status.is_terminal:
        assert time.monotonic() < deadline, (
            f"job {job_name} is still {state.status.value} after "
            f"{JOB_END_DEADLINE_SECONDS}s (safety deadline): it hangs"
        )
        time.sleep(1)
    return state


def parse_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def output_ids(bucket: str) -> list[int]:
    """Every row id across the step's outputs (its manifests and other ``_`` files left out)."""
    s3 = boto3.client("s3")
    ids: list[int] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="out/"):
        for item in page.get("Contents", []):
            if "/_" in item["Key"]:
                continue
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            ids.extend(pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist())
    return ids


def assert_every_row_once(bucket: str, total: int) -> None:
    ids = output_ids(bucket)
    counts = collections.Counter(ids)
    twice = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(range(total)) - counts.keys())
    assert not twice and not missing, (
        f"{len(ids)} output rows for {total} input rows: {len(twice)} id(s) more "
        f"than once (e.g. {twice[:5]}), {len(missing)} missing (e.g. {missing[:5]})"
    )
    assert len(ids) == total


def assert_ledger_reconciles(spec: PipelineSpec, run_id: str, total: int) -> None:
    files = file_items(spec, run_id)
    assert len(files) == FILES
    wrong = [
        (f.input_key, f.status, f.rows_in, f.rows_out)
        for f in files
        if f.status != FileStatus.SUCCEEDED or f.rows_in != f.rows_out
    ]
    assert not wrong, f"files not SUCCEEDED with rows_in == rows_out: {wrong}"
    summary = step_end.summarize(spec, StepRef(spec.pipeline, run_id, STEP))
    assert (summary.succeeded, summary.failed, summary.rows_in, summary.rows_out) == (FILES, 0, total, total), summary


def job_logs(root: Path, tail: int | None = 3000) -> str:
    """Every job's logs (the tail of each, for a failure message; ``tail=None``: whole)."""
    parts = []
    for path in sorted(root.glob("jobs/sl-*/**/*.log")):
        text = path.read_text(errors="replace")
        parts.append(f"--- {path.relative_to(root)}\n{text[-tail:] if tail else text}")
    return "\n".join(parts)


# -- the tests ------------------------------------------------------------------------------------------------


def test_a_poll_of_a_running_step_reads_no_file_item_and_its_end_reads_them(
    own_moto: MotoServer, local_root, tmp_path, monkeypatch
):
    """While the job runs and its instances send heartbeats, a poll is one DynamoDB request (the STEP and
    SHARD items), however many files the step has; once the job has ended, the poll reads every file."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, total = stage(
        tmp_path,
        own_moto.url,
        gated_model(tmp_path / "model", gate),
        rows_per_file=500,
        input={"features": ["f0", "f1"]},
    )
    run_id = "poll-1"
    attempt = plan_and_submit(spec, bucket, run_id)
    deadline = time.monotonic() + JOB_END_DEADLINE_SECONDS
    while not (running := watch.snapshot(spec, attempt)).shards:  # the gate holds every file: the job runs
        assert time.monotonic() < deadline, "no instance sent a heartbeat (safety deadline)"
        time.sleep(0.2)
    assert running.files is None and running.ledger_requests == 1, running
    assert decide(running, watch.policy_for(spec, STEP)).action is Action.WAIT
    assert "instance(s) report 0/" in watch.decide_now(spec, attempt).reason

    gate.touch()
    final, _ = drive_to_the_end(spec, attempt)
    ended = watch.snapshot(spec, final)
    assert ended.files is not None and len(ended.files) == FILES, ended
    assert {f.status for f in ended.files} == {FileStatus.SUCCEEDED}
    assert ended.ledger_requests == 2, ended  # the STEP and SHARD items, then the FILE items
    assert_ledger_reconciles(spec, run_id, total)
    assert_every_row_once(bucket, total)


def test_endpoint_frozen_30s_mid_job_the_run_succeeds_with_every_row_once(
    own_moto: MotoServer, local_root, xgboost_model, tmp_path, monkeypatch
):
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    _, spec, bucket, total = stage(tmp_path, own_moto.url, xgboost_model.parent)
    run_id = "frozen-1"
    attempt = plan_and_submit(spec, bucket, run_id)
    wait_until_a_file_is_claimed(spec, attempt, run_id)

    own_moto.freeze_for(FREEZE_SECONDS)  # every client of it (this test, the supervisor, the workers) waits

    try:
        final, history = drive_to_the_end(spec, attempt)
    except BaseException:
        print(job_logs(local_root), "\n--- moto_server\n", own_moto.log_tail())
        raise
    print("\n".join(history))
    assert_every_row_once(bucket, total)
    assert_ledger_reconciles(spec, run_id, total)
    assert final.number >= 1


def test_endpoint_down_past_the_budget_fails_the_step_with_how_to_resubmit_and_no_status_is_lost(
    own_moto: MotoServer, local_root, tmp_path, monkeypatch
):
    """The endpoint goes down for longer than every retry budget (the watch's and the job's), then comes
    back. The watch task fails the step saying so; the job drops the writes it could not land, withdraws the
    outputs they were for and ends; on-call resubmits what did not finish, and every row comes out once."""
    from shardline.airflow.triggers.step import StepTrigger

    gate = tmp_path / "gate"
    with TcpProxy(("127.0.0.1", own_moto.port)) as proxy:
        # Every client goes through the proxy, the job's supervisor and workers included.
        point_aws_at(monkeypatch, tmp_path, proxy.url)
        _spec_path, spec, bucket, total = stage(
            tmp_path,
            proxy.url,
            gated_model(tmp_path / "model", gate),
            rows_per_file=500,
            heartbeat_timeout_seconds=30,
            input={"features": ["f0", "f1"]},
        )
        run_id = "down-1"
        attempt = plan_and_submit(spec, bucket, run_id)
        wait_until_a_file_is_claimed(spec, attempt, run_id)

        proxy.refuse()  # new connections refused, open ones reset: every client fails fast
        gate.touch()  # only now can any file finish, so no file's SUCCEEDED record can have landed
        try:

            async def first_event():
                async for event in StepTrigger(
                    attempt.to_xcom(), watch.StepWatch.of(spec, STEP).to_json(), poll_interval=1
                ).run():
                    return event
                return None

            from structlog.testing import capture_logs  # a trigger logs through Airflow's structlog

            with capture_logs() as logged:
                started = time.monotonic()
                event = asyncio.run(asyncio.wait_for(first_event(), timeout=600))
                waited = time.monotonic() - started
            assert event is not None, "the trigger ended without an event"
            # It polled every second through the outage, and said so at most once a minute.
            said = [e for e in logged if "the AWS endpoint is unreachable" in str(e.get("event"))]
            assert 1 <= len(said) <= 1 + waited // 60, said
            payload = event.payload
            assert payload["action"] == Action.UNREACHABLE, payload
            reason = payload["reason"]
            assert "unreachable" in reason and "shardline resubmit" in reason and "--all-failed" in reason, reason

            # The endpoint stays down until the job gives up on its ledger writes (its budget is the step's
            # heartbeat timeout) and ends on its own.
            ended = wait_for_job_end(spec, attempt.job_name)
        except BaseException:
            print(job_logs(local_root))
            raise
        finally:
            proxy.accept()
        job_log = job_logs(local_root, tail=None)
        assert "ledger write dropped" in job_log, job_log[-6000:]

        s3 = boto3.client("s3")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="in/")["Contents"]
        inputs = sorted(f"s3://{bucket}/{o['Key']}" for o in listed)
        files = {f.input_key: f for f in file_items(spec, run_id)}
        assert sorted(files) == inputs, f"FILE items missing from the ledger: {sorted(set(inputs) - set(files))}"
        for key, item in sorted(files.items()):
            status = FileStatus(item.status)
            assert status not in (FileStatus.FAILED, FileStatus.SUCCEEDED), (
                f"{key} was recorded {status.value} ({item.error_class}: {item.error_message}) while the "
                "endpoint was down"
            )
        assert output_ids(bucket) == [], "outputs whose SUCCEEDED record never landed were not withdrawn"
        print(
            f"job {attempt.job_name}: {ended.status.value} ({ended.failure_reason}); all {FILES} file(s) "
            f"unfinished; proxy accepted {proxy.accepted} connection(s), cut {proxy.cut}"
        )

        # What on-call does next, as the message says: resubmit what did not finish; the watch task drives the
        # step to its end.
        latest = latest_attempt(spec, StepRef(spec.pipeline, run_id, STEP))
        assert latest is not None and latest.number == attempt.number
        current = step_jobs.resubmit(spec, latest, sorted(files), by_oncall=True).attempt
        try:
            _, history = drive_to_the_end(spec, current)
        except BaseException:
            print(job_logs(local_root))
            raise
        print("\n".join(history))
        assert_every_row_once(bucket, total)
        assert_ledger_reconciles(spec, run_id, total)


def test_a_job_cut_off_from_the_endpoint_is_stopped_and_no_row_it_finished_is_lost(
    own_moto: MotoServer, local_root, tmp_path, monkeypatch
):
    """Only the job loses the endpoint (the watch task still reaches it): its heartbeat goes stale, the watch task
    stops it and resubmits. Every row must still come out exactly once: the files it had recorded SUCCEEDED were
    uploaded before they were recorded, so they stay, and only the rest go again."""
    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    with TcpProxy(("127.0.0.1", own_moto.port)) as proxy:
        _, spec, bucket, total = stage(
            tmp_path,
            own_moto.url,
            slow_model(tmp_path / "model", 3),
            rows_per_file=500,
            heartbeat_timeout_seconds=30,
            resources={"instance_count": 1},
            input={"features": ["f0", "f1"]},
        )
        run_id = "cut-1"
        attempt = plan_and_submit(spec, bucket, run_id, job_endpoint=proxy.url, monkeypatch=monkeypatch)
        deadline = time.monotonic() + JOB_END_DEADLINE_SECONDS
        while not any(f.status == FileStatus.SUCCEEDED for f in file_items(spec, run_id)):
            assert time.monotonic() < deadline, "no file succeeded (safety deadline)"
            time.sleep(0.2)

        proxy.refuse()  # the job's ledger writes and heartbeats fail from now on; the watch's do not
        while (decision := watch.decide_now(spec, attempt)).action is Action.WAIT:
            assert time.monotonic() < deadline, f"the watch task never gave up on the cut-off job: {decision.reason}"
            time.sleep(POLL_SECONDS)
        assert decision.action is Action.RESUBMIT and decision.stop_job, decision
        assert "heartbeat_timeout_seconds" in decision.reason, decision.reason
        succeeded_before = sorted(f.input_key for f in file_items(spec, run_id) if f.status == FileStatus.SUCCEEDED)
        assert not set(succeeded_before) & set(decision.retry_files), decision  # what it finished is kept
        nxt = step_jobs.resubmit(spec, attempt, list(decision.retry_files)).attempt  # stops attempt 1's job first
        print(f"attempt 1 stopped with {len(succeeded_before)} file(s) SUCCEEDED: {succeeded_before}")

    try:
        _, history = drive_to_the_end(spec, nxt)
    except BaseException:
        print(job_logs(local_root))
        raise
    print("\n".join(history))
    assert_ledger_reconciles(spec, run_id, total)  # the ledger says every row came out...
    assert_every_row_once(bucket, total)  # ...and so must the outputs


def test_a_lost_instance_costs_only_its_unfinished_files_and_no_row_is_lost_or_doubled(
    own_moto: MotoServer, local_root, tmp_path, monkeypatch
):
    """Each output goes to S3 before its file is recorded SUCCEEDED, so an instance lost mid-job (SIGKILL, as a
    lost machine) keeps every file it finished: the next attempt takes exactly the lost instance's unfinished ones,
    at once, while the job's other instance goes on with its own, and the run's rows come out once each. (With
    SageMaker's EndOfJob upload every file the job had finished went again; until the backend said an instance
    died, the whole job was stopped once its heartbeat went stale, and the other instance's files went again.)"""
    import psutil

    point_aws_at(monkeypatch, tmp_path, own_moto.url)
    gate = tmp_path / "gate"
    _, spec, bucket, total = stage(
        tmp_path,
        own_moto.url,
        stalling_until(tmp_path / "model", 2, gate),
        rows_per_file=500,
        heartbeat_timeout_seconds=30,
        input={"features": ["f0", "f1"]},
    )
    run_id = "lost-1"
    attempt = plan_and_submit(spec, bucket, run_id)
    deadline = time.monotonic() + JOB_END_DEADLINE_SECONDS
    # Two instances of four files each: both finish two, then hang.
    while True:
        files = file_items(spec, run_id)
        if sum(f.status == FileStatus.SUCCEEDED for f in files) >= 4:
            break
        assert time.monotonic() < deadline, f"not 4 files SUCCEEDED (safety deadline): {files}"
        time.sleep(0.2)
    finished = {f.input_key for f in files if f.status == FileStatus.SUCCEEDED}
    s3 = boto3.client("s3")
    for f in files:  # durable already, while the job still runs: in S3, with the sha256 the ledger records
        if f.input_key in finished:
            head = s3.head_object(Bucket=bucket, Key=parse_s3(f.output_key)[1], ChecksumMode="ENABLED")
            assert head["ChecksumSHA256"]

    instance_dir = next((local_root / "jobs").glob("sl-*-a1")) / "algo-2"
    lost = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "shardline.worker" in (p.info["cmdline"] or []) and any(str(instance_dir) in a for a in p.info["cmdline"])
    ]
    assert lost, "no worker process of algo-2 found"
    for proc in lost:
        for victim in [proc, *proc.children(recursive=True)]:
            victim.kill()

    while (decision := watch.decide_now(spec, attempt)).action is Action.WAIT:
        assert time.monotonic() < deadline, f"the watch task never gave up on the lost instance: {decision.reason}"
        time.sleep(POLL_SECONDS)
    assert decision.action is Action.RESUBMIT and decision.beside, decision
    planned = {f.input_key for f in files}
    backend = services.backend_for(spec)
    (seen,) = backend.describe(attempt.job_name).lost_instances  # what the backend says it dealt the dead one
    assert seen.host == "algo-2" and "exited with code -9" in seen.reason, seen
    assert set(decision.retry_files) == set(seen.inputs) - finished, decision  # its unfinished files, exactly
    nxt = step_jobs.resubmit(spec, attempt, list(decision.retry_files), beside=decision.beside).attempt
    assert not backend.describe(attempt.job_name).status.is_terminal  # the other instance goes on with its own
    # Its files taken, the lost instance decides nothing more: the polls while the other instance goes on read no
    # FILE item (each would read them all), and that instance's heartbeats are still watched.
    polled = watch.snapshot(spec, nxt)
    assert polled.lost_instances == () and polled.files is None, polled
    assert polled.earlier_job_running == attempt.job_name and [s.host for s in polled.shards] == ["algo-1"], polled
    gate.touch()
    try:
        _, history = drive_to_the_end(spec, nxt)
    except BaseException:
        print(job_logs(local_root))
        raise
    print("\n".join(history))
    assert step_end.finish(spec, nxt, Action.ADVANCE, "all files succeeded").value == "SUCCEEDED"
    by_attempt = {f.input_key: f.attempt for f in file_items(spec, run_id)}
    assert {k for k, a in by_attempt.items() if a == 1} == planned - set(decision.retry_files), by_attempt
    assert {k for k, a in by_attempt.items() if a == 2} == set(decision.retry_files), by_attempt
    assert_ledger_reconciles(spec, run_id, total)
    assert_every_row_once(bucket, total)
