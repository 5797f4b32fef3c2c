"""The on-call loop against a real Airflow (standalone) and moto_server, through the REST API and
the `shardline` CLI as an engineer would run them:

trigger with a conf -> a corrupt input fails the run -> `shardline failed` names the file ->
the input is fixed -> `shardline resubmit --all-failed` -> the same DAG run turns green,
with every row written exactly once. The trigger form's validation is checked here too.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shardline.oncall.airflow_client import AirflowApiError
from shardline.planning import naming

PIPELINE = "tabular_scoring_hourly"
BUCKET = "shardline-demo"

pytestmark = pytest.mark.slow


def shardline(
    stack, *args: str, airflow: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the CLI as an engineer would; ``airflow`` replaces its SHARDLINE_AIRFLOW_* settings (``{}``: none);
    ``env``: more settings of its own."""
    more = env or {}
    cli = Path(sys.executable).with_name("shardline")
    env = {
        **stack.cli_env(),
        "PATH": str(cli.parent),
        "COLUMNS": "200",
        "SHARDLINE_AIRFLOW_CONFIG": str(stack.home / "no-shardline-login.json"),
    }  # never a developer's own
    if airflow is not None:
        env = {k: v for k, v in env.items() if not k.startswith("SHARDLINE_AIRFLOW_")} | airflow
        env.setdefault("SHARDLINE_AIRFLOW_CONFIG", str(stack.home / "no-shardline-login.json"))
    return subprocess.run([str(cli), *args], env=env | more, capture_output=True, text=True, timeout=300, check=False)


def _password_env(url: str, stack) -> dict[str, str]:
    return {
        "SHARDLINE_AIRFLOW_URL": url,
        "SHARDLINE_AIRFLOW_USERNAME": stack.username,
        "SHARDLINE_AIRFLOW_PASSWORD": stack.password,
    }


def _failed_and_fixed(stack, staged, hour: dt.datetime) -> tuple[str, str]:
    """A run that failed on a corrupt input, whose input is then fixed: (run id, PIPELINE/RUN_ID)."""
    staged["upload_hour"](hour, corrupt=True)
    run_id = _trigger(stack, hour)
    assert stack.wait_for_run(PIPELINE, run_id)["state"] == "failed", stack.tail()
    prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    staged["s3"].upload_file(str(staged["good_file"]), BUCKET, prefix + "late-arrival.parquet")
    return run_id, f"{PIPELINE}/{run_id}"


def _attempt(stack, ref: str) -> dict:
    status = shardline(stack, "status", ref, "--json")
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)


def _assert_every_row_once(staged, hour: dt.datetime) -> None:
    ids = _output_rows(staged["s3"], hour)
    assert len(ids) == 20_000 + 5_000  # four files of 5,000 rows, and the fixed file (a copy of the first)
    assert len(set(ids)) == 20_000  # the copy repeats the first file's ids, nothing else repeats


@pytest.fixture(scope="module")
def staged(airflow_stack, tmp_path_factory, xgboost_model, sklearn_model):
    """The bucket, the ledger table, a packed XGBoost model, and a helper to upload an hour of inputs."""
    from examples import synthetic
    from shardline.ledger.table import create_ledger_table
    from shardline.spec import load_spec

    work = tmp_path_factory.mktemp("oncall")
    env = airflow_stack.env
    patch = pytest.MonkeyPatch()
    airflow_stack.use_aws(patch)
    s3 = airflow_stack.s3()
    spec = load_spec(airflow_stack.dags / "pipelines" / f"{PIPELINE}.yaml")
    s3.create_bucket(Bucket=BUCKET)
    create_ledger_table(spec.ledger_table, "us-east-1", env["AWS_ENDPOINT_URL"])
    synthetic.pack(xgboost_model.parent, work / "model.tar.gz")
    s3.upload_file(str(work / "model.tar.gz"), BUCKET, "models/xgboost/v1/model.tar.gz")
    # daily_churn's first step checks its model is there.
    synthetic.pack(sklearn_model.parent, work / "churn-model.tar.gz")
    s3.upload_file(str(work / "churn-model.tar.gz"), BUCKET, "models/sklearn/v1/model.tar.gz")
    files = synthetic.make_dataset(work / "data", files=4, rows=20_000)

    def upload_hour(hour: dt.datetime, *, corrupt: bool) -> str:
        prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
        for path in files:
            s3.upload_file(str(path), BUCKET, prefix + path.name)
        if corrupt:
            s3.put_object(Bucket=BUCKET, Key=prefix + "late-arrival.parquet", Body=b"PAR1 truncated upload")
        return prefix

    yield {"s3": s3, "upload_hour": upload_hour, "good_file": files[0], "spec": spec, "work": work}
    patch.undo()


def _trigger(stack, hour: dt.datetime, conf: dict | None = None) -> str:
    run_id = f"manual__{hour:%Y%m%dT%H}-{uuid.uuid4().hex[:6]}"
    stack.client().trigger(PIPELINE, conf or {}, run_id=run_id, logical_date=hour.isoformat())
    return run_id


def _task_log(stack, run_id: str, task_id: str) -> str:
    """The log of the task's latest try (Airflow may have retried it; every try ends the same way)."""
    client = stack.client()
    tis = {t["task_id"]: t for t in client.task_instances(PIPELINE, run_id)}
    assert task_id in tis, tis
    try_number = tis[task_id]["try_number"]
    assert try_number >= 1, [(t["task_id"], t["state"], t["try_number"]) for t in tis.values()]
    return str(
        client._call(
            "GET",
            f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
        )
    )


def _keys(s3, prefix: str) -> list[str]:
    return [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for o in page.get("Contents", [])
    ]


def _output_rows(s3, hour: dt.datetime) -> list[int]:
    """Every id in the hour's outputs, from the output files themselves."""
    prefix = f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    ids = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"].endswith(".parquet") and "/_" not in item["Key"]:
                body = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
                ids += pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    return ids


def test_a_failed_run_is_resubmitted_from_the_cli_and_turns_green(airflow_stack, staged):
    hour = dt.datetime(2026, 11, 22, 3, tzinfo=dt.UTC)
    staged["upload_hour"](hour, corrupt=True)
    run_id = _trigger(airflow_stack, hour)
    ref = f"{PIPELINE}/{run_id}"
    run = airflow_stack.wait_for_run(PIPELINE, run_id)
    assert run["state"] == "failed", airflow_stack.tail()
    failed_at = time.monotonic()

    # The watch's failure names the file, the reason and the exact command that fixes it.
    fix = f"shardline resubmit {ref} --step score --all-failed"
    log = _task_log(airflow_stack, run_id, "watch_score")
    assert "late-arrival.parquet (CorruptInputError" in log and fix in log, log[-3000:]
    status = shardline(airflow_stack, "status", ref)
    assert status.returncode == 0, status.stderr
    assert "FAILED" in status.stdout and fix in status.stdout, status.stdout
    failed = shardline(airflow_stack, "failed", ref, "--json")
    assert failed.returncode == 0, failed.stderr
    rows = json.loads(failed.stdout)
    assert [(Path(r["input_key"]).name, r["error_class"]) for r in rows] == [
        ("late-arrival.parquet", "CorruptInputError")
    ]
    runs = shardline(airflow_stack, "runs", "--pipeline", PIPELINE, "--json")
    assert any(
        r["run_id"] == run_id
        and r["status"] == "FAILED"
        and r["airflow_state"] == "failed"
        and r["disagreement"] is None
        for r in json.loads(runs.stdout)
    ), runs.stdout
    out_prefix = f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    assert not _keys(staged["s3"], out_prefix + "_SUCCESS")  # a failed step never marks its prefix complete

    # A resubmission of a file that is still corrupt would fail again: fix the input first.
    prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    staged["s3"].upload_file(str(staged["good_file"]), BUCKET, prefix + "late-arrival.parquet")

    dry = shardline(airflow_stack, "resubmit", ref, "--step", "score", "--all-failed", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "1 file(s) of step score selected" in dry.stdout and "would submit attempt 2" in dry.stdout
    assert airflow_stack.client().dag_run(PIPELINE, run_id)["state"] == "failed"  # a dry run changes nothing

    done = shardline(airflow_stack, "resubmit", ref, "--step", "score", "--all-failed")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "submitted attempt 2" in done.stdout and "cleared" in done.stdout, done.stdout

    again = shardline(airflow_stack, "resubmit", ref, "--step", "score", "--all-failed")
    assert "submitted attempt" not in again.stdout  # safe twice: no third attempt
    said = again.stdout + again.stderr
    # Which refusal depends on how far attempt 2 got meanwhile (running, ended but not yet recorded by its
    # watch task, or recorded): each one submits nothing.
    assert (
        ("is still InProgress" in said and again.returncode == 0)
        or ("has not ended yet" in said and again.returncode == 1)
        or ("has not recorded the outcome yet" in said and again.returncode == 1)
        or "nothing to resubmit" in said
    ), said
    assert json.loads(shardline(airflow_stack, "status", ref, "--json").stdout)["steps"][0]["attempt"] == 2

    run = airflow_stack.wait_for_run(PIPELINE, run_id)
    assert run["state"] == "success", airflow_stack.tail()
    # Reported, not asserted (no test depends on timing): the README quotes this figure.
    print(
        f"on-call loop: from the failed DAG run to green in {time.monotonic() - failed_at:.0f} s "
        "(reading the failure, the status and failed views, fixing the input, a dry run, the resubmission)"
    )

    ids = _output_rows(staged["s3"], hour)
    expected = 20_000 + 5_000  # four files of 5,000 rows, and the fixed file (a copy of the first)
    assert len(ids) == expected
    assert len(set(ids)) == 20_000  # the copy repeats the first file's ids, nothing else repeats
    status = json.loads(shardline(airflow_stack, "status", ref, "--json").stdout)
    step = status["steps"][0]
    assert (status["status"], step["status"], step["attempt"]) == ("SUCCEEDED", "SUCCEEDED", 2)
    assert step["succeeded"] == step["files"] == 5 and step["rows_in"] == step["rows_out"] == expected

    # What downstream readers trust: _SUCCESS now, each attempt's instance manifests (attempt 2's did not
    # overwrite attempt 1's) covering every output, and the step's outputs manifest naming each one's attempt.
    s3 = staged["s3"]
    outputs = {
        k.removeprefix(out_prefix)
        for k in _keys(s3, out_prefix)
        if "/_" not in "/" + k.removeprefix(out_prefix) and k.endswith(".parquet")
    }
    assert len(outputs) == 5
    marker = json.loads(s3.get_object(Bucket=BUCKET, Key=out_prefix + "_SUCCESS")["Body"].read())
    assert (marker["run_id"], marker["attempts"], marker["outputs"], marker["rows_out"]) == (run_id, 2, 5, expected)
    by_attempt: dict[str, set[str]] = {}
    for key in _keys(s3, out_prefix + "_shardline/instances/"):
        if not key.rsplit("/", 1)[-1].startswith("manifest-"):
            continue  # each file's profile beside the manifests (contract.PROFILES_FOLDER)
        body = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        done = {r["output"] for r in body["file_reports"] if r["status"] == "SUCCEEDED"}
        by_attempt.setdefault(key.rsplit("/", 2)[1], set()).update(done)
    assert sorted(by_attempt) == ["attempt-0001", "attempt-0002"], by_attempt
    assert set().union(*by_attempt.values()) == outputs, by_attempt
    # The hourly pipeline's outputs are its table's data files: each named by the run and attempt that wrote it.
    late = f"late-arrival.{naming.output_tag(run_id, 2)}.parquet"
    assert by_attempt["attempt-0002"] == {late}
    assert all(name.endswith(f".{naming.output_tag(run_id, 1)}.parquet") for name in outputs - {late}), outputs
    outputs_manifest = marker["manifest"].removeprefix(f"s3://{BUCKET}/")
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=outputs_manifest)["Body"].read())
    assert {Path(o["output"]).name: o["attempt"] for o in manifest["outputs"]} == {
        **{name: 1 for name in outputs - {late}},
        late: 2,
    }
    # Lineage: the watch task's first try, which failed, told OpenLineage what it had scored and FAILED; its try after
    # the resubmission names the step's S3 datasets with the ledger's rows in and out, and the model it ran.
    events = airflow_stack.lineage(PIPELINE, run_id, "watch_score")
    ended = {e["eventType"]: e for e in events if e["eventType"] in ("FAIL", "COMPLETE")}
    assert set(ended) == {"FAIL", "COMPLETE"}, [e["eventType"] for e in events]
    for event, rows, files, status in (
        (ended["FAIL"], 20_000, 4, "FAILED"),
        (ended["COMPLETE"], expected, 5, "SUCCEEDED"),
    ):
        [source], [target, *table] = event["inputs"], event["outputs"]
        # The prefix names the table its files are the data of; once committed, the table is an output too.
        assert [(t["namespace"], t["name"]) for t in table] == (
            [("iceberg://local", "scoring.hourly_scores")] if status == "SUCCEEDED" else []
        ), table
        assert target["facets"]["symlinks"]["identifiers"][0]["name"] == "scoring.hourly_scores", target
        assert (source["namespace"], source["name"]) == (f"s3://{BUCKET}", prefix.rstrip("/")), source
        assert (target["namespace"], target["name"]) == (f"s3://{BUCKET}", out_prefix.rstrip("/")), target
        assert source["inputFacets"]["inputStatistics"]["rowCount"] == rows, source
        assert target["outputFacets"]["outputStatistics"] == {
            **target["outputFacets"]["outputStatistics"],
            "rowCount": rows,
            "fileCount": files,
        }
        facet = event["run"]["facets"]["shardline"]
        assert (facet["status"], facet["step"], facet["modelUri"]) == (
            status,
            "score",
            f"s3://{BUCKET}/models/xgboost/v1/model.tar.gz",
        ), facet
    assert ended["COMPLETE"]["run"]["facets"]["shardline"]["attempts"] == 2
    assert ended["COMPLETE"]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == step["rows_out"]

    # The Asset event says the same.
    events = airflow_stack.client()._call("GET", "/assets/events", params={"source_run_id": run_id})
    extras = [e["extra"] for e in events["asset_events"] if e["source_run_id"] == run_id]
    assert extras and extras[-1]["status"] == "SUCCEEDED", events
    assert extras[-1]["steps"][0]["success_marker"] == f"s3://{BUCKET}/{out_prefix}_SUCCESS", extras
    # ... and the table commit: the snapshot that holds the hour, as `shardline status` shows it.
    committed = extras[-1]["steps"][0]["table"]
    assert (committed["table"], committed["rows_added"]) == ("scoring.hourly_scores", expected), committed
    assert committed == step["table"] and committed["partition"] == {"dt": f"{hour:%Y-%m-%d}", "hour": f"{hour:%H}"}
    # Without partitioned_asset the event is as before, unkeyed (DAGs on the plain asset start from it), and its
    # extra names the partition.
    mine = [e for e in events["asset_events"] if e["source_run_id"] == run_id]
    assert mine[-1]["partition_key"] is None and extras[-1]["partition"] == f"{hour:%Y-%m-%dT%H:%M:%S}", mine


def test_outputs_held_back_by_a_check_are_approved_from_the_cli_and_the_run_turns_green(airflow_stack, staged):
    """A broken model (it scores every row the same) is held back by the shipped distinct-values check: no
    _SUCCESS, the run red, `shardline checks` says why and exits 1; `shardline approve` with a reason turns the same
    DAG run green with its _SUCCESS, and says who approved it."""
    from examples import synthetic

    work = staged["work"]
    broken = synthetic.train_xgboost(work / "broken", broken=True).parent
    synthetic.pack(broken, work / "broken.tar.gz")
    staged["s3"].upload_file(str(work / "broken.tar.gz"), BUCKET, "models/xgboost/broken/model.tar.gz")
    hour = dt.datetime(2026, 11, 22, 8, tzinfo=dt.UTC)
    staged["upload_hour"](hour, corrupt=False)
    run_id = _trigger(airflow_stack, hour, {"model_version": "broken"})
    ref = f"{PIPELINE}/{run_id}"
    assert airflow_stack.wait_for_run(PIPELINE, run_id)["state"] == "failed", airflow_stack.tail()
    out_prefix = f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    assert not _keys(staged["s3"], out_prefix + "_SUCCESS")
    assert len([k for k in _keys(staged["s3"], out_prefix) if k.endswith(".parquet")]) == 4  # written, held back

    held = "checks.columns.prediction.min_distinct: 1 against at least 2"
    status = shardline(airflow_stack, "status", ref)
    assert f"checks: blocked by {held}" in status.stdout, status.stdout
    checks = shardline(airflow_stack, "checks", ref)
    assert checks.returncode == 1, checks.stderr
    assert f"FAIL  blocking  {held}" in checks.stdout and "step score: held back by 1 blocking" in checks.stdout
    assert f"shardline approve {ref} --step score --reason" in checks.stdout

    short = shardline(airflow_stack, "approve", ref, "--step", "score", "--reason", "fine")
    assert short.returncode != 0 and "--reason" in short.stderr + short.stdout
    done = shardline(airflow_stack, "approve", ref, "--step", "score", "--reason", "a test of the approval path")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "approved by " in done.stdout and held in done.stdout
    assert airflow_stack.wait_for_run(PIPELINE, run_id)["state"] == "success", airflow_stack.tail()
    assert _keys(staged["s3"], out_prefix + "_SUCCESS")
    view = _attempt(airflow_stack, ref)
    assert view["status"] == "SUCCEEDED" and "a test of the approval path" in view["steps"][0]["message"]
    again = shardline(airflow_stack, "checks", ref, "--json")
    assert again.returncode == 0, again.stderr  # approved: nothing holds the step back any more
    assert json.loads(again.stdout)["approvals"]["score"]["reason"] == "a test of the approval path"


def test_the_trigger_form_takes_a_conf_through_the_rest_api(airflow_stack, staged):
    hour = dt.datetime(2026, 11, 22, 4, tzinfo=dt.UTC)
    prefix = staged["upload_hour"](hour, corrupt=False)
    client = airflow_stack.client()
    run_id = _trigger(
        airflow_stack, hour, {"input_prefix": f"s3://{BUCKET}/{prefix}", "instance_count": 3, "dry_run": True}
    )
    run = airflow_stack.wait_for_run(PIPELINE, run_id)
    assert run["conf"]["instance_count"] == 3
    states = {t["task_id"]: t["state"] for t in client.task_instances(PIPELINE, run_id)}
    assert states["plan_score"] == "skipped" and states["watch_score"] == "skipped", states
    text = _task_log(airflow_stack, run_id, "plan_score")
    assert "dry run: 4 file(s)" in text and "would run 3 instance(s)" in text, text[-3000:]
    # The data engineer sees sample predictions before anything is submitted: the preview's table and summary.
    assert "preview of step score: model s3://" in text, text[-3000:]
    assert "preview of part-" in text and "20 row(s), model xgboost" in text, text[-3000:]
    assert "prediction: rows 20, NaN 0" in text and "preview of s3://" in text, text[-3000:]


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"instance_count": 0}, "instance_count"),
        ({"input_prefix": "/local/path"}, "input_prefix"),
        ({"dry_run": "maybe"}, "dry_run"),
        # Trust boundary: a conf may not point the job at another bucket or climb out of the spec's prefix,
        ({"input_prefix": "s3://someone-elses-bucket/events/"}, "input_prefix"),
        ({"input_prefix": f"s3://{BUCKET}/events/../models/"}, "input_prefix"),
        ({"input_prefix": f"s3://{BUCKET}/events//tmp/"}, "input_prefix"),
        # nor pick a model outside the model prefix.
        ({"model_version": "../../other-team/model"}, "model_version"),
        ({"model_version": ".."}, "model_version"),
    ],
)
def test_the_trigger_form_refuses_a_bad_conf_and_names_the_field(airflow_stack, conf, field):
    with pytest.raises(AirflowApiError) as err:
        airflow_stack.client().trigger(PIPELINE, conf, logical_date=None)
    assert "400" in str(err.value) and field in str(err.value), str(err.value)


def test_cancel_stops_the_job_and_fails_the_dag_run(airflow_stack, staged, tmp_path):
    from examples import synthetic
    from tests.support.helpers import write_inference_script

    hour = dt.datetime(2026, 11, 22, 6, tzinfo=dt.UTC)
    prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    for path in synthetic.make_dataset(tmp_path / "data", files=2, rows=1_000):
        staged["s3"].upload_file(str(path), BUCKET, prefix + path.name)
    # A model that never loads: the job is certainly still running when it is cancelled, however busy
    # the machine (a big input that is merely slow can finish first).
    write_inference_script(
        tmp_path / "endless",
        """
        import time

        def model_fn(model_dir):
            while True:
                time.sleep(1)

        def predict_fn(data, model):
            return data[:, 0]
    """,
    )
    synthetic.pack(tmp_path / "endless", tmp_path / "endless.tar.gz")
    staged["s3"].upload_file(str(tmp_path / "endless.tar.gz"), BUCKET, "models/xgboost/endless/model.tar.gz")
    run_id = _trigger(airflow_stack, hour, {"model_version": "endless"})
    ref = f"{PIPELINE}/{run_id}"
    deadline = time.monotonic() + 180
    while True:  # wait until the job runs
        status = shardline(airflow_stack, "status", ref, "--json")
        if (
            status.returncode == 0
            and json.loads(status.stdout)["steps"]
            and json.loads(status.stdout)["steps"][0]["job_status"] == "InProgress"
        ):
            break
        assert time.monotonic() < deadline, status.stdout + status.stderr + airflow_stack.tail()
        time.sleep(1)
    refused = shardline(airflow_stack, "cancel", ref)  # no terminal to confirm on
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = shardline(airflow_stack, "cancel", ref, "--yes", "--reason", "wrong model version")
    assert done.returncode == 0, done.stderr
    assert "stopped sl-" in done.stdout and "step score: CANCELLED" in done.stdout, done.stdout
    run = airflow_stack.wait_for_run(PIPELINE, run_id)
    assert run["state"] == "failed"
    # Every task instance of the run ended red: the scheduler, whenever it looks, finds a failed leaf (marking the run
    # alone skipped the report task, and a scheduler that read the run then marked the cancelled run green).
    states = {ti["task_id"]: ti["state"] for ti in airflow_stack.client().task_instances(PIPELINE, run_id)}
    assert states == {"plan_score": "success", "watch_score": "failed", "report": "failed"}, states
    view = json.loads(shardline(airflow_stack, "status", ref, "--json").stdout)
    assert view["status"] == "CANCELLED" and view["message"] == "wrong model version"
    assert view["steps"][0]["job_status"] in ("Stopped", "Stopping")


def test_a_resubmit_is_all_or_nothing_and_the_same_command_completes_a_half_done_one(airflow_stack, staged):
    """Without Airflow access nothing is submitted; with a clear refused after the submit (a token revoked in
    between), the command exits 1 and says so, and the same command run again completes it: the DAG run
    turns green with every row once."""
    from tests.support.faults import ClearDenyingProxy

    hour = dt.datetime(2026, 11, 22, 7, tzinfo=dt.UTC)
    run_id, ref = _failed_and_fixed(airflow_stack, staged, hour)
    command = ("resubmit", ref, "--step", "score", "--all-failed")

    # No Airflow settings at all: refused up front, with what to set.
    bare = shardline(airflow_stack, *command, airflow={})
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert "Airflow is not configured, so nothing was submitted" in bare.stderr, bare.stderr
    assert "shardline login URL" in bare.stderr and "SHARDLINE_AIRFLOW_URL" in bare.stderr, bare.stderr
    # A user who may read but not clear tasks: Airflow's own answer to a dry-run clear refuses it up front.
    viewer = shardline(
        airflow_stack,
        *command,
        airflow={
            "SHARDLINE_AIRFLOW_URL": airflow_stack.url,
            "SHARDLINE_AIRFLOW_TOKEN": airflow_stack.token_for("viewer", "viewer"),
        },
    )
    assert viewer.returncode == 1, viewer.stdout + viewer.stderr
    assert "would not let this caller clear watch_score" in viewer.stderr and "403" in viewer.stderr, viewer.stderr
    assert "nothing was submitted" in viewer.stderr and "Op role" in viewer.stderr, viewer.stderr
    # A token that is missing, cut short, or expired: each refusal names its own fix, and none blames a role.
    admin = airflow_stack.token_for(airflow_stack.username, "admin")
    for case, token, expected in [
        ("missing", None, "needs a token, and none was sent"),
        ("cut short", admin[:-12], "cannot read the token"),
        ("expired", airflow_stack.token_for(airflow_stack.username, "admin", expires_in=-60), "has expired"),
    ]:
        answer = shardline(
            airflow_stack,
            *command,
            airflow={
                "SHARDLINE_AIRFLOW_URL": airflow_stack.url,
                **({"SHARDLINE_AIRFLOW_TOKEN": token} if token else {}),
            },
        )
        assert answer.returncode == 1, (case, answer.stdout + answer.stderr)
        assert expected in answer.stderr and "nothing was submitted" in answer.stderr, (case, answer.stderr)
        assert "Op role" not in answer.stderr and "admin for it" not in answer.stderr, (case, answer.stderr)
    # The fix those refusals print works as printed: `shardline login URL` keeps a token, and the command then
    # finds Airflow by itself (a dry run: Airflow is asked, nothing is submitted).
    login_file = airflow_stack.home / "oncall-login.json"
    cli = Path(sys.executable).with_name("shardline")
    env = {k: v for k, v in airflow_stack.cli_env().items() if not k.startswith("SHARDLINE_AIRFLOW_")}
    env |= {"PATH": str(cli.parent), "SHARDLINE_AIRFLOW_CONFIG": str(login_file)}
    logged_in = subprocess.run(
        [str(cli), "login", airflow_stack.url, "--username", airflow_stack.username, "--password-stdin"],
        input=airflow_stack.password + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert logged_in.returncode == 0 and "logged in to" in logged_in.stdout, logged_in.stdout + logged_in.stderr
    dry = shardline(airflow_stack, *command, "--dry-run", airflow={"SHARDLINE_AIRFLOW_CONFIG": str(login_file)})
    assert dry.returncode == 0 and "would submit attempt 2" in dry.stdout, dry.stdout + dry.stderr

    assert _attempt(airflow_stack, ref)["steps"][0]["attempt"] == 1  # nothing was submitted
    assert airflow_stack.client().dag_run(PIPELINE, run_id)["state"] == "failed"

    # Airflow allows the clear when asked beforehand, then refuses it (a token revoked in between).
    with ClearDenyingProxy(airflow_stack.url) as proxy:
        half = shardline(airflow_stack, *command, airflow=_password_env(proxy.url, airflow_stack))
    assert proxy.denied == 1, half.stdout + half.stderr
    assert half.returncode == 1, half.stdout + half.stderr
    said = half.stderr
    assert "attempt 2 is submitted as job sl-" in said and "the DAG run does not follow it yet" in said, said
    assert "403" in said and "run the same command again once Airflow lets you" in said, said
    assert said.rstrip().endswith(f"shardline resubmit {ref} --step score --all-failed"), said
    assert airflow_stack.client().dag_run(PIPELINE, run_id)["state"] == "failed"
    view = _attempt(airflow_stack, ref)
    assert view["steps"][0]["attempt"] == 2
    # The disagreement is visible: Airflow's state beside the ledger's, and what to do.
    assert view["airflow_state"] == "failed" and "takes it up again" in view["disagreement"], view

    done = shardline(airflow_stack, *command)  # the same command, now that Airflow lets it clear
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted attempt" not in done.stdout and "cleared" in done.stdout, done.stdout
    airflow_stack.assert_succeeds(PIPELINE, run_id)
    view = _attempt(airflow_stack, ref)
    assert (view["status"], view["steps"][0]["attempt"], view["airflow_state"], view["disagreement"]) == (
        "SUCCEEDED",
        2,
        "success",
        None,
    )
    _assert_every_row_once(staged, hour)


def test_force_ends_green_even_when_the_forced_attempt_succeeded_unwatched(airflow_stack, staged):
    from tests.support.faults import ClearDenyingProxy

    hour = dt.datetime(2026, 11, 22, 9, tzinfo=dt.UTC)
    run_id, ref = _failed_and_fixed(airflow_stack, staged, hour)
    command = ("resubmit", ref, "--step", "score", "--all-failed", "--force")
    with ClearDenyingProxy(airflow_stack.url) as proxy:
        half = shardline(airflow_stack, *command, airflow=_password_env(proxy.url, airflow_stack))
    assert half.returncode == 1 and "attempt 2 is submitted" in half.stderr, half.stdout + half.stderr
    deadline = time.monotonic() + 240
    while (job := _attempt(airflow_stack, ref)["steps"][0]["job_status"]) != "Completed":
        assert job in ("InProgress", "Completed"), job
        assert time.monotonic() < deadline, "attempt 2 did not complete (safety deadline)"
        time.sleep(1)

    # Every file has succeeded, but no watch task saw it: `runs` flags it, and the same command turns it green.
    runs = json.loads(shardline(airflow_stack, "runs", "--pipeline", PIPELINE, "--json").stdout)
    row = next(r for r in runs if r["run_id"] == run_id)
    assert row["airflow_state"] == "failed" and row["disagreement"], row
    table = shardline(airflow_stack, "runs", "--pipeline", PIPELINE).stdout
    assert f"! {ref}: the DAG run's state is failed but the ledger says RUNNING" in table, table
    done = shardline(airflow_stack, *command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to resubmit" not in done.stdout and "cleared" in done.stdout, done.stdout
    airflow_stack.assert_succeeds(PIPELINE, run_id)
    _assert_every_row_once(staged, hour)


def test_an_unknown_conf_key_fails_the_run_at_plan_naming_the_key(airflow_stack, staged):
    hour = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
    staged["upload_hour"](hour, corrupt=False)
    run_id = _trigger(airflow_stack, hour, {"instance_cnt": 1})  # a typo: the form's schema lets extra keys in
    assert airflow_stack.wait_for_run(PIPELINE, run_id)["state"] == "failed", airflow_stack.tail()
    states = {t["task_id"]: t["state"] for t in airflow_stack.client().task_instances(PIPELINE, run_id)}
    assert states["plan_score"] == "failed" and states["watch_score"] == "upstream_failed", states
    log = _task_log(airflow_stack, run_id, "plan_score")
    assert "unknown key(s) 'instance_cnt' (did you mean 'instance_count'?)" in log, log[-3000:]

    # The advice it prints works on this Airflow: the same partition again, with a conf the engineer fixed.
    [command] = _printed_commands(log, "rerun")
    assert command == ["rerun", f"{PIPELINE}/{run_id}", "--conf", "{...}"], command
    # A conf the trigger form would refuse is refused before anything is deleted.
    refused = shardline(airflow_stack, *command[:-1], '{"instance_count": 0}')
    assert refused.returncode != 0 and "instance_count 0 must be null or a whole number" in refused.stderr, (
        refused.stdout + refused.stderr
    )
    assert airflow_stack.client().dag_run(PIPELINE, run_id)["state"] == "failed"  # still there
    again = shardline(airflow_stack, *command[:-1], '{"instance_count": 1}')
    assert again.returncode == 0, again.stdout + again.stderr
    new_run = re.search(r"triggered it again as (\S+) with conf", again.stdout).group(1)
    airflow_stack.assert_succeeds(PIPELINE, new_run)
    rerun = airflow_stack.client().dag_run(PIPELINE, new_run)
    assert (rerun["data_interval_start"], rerun["conf"]) == (
        hour.isoformat().replace("+00:00", "Z"),
        {"instance_count": 1},
    ), rerun
    with pytest.raises(AirflowApiError, match="404"):  # the failed run made way for it (one run per logical date)
        airflow_stack.client().dag_run(PIPELINE, run_id)


def _printed_commands(text: str, command: str) -> list[list[str]]:
    """Each `shardline COMMAND ...` a message printed, as the arguments after `shardline`."""
    import shlex

    return [shlex.split(found)[1:] for found in re.findall(rf"`(shardline {command} [^`]+)`", text)]


def test_an_hourly_run_with_no_input_yet_waits_for_it_then_succeeds_once_it_lands(airflow_stack, staged):
    hour = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)
    run_id = _trigger(airflow_stack, hour)  # the hour's data has not landed
    client = airflow_stack.client()
    deadline = time.monotonic() + 180
    while (state := client.task_instance(PIPELINE, run_id, "plan_score").get("state")) != "deferred":
        assert state in (None, "scheduled", "queued", "running"), (state, airflow_stack.tail())
        assert time.monotonic() < deadline, "plan_score never started waiting (safety deadline)"
        time.sleep(1)
    log = _task_log(airflow_stack, run_id, "plan_score")
    prefix = f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    assert f"no input file under s3://{BUCKET}/{prefix}" in log and "waiting up to" in log, log[-3000:]
    assert client.dag_run(PIPELINE, run_id)["state"] == "running"  # never green by doing nothing
    # On call sees the waiting run, its partition and what it waits for.
    runs = json.loads(shardline(airflow_stack, "runs", "--pipeline", PIPELINE, "--json").stdout)
    row = next(r for r in runs if r["run_id"] == run_id)
    assert (row["status"], row["partition"]) == ("RUNNING", "2026-11-22T11:00:00"), row
    assert "waiting up to" in row["message"], row
    table = shardline(airflow_stack, "runs", "--pipeline", PIPELINE).stdout
    assert "PARTITION" in table and "2026-11-22 11:00" in table, table
    # The spec's deadline (12h, conftest): a manual run of an old hour is due when it was triggered (not at its
    # hour's end, long past), and Airflow holds it.
    [held] = airflow_stack.deadlines(PIPELINE, run_id).values()
    triggered = _utc(client.dag_run(PIPELINE, run_id)["run_after"])  # the trigger's own time, as created
    due = _utc(held["deadline_time"]) - dt.timedelta(hours=12)
    assert not held["missed"] and abs(due - triggered) < dt.timedelta(minutes=1), (held, triggered)

    staged["upload_hour"](hour, corrupt=False)  # the data lands late
    airflow_stack.assert_succeeds(PIPELINE, run_id)
    ids = _output_rows(staged["s3"], hour)
    assert sorted(ids) == list(range(20_000))
    # Green in time: Airflow dropped its deadline, so no alert can fire.
    assert airflow_stack.deadlines(PIPELINE, run_id) == {}


def test_a_run_whose_input_is_missing_fails_naming_the_prefix(airflow_stack, staged):
    day = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)  # no customers were uploaded for this day
    run_id = f"manual__{day:%Y%m%d}-{uuid.uuid4().hex[:6]}"
    airflow_stack.client().trigger("daily_churn", {}, run_id=run_id, logical_date=day.isoformat())
    assert airflow_stack.wait_for_run("daily_churn", run_id)["state"] == "failed", airflow_stack.tail()
    prefix = f"s3://{BUCKET}/customers/dt=2026-11-20/"
    runs = json.loads(shardline(airflow_stack, "runs", "--pipeline", "daily_churn", "--json").stdout)
    row = next(r for r in runs if r["run_id"] == run_id)
    assert row["status"] == "FAILED" and row["airflow_state"] == "failed", row
    assert f"no input file under {prefix}" in row["message"], row
    assert "input.when_missing: fail, the default for a manual run" in row["message"], row

    # The advice it prints works: once the customers (and the calibration code) are there, the printed command
    # plans the same run again, and both steps run to green.
    [command] = _printed_commands(row["message"], "rerun")
    assert command == ["rerun", f"daily_churn/{run_id}"], command
    from examples import synthetic

    s3 = staged["s3"]
    s3.upload_file(str(staged["good_file"]), BUCKET, "customers/dt=2026-11-20/customers.parquet")
    work = Path(staged["work"])
    synthetic.pack(synthetic.calibration_model(work / "calibration"), work / "calibration.tar.gz")
    s3.upload_file(str(work / "calibration.tar.gz"), BUCKET, "models/calibration/v1/model.tar.gz")
    again = shardline(airflow_stack, *command)
    assert again.returncode == 0, again.stdout + again.stderr
    airflow_stack.assert_succeeds("daily_churn", run_id, 400)
    runs = json.loads(shardline(airflow_stack, "runs", "--pipeline", "daily_churn", "--json").stdout)
    assert next(r for r in runs if r["run_id"] == run_id)["status"] == "SUCCEEDED"


def test_a_model_that_is_not_there_fails_the_plan_at_once_naming_the_uri_with_no_retry(airflow_stack, staged):
    hour = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
    staged["upload_hour"](hour, corrupt=False)
    run_id = _trigger(airflow_stack, hour, {"model_version": "v9"})  # no such version was ever uploaded
    assert airflow_stack.wait_for_run(PIPELINE, run_id)["state"] == "failed", airflow_stack.tail()
    plan = airflow_stack.client().task_instance(PIPELINE, run_id, "plan_score")
    assert plan["state"] == "failed" and plan["try_number"] == 1, plan  # a setup error is not retried
    # Reported, not asserted (no test depends on timing).
    print(
        f"missing model: plan_score failed {(_utc(plan['end_date']) - _utc(plan['start_date'])).total_seconds():.1f}"
        " s after it started"
    )
    uri = f"s3://{BUCKET}/models/xgboost/v9/model.tar.gz"
    log = _task_log(airflow_stack, run_id, "plan_score")
    # It names what is there instead (v1, and any version another test uploaded).
    assert f"no model at {uri}" in log and re.search(r"there are: [\w, -]*\bv1\b", log), log[-3000:]
    runs = json.loads(shardline(airflow_stack, "runs", "--pipeline", PIPELINE, "--json").stdout)
    row = next(r for r in runs if r["run_id"] == run_id)
    assert row["status"] == "FAILED" and f"no model at {uri}" in row["message"], row
    assert not _keys(staged["s3"], f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/"), "nothing may have run"

    # The advice works: the model is uploaded where the run looked, and the printed command plans the run again.
    command = _printed_commands(log, "rerun")[0]
    assert command == ["rerun", f"{PIPELINE}/{run_id}"], command
    s3 = staged["s3"]
    s3.copy_object(
        Bucket=BUCKET,
        Key="models/xgboost/v9/model.tar.gz",
        CopySource={"Bucket": BUCKET, "Key": "models/xgboost/v1/model.tar.gz"},
    )
    try:
        again = shardline(airflow_stack, *command)
        assert again.returncode == 0 and "cleared plan_score" in again.stdout, again.stdout + again.stderr
        airflow_stack.assert_succeeds(PIPELINE, run_id)
    finally:
        s3.delete_object(Bucket=BUCKET, Key="models/xgboost/v9/model.tar.gz")
    assert sorted(_output_rows(s3, hour)) == list(range(20_000))


def test_a_dry_run_of_an_empty_partition_fails_naming_the_prefix(airflow_stack, staged):
    hour = dt.datetime(2026, 11, 22, 13, tzinfo=dt.UTC)  # nothing was uploaded for this hour
    run_id = _trigger(airflow_stack, hour, {"dry_run": True})
    assert airflow_stack.wait_for_run(PIPELINE, run_id)["state"] == "failed", airflow_stack.tail()
    log = _task_log(airflow_stack, run_id, "plan_score")
    prefix = f"s3://{BUCKET}/events/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    assert f"dry run: no input file under {prefix}" in log, log[-3000:]


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_fleet_sync_keeps_a_pool_per_quota_that_counts_deferred_tasks(airflow_stack, tmp_path):
    """`shardline fleet sync` against the real API server: created, then unchanged, then updated to a new quota."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fleet.yaml").write_text("quotas:\n  ml.c5.2xlarge: 20\n  ml.g5.xlarge: 2\n")
    client = airflow_stack.client()
    try:
        first = shardline(airflow_stack, "--dags-folder", str(dags), "fleet", "sync")
        assert first.returncode == 0, first.stderr
        assert "pool sagemaker-ml.c5.2xlarge: 20 slot(s), deferred tasks counted (created)" in first.stdout
        pool = client.pool("sagemaker-ml.c5.2xlarge")
        assert (pool["slots"], pool["include_deferred"]) == (20, True)
        again = shardline(airflow_stack, "--dags-folder", str(dags), "fleet", "sync", "--json")
        assert [c["action"] for c in json.loads(again.stdout)] == ["unchanged", "unchanged"]
        (dags / "fleet.yaml").write_text("quotas:\n  ml.c5.2xlarge: 24\n")
        dry = shardline(airflow_stack, "--dags-folder", str(dags), "fleet", "sync", "--dry-run")
        assert "(would be updated; it had 20)" in dry.stdout and client.pool("sagemaker-ml.c5.2xlarge")["slots"] == 20
        done = shardline(airflow_stack, "--dags-folder", str(dags), "fleet", "sync")
        assert "24 slot(s), deferred tasks counted (updated; it had 20)" in done.stdout
        assert client.pool("sagemaker-ml.c5.2xlarge")["slots"] == 24
        assert client.pool("sagemaker-ml.g5.xlarge")["slots"] == 2  # no longer in the file: left alone
    finally:
        for name in ("sagemaker-ml.c5.2xlarge", "sagemaker-ml.g5.xlarge"):
            if client.pool(name) is not None:
                client._call("DELETE", f"/pools/{name}")
    unset = shardline(airflow_stack, "--dags-folder", str(dags), "fleet", "sync", airflow={})
    assert unset.returncode != 0 and "Airflow is not configured, so no pool was synced" in unset.stderr


def test_a_hold_left_by_a_deleted_dag_run_is_ended_at_once_not_waited_out(airflow_stack, staged):
    """A DAG run deleted while it held its partition (a killed `dag.test()` started again deletes it) never ends its
    hold itself: the next run of the partition asks Airflow, finds the run gone, ends it in the ledger (stopping any
    job of it) and plans at once. It used to wait for the hold's lease: six hours."""
    from shardline.ledger.keys import RUN_SK, StepRef, run_pk
    from shardline.ledger.partitions import read_holder, take
    from shardline.ledger.records import RunRecord
    from shardline.ledger.states import StepStatus
    from shardline.ledger.step_writes import ensure_run, set_run_status
    from shardline.orchestration import services

    hour = dt.datetime(2026, 11, 22, 14, tzinfo=dt.UTC)
    prefix = f"s3://{BUCKET}/scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    model = services.ledger_model(staged["spec"])
    gone = StepRef(PIPELINE, "manual__deleted-before-this-test", "score")
    ensure_run(model, PIPELINE, gone.run_id)
    set_run_status(model, PIPELINE, gone.run_id, StepStatus.RUNNING)
    take(model, prefix, gone, dt.datetime.now(dt.UTC) + dt.timedelta(hours=6))
    staged["upload_hour"](hour, corrupt=False)

    run_id = _trigger(airflow_stack, hour)
    airflow_stack.assert_succeeds(PIPELINE, run_id)
    assert "its DAG run no longer exists in Airflow" in _task_log(airflow_stack, run_id, "plan_score")
    assert sorted(_output_rows(staged["s3"], hour)) == list(range(20_000))
    ended = RunRecord.of(model.Control.get(run_pk(PIPELINE, gone.run_id), RUN_SK, consistent_read=True))
    assert ended.status == "FAILED" and "no longer exists in Airflow" in (ended.message or "")
    assert read_holder(model, prefix).run_id == run_id


def test_a_commit_the_catalog_refuses_fails_the_run_red_and_the_printed_rerun_commits_the_hour_once(
    airflow_stack, staged, monkeypatch
):
    """The hour scores, but its table commit fails: the stack's catalog file is not a database (a broken disk, a
    bad restore). The step fails with no ``_SUCCESS`` and a message naming the table and the command; the run is red.
    The catalog mended, the printed ``shardline rerun`` scores the hour again and commits it once: the run green,
    the partition holding each row once, the snapshot named by ``shardline status``."""
    from shardline.orchestration import tables

    hour = dt.datetime(2026, 11, 22, 16, tzinfo=dt.UTC)
    partition = {"dt": "2026-11-22", "hour": "16"}
    staged["upload_hour"](hour, corrupt=False)
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", airflow_stack.env["SHARDLINE_LOCAL_ROOT"])  # the stack's catalog
    catalog = Path(airflow_stack.env["SHARDLINE_LOCAL_ROOT"]) / "iceberg" / "catalog.db"
    catalog.parent.mkdir(parents=True, exist_ok=True)
    kept = catalog.with_name("catalog.db.kept")
    if catalog.exists():
        catalog.rename(kept)
    catalog.write_bytes(b"this is not a SQLite database\n" * 100)
    try:
        run_id = _trigger(airflow_stack, hour)
        assert airflow_stack.wait_for_run(PIPELINE, run_id)["state"] == "failed", airflow_stack.tail()
    finally:
        catalog.unlink()
        if kept.exists():
            kept.rename(catalog)
    prefix = f"scores/dt={hour:%Y-%m-%d}/hour={hour:%H}/"
    assert prefix + "_SUCCESS" not in _keys(staged["s3"], prefix)
    status = _attempt(airflow_stack, f"{PIPELINE}/{run_id}")
    [step] = status["steps"]
    assert step["status"] == "FAILED" and step["message"].startswith("table: "), step
    assert "catalog 'local'" in step["message"] and step["table"] is None, step
    [command] = _printed_commands(step["message"], "rerun")
    assert command == ["rerun", f"{PIPELINE}/{run_id}"], command

    again = shardline(airflow_stack, *command)
    assert again.returncode == 0, again.stdout + again.stderr
    airflow_stack.assert_succeeds(PIPELINE, run_id)
    assert prefix + "_SUCCESS" in _keys(staged["s3"], prefix)
    scanned = tables.load_table(staged["spec"], "score").scan(
        row_filter="dt == '2026-11-22' and hour == '16'", selected_fields=("id",)
    )
    assert sorted(scanned.to_arrow().column("id").to_pylist()) == list(range(20_000))  # each row once
    [commit] = [h for h in tables.history(staged["spec"], "score") if h.run_id == run_id]
    assert json.loads(commit.partition) == partition and commit.rows_added == 20_000, commit
    shown = shardline(airflow_stack, "status", f"{PIPELINE}/{run_id}")
    assert f"{commit.rows_added:,} rows committed in snapshot {commit.snapshot_id}" in shown.stdout, shown.stdout
