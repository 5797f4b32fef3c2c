"""Approving held-back outputs on real runs (moto_server, the local backend, the real worker): the approval is
recorded fenced on the facts it accepts, the step's end then writes ``_SUCCESS`` and says who approved it, and what
is not a held-back step (or is another run's prefix now) is refused."""

from __future__ import annotations

import boto3
import pytest

from shardline.ledger.keys import StepRef
from shardline.ledger.step_reads import read_run, read_step_item
from shardline.orchestration import services
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step.approval import Approval, NotApprovable, approve
from shardline.spec import parse_spec
from tests.orchestration.step.test_checks import _run, _success_marker, pipeline  # noqa: F401 - the fixture


def _strict(spec):
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["checks"] = {"rows_out": {"at_least": 10_000}}  # 1,600 rows: held back
    return parse_spec(data, "checks_test.yaml")


def test_an_approved_step_ends_again_green_with_who_when_and_why(pipeline):  # noqa: F811
    spec, bucket = pipeline
    strict = _strict(spec)
    attempt, status, _ = _run(strict, bucket, "run-held")
    assert status.value == "FAILED" and not _success_marker(bucket, "run-held")
    ref = StepRef(strict.pipeline, "run-held", "score")

    with pytest.raises(NotApprovable, match="--reason"):
        approve(strict, ref, "oncall", "ok")
    approval = approve(strict, ref, "oncall", "a holiday: traffic is a tenth of a normal hour")
    assert isinstance(approval, Approval) and approval.attempt == attempt.number
    assert approval.held_back.startswith("checks: blocked by checks.rows_out.at_least: 1,600 against at least 10,000")
    model = services.ledger_model(strict)
    assert read_run(model, strict.pipeline, "run-held").run.status == "RUNNING"  # taken up again

    # The DAG run's watch task ends the step again (as a cleared watch task does): green, with its marker.
    assert step_end.finish(strict, attempt, "ADVANCE", "all files succeeded").value == "SUCCEEDED"
    assert _success_marker(bucket, "run-held")
    message = read_step_item(model, ref).message
    assert "approved by oncall at " in message and "a holiday" in message
    key = f"out/run-held/_shardline/reports/{attempt.report_uri('json').split('/reports/')[1]}"
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    assert b'"approval"' in body and b"a holiday" in body

    with pytest.raises(NotApprovable, match="is SUCCEEDED"):  # nothing held back any more
        approve(strict, ref, "oncall", "a holiday: traffic is a tenth of a normal hour")


def test_a_step_that_failed_for_another_reason_is_not_approvable(pipeline):  # noqa: F811
    spec, bucket = pipeline
    _, status, _ = _run(spec, bucket, "run-failed", action="FAIL")
    assert status.value == "FAILED"
    with pytest.raises(NotApprovable, match="only outputs its blocking checks held back"):
        approve(spec, StepRef(spec.pipeline, "run-failed", "score"), "oncall", "the outputs look fine to me")
