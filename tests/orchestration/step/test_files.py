"""No FILE items at plan time: a step's first attempt writes its plan file, and every reader (the watch's
snapshot, the CLI and page, a resubmission, the report) still sees each planned input, PENDING until claimed."""

from __future__ import annotations

import boto3
import pytest

from shardline.ledger.keys import StepRef, file_sk_prefix, run_pk
from shardline.ledger.records import FileRecord
from shardline.oncall.service import OnCall
from shardline.oncall.values import RunRef
from shardline.orchestration import services
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import PlanFileError, latest_attempt, read_step_files
from shardline.planning.inputs import parse_plan_file
from shardline.s3uri import parse_s3_uri
from tests.support.pipelines import parquet_bytes, plan_request, stage_step

SIZES = {f"part-{i}.parquet": 300 + 100 * i for i in range(4)}


@pytest.fixture
def pipeline(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "plan_files",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {name: parquet_bytes(rows, rows) for name, rows in SIZES.items()},
    )


def _file_items(spec, run_id: str) -> list:
    model = services.ledger_model(spec)
    return list(model.query(run_pk(spec.pipeline, run_id), model.sk.startswith(file_sk_prefix("score"))))


def test_a_plan_writes_a_plan_file_and_no_file_item_and_every_reader_sees_its_inputs_pending(pipeline):
    spec, bucket = pipeline
    attempt = step_plan.plan(spec, "score", plan_request("run-1", bucket))
    assert _file_items(spec, "run-1") == []  # one STEP write planned the step

    s3 = boto3.client("s3")
    [(number, uri)] = read_step_files(spec, StepRef(spec.pipeline, "run-1", "score")).step.plan_files.items()
    assert number == 1 and uri.startswith(attempt.manifest_uri.removesuffix(".manifest"))
    plan_bucket, plan_key = parse_s3_uri(uri)
    planned = parse_plan_file(s3.get_object(Bucket=plan_bucket, Key=plan_key)["Body"].read(), uri)
    stored = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="in/")["Contents"]}
    assert sorted(planned) == sorted((f"s3://{bucket}/{key}", size) for key, size in stored.items())

    records = read_step_files(spec, StepRef(spec.pipeline, "run-1", "score"))
    assert all(f == FileRecord.unclaimed(f.input_key, 1, f.bytes_in) for f in records.files)
    assert sorted((f.input_key, f.status, f.attempt, f.bytes_in) for f in records.files) == sorted(
        (key, "PENDING", 1, size) for key, size in planned
    )
    assert latest_attempt(spec, StepRef(spec.pipeline, "run-1", "score")).file_count == 4

    view = OnCall({spec.pipeline: spec}).status(RunRef(spec.pipeline, "run-1"))
    [step] = view.steps
    assert (step.files, step.pending, step.succeeded) == (4, 4, 0)
    assert step_end.summarize(spec, StepRef(spec.pipeline, "run-1", "score")).files == 4


def test_a_claim_creates_the_file_s_item_and_the_rest_stay_pending(pipeline):
    from shardline.ledger.context import LedgerContext
    from shardline.ledger.job_writes import FinishedFile, WorkerLedger
    from shardline.ledger.states import FileStatus

    spec, bucket = pipeline
    step_plan.plan(spec, "score", plan_request("run-2", bucket))
    worker = WorkerLedger(
        LedgerContext(spec.ledger_table, spec.pipeline, "run-2", "score", 1, input_uri=f"s3://{bucket}/in/"), "algo-1"
    )
    worker.claim_file("part-0.parquet")
    worker.claim_file("part-1.parquet")
    worker.finish_file("part-1.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=400, rows_out=400))
    assert len(_file_items(spec, "run-2")) == 2
    seen = {
        f.input_key.rsplit("/", 1)[1]: f.status
        for f in read_step_files(spec, StepRef(spec.pipeline, "run-2", "score")).files
    }
    assert seen == {
        "part-0.parquet": "RUNNING",
        "part-1.parquet": "SUCCEEDED",
        "part-2.parquet": "PENDING",
        "part-3.parquet": "PENDING",
    }


def test_a_re_plan_before_the_job_starts_is_read_afresh_not_from_the_cache(pipeline):
    """A plan task retried before its job was submitted plans the same attempt again, with what landed since,
    into a plan file of its own: the one it replaces is left as it was, for no reader."""
    spec, bucket = pipeline
    step_plan.plan(spec, "score", plan_request("run-3", bucket))
    before = read_step_files(spec, StepRef(spec.pipeline, "run-3", "score"))
    assert len(before.files) == 4  # now in the reader's cache
    boto3.client("s3").put_object(Bucket=bucket, Key="in/part-late.parquet", Body=parquet_bytes(10, 9000))
    again = step_plan.plan(spec, "score", plan_request("run-3", bucket))
    assert (again.number, again.file_count) == (1, 5)
    after = read_step_files(spec, StepRef(spec.pipeline, "run-3", "score"))
    assert len(after.files) == 5
    assert after.step.plan_files[1] != before.step.plan_files[1]


def test_a_recorded_plan_file_that_is_gone_is_an_error_that_names_it_not_a_smaller_step(pipeline):
    spec, bucket = pipeline
    step_plan.plan(spec, "score", plan_request("run-5", bucket))
    uri = read_step_files(spec, StepRef(spec.pipeline, "run-5", "score")).step.plan_files[1]
    boto3.client("s3").delete_object(Bucket=bucket, Key=parse_s3_uri(uri)[1])
    from shardline.orchestration.step import files as step_files

    step_files._cache.pop(uri, None)  # another process: the API server, the CLI
    with pytest.raises(PlanFileError, match=uri.replace(".", r"\.") + " is gone"):
        read_step_files(spec, StepRef(spec.pipeline, "run-5", "score"))
    from shardline.oncall.errors import Conflict

    with pytest.raises(Conflict, match="is gone"):  # what `shardline status` and the page say, not a traceback
        OnCall({spec.pipeline: spec}).status(RunRef(spec.pipeline, "run-5"))


def test_a_resubmission_of_never_claimed_files_takes_their_sizes_from_the_plan_file(pipeline):
    """Sizes deal a retry by size and are recorded on its fence items: none is asked of S3 again (an input
    deleted since the plan would fail that HEAD)."""
    spec, bucket = pipeline
    first = step_plan.plan(spec, "score", plan_request("run-4", bucket))
    stored = {o["Key"]: o["Size"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="in/")["Contents"]}
    boto3.client("s3").delete_object(Bucket=bucket, Key="in/part-3.parquet")
    keys = [f"s3://{bucket}/in/{name}" for name in SIZES]
    sized = step_plan.sized_objects(spec, first, keys)  # what resubmit plans the next attempt with
    assert [(o.key, o.size) for o in sized] == [(f"in/{name}", stored[f"in/{name}"]) for name in SIZES]
