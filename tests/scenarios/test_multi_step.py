"""The shipped two-step pipeline, `daily_churn`, end to end in a real `airflow standalone`.

Step 1 (`score`, a scikit-learn classifier) writes each customer's churn probability; step 2 (`calibrate`, the
user's own SageMaker-style inference.py) reads exactly the outputs step 1 committed, per its outputs manifest,
and writes one calibrated row per scored row. A file that fails in step 2 is resubmitted alone: step 1 never
runs again.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.ledger.table import create_ledger_table
from shardline.spec import load_spec
from tests.scenarios.test_oncall_airflow import shardline

pytestmark = pytest.mark.slow

PIPELINE = "daily_churn"
BUCKET = "shardline-demo"
ROWS = {"customers-0.parquet": 4_000, "customers-1.parquet": 3_000, "customers-2.parquet": 777}
FAILING_ROWS = 777  # the calibration refuses a batch of this size while the flag file exists


@pytest.fixture
def churn(airflow_stack, sklearn_model, tmp_path, monkeypatch):
    """The bucket, the ledger table, both models (step 2's refuses one file while a flag file exists)."""
    env = airflow_stack.env
    airflow_stack.use_aws(monkeypatch)
    s3 = airflow_stack.s3()
    spec = load_spec(airflow_stack.dags / "pipelines" / f"{PIPELINE}.yaml")
    s3.create_bucket(Bucket=BUCKET)
    create_ledger_table(spec.ledger_table, "us-east-1", env["AWS_ENDPOINT_URL"])
    synthetic.pack(sklearn_model.parent, tmp_path / "score.tar.gz")
    s3.upload_file(str(tmp_path / "score.tar.gz"), BUCKET, "models/sklearn/v1/model.tar.gz")
    flag = tmp_path / "refuse"
    # The shipped calibration, and a refusal a test can switch on: a fault in step 2 alone.
    script = synthetic.CALIBRATION_SCRIPT.replace(
        "def predict_fn(data, params):\n",
        "def predict_fn(data, params):\n"
        f"    if os.path.exists({str(flag)!r}) and len(data) == {FAILING_ROWS}:\n"
        "        raise ValueError('the calibration refuses this batch (the test switched it on)')\n",
    )
    synthetic.pack(synthetic.calibration_model(tmp_path / "calibration", script=script), tmp_path / "cal.tar.gz")
    s3.upload_file(str(tmp_path / "cal.tar.gz"), BUCKET, "models/calibration/v1/model.tar.gz")
    return {"s3": s3, "flag": flag}


def _rows(s3, prefix: str, columns: list[str]) -> dict[str, list]:
    """Every data file's rows under ``prefix`` (not _SUCCESS, not _shardline/), one column list per name."""
    found: dict[str, list] = {c: [] for c in columns}
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
        if "/_" in "/" + item["Key"][len(prefix) :] or item["Key"].endswith("-old.parquet"):
            continue  # markers, Shardline's own files, and the stale output the test planted
        table = pq.read_table(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()), columns=columns)
        for c in columns:
            found[c] += table.column(c).to_pylist()
    return found


def test_daily_churn_runs_both_steps_and_a_step_two_failure_is_resubmitted_alone(airflow_stack, churn, tmp_path):
    s3 = churn["s3"]
    day = dt.datetime(2026, 11, 18, tzinfo=dt.UTC)
    first = 0
    for name, rows in ROWS.items():
        path = tmp_path / "in" / name
        synthetic.write_table(synthetic.make_table(rows, first_id=first, seed=first), path, "parquet")
        s3.upload_file(str(path), BUCKET, f"customers/dt={day:%Y-%m-%d}/{name}")
        first += rows
    # An older run's output in step 1's prefix, for an input this partition no longer has: step 2 must not read it.
    stale = f"churn/scores/dt={day:%Y-%m-%d}/customers-old.parquet"
    s3.copy_object(
        Bucket=BUCKET,
        Key=stale,
        CopySource={"Bucket": BUCKET, "Key": f"customers/dt={day:%Y-%m-%d}/customers-0.parquet"},
    )
    churn["flag"].touch()  # step 2 refuses the 777-row file

    run_id = f"manual__{day:%Y%m%d}-{uuid.uuid4().hex[:6]}"
    airflow_stack.client().trigger(PIPELINE, {}, run_id=run_id, logical_date=day.isoformat())
    assert airflow_stack.wait_for_run(PIPELINE, run_id, timeout=600)["state"] == "failed", airflow_stack.tail()
    states = {t["task_id"]: t["state"] for t in airflow_stack.client().task_instances(PIPELINE, run_id)}
    assert states["watch_score"] == "success" and states["watch_calibrate"] == "failed", states
    ref = f"{PIPELINE}/{run_id}"
    failed = json.loads(shardline(airflow_stack, "failed", ref, "--json").stdout)
    assert [(r["step"], r["input_key"].rsplit("/", 1)[1]) for r in failed] == [("calibrate", "customers-2.parquet")]

    # Step 2's failed file alone goes again; step 1 is not rerun.
    churn["flag"].unlink()
    done = shardline(airflow_stack, "resubmit", ref, "--step", "calibrate", "--all-failed")
    assert done.returncode == 0, done.stdout + done.stderr
    airflow_stack.assert_succeeds(PIPELINE, run_id, 600)
    status = json.loads(shardline(airflow_stack, "status", ref, "--json").stdout)
    attempts = {s["name"]: (s["status"], s["attempt"], s["files"]) for s in status["steps"]}
    assert attempts == {"score": ("SUCCEEDED", 1, 3), "calibrate": ("SUCCEEDED", 2, 3)}, attempts

    # One calibrated row per scored row, joined on id, each the calibration of that customer's own score.
    scored = _rows(s3, f"churn/scores/dt={day:%Y-%m-%d}/", ["id", "proba_1"])
    calibrated = _rows(s3, f"churn/calibrated/dt={day:%Y-%m-%d}/", ["id", "prediction"])
    total = sum(ROWS.values())
    assert sorted(calibrated["id"]) == list(range(total))  # every customer once; the stale output was not read
    by_id = dict(zip(scored["id"], scored["proba_1"], strict=True))
    expected = synthetic.calibrate(np.array([by_id[i] for i in calibrated["id"]]))
    np.testing.assert_allclose(np.array(calibrated["prediction"]), expected, rtol=1e-5)
    marker = json.loads(s3.get_object(Bucket=BUCKET, Key=f"churn/calibrated/dt={day:%Y-%m-%d}/_SUCCESS")["Body"].read())
    assert (marker["step"], marker["outputs"], marker["rows_out"]) == ("calibrate", 3, total), marker
