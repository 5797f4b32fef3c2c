"""A step's output table on real parts: moto_server, the local backend, the real worker, pyiceberg's SQL catalog in
SQLite (the stack's own, ``local``) and Glue on the embedded endpoint. A run's partition lands in one snapshot at
its step's end, before ``_SUCCESS``; a rerun replaces it whole; a retried or killed commit lands once; a schema the
table cannot take is refused with nothing committed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from examples import synthetic
from shardline.errors import TableError
from shardline.orchestration import partitions, tables
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.planning.attempt import Attempt
from shardline.spec import load_spec, parse_spec
from shardline.waiting import wait_for
from tests.support.pipelines import plan_request, stage_step, wait_for_job

PARTITION = {"dt": "2026-12-01", "hour": "05"}
TABLE = {"namespace": "scoring", "name": "hourly_scores", "partition": {"dt": "{{ ds }}", "hour": "{{ hour }}"}}


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _inputs(files: int, rows: int, seed: int) -> dict[str, bytes]:
    return {
        f"part-{i}.parquet": _parquet(synthetic.make_table(rows, first_id=seed * 100_000 + i * rows, seed=seed + i))
        for i in range(files)
    }


@pytest.fixture
def pipeline(aws_env, ledger_table, sklearn_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    return stage_step(
        "tables_test",
        ledger_table,
        sklearn_model.parent,
        tmp_path,
        _inputs(3, 300, 1),
        features=synthetic.feature_names(),
        step_settings={"output": {"prefix": "s3://placeholder/out/", "table": TABLE}},
    )


def _score(spec, bucket, run_id, folder="in", partition=PARTITION):
    """Plan, run and end one run of the partition through the real worker; the attempt and the step's status."""
    request = plan_request(
        run_id,
        bucket,
        input_prefix=f"s3://{bucket}/{folder}/",
        output_prefix=f"s3://{bucket}/out/",
        table_partition=partition,
    )
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", request)).attempt
    wait_for_job(spec, attempt)
    return attempt, step_end.finish(spec, attempt, "ADVANCE", "all files succeeded")


def _partition_ids(spec, partition=PARTITION) -> list[int]:
    from pyiceberg.expressions import And, EqualTo

    table = tables.load_table(spec, "score")
    where = And(*(EqualTo(k, v) for k, v in partition.items())) if len(partition) > 1 else EqualTo(*partition.items())
    return table.scan(row_filter=where, selected_fields=("id",)).to_arrow().column("id").to_pylist()


def _ids(inputs: dict[str, bytes]) -> list[int]:
    return [
        i for body in inputs.values() for i in pq.read_table(io.BytesIO(body), columns=["id"]).column("id").to_pylist()
    ]


def test_a_rerun_replaces_the_partition_whole_in_one_snapshot_per_run(pipeline, aws_env, tmp_path):
    spec, bucket = pipeline
    first_inputs = _inputs(3, 300, 1)
    attempt, status = _score(spec, bucket, "run-1")
    assert status.value == "SUCCEEDED"
    assert sorted(_partition_ids(spec)) == sorted(_ids(first_inputs))
    # Each output carries the partition and is named by its run and attempt: no later run rewrites it.
    s3 = boto3.client("s3")
    keys = [
        o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"] if o["Key"].endswith(".parquet")
    ]
    assert keys and all(k.endswith(f".{attempt.output_tag}.parquet") for k in keys if "/_" not in k), keys
    written = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read()))
    assert set(written.column("dt").to_pylist()) == {"2026-12-01"} and set(written.column("hour").to_pylist()) == {"05"}
    marker = json.loads(s3.get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert marker["table"]["rows_added"] == 900 and marker["table"]["files_added"] == 3
    # The commit is a fact of the step where people look: its ledger record (the summary the Asset event and the
    # lineage carry), its run report, and `shardline status`.
    current = tables.load_table(spec, "score").current_snapshot().snapshot_id
    summary = step_end.summarize(spec, attempt.ref)
    assert summary.table["snapshot_id"] == current and summary.table["rows_added"] == 900
    report = json.loads(s3.get_object(Bucket=bucket, Key=_key(attempt.report_uri("json")))["Body"].read())
    assert report["table"] == summary.table
    assert (
        f"snapshot {current}"
        in s3.get_object(Bucket=bucket, Key=_key(attempt.report_uri("html")))["Body"].read().decode()
    )
    shown = _shardline(spec, tmp_path / "dags", aws_env, "status", f"{spec.pipeline}/run-1")
    said = f"table scoring.hourly_scores partition dt=2026-12-01/hour=05: 900 rows committed in snapshot {current}"
    assert f"step score: {said}" in shown, shown

    # The second run of the partition reads other inputs (a fix upstream): only its rows are the partition's.
    second_inputs = _inputs(2, 250, 7)
    for name, body in second_inputs.items():
        s3.put_object(Bucket=bucket, Key=f"in-2/{name}", Body=body)
    partitions.release_run(spec, spec.pipeline, "run-1")  # the run ended: its hold on the prefix goes
    _, status = _score(spec, bucket, "run-2", folder="in-2")
    assert status.value == "SUCCEEDED"
    ids = _partition_ids(spec)
    assert sorted(ids) == sorted(_ids(second_inputs)) and len(ids) == len(set(ids)) == 500

    history = tables.history(spec, "score")
    assert [(h.run_id, h.operation) for h in history] == [("run-2", "overwrite"), ("run-1", "append")]
    assert history[0].rows_added == 500 and history[0].rows_removed == 900 and history[0].total_rows == 500
    # The first run's files are still where its snapshot says: a reader of that snapshot reads it whole.
    old = tables.load_table(spec, "score").scan(snapshot_id=history[1].snapshot_id, selected_fields=("id",))
    assert sorted(old.to_arrow().column("id").to_pylist()) == sorted(_ids(first_inputs))

    # The step's end run again (a retried watch task) commits nothing more.
    again = tables.commit_partition(spec, attempt.model_copy(update={"run_id": "run-2"}), _manifest_outputs(bucket))
    assert again.already and len(tables.history(spec, "score")) == 2


def _key(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[1]


def _shardline(spec, dags, aws_env: dict, *args: str) -> str:
    """The on-call CLI over a DAG folder that holds the spec, as on-call runs it; its output."""
    (dags / "pipelines").mkdir(parents=True, exist_ok=True)
    (dags / "pipelines" / f"{spec.pipeline}.yaml").write_text(
        yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True))
    )
    shown = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "shardline"), "--dags-folder", str(dags), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **aws_env, "COLUMNS": "240"},
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return shown.stdout


def _manifest_outputs(bucket: str) -> list[dict]:
    marker = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    bucket_name, key = marker["manifest"].removeprefix("s3://").split("/", 1)
    return json.loads(boto3.client("s3").get_object(Bucket=bucket_name, Key=key)["Body"].read())["outputs"]


# -- the commit alone, on files written as the worker writes them ------------------------------------------------


def _spec_and_attempt(bucket: str, run_id: str, *, mode="replace_partition", catalog="local", spec=None):
    spec = spec or parse_spec(
        {
            "pipeline": "tables_commit",
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": f"s3://{bucket}/m/model.tar.gz", "sha256": "0" * 64},
                    "input": {"prefix": f"s3://{bucket}/in/"},
                    "output": {"prefix": f"s3://{bucket}/out/", "table": {**TABLE, "mode": mode, "catalog": catalog}},
                }
            ],
        },
        "tables_commit.yaml",
    )
    attempt = Attempt(
        pipeline=spec.pipeline,
        run_id=run_id,
        step="score",
        number=1,
        input_prefix=f"s3://{bucket}/in/",
        output_prefix=f"s3://{bucket}/out/",
        model_uri=f"s3://{bucket}/m/model.tar.gz",
        table_partition=dict(PARTITION),
    )
    return spec, attempt


def _write(bucket: str, key: str, rows: int, *, partition=PARTITION, extra: dict | None = None, first_id=0) -> dict:
    """One output as the worker writes it (id, prediction, the partition columns), and its manifest entry."""
    columns = {"id": pa.array(range(first_id, first_id + rows), pa.int64()), "prediction": pa.array([0.25] * rows)}
    columns.update(extra or {})
    columns.update({name: pa.array([value] * rows) for name, value in partition.items()})
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=_parquet(pa.table(columns)))
    return {"output": f"s3://{bucket}/{key}", "rows_out": rows}


@pytest.fixture
def bucket(aws_env, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    name = f"t-{os.urandom(4).hex()}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


def test_an_added_column_evolves_the_table_and_a_changed_type_is_refused_with_nothing_committed(bucket):
    spec, attempt = _spec_and_attempt(bucket, "run-1")
    tables.commit_partition(spec, attempt, [_write(bucket, "out/a.r1.parquet", 10)])
    _, second = _spec_and_attempt(bucket, "run-2")
    done = tables.commit_partition(
        spec, second, [_write(bucket, "out/a.r2.parquet", 4, extra={"proba_1": pa.array([0.5] * 4)})]
    )
    table = tables.load_table(spec, "score")
    assert "proba_1" in table.schema().column_names and not table.schema().find_field("proba_1").required
    assert done.rows_added == 4

    before = tables.history(spec, "score")
    _, third = _spec_and_attempt(bucket, "run-3")
    changed = _write(bucket, "out/a.r3.parquet", 3, extra={"proba_1": pa.array(["high"] * 3)})
    with pytest.raises(TableError, match=r"column 'proba_1' is double in the table, string in this run's outputs"):
        tables.commit_partition(spec, third, [changed])
    gone = _write(bucket, "out/a.r4.parquet", 3)  # proba_1 no longer written
    with pytest.raises(TableError, match=r"column 'proba_1' \(double\) is in the table but not in this run's outputs"):
        tables.commit_partition(spec, third, [gone])
    assert tables.history(spec, "score") == before
    assert sorted(_partition_ids(spec)) == [0, 1, 2, 3]


def test_append_mode_adds_beside_and_a_file_of_another_partition_is_refused(bucket):
    spec, first = _spec_and_attempt(bucket, "run-1", mode="append")
    tables.commit_partition(spec, first, [_write(bucket, "out/a.r1.parquet", 5)])
    _, second = _spec_and_attempt(bucket, "run-2", mode="append")
    tables.commit_partition(spec, second, [_write(bucket, "out/a.r2.parquet", 3, first_id=100)])
    assert sorted(_partition_ids(spec)) == [0, 1, 2, 3, 4, 100, 101, 102]
    stray = _write(bucket, "out/b.r3.parquet", 2, partition={"dt": "2026-12-01", "hour": "06"})
    _, third = _spec_and_attempt(bucket, "run-3", mode="append")
    with pytest.raises(TableError, match=r"holds partition \('2026-12-01', '06'\), not this run's"):
        tables.commit_partition(spec, third, [stray])


def test_partitions_committed_at_once_all_land(bucket):
    spec, _ = _spec_and_attempt(bucket, "seed")
    hours = [f"{h:02d}" for h in range(6)]
    outputs = {
        h: _write(bucket, f"out/hour={h}/a.parquet", 10 + int(h), partition={**PARTITION, "hour": h}) for h in hours
    }
    start, errors = threading.Barrier(len(hours)), []

    def commit(hour: str) -> None:
        attempt = _spec_and_attempt(bucket, f"run-{hour}", spec=spec)[1].model_copy(
            update={"table_partition": {**PARTITION, "hour": hour}}
        )
        start.wait()
        try:
            tables.commit_partition(spec, attempt, [outputs[hour]])
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=commit, args=(h,)) for h in hours]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for hour in hours:
        assert len(_partition_ids(spec, {**PARTITION, "hour": hour})) == 10 + int(hour)
    assert sorted(h.run_id for h in tables.history(spec, "score")) == sorted(f"run-{h}" for h in hours)


KILLED_COMMIT = """
import json, sys
from shardline.orchestration import tables
from shardline.planning.attempt import Attempt
from shardline.spec import parse_spec
args = json.loads(sys.argv[1])
tables.commit_partition(parse_spec(args["spec"], "x.yaml"), Attempt(**args["attempt"]), args["outputs"])
"""


def test_a_commit_killed_before_the_catalog_swap_leaves_the_table_unchanged_and_the_retry_lands_once(
    bucket, aws_env, tmp_path, monkeypatch
):
    import sqlite3

    database = tmp_path / "catalog.db"
    monkeypatch.setenv(tables.ENV_LOCAL_CATALOG_URI, f"sqlite:///{database}?timeout=600")
    spec, first = _spec_and_attempt(bucket, "run-1")
    tables.commit_partition(spec, first, [_write(bucket, "out/a.r1.parquet", 6)])
    location = tables.load_table(spec, "score").metadata_location
    _, second = _spec_and_attempt(bucket, "run-2")
    outputs = [_write(bucket, "out/a.r2.parquet", 4, first_id=50)]
    s3 = boto3.client("s3")
    table_folder = location.removeprefix(f"s3://{tables.LOCAL_WAREHOUSE.removeprefix('s3://')}").rsplit("/", 1)[0]
    metadata_before = _metadata_files(s3, table_folder)

    # The catalog's swap waits on a write lock the test holds; the commit writes its new metadata file first.
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    args = {
        "spec": spec.model_dump(mode="json", exclude_none=True),
        "attempt": second.model_dump(mode="json"),
        "outputs": outputs,
    }
    env = {**os.environ, tables.ENV_LOCAL_CATALOG_URI: f"sqlite:///{database}?timeout=600"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_COMMIT, json.dumps(args)], env=env)
    try:
        assert wait_for(lambda: len(_metadata_files(s3, table_folder)) > len(metadata_before), timeout=120)
    finally:
        proc.kill()
        proc.wait()
        holder.execute("ROLLBACK")
        holder.close()

    table = tables.load_table(spec, "score")
    assert table.metadata_location == location  # the swap never happened: the table is as it was
    assert sorted(_partition_ids(spec)) == list(range(6))
    done = tables.commit_partition(spec, second, outputs)
    assert not done.already and done.rows_added == 4
    assert [h.run_id for h in tables.history(spec, "score")] == ["run-2", "run-1"]
    assert sorted(_partition_ids(spec)) == [50, 51, 52, 53]


def _metadata_files(s3, folder: str) -> list[str]:
    bucket = tables.LOCAL_WAREHOUSE.removeprefix("s3://").rstrip("/")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=folder.lstrip("/") + "/")
    return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".metadata.json")]


def test_the_glue_catalog_on_the_embedded_endpoint(bucket, aws_env, tmp_path):
    dags = tmp_path / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "catalogs.yaml").write_text(
        "catalog:\n"
        "  lake:\n"
        "    type: glue\n"
        "    glue.endpoint: ${AWS_ENDPOINT_URL}\n"
        "    glue.region: us-east-1\n"
        f"    warehouse: s3://{bucket}/warehouse/\n"
        "    s3.endpoint: ${AWS_ENDPOINT_URL}\n"
        "    s3.region: us-east-1\n"
    )
    spec, attempt = _spec_and_attempt(bucket, "run-1", catalog="lake")
    spec_file = dags / "pipelines" / "tables_commit.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    spec = load_spec(spec_file)  # the catalogs file beside the specs names `lake`
    done = tables.commit_partition(spec, attempt, [_write(bucket, "out/a.r1.parquet", 7)])
    glue = boto3.client("glue").get_table(DatabaseName="scoring", Name="hourly_scores")["Table"]
    assert glue["Parameters"]["table_type"].upper() == "ICEBERG"
    assert glue["Parameters"]["metadata_location"] == tables.load_table(spec, "score").metadata_location
    assert done.rows_added == 7 and tables.scanned_rows(spec, "score", PARTITION) == 7

    # `shardline table history` lists the snapshot with the run that committed it.
    shown = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "shardline"),
            "--dags-folder",
            str(dags),
            "table",
            "history",
            "tables_commit",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **aws_env},
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    [snapshot] = json.loads(shown.stdout)["snapshots"]
    assert (snapshot["run_id"], snapshot["attempt"], snapshot["rows_added"]) == ("run-1", "1", 7)
    assert snapshot["snapshot_id"] == done.snapshot_id


def test_an_attempt_planned_before_the_table_was_set_is_refused_never_skipped(bucket):
    spec, attempt = _spec_and_attempt(bucket, "run-1")
    unpartitioned = attempt.model_copy(update={"table_partition": None})
    with pytest.raises(TableError, match=r"was planned without it .* nothing was committed"):
        tables.commit_partition(spec, unpartitioned, [_write(bucket, "out/a.parquet", 3)])


def test_a_catalog_setting_not_set_where_the_commit_runs_fails_the_commit_naming_it(bucket, tmp_path, monkeypatch):
    """A ``${NAME}`` in dags/catalogs.yaml that Airflow's workers do not have: the commit fails as a setting to
    change (a TableError naming it and the retry), never a crash of the watch task, and nothing is committed."""
    monkeypatch.delenv("SHARDLINE_TEST_LAKE_URI", raising=False)
    dags = tmp_path / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "catalogs.yaml").write_text("catalog:\n  lake:\n    type: sql\n    uri: ${SHARDLINE_TEST_LAKE_URI}\n")
    spec, attempt = _spec_and_attempt(bucket, "run-1", catalog="lake")
    spec_file = dags / "pipelines" / "tables_commit.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    spec = load_spec(spec_file)
    with pytest.raises(TableError, match=r"SHARDLINE_TEST_LAKE_URI, not set .* `shardline rerun tables_commit/run-1`"):
        tables.commit_partition(spec, attempt, [_write(bucket, "out/a.r1.parquet", 3)])
