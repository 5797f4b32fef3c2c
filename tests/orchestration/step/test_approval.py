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


def test_an_approval_covers_the_checks_it_accepted_and_no_other(pipeline):  # noqa: F811
    spec, bucket = pipeline
    strict = _strict(spec)
    attempt, _, _ = _run(strict, bucket, "run-scope")
    ref = StepRef(strict.pipeline, "run-scope", "score")
    assert approve(strict, ref, "oncall", "a holiday: a tenth of the traffic").checks == ("checks.rows_out.at_least",)
    # Meanwhile the checks grew: a failure the approval never saw holds the outputs back still.
    data = strict.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["checks"]["columns"] = {"prediction": {"min_distinct": 3}}
    stricter = parse_spec(data, "checks_test.yaml")
    assert step_end.finish(stricter, attempt, "ADVANCE", "all files succeeded").value == "FAILED"
    message = read_step_item(services.ledger_model(spec), ref).message
    assert message.startswith("checks: blocked by checks.columns.prediction.min_distinct: 2 against at least 3")
    assert "which accepted only checks.rows_out.at_least" in message
    assert not _success_marker(bucket, "run-scope")


def test_what_could_not_be_computed_is_never_approved(pipeline):  # noqa: F811
    spec, bucket = pipeline
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["checks"] = {"columns": {"score": {"min_distinct": 2}}}  # the step writes no column "score"
    typo = parse_spec(data, "checks_test.yaml")
    _run(typo, bucket, "run-typo")
    ref = StepRef(typo.pipeline, "run-typo", "score")
    with pytest.raises(NotApprovable, match=r"could not be computed .* an approval accepts values, not their absence"):
        approve(typo, ref, "oncall", "the column is there, trust me")
    assert read_step_item(services.ledger_model(spec), ref).approval is None


def test_an_approval_of_a_prefix_another_run_took_since_is_refused_and_taken_back(pipeline):  # noqa: F811
    from shardline.orchestration.partitions import PartitionHeld, PartitionMovedOn
    from shardline.orchestration.step import plan as step_plan
    from tests.support.pipelines import plan_request

    spec, bucket = pipeline
    strict = _strict(spec)
    _run(strict, bucket, "run-taken")
    # Another run of the same partition takes its prefix (the first run ended FAILED: its hold is free to take).
    other = plan_request(
        "run-other", bucket, input_prefix=f"s3://{bucket}/in/", output_prefix=f"s3://{bucket}/out/run-taken/"
    )
    step_plan.plan(strict, "score", other)
    ref = StepRef(strict.pipeline, "run-taken", "score")
    with pytest.raises((PartitionHeld, PartitionMovedOn)):
        approve(strict, ref, "oncall", "a holiday: a tenth of the traffic")
    model = services.ledger_model(strict)
    assert read_step_item(model, ref).approval is None  # taken back: it was never acted on
    assert read_run(model, strict.pipeline, "run-taken").run.status == "FAILED"  # as it ended
