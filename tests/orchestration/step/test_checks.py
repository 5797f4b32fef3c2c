"""A step's output checks on real runs (moto_server, the local backend, the real worker): computed from the profiles
the workers recorded while they scored, a failing blocking check holds back ``_SUCCESS`` and fails the step naming
the check, its value and its bound, and a warn check only says so."""

from __future__ import annotations

import io

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.planning.naming import run_folder
from shardline.report.model import RunReport
from shardline.spec import parse_spec
from tests.support.pipelines import plan_request, stage_step, wait_for_job

CHECKS = {
    "last": 3,
    "rows_out": {"at_least": 1000, "within": 0.5},
    "columns": {
        "prediction": {"min_distinct": 2, "class_share_within": 0.15, "max_null_share": 0},
        "proba_1": {"min": 0, "max": 1, "mean_within": 0.25, "max_nan_share": 0},
    },
    "features": {"f0": {"max_null_share": 0.01, "max_psi": 0.25}},
}


def _table(rows: int, seed: int) -> pa.Table:
    return synthetic.make_table(rows, first_id=seed * 10_000, seed=seed)


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


@pytest.fixture
def pipeline(aws_env, ledger_table, sklearn_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "checks_test",
        ledger_table,
        sklearn_model.parent,
        tmp_path,
        {f"part-{i}.parquet": _parquet(_table(400, i)) for i in range(4)},
        features=synthetic.feature_names(),
        step_settings={"probabilities": True, "checks": CHECKS},
    )


def _put(bucket: str, folder: str, tables: dict[str, pa.Table]) -> None:
    s3 = boto3.client("s3")
    for name, table in tables.items():
        s3.put_object(Bucket=bucket, Key=f"{folder}/{name}", Body=_parquet(table))


def _run(spec, bucket, run_id, folder="in", action="ADVANCE"):
    request = plan_request(
        run_id, bucket, input_prefix=f"s3://{bucket}/{folder}/", output_prefix=f"s3://{bucket}/out/{run_id}/"
    )
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", request)).attempt
    wait_for_job(spec, attempt)
    status = step_end.finish(spec, attempt, action, "all files succeeded")
    key = f"out/{run_id}/_shardline/reports/{run_folder(run_id)}/score/report.json"
    report = RunReport.from_json(boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    return attempt, status, report


def _success_marker(bucket: str, run_id: str) -> bool:
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=f"out/{run_id}/")
    return f"out/{run_id}/_SUCCESS" in {o["Key"] for o in listed.get("Contents", [])}


def _verdicts(report: RunReport) -> dict[str, str]:
    return {c.check: c.verdict for c in report.checks}


def test_every_check_passes_on_good_partitions_and_the_bands_wait_for_history(pipeline):
    spec, bucket = pipeline
    _, status, first = _run(spec, bucket, "run-1")
    assert status.value == "SUCCEEDED" and _success_marker(bucket, "run-1"), (first.reconciliation, first.checks)
    verdicts = _verdicts(first)
    # No earlier partition: the bands say so, and every other check passed on the workers' own counts.
    for band in (
        "checks.rows_out.within",
        "checks.columns.prediction.class_share_within",
        "checks.columns.proba_1.mean_within",
        "checks.features.f0.max_psi",
        "drift.max_psi",
    ):
        assert verdicts.pop(band) == "n/a", band
    assert set(verdicts.values()) == {"pass"}, verdicts
    assert first.profile["outputs"]["prediction"]["rows"] == 1600
    assert first.profile["inputs"]["f0"]["rows"] == 1600  # the input feature the checks name, counted as read

    _put(bucket, "in-2", {f"part-{i}.parquet": _table(400, 10 + i) for i in range(4)})
    _, status, second = _run(spec, bucket, "run-2", "in-2")
    assert status.value == "SUCCEEDED" and _success_marker(bucket, "run-2")
    verdicts = _verdicts(second)
    assert verdicts.pop("drift.max_psi") in ("pass", "fail")  # a warn check: it never holds anything back
    assert set(verdicts.values()) == {"pass"}, second.checks
    [rows] = [c for c in second.checks if c.check == "checks.rows_out.within"]
    assert rows.history == [1600.0] and rows.value == 1600


def test_a_constant_partition_is_held_back_naming_each_check_value_and_bound(pipeline):
    spec, bucket = pipeline
    _run(spec, bucket, "run-1")
    # One file of 300 copies of one row, its f0 missing: the model answers one class, one probability.
    row = _table(1, 99)
    constant = pa.concat_tables([row] * 300)
    constant = constant.set_column(1, "f0", pa.array(np.full(300, np.nan, dtype=np.float32)))
    _put(bucket, "in-bad", {"part-0.parquet": constant})

    attempt, status, report = _run(spec, bucket, "run-bad", "in-bad")
    assert status.value == "FAILED"
    assert not _success_marker(bucket, "run-bad")  # held back: readers never see it complete
    failed = {c.check: c for c in report.checks if c.verdict == "fail"}
    assert {
        "checks.rows_out.at_least",
        "checks.rows_out.within",
        "checks.columns.prediction.min_distinct",
        "checks.columns.prediction.class_share_within",
        "checks.features.f0.max_null_share",
    } <= set(failed), report.checks
    distinct = failed["checks.columns.prediction.min_distinct"]
    assert (distinct.value, distinct.bound, distinct.files) == (1, "at least 2", ["part-0.parquet"])
    assert failed["checks.rows_out.at_least"].line() == "checks.rows_out.at_least: 300 against at least 1,000"
    assert failed["checks.features.f0.max_null_share"].shown == "100%"
    # The range holds (probabilities stay in [0, 1]) and nothing is NaN.
    verdicts = _verdicts(report)
    assert verdicts["checks.columns.proba_1.min"] == verdicts["checks.columns.proba_1.max"] == "pass"
    assert verdicts["checks.columns.proba_1.max_nan_share"] == "pass"

    message = step_end.step_message(spec, attempt)
    assert message.startswith("checks: blocked by checks.rows_out.at_least: 300 against at least 1,000 (and ")
    assert "shardline checks checks_test/run-bad" in message
    assert "shardline approve checks_test/run-bad --step score --reason" in message
    assert "shardline rerun checks_test/run-bad" in message
    assert "--all-failed" not in message  # no file failed: resubmitting failed files would do nothing


def test_a_warn_check_that_fails_keeps_the_step_green(pipeline):
    spec, bucket = pipeline
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["checks"] = {"rows_out": {"at_least": 10_000, "level": "warn"}}
    lenient = parse_spec(data, "checks_test.yaml")
    _, status, report = _run(lenient, bucket, "run-warn")
    assert status.value == "SUCCEEDED" and _success_marker(bucket, "run-warn")
    [rows] = [c for c in report.checks if c.check == "checks.rows_out.at_least"]
    assert (rows.level, rows.verdict, rows.value) == ("warn", "fail", 1600)


def test_a_check_on_a_column_the_step_never_writes_fails_closed(pipeline):
    spec, bucket = pipeline
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["checks"] = {"columns": {"score": {"min_distinct": 2}}, "features": {"age": {"max_psi": 0.2}}}
    typo = parse_spec(data, "checks_test.yaml")
    attempt, status, report = _run(typo, bucket, "run-typo")
    assert status.value == "FAILED" and not _success_marker(bucket, "run-typo")
    failed = {c.check: c.bound for c in report.checks if c.verdict == "fail"}
    assert (
        "the step wrote no column 'score' (its columns: prediction, proba_0, proba_1)" in failed["checks.columns.score"]
    )
    assert "the workers read no feature 'age'" in failed["checks.features.age"]
    assert step_end.step_message(typo, attempt).startswith("checks: blocked by checks.columns.score: missing against")


def test_psi_against_a_baseline_made_once_from_a_file(pipeline):
    from shardline.orchestration.step.baseline import make_baseline

    spec, bucket = pipeline
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["checks"] = {
        "reference": "baseline",
        "columns": {"proba_1": {"max_psi": 0.2}},
        "features": {"f0": {"max_psi": 0.2}},
    }
    against = parse_spec(data, "checks_test.yaml")
    # No baseline yet: the checks that need it fail, naming the command that makes one.
    _, status, report = _run(against, bucket, "run-before")
    assert status.value == "FAILED"
    [psi] = [c for c in report.checks if c.check == "checks.columns.proba_1.max_psi"]
    assert psi.verdict == "fail" and "shardline checks baseline checks_test --step score --from" in psi.bound

    # A validation set's predictions and features, as a user keeps them: one parquet file.
    s3 = boto3.client("s3")
    outputs = [
        pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()))
        for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/run-before/")["Contents"]
        if o["Key"].endswith(".parquet") and "/_" not in o["Key"]
    ]
    predictions = pa.concat_tables(outputs).sort_by("id")
    features = pa.concat_tables([_table(400, i) for i in range(4)]).sort_by("id")
    validation = predictions.append_column("f0", features.column("f0"))
    s3.put_object(Bucket=bucket, Key="validation/predictions.parquet", Body=_parquet(validation))
    made = make_baseline(against, "score", f"s3://{bucket}/validation/predictions.parquet", "data-eng")
    assert made["rows"] == 1600 and set(made["profile"]["outputs"]) >= {"proba_1", "f0"}

    _, status, report = _run(against, bucket, "run-same")  # the same inputs: the same predictions
    assert status.value == "SUCCEEDED", report.checks
    psis = {c.check: c for c in report.checks if c.check.endswith("max_psi")}
    assert psis["checks.columns.proba_1.max_psi"].value == pytest.approx(0.0, abs=1e-6)
    assert "validation/predictions.parquet" in psis["checks.features.f0.max_psi"].bound

    shifted = {f"part-{i}.parquet": _table(400, 20 + i) for i in range(4)}
    for name, table in shifted.items():
        shifted[name] = table.set_column(1, "f0", pc.add(table.column("f0"), 3.0))
    _put(bucket, "in-shifted", shifted)
    _, status, report = _run(against, bucket, "run-shifted", "in-shifted")
    assert status.value == "FAILED"
    failed = {c.check for c in report.checks if c.verdict == "fail"}
    assert "checks.features.f0.max_psi" in failed, report.checks


SCRIPT = """
import json

import numpy as np


def model_fn(model_dir):
    return None


def predict_fn(data, model):
    return data[:, 0]  # the first feature, as it is: a model that passes its input through


def output_fn(prediction, accept):
    # A missing feature comes back as null on every tenth row, as NaN on the others.
    return json.dumps([None if np.isnan(v) and i % 10 == 0 else float(v) for i, v in enumerate(prediction)])
"""


def test_a_scripts_range_nulls_nans_mean_and_psi_fail_their_checks(aws_env, ledger_table, tmp_path, monkeypatch):
    """The checks a well-behaved model never trips, tripped by a script that passes its first feature through: out
    of range, null and NaN where the feature is missing, and a mean and distribution that move with the input."""
    from examples import synthetic
    from tests.support.helpers import write_inference_script

    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    write_inference_script(tmp_path / "script", SCRIPT)
    checks = {
        "columns": {
            "prediction": {
                "min": -6,
                "max": 6,
                "max_null_share": 0.01,
                "max_nan_share": 0.01,
                "mean_within": 0.5,
                "max_psi": 0.25,
            }
        }
    }
    around_one = {f"part-{i}.parquet": _table(400, i) for i in range(2)}  # f0 moved to a mean of 1
    around_one = {name: t.set_column(1, "f0", pc.add(t["f0"], 1.0)) for name, t in around_one.items()}
    staged, bucket = stage_step(
        "checks_script",
        ledger_table,
        tmp_path / "script",
        tmp_path,
        {name: _parquet(t) for name, t in around_one.items()},
        features=synthetic.feature_names(),
        step_settings={"checks": checks},
    )
    data = staged.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["model"]["allow_nan_predictions"] = True  # NaN is written, for the check to see
    spec = parse_spec(data, "checks_script.yaml")
    _, status, first = _run(spec, bucket, "run-1")
    assert status.value == "SUCCEEDED", first.checks
    assert {c.verdict for c in first.checks if c.check.startswith("checks.")} <= {"pass", "n/a"}

    shifted = []
    for i in range(2):
        table = _table(400, 30 + i)
        f0 = pc.add(table["f0"], 9.0).to_numpy().copy()  # upstream moved the feature, and lost a fifth of it
        f0[::5] = np.nan
        shifted.append(table.set_column(1, "f0", pa.array(f0)))
    _put(bucket, "in-bad", {f"part-{i}.parquet": t for i, t in enumerate(shifted)})
    _, status, report = _run(spec, bucket, "run-bad", "in-bad")
    assert status.value == "FAILED"
    failed = {c.check: c for c in report.checks if c.verdict == "fail"}
    assert {
        "checks.columns.prediction.max",
        "checks.columns.prediction.max_null_share",
        "checks.columns.prediction.max_nan_share",
        "checks.columns.prediction.mean_within",
        "checks.columns.prediction.max_psi",
    } <= set(failed), report.checks
    # A fifth of the rows lost f0: half of those come back null (every tenth row), the other half NaN.
    assert failed["checks.columns.prediction.max_null_share"].shown == "10%"
    assert failed["checks.columns.prediction.max_nan_share"].shown == "10%"
    assert failed["checks.columns.prediction.max"].bound == "at most 6"
    assert "against run run-1" in failed["checks.columns.prediction.max_psi"].bound


def test_an_instance_lost_before_its_manifest_went_up_still_has_every_file_counted(pipeline):
    """Each file's profile goes up beside the instance's manifest with its output: the checks count a lost instance's
    finished files from there; a file with neither is not counted, and says so (the checks then fail)."""
    from shardline.orchestration.step.files import read_step_files
    from shardline.orchestration.step.run_report import current_profile

    spec, bucket = pipeline
    attempt, status, _ = _run(spec, bucket, "run-lost")
    assert status.value == "SUCCEEDED"
    s3 = boto3.client("s3")
    metadata = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/run-lost/_shardline/")["Contents"]]
    manifests = [k for k in metadata if k.rsplit("/", 1)[-1].startswith("manifest-")]
    beside = sorted(k for k in metadata if "/profiles/" in k)
    assert manifests and [k.rsplit("/", 1)[-1] for k in beside] == [f"part-{i}.parquet.json" for i in range(4)]
    for key in manifests:  # as if the instance were lost before its end
        s3.delete_object(Bucket=bucket, Key=key)
    files = read_step_files(spec, attempt.ref).files
    counted = current_profile(spec, attempt, files)
    assert counted.missing is None and counted.merged.outputs["prediction"].rows == 1600
    s3.delete_object(Bucket=bucket, Key=beside[0])
    counted = current_profile(spec, attempt, files)
    assert counted.merged.outputs["prediction"].rows == 1200
    assert (
        counted.missing.startswith("1 of 4 file(s) cannot be counted: ")
        and "part-0.parquet: no profile" in counted.missing
    )
