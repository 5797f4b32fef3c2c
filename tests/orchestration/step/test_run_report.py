"""The run report of real runs (moto_server, the local backend, the real worker): it agrees with the ledger,
compares each run with the previous successful one, and a drift beyond the spec's limit can fail the step."""

from __future__ import annotations

import io
import json

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.ledger.keys import StepRef
from shardline.ledger.step_reads import read_step
from shardline.orchestration import services
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from shardline.planning.naming import run_folder
from shardline.report.cost import Prices
from shardline.report.model import RunReport
from shardline.spec import parse_spec
from tests.support.pipelines import parquet_bytes, plan_request, stage_step, wait_for_job


@pytest.fixture
def pipeline(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "report_test",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {f"part-{i}.parquet": parquet_bytes(400, i * 400) for i in range(4)},
    )


def _run(spec, bucket, run_id, action="ADVANCE", input_folder="in"):
    request = plan_request(
        run_id,
        bucket,
        instances=2,  # the report breaks a step down by instance
        input_prefix=f"s3://{bucket}/{input_folder}/",
        output_prefix=f"s3://{bucket}/out/{run_id}/",
    )
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", request)).attempt
    wait_for_job(spec, attempt)
    return attempt, step_end.finish(spec, attempt, action, "all 4 files succeeded")


def _report(bucket, run_id) -> RunReport:
    key = f"out/{run_id}/_shardline/reports/{run_folder(run_id)}/score/report.json"
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)
    return RunReport.from_json(body["Body"].read())


def test_the_report_of_a_run_agrees_with_its_ledger_and_the_next_run_compares_with_it(pipeline):
    spec, bucket = pipeline
    _, status = _run(spec, bucket, "run-a")
    assert status.value == "SUCCEEDED"
    first = _report(bucket, "run-a")

    records = read_step(services.ledger_model(spec), StepRef(spec.pipeline, "run-a", "score"), file_attributes=None)
    assert first.reconciliation.files == len(records.files) == 4
    assert first.reconciliation.rows_out == sum(int(f.rows_out) for f in records.files) == 1600
    assert first.reconciliation.balanced
    by_host = {}
    for item in records.files:
        by_host[item.host] = by_host.get(item.host, 0) + 1
    assert {s.host: s.files for s in first.instances} == by_host and len(by_host) == 2
    # Cost: instance-seconds x the instance type's price (the local backend is priced as its instance type).
    price = Prices.default().hourly("ml.m5.xlarge")
    assert first.cost.instance_seconds == pytest.approx(sum(s.seconds for s in first.instances))
    assert first.cost.total == pytest.approx(first.cost.instance_seconds * price / 3600)
    assert first.cost.cost_per_million == pytest.approx(first.cost.total / 1600 * 1e6)
    # The predictions' distribution is every written prediction, and there is nothing to compare with yet.
    assert first.drift.current_histogram["count"] == 1600
    assert (first.drift.verdict, first.drift.reference_run_id) == ("n/a", None)
    html = boto3.client("s3").get_object(
        Bucket=bucket, Key=f"out/run-a/_shardline/reports/{run_folder('run-a')}/score/report.html"
    )
    assert html["ContentType"].startswith("text/html") and b"<img" in html["Body"].read()
    assert (
        step_end.summarize(spec, StepRef(spec.pipeline, "run-a", "score")).report
        == f"s3://{bucket}/out/run-a/_shardline/reports/{run_folder('run-a')}/score/report.html"
    )

    _run(spec, bucket, "run-b")  # the same inputs again
    second = _report(bucket, "run-b")
    assert second.drift.reference_run_id == "run-a"
    assert second.drift.psi == pytest.approx(0.0, abs=1e-9)  # the same predictions
    assert second.drift.verdict == "stable"
    assert [p.run_id for p in second.cost.trend] == ["run-a", "run-b"]


def _drifted_inputs(bucket: str) -> None:
    s3 = boto3.client("s3")
    for i in range(4):
        table = synthetic.make_table(400, first_id=i * 400, seed=i * 400)
        shifted = pa.table(
            {
                name: (table[name] if name == "id" else pa.array(table[name].to_numpy() * 3 + 2))
                for name in table.column_names
            }
        )
        buf = io.BytesIO()
        pq.write_table(shifted, buf)
        s3.put_object(Bucket=bucket, Key=f"in-shifted/part-{i}.parquet", Body=buf.getvalue())


def test_drift_beyond_max_psi_fails_the_step_with_the_psi_when_the_spec_says_fail(pipeline):
    spec, bucket = pipeline
    _run(spec, bucket, "run-ref")
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["drift"] = {"max_psi": 0.2, "action": "fail"}
    strict = parse_spec(data, "report_test.yaml")
    _drifted_inputs(bucket)

    attempt, status = _run(strict, bucket, "run-shifted", input_folder="in-shifted")
    assert status.value == "FAILED"
    message = step_end.step_message(strict, attempt)
    report = _report(bucket, "run-shifted")
    assert report.drift.verdict == "drift" and report.drift.psi > 0.2
    assert message.startswith(f"checks: blocked by drift.max_psi: {report.drift.psi:.3f} against below 0.2 ")
    assert "run-ref" in message and "shardline approve report_test/run-shifted --step score" in message
    [drift] = [c for c in report.checks if c.check == "drift.max_psi"]
    assert (drift.level, drift.verdict) == ("blocking", "fail")
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="out/run-shifted/")["Contents"]}
    assert "out/run-shifted/_SUCCESS" not in keys  # a drifted step is not complete for its readers


def test_drift_with_warn_keeps_the_step_green_and_says_so_in_the_report(pipeline):
    spec, bucket = pipeline
    _run(spec, bucket, "run-ref")
    _drifted_inputs(bucket)
    _, status = _run(spec, bucket, "run-shifted", input_folder="in-shifted")  # drift.action: warn (default)
    assert status.value == "SUCCEEDED"
    report = _report(bucket, "run-shifted")
    assert report.drift.verdict == "drift"
    html = (
        boto3.client("s3")
        .get_object(
            Bucket=bucket, Key=f"out/run-shifted/_shardline/reports/{run_folder('run-shifted')}/score/report.html"
        )["Body"]
        .read()
        .decode()
    )
    assert f"{report.drift.psi:.3f}" in html or f"{report.drift.psi:.2f}" in html
    assert json.loads(report.to_json())["drift"]["reference_run_id"] == "run-ref"


def _forge(spec, bucket, run_id, input_key: str, **attributes) -> None:
    """Write a FILE item as anything but the worker could: straight to the table, in its stored names."""
    from shardline.ledger.keys import file_sk, run_pk

    item = {
        "pk": run_pk(spec.pipeline, run_id),
        "sk": file_sk("score", input_key),
        "st": "SUCCEEDED",
        "at": 1,
        "ik": input_key,
        "ho": "algo-1",
        **attributes,
    }
    boto3.client("dynamodb").put_item(
        TableName=spec.ledger_table,
        Item={name: {"N": str(value)} if isinstance(value, int) else {"S": value} for name, value in item.items()},
    )


@pytest.mark.parametrize("forgery", ["a file the job never wrote", "rows the worker did not write"])
def test_a_forged_succeeded_item_never_makes_a_run_green(pipeline, forgery):
    spec, bucket = pipeline
    run_id = f"run-forged-{forgery[:6].strip().replace(' ', '-')}"
    request = plan_request(run_id, bucket, output_prefix=f"s3://{bucket}/out/{run_id}/")
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", request)).attempt
    wait_for_job(spec, attempt)
    real_output = f"s3://{bucket}/out/{run_id}/part-0.parquet"
    real = read_step(services.ledger_model(spec), attempt.ref, file_attributes=None).files
    [genuine] = [f for f in real if f.output_key == real_output]
    # The forger copies the real item's bytes and sha256, so the object in S3 matches: only that no other file
    # may claim the output, and the instance's own manifest, can tell.
    copied = {"ok": real_output, "bout": genuine.bytes_out, "osha": genuine.output_sha256}
    if forgery == "a file the job never wrote":
        _forge(spec, bucket, run_id, f"s3://{bucket}/in/part-9.parquet", rout=400, **copied)
    else:
        _forge(spec, bucket, run_id, f"s3://{bucket}/in/part-0.parquet", rout=4000, **copied)
    decision = watch.decide_now(spec, attempt)
    assert decision.action == "ADVANCE"  # the policy, reading the ledger alone, calls it green

    status = step_end.finish(spec, attempt, decision.action, "every file succeeded")
    assert status is not None and status.value == "FAILED"
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=f"out/{run_id}/").get("Contents", [])
    assert not [o["Key"] for o in listed if o["Key"].endswith("_SUCCESS")]
    step = read_step(services.ledger_model(spec), StepRef(spec.pipeline, run_id, "score"), file_attributes=None).step
    assert "have no output in S3 that is the one the worker uploaded" in step.message
    assert step.message.count("shardline resubmit") == 1 and "--all-failed" in step.message
    assert (
        "part-0.parquet" in step.message
        if forgery != "a file the job never wrote"
        else "part-9.parquet" in step.message
    )
    # The forged file is FAILED now, so `shardline failed` shows it and `resubmit --all-failed` takes it.
    from shardline.oncall.selection import resubmittable
    from shardline.oncall.views import file_view

    files = read_step(services.ledger_model(spec), StepRef(spec.pipeline, run_id, "score"), file_attributes=None).files
    forged = f"s3://{bucket}/in/part-{'9' if forgery == 'a file the job never wrote' else '0'}.parquet"
    [item] = [f for f in files if f.input_key == forged]
    assert (item.status, item.error_class) == ("FAILED", "UnvouchedOutputError")
    assert forged in resubmittable(file_view("score", f) for f in files)


def test_a_run_the_worker_vouches_for_is_green(pipeline):
    spec, bucket = pipeline
    # An empty JSON lines input gets an empty (0-byte) output: vouched for like any other.
    boto3.client("s3").put_object(Bucket=bucket, Key="in/empty.jsonl", Body=b"")
    _, status = _run(spec, bucket, "run-vouched")
    assert status.value == "SUCCEEDED"
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="out/run-vouched/").get("Contents", [])
    assert [o["Key"] for o in listed if o["Key"].endswith("_SUCCESS")] == ["out/run-vouched/_SUCCESS"]
    # What the orchestrator wrote under _shardline/ carries the tag the bucket's lifecycle rule expires by.
    s3 = boto3.client("s3")
    written = [o["Key"] for o in listed if "/_shardline/" in o["Key"] and "/_shardline/instances/" not in o["Key"]]
    assert {k.rsplit("/", 1)[-1] for k in written} >= {"report.html", "report.json", "outputs.json"}
    for key in written:
        tags = s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
        assert tags == [{"Key": "shardline-retention", "Value": "metadata"}], (key, tags)


def test_the_report_reads_a_rejects_list_only_where_the_steps_instances_put_it(pipeline):
    """A job's own code can write its FILE items: a rejects_key pointing at another bucket is not read into the run
    report (its rows would be copied into report.json), and one in the attempt's instances/ folder is."""
    from shardline.ledger.records import FileRecord
    from shardline.ledger.states import FileStatus
    from shardline.orchestration.step.run_report import rejected_rows
    from shardline.planning.attempt import Attempt
    from shardline.planning.naming import worker_manifest_folder

    spec, bucket = pipeline
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=f"{bucket}-secret")
    s3.put_object(Bucket=f"{bucket}-secret", Key="rows.jsonl", Body=b'{"line": 1, "reason": "secret row"}\n')
    attempt = Attempt(
        pipeline=spec.pipeline,
        run_id="run-1",
        step="score",
        number=1,
        input_prefix=f"s3://{bucket}/in/",
        output_prefix=f"s3://{bucket}/out/",
        model_uri=f"s3://{bucket}/model/model.tar.gz",
    )
    own = f"{worker_manifest_folder(attempt.output_prefix, 'run-1', 'score', 1, None)}/rejects/a.jsonl"
    body = json.dumps({"line": 3, "reason": "not a number"}).encode() + b"\n"
    s3.put_object(Bucket=bucket, Key=own.removeprefix(f"s3://{bucket}/"), Body=body)

    def succeeded(key: str, rejects_key: str) -> FileRecord:
        return FileRecord(
            key, FileStatus.SUCCEEDED, 1, rows_in=10, rows_out=9, rows_rejected=1, rejects_key=rejects_key
        )

    found = rejected_rows(
        spec,
        attempt,
        [
            succeeded(f"s3://{bucket}/in/a.csv", own),
            succeeded(f"s3://{bucket}/in/b.csv", f"s3://{bucket}-secret/rows.jsonl"),
        ],
    )
    assert list(found) == [f"s3://{bucket}/in/a.csv"]
    assert [r.reason for r in found[f"s3://{bucket}/in/a.csv"]] == ["not a number"]
