"""tolerance.rows through a whole step: the local backend runs the worker on moto_server, the step ends, and the
rejected rows are accounted for in the FILE item, the step's summary, `shardline status`, `shardline failed`, the
outputs manifest and the run report (rows in = rows out + rows rejected everywhere)."""

from __future__ import annotations

import io
import json
import time

import boto3
import numpy as np
import pyarrow.csv as pacsv
import pytest

from examples import synthetic
from shardline.decision.policy import Action
from shardline.ledger.keys import StepRef
from shardline.oncall.errors import Conflict
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice, RunRef
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step import watch
from shardline.orchestration.step.files import latest_attempt
from shardline.planning import naming
from shardline.s3uri import parse_s3_uri
from tests.support.pipelines import plan_request, stage_step, wait_for_job

ROWS, BAD = 200_000, 37


def csv_with_bad_lines(rows: int, bad: int, seed: int = 5) -> tuple[bytes, list[int]]:
    """A CSV export of ``rows`` rows in which ``bad`` lines are broken the ways exports break: an extra field, a
    missing one, or text where a number goes. Returns the bytes and the broken lines (1-based, header line 1)."""
    buf = io.BytesIO()
    pacsv.write_csv(synthetic.make_table(rows, seed=seed), buf)
    lines = buf.getvalue().decode().splitlines()
    broken = sorted(int(n) for n in np.random.default_rng(seed).choice(np.arange(2, rows + 2), bad, replace=False))
    for k, line in enumerate(broken):
        fields = lines[line - 1].split(",")
        if k % 3 == 0:
            fields.append("9.5")
        elif k % 3 == 1:
            fields.pop()
        else:
            fields[1] = "n.a."
        lines[line - 1] = ",".join(fields)
    return ("\n".join(lines) + "\n").encode(), broken


@pytest.fixture(scope="module")
def export() -> tuple[bytes, list[int]]:
    return csv_with_bad_lines(ROWS, BAD)


@pytest.fixture(scope="module")
def small_export() -> tuple[bytes, list[int]]:
    return csv_with_bad_lines(20_000, BAD)


def _staged(export, ledger_table, xgboost_model, tmp_path, rows_tolerated: int):
    body, _ = export
    return stage_step(
        "rejects_test",
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {"part-0.csv": body},
        step_settings={"tolerance": {"rows": rows_tolerated}, "resources": {"instance_count": 1}},
    )


@pytest.mark.slow
def test_a_csv_with_malformed_lines_ends_green_with_every_reject_listed(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch, export
):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    spec, bucket = _staged(export, ledger_table, xgboost_model, tmp_path, 100)
    s3 = boto3.client("s3")
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-rj", bucket))).attempt
    wait_for_job(spec, attempt, timeout=600)
    decision = watch.decide_now(spec, attempt)
    assert decision.action.value == "ADVANCE", decision
    assert step_end.finish(spec, attempt, Action.ADVANCE, decision.reason).value == "SUCCEEDED"
    summary = step_end.summarize(spec, StepRef(spec.pipeline, "run-rj", "score"))
    assert (summary.rows_in, summary.rows_out, summary.rows_rejected) == (ROWS, ROWS - BAD, BAD)
    assert summary.rows_mismatched_files == ()
    assert "out/_SUCCESS" in {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}

    _, broken = export
    oncall = OnCall({spec.pipeline: spec})
    ref = RunRef(spec.pipeline, "run-rj")
    step = oncall.status(ref).steps[0]
    assert (step.rows_in, step.rows_out, step.rows_rejected) == (ROWS, ROWS - BAD, BAD)
    (listed,) = oncall.failed(ref)
    assert (listed.status, listed.rows_rejected) == ("SUCCEEDED", BAD)
    assert [r["line"] for r in listed.rejects] == broken
    assert all(r["reason"] for r in listed.rejects)

    report = json.loads(s3.get_object(Bucket=bucket, Key=parse_s3_uri(attempt.report_uri("json"))[1])["Body"].read())[
        "reconciliation"
    ]
    assert (report["rows_in"], report["rows_out"], report["rows_rejected"], report["balanced"]) == (
        ROWS,
        ROWS - BAD,
        BAD,
        True,
    )
    assert [r["where"].split(" (")[0] for r in report["rejects"]] == [f"line {n}" for n in broken]

    # resubmit --rejects picks rows by number: a "fix" that drops a line would shift them, and is refused.
    key = listed.input_key.removeprefix(f"s3://{bucket}/")
    lines = export[0].decode().splitlines(keepends=True)
    s3.put_object(Bucket=bucket, Key=key, Body="".join(lines[:-1]).encode())
    with pytest.raises(Conflict, match=f"now has {ROWS - 1:,} data rows; it had {ROWS:,}"):
        oncall.resubmit(ref, "score", FileChoice(rejects=True), ledger_only=True)

    # Not mended yet: the 37 rows are taken again and rejected again, each alone (all of them failing again is no
    # sign of a wrong setting), and the step stays green with the same figures.
    s3.put_object(Bucket=bucket, Key=key, Body=export[0])
    _rescore(spec, oncall, ref, 2, [listed.input_key])
    summary = step_end.summarize(spec, StepRef(spec.pipeline, "run-rj", "score"))
    assert (summary.files, summary.rows_out, summary.rows_rejected) == (1, ROWS - BAD, BAD), summary
    (again,) = oncall.failed(ref)
    assert (again.input_key, again.rows_rejected) == (listed.input_key, BAD)

    # Mended in place, the 37 rows are scored again, exactly them, as one more part of the same file.
    table = synthetic.make_table(ROWS, seed=5)
    mended = io.BytesIO()
    pacsv.write_csv(table, mended)
    s3.put_object(Bucket=bucket, Key=key, Body=mended.getvalue())
    second = _rescore(spec, oncall, ref, 3, [listed.input_key])

    summary = step_end.summarize(spec, StepRef(spec.pipeline, "run-rj", "score"))
    assert (summary.files, summary.rows_in, summary.rows_out, summary.rows_rejected) == (1, ROWS, ROWS, 0)
    assert oncall.failed(ref) == []
    step = oncall.status(ref).steps[0]
    assert (step.rows_in, step.rows_out, step.rows_rejected) == (ROWS, ROWS, 0)
    part = pacsv.read_csv(io.BytesIO(s3.get_object(Bucket=bucket, Key="out/part-0.rejects-a3.csv")["Body"].read()))
    assert part["id"].to_pylist() == [line - 2 for line in broken]  # id n is on line n + 2
    import xgboost as xgb

    booster = xgb.Booster(model_file=str(xgboost_model))
    expected = booster.predict(xgb.DMatrix(table.take([line - 2 for line in broken]).drop(["id"]).to_pandas()))
    assert np.allclose(part["prediction"].to_numpy(), expected, rtol=1e-6, atol=1e-6)
    main = pacsv.read_csv(io.BytesIO(s3.get_object(Bucket=bucket, Key="out/part-0.csv")["Body"].read()))
    assert set(main["id"].to_pylist()).isdisjoint(part["id"].to_pylist())
    assert main.num_rows + part.num_rows == ROWS  # no row lost, none written twice

    listed_outputs = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert {"out/_SUCCESS", "out/part-0.csv", "out/part-0.rejects-a3.csv"} <= listed_outputs
    where = naming.outputs_manifest_key(second.output_prefix, "run-rj", "score", second.metadata_prefix)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=parse_s3_uri(where)[1])["Body"].read())
    assert (manifest["files"], manifest["rows_out"], manifest["rows_rejected"]) == (1, ROWS, 0)
    assert sorted((o["output"], o.get("part_of")) for o in manifest["outputs"]) == [
        (f"s3://{bucket}/out/part-0.csv", None),
        (f"s3://{bucket}/out/part-0.rejects-a2.csv", listed.input_key),
        (f"s3://{bucket}/out/part-0.rejects-a3.csv", listed.input_key),
    ]


@pytest.mark.slow
def test_over_the_limit_the_file_fails_naming_its_first_rejects(
    aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch, small_export
):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    spec, bucket = _staged(small_export, ledger_table, xgboost_model, tmp_path, 10)
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-rj10", bucket))).attempt
    wait_for_job(spec, attempt, timeout=600)
    (failed,) = OnCall({spec.pipeline: spec}).failed(RunRef(spec.pipeline, "run-rj10"))
    _, broken = small_export
    assert failed.error_class == "TooManyRejectsError"
    assert "more than tolerance.rows allows (10 row(s))" in failed.error_message
    assert f"line {broken[0]}" in failed.error_message


def _rescore(spec, oncall, ref, number: int, files: list[str]):
    """`shardline resubmit --rejects` (no Airflow), and the attempt it submitted run to its end."""
    result = oncall.resubmit(ref, "score", FileChoice(rejects=True), ledger_only=True)
    assert (result.attempt, result.plan.files) == (number, files), result
    attempt = latest_attempt(spec, StepRef(spec.pipeline, ref.run_id, "score")).submitted(time.time())
    wait_for_job(spec, attempt, timeout=600)
    decision = watch.decide_now(spec, attempt)
    assert decision.action.value == "ADVANCE", decision
    assert step_end.finish(spec, attempt, Action.ADVANCE, decision.reason).value == "SUCCEEDED"
    return attempt
