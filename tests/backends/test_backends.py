"""The backend contract, run against both implementations: the local emulator (its own duties in test_local.py and
test_local_supervisor.py) and SageMaker's API on moto_server over HTTP (moto runs nothing, so its jobs complete at
once).
"""

from __future__ import annotations

import boto3
import pytest

from shardline.backends import JobNotFound
from shardline.backends.local import LocalBackend
from shardline.backends.sagemaker import SageMakerBackend
from shardline.decision.policy import JobStatus
from tests.support.backend_jobs import job, wait_terminal  # noqa: F401


@pytest.fixture(params=["local", "sagemaker"])
def backend(request, tmp_path, aws_env):
    if request.param == "local":
        return LocalBackend(tmp_path / "local-backend")
    return SageMakerBackend(boto3.client("sagemaker"))


# -- the contract both backends keep -----------------------------------------------------------


@pytest.mark.slow
def test_submit_is_idempotent_and_the_job_completes(backend, job):  # noqa: F811
    request = job()
    name = backend.submit(request)
    assert backend.submit(request) == name  # a retried task adopts the job
    state = wait_terminal(backend, name)
    assert state.status is JobStatus.COMPLETED, state
    assert state.name == name


def test_unknown_jobs_are_not_found(backend, aws_env):
    with pytest.raises(JobNotFound):
        backend.describe("sl-nope-a1")
    with pytest.raises(JobNotFound):
        backend.stop("sl-nope-a1")


def test_stopping_a_finished_job_is_a_no_op(backend, job):  # noqa: F811
    name = backend.submit(job(run_id="run-stop-done"))
    wait_terminal(backend, name)
    backend.stop(name)
    assert backend.describe(name).status is JobStatus.COMPLETED
