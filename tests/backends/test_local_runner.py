"""A local job left to a runner service (``SHARDLINE_LOCAL_RUNNER=service``, as compose's Airflow does): the
submitter starts nothing, exactly one runner claims and starts it, and every way it can end without its
supervisor saying so (the supervisor killed, the runner restarted, no runner at all) is recorded, never left
InProgress for ever."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from shardline.backends import local_runner
from shardline.backends.local import STATE_FILE, read_state, write_json_atomic
from shardline.decision.policy import JobStatus
from tests.support.backend_jobs import job, local_backend, wait_terminal  # noqa: F401


@pytest.fixture
def handed_off(monkeypatch):
    monkeypatch.setenv(local_runner.RUNNER_ENV, local_runner.RUNNER_SERVICE)


@pytest.mark.slow
def test_a_handed_off_job_waits_for_a_runner_and_exactly_one_runner_runs_it(
    handed_off,
    job,  # noqa: F811
    local_backend,  # noqa: F811
):
    name = local_backend.submit(job())
    job_dir = local_backend.job_dir(name)
    state = read_state(job_dir)
    assert state["runner"] == "service" and state["pid"] is None
    assert not (job_dir / "supervisor.log").exists()  # the submitter started nothing
    assert oct(job_dir.stat().st_mode & 0o7777) == "0o2770"  # the runner's uid reaches it by group
    assert local_backend.describe(name).status is JobStatus.IN_PROGRESS

    first, second = local_runner.Runner(local_backend.root, "runner-a"), local_runner.Runner(local_backend.root, "b")
    assert [p.name for p in first.waiting()] == [name]
    assert first.start_waiting() == [name]
    assert second.start_waiting() == [] and second.waiting() == []
    assert (job_dir / local_runner.CLAIM_FILE).read_text() == "runner-a"
    assert wait_terminal(local_backend, name).status is JobStatus.COMPLETED
    first.children[name].wait(timeout=60)
    assert first.reap() == [] and first.children == {}  # it ended as it should: nothing to record


def test_a_submit_that_is_not_handed_off_records_no_runner(monkeypatch, tmp_path):
    monkeypatch.delenv(local_runner.RUNNER_ENV, raising=False)
    assert not local_runner.handed_off()
    assert local_runner.handed_off({local_runner.RUNNER_ENV: " Service "})
    assert not local_runner.handed_off({local_runner.RUNNER_ENV: "process"})


def _left_job(root, name: str, **state) -> object:
    job_dir = root / "jobs" / name
    job_dir.mkdir(parents=True)
    (job_dir / "request.json").write_text(json.dumps({"ProcessingJobName": name}))
    write_json_atomic(
        job_dir / STATE_FILE,
        {"name": name, "status": "InProgress", "created_at": time.time(), "pid": None, "runner": "service", **state},
    )
    return job_dir


def test_a_job_no_runner_claims_in_time_fails_naming_the_service(tmp_path):
    from shardline.backends.local import LocalBackend

    backend = LocalBackend(tmp_path)
    _left_job(tmp_path, "fresh")
    _left_job(tmp_path, "stale", created_at=time.time() - local_runner.CLAIM_SECONDS - 1)
    assert backend.describe("fresh").status is JobStatus.IN_PROGRESS
    stale = backend.describe("stale")
    assert stale.status is JobStatus.FAILED
    assert "job-runner" in stale.failure_reason and "SHARDLINE_LOCAL_RUNNER" in stale.failure_reason
    assert read_state(tmp_path / "jobs" / "stale")["status"] == "Failed"  # recorded, not only reported
    # The verdict took the claim: a runner that comes up now does not start the job it failed.
    assert [p.name for p in local_runner.Runner(tmp_path, "late").waiting()] == ["fresh"]


def test_a_runner_that_claimed_first_wins_over_the_unclaimed_verdict(tmp_path):
    job_dir = _left_job(tmp_path, "raced", created_at=time.time() - local_runner.CLAIM_SECONDS - 1)
    assert local_runner.claim(job_dir, "runner-a")
    assert local_runner.unclaimed_reason(job_dir, read_state(job_dir), time.time()) is None


def test_a_supervisor_that_dies_is_recorded_by_its_runner(tmp_path):
    import subprocess
    import sys

    job_dir = _left_job(tmp_path, "doomed")
    runner = local_runner.Runner(tmp_path, "runner-a")
    # A supervisor that never records an end: its process is killed before it can.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    assert local_runner.claim(job_dir, "runner-a")
    runner.children["doomed"] = child
    assert runner.reap() == []  # still running
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert runner.reap() == ["doomed"]
    state = read_state(job_dir)
    assert state["status"] == "Failed" and state["failure_reason"] == local_runner.DIED_REASON


def test_a_restarted_runner_records_the_jobs_it_had_claimed_and_leaves_the_rest(tmp_path):
    mine = _left_job(tmp_path, "mine", pid=12345)
    other = _left_job(tmp_path, "other", pid=12346)
    done = _left_job(tmp_path, "done", status="Completed", pid=12347)
    for job_dir, host in ((mine, "runner-a"), (other, "runner-b"), (done, "runner-a")):
        assert local_runner.claim(job_dir, host)
    assert local_runner.Runner(tmp_path, "runner-a").adopt_orphans() == ["mine"]
    assert read_state(mine)["status"] == "Failed"
    assert read_state(other)["status"] == "InProgress" and read_state(done)["status"] == "Completed"


def test_the_health_check_reads_the_runners_last_pass(tmp_path):
    assert not local_runner.healthy(tmp_path)  # no runner has passed yet
    local_runner.Runner(tmp_path, "runner-a").pass_once()
    assert local_runner.healthy(tmp_path)
    later = time.time() + local_runner.HEARTBEAT_SECONDS + 1
    assert not local_runner.healthy(tmp_path, now=later)
    assert local_runner.main(["--check", str(tmp_path)]) == 0


@pytest.mark.slow
def test_a_runner_whose_one_way_out_is_a_grant_service_runs_the_job_signed_as_itself(
    handed_off,
    monkeypatch,
    tmp_path,
    aws_env,
    job,  # noqa: F811
    local_backend,  # noqa: F811
):
    """As in compose: the submitter files the job's grant; the runner's jobs reach S3 and DynamoDB only through
    one grant endpoint for all jobs, each request signed with its job's name, and the job completes."""
    from shardline.grant import book
    from shardline.grant.proxy import GrantProxy

    monkeypatch.setenv(book.GRANTS_ENV, str(tmp_path / "grants"))
    request = job()
    name = local_backend.submit(request)
    endpoint = aws_env["AWS_ENDPOINT_URL"]
    refusals: list[str] = []
    grants = book.GrantBook(tmp_path / "grants", os.environ)
    with GrantProxy(
        None, {"s3": endpoint, "dynamodb": endpoint}, grant_for=grants.grant_for, on_refusal=refusals.append
    ) as service:
        # The runner's environment: the grant service is its endpoint, its own keys placeholders.
        for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB", book.ENDPOINT_ENV):
            monkeypatch.setenv(variable, service.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "shardline-job")
        runner = local_runner.Runner(local_backend.root, "runner-a")
        assert runner.start_waiting() == [name]
        assert wait_terminal(local_backend, name).status is JobStatus.COMPLETED
        runner.children[name].wait(timeout=60)
    assert refusals == []  # everything the job did, its grant allowed
    log = (local_backend.job_dir(name) / "supervisor.log").read_text()
    assert "through the grant service" in log, log[-2000:]


def test_a_runner_leaves_alone_the_jobs_their_submitter_started(tmp_path):
    _left_job(tmp_path, "started-here", runner=None, pid=4242)
    _left_job(tmp_path, "left")
    runner = local_runner.Runner(tmp_path, "runner-a")
    assert [p.name for p in runner.waiting()] == ["left"]
    assert [p.name for p in runner.waiting()] == ["left"]  # and on the next pass too, without reading it again
    assert not (tmp_path / "jobs" / "started-here" / local_runner.CLAIM_FILE).exists()
