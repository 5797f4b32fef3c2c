"""Picking a file's rejected rows again (`resubmit --rejects`): by number, as the worker numbered them, from the
source as it is now; and the ledger's reading that folds a part into its source."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import uuid

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardline.ledger.context import LedgerContext
from shardline.ledger.job_writes import FinishedFile, WorkerLedger
from shardline.ledger.keys import StepRef, file_sk, run_pk
from shardline.ledger.records import FileRecord, settle_parts, sources_with_rejects, stale_parts
from shardline.ledger.states import FileStatus
from shardline.oncall.errors import Conflict
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice, RunRef
from shardline.orchestration import services
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import latest_attempt
from shardline.orchestration.step.rejects import RejectsPartError, pick_lines, pick_parquet, resubmit_rejects
from shardline.planning import naming
from shardline.s3uri import parse_s3_uri
from tests.support.pipelines import plan_request, stage_step


def test_rows_are_numbered_as_the_worker_numbers_them_blank_lines_not_counted():
    source = b"id,x\n0,1.0\n\n1,oops\r\n2,3.0\n3,4.0"
    picked, rows = pick_lines(io.BytesIO(source), [2, 4], header=True)
    assert (picked, rows) == (b"id,x\n1,oops\r\n3,4.0\n", 4)
    picked, rows = pick_lines(io.BytesIO(b'{"a":1}\n{"a":2}\n'), [1], header=False)
    assert (picked, rows) == (b'{"a":1}\n', 2)


def test_parquet_rows_are_picked_across_row_groups(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"id": list(range(10))}), path, row_group_size=3)
    body, rows = pick_parquet(str(path), [1, 4, 10])
    assert rows == 10
    assert pq.read_table(io.BytesIO(body))["id"].to_pylist() == [0, 3, 9]


def test_a_part_is_named_as_one_more_part_of_its_source():
    assert naming.rejects_part_name("day/x.csv.gz", 3) == "day/x.rejects-a3.csv.gz"
    assert naming.rejects_part_name("x.parquet.gz", 3) == "x.rejects-a3.parquet"
    assert naming.rejects_part_name("x.parquet", 2) == "x.rejects-a2.parquet"
    assert naming.rejects_part_name("part-00000", 2) == "part-00000.rejects-a2"


def _file(key, status=FileStatus.SUCCEEDED, attempt=1, **figures) -> FileRecord:
    return FileRecord(key, status, attempt, **figures)


def test_a_succeeded_part_is_folded_into_its_source_and_the_balance_holds():
    source = _file("s3://b/in/x.csv", rows_in=100, rows_out=90, rows_rejected=10, rejects_key="s3://b/r1")
    first = _file(
        "s3://b/m/attempt-0002.rejects/x.rejects-a2.csv",
        attempt=2,
        rows_in=10,
        rows_out=7,
        rows_rejected=3,
        rejects_key="s3://b/r2",
        output_key="s3://b/out/x.rejects-a2.csv",
        part_of=source.input_key,
    )
    other = _file("s3://b/in/y.csv", rows_in=5, rows_out=5, rows_rejected=0)
    (settled, same) = settle_parts([source, first, other])
    assert (settled.rows_in, settled.rows_out, settled.rows_rejected, settled.rejects_key) == (100, 97, 3, "s3://b/r2")
    assert settled.parts == ("s3://b/out/x.rejects-a2.csv",)
    assert same == other
    assert [f.input_key for f in sources_with_rejects([source, first, other])] == [source.input_key]

    # A part that failed stays a file of its own, and changes nothing, until a later part of the source succeeds.
    failed = _file("s3://b/m/attempt-0003.rejects/x.rejects-a3.csv", FileStatus.FAILED, 3, part_of=source.input_key)
    assert [f.input_key for f in settle_parts([source, first, failed])] == [source.input_key, failed.input_key]
    second = _file(
        "s3://b/m/attempt-0004.rejects/x.rejects-a4.csv",
        attempt=4,
        rows_in=3,
        rows_out=3,
        rows_rejected=0,
        output_key="s3://b/out/x.rejects-a4.csv",
        part_of=source.input_key,
    )
    (done,) = settle_parts([source, first, failed, second])
    assert (done.rows_out, done.rows_rejected, done.rejects_key) == (100, 0, None)
    assert sources_with_rejects([source, first, failed, second]) == []
    # The newest part, unfinished, is a file of the step's; an older unfinished one a newer part took again is not.
    running = dataclasses.replace(failed, status=FileStatus.RUNNING)
    newer = dataclasses.replace(second, status=FileStatus.RUNNING)
    assert [f.input_key for f in settle_parts([source, first, running, newer])] == [source.input_key, newer.input_key]


def test_a_part_of_an_earlier_version_of_its_source_counts_for_nothing():
    """The source changed again after its rows were picked, and was scored again whole (attempt 3): the part of
    attempt 2 holds rows its source's new output holds too."""
    source = _file("s3://b/in/x.csv", attempt=3, rows_in=100, rows_out=100, rows_rejected=0)
    old = _file(
        "s3://b/m/attempt-0002.rejects/x.rejects-a2.csv",
        attempt=2,
        rows_in=10,
        rows_out=10,
        rows_rejected=0,
        output_key="s3://b/out/x.rejects-a2.csv",
        part_of=source.input_key,
    )
    assert settle_parts([source, old]) == [source]
    assert stale_parts([source, old]) == {old.input_key}


def test_a_blank_json_line_of_white_space_is_no_row():
    picked, rows = pick_lines(io.BytesIO(b'{"a":1}\n   \n{"a":2}\n'), [2], header=False, fmt="jsonl")
    assert (picked, rows) == (b'{"a":2}\n', 2)


# -- a FILE item the job wrote itself is no source to pick from (M-19) ------------------------------------------


@pytest.fixture
def planned(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    """A step planned over two CSV files (no job run), x.csv succeeded with row 2 rejected as its instance records
    it, and another bucket the step has nothing to do with."""
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    body = b"id,a\n0,1.0\n1,oops\n2,3.0\n"
    spec, bucket = stage_step(
        "rejects_forged",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {"x.csv": body, "y.csv": body},
        step_settings={"tolerance": {"rows": 5}},
    )
    attempt = step_plan.plan(spec, "score", plan_request("run-f", bucket))
    folder = naming.worker_manifest_folder(attempt.output_prefix, "run-f", "score", 1, attempt.metadata_prefix)
    rejects = f"{folder}/rejects/x.csv.jsonl"
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key=parse_s3_uri(rejects)[1], Body=b'{"row": 2, "reason": "oops"}\n')
    worker = WorkerLedger(
        LedgerContext(spec.ledger_table, spec.pipeline, "run-f", "score", 1, input_uri=f"s3://{bucket}/in/"), "algo-1"
    )
    worker.claim_file("x.csv")
    done = FinishedFile(FileStatus.SUCCEEDED, rows_in=3, rows_out=2, rows_rejected=1, rejects_key=rejects)
    worker.finish_file("x.csv", done)
    other = f"other-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=other)
    s3.put_object(Bucket=other, Key="secret.csv", Body=b"id,a\n0,42.0\n")
    s3.put_object(Bucket=other, Key="rejects.jsonl", Body=b'{"row": 1, "reason": "forged"}\n')
    return spec, bucket, other


def _forge(spec, input_key: str, attempt: int = 1, **attributes) -> None:
    """A FILE item as a job's own code can write one (its role may write its pipeline's FILE items)."""
    model = services.ledger_model(spec)
    model(
        run_pk(spec.pipeline, "run-f"),
        file_sk("score", input_key),
        status=FileStatus.SUCCEEDED.value,
        attempt=attempt,
        input_key=input_key,
        rows_in=1,
        rows_out=0,
        rows_rejected=1,
        **attributes,
    ).save()


def _every_object() -> dict[str, set[tuple[str, str]]]:
    s3 = boto3.client("s3")
    found = {}
    for b in s3.list_buckets()["Buckets"]:
        listed = s3.list_objects_v2(Bucket=b["Name"]).get("Contents", [])
        found[b["Name"]] = {(o["Key"], o["ETag"]) for o in listed}
    return found


def _refused(spec, keys: list[str], named: str) -> None:
    """``resubmit --rejects`` of ``keys`` refuses, naming ``named``, and writes no object anywhere; the on-call's
    plan (a dry run's too) refuses alike, before Airflow is asked anything."""
    ref = StepRef(spec.pipeline, "run-f", "score")
    before = _every_object()
    with pytest.raises(Conflict, match=re.escape(named)):
        OnCall({spec.pipeline: spec}).plan_resubmission(
            RunRef(spec.pipeline, "run-f"), "score", FileChoice(rejects=True)
        )
    with pytest.raises(RejectsPartError, match=re.escape(named)):
        resubmit_rejects(spec, latest_attempt(spec, ref), keys)
    assert _every_object() == before
    assert latest_attempt(spec, ref).number == 1  # nothing planned either


def test_a_forged_file_of_another_bucket_is_refused_and_nothing_is_written(planned):
    spec, bucket, other = planned
    forged = f"s3://{other}/secret.csv"
    _forge(spec, forged, rejects_key=f"s3://{other}/rejects.jsonl")
    _refused(spec, [f"s3://{bucket}/in/x.csv", forged], forged)


def test_a_planned_file_whose_rejects_list_lies_in_another_bucket_is_refused(planned):
    spec, bucket, other = planned
    _forge(spec, f"s3://{bucket}/in/y.csv", rejects_key=f"s3://{other}/rejects.jsonl")
    _refused(spec, [f"s3://{bucket}/in/x.csv", f"s3://{bucket}/in/y.csv"], f"s3://{other}/rejects.jsonl")


def test_a_forged_part_of_a_planned_file_is_refused(planned):
    """A FILE item naming itself attempt 2's rejects part of x.csv, in another bucket, with its rows map there."""
    spec, bucket, other = planned
    part = f"s3://{other}/m/attempt-0002.rejects/x.rejects-a2.csv"
    boto3.client("s3").put_object(Bucket=other, Key="m/attempt-0002.rejects.json", Body=json.dumps({part: [1, 2, 3]}))
    _forge(spec, part, attempt=2, part_of=f"s3://{bucket}/in/x.csv", rejects_key=f"s3://{other}/rejects.jsonl")
    _refused(spec, [f"s3://{bucket}/in/x.csv"], part)
