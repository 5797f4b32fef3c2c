"""The local job's supervisor (``shardline.backends.local_supervisor``): how a job that ended is judged, and the
inputs and model files it refuses to stage."""

from __future__ import annotations

import io
import json

import boto3
import pyarrow.parquet as pq
import pytest

from examples import synthetic
from shardline.decision.policy import JobStatus
from shardline.planning.inputs import write_manifest
from tests.support.backend_jobs import job, local_backend, wait_terminal  # noqa: F401


@pytest.mark.parametrize(
    ("codes", "elapsed", "status"),
    [
        ({"algo-1": 0, "algo-2": 0}, 3.5, JobStatus.STOPPED),  # ended between the last two polls, past 3 s
        ({"algo-1": 0, "algo-2": 1}, 3.5, JobStatus.STOPPED),
        ({"algo-1": 0, "algo-2": 0}, 2.9, JobStatus.COMPLETED),
        ({"algo-1": 0, "algo-2": 1}, 2.9, JobStatus.FAILED),
    ],
)
def test_job_seen_to_end_past_max_runtime_is_stopped_not_completed(codes, elapsed, status):
    from shardline.backends.local_supervisor import job_end

    ended = job_end(codes, elapsed, 3)
    assert ended["status"] == status.value, ended
    if status is JobStatus.STOPPED:
        assert ended["failure_reason"] == "MaxRuntimeInSeconds (3) exceeded"


def _files(root):
    return {p for p in root.rglob("*") if not p.is_dir()}


@pytest.mark.slow
def test_path_escape_keys_in_a_manifest_and_a_model_prefix_are_refused_and_the_rest_processed(
    job,  # noqa: F811
    local_backend,  # noqa: F811
    tmp_path,
):
    s3 = boto3.client("s3")
    raw, models, out = job.buckets["raw"], job.buckets["models"], job.buckets["out"]
    request = job(run_id="run-escape")
    # The job dir is tmp_path/lb/jobs/NAME, and each input dir four levels below it: seven '..' reach tmp_path.
    up = "../" * 7
    crafted = [
        str(tmp_path / "escaped-absolute.parquet"),  # the key has '//': the path is absolute
        f"{up}escaped-dotdot.parquet",
        f"sub/{up}../escaped-sub.parquet",
        "./dot.parquet",
        "sub//inner.parquet",
        "../../x",
    ]
    body = io.BytesIO()
    pq.write_table(synthetic.make_table(10, first_id=10_000, seed=9), body)
    for rel in crafted:  # real parquet files: downloaded, each would be processed too
        s3.put_object(Bucket=raw, Key=f"dt=2026-11-22/{rel}", Body=body.getvalue())
    entries = [{"prefix": f"s3://{raw}/dt=2026-11-22/"}, *[f"part-{i}.parquet" for i in range(6)], *crafted]
    manifest = request["ProcessingInputs"][0]["S3Input"]["S3Uri"]
    write_manifest(s3, manifest, json.dumps(entries))
    # A model prefix with the model and a key that climbs out of the model dir to plant a file.
    s3.copy_object(Bucket=models, Key="xgbdir/model.tar.gz", CopySource={"Bucket": models, "Key": "xgb/model.tar.gz"})
    s3.put_object(Bucket=models, Key=f"xgbdir/{up}escaped-model.pth", Body=b"import os\n")
    request["ProcessingInputs"][1]["S3Input"]["S3Uri"] = f"s3://{models}/xgbdir/"

    before = _files(tmp_path)
    name = local_backend.submit(request)
    state = wait_terminal(local_backend, name)
    job_dir = local_backend.job_dir(name)
    assert list(tmp_path.glob("escaped-*")) == []
    assert {p for p in _files(tmp_path) - before if not p.is_relative_to(job_dir)} == set()
    assert list(job_dir.glob("algo-*/processing/x")) == []  # '../../x' would leave the input dir
    assert state.status is JobStatus.COMPLETED, state
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=out, Prefix="run-escape/")["Contents"])
    assert [k for k in keys if k.endswith(".parquet")] == [f"run-escape/part-{i}.parquet" for i in range(6)]
    log = (job_dir / "supervisor.log").read_text()
    for rel in crafted:
        assert f"not downloading entry {rel!r}" in log, rel
    assert f"xgbdir/{up}escaped-model.pth: '..' segment" in log


@pytest.mark.parametrize(
    ("codes", "reason"),
    [
        (
            {"algo-1": 3, "algo-2": 0, "algo-3": -9},
            "AlgorithmError: algo-1 exited with code 3, algo-3 exited with code -9",
        ),
        ({"algo-2": 4, "algo-1": 5}, "AlgorithmError: algo-1 exited with code 5, algo-2 exited with code 4"),
    ],
)
def test_a_failed_job_names_each_instance_that_exited_non_zero_in_host_order(codes, reason):
    from shardline.backends.local_supervisor import job_end

    assert job_end(codes, 1.0, 60) == {"status": JobStatus.FAILED.value, "failure_reason": reason, "exit_codes": codes}


@pytest.mark.parametrize(
    ("code", "lost"),
    [(None, False), (0, False), (3, False), (4, False), (5, False), (-9, True), (143, True), (1, True), (137, True)],
)
def test_an_instance_is_lost_when_it_exited_without_one_of_the_workers_own_ends(code, lost):
    from shardline.backends.local_supervisor import is_lost

    assert is_lost(code) is lost


def test_a_container_path_maps_into_the_instances_directory_and_never_out_of_it(tmp_path):
    from shardline.backends.local_supervisor import local_path
    from shardline.errors import InputRefused

    instance = tmp_path / "algo-1"
    assert local_path(instance, "/opt/ml/processing/input/data/") == instance / "processing" / "input/data/"
    assert local_path(instance, "/elsewhere/out") == instance / "processing" / "elsewhere/out"
    for escape in ("/opt/ml/processing/../../etc", "/opt/ml/processing/input/./data", "/opt/ml/processing//x"):
        with pytest.raises(InputRefused, match="does not name a directory under /opt/ml/processing/"):
            local_path(instance, escape)


def test_inputs_are_dealt_by_key_or_given_whole_to_every_instance():
    from shardline.backends.local_supervisor import deal

    keys = ["a", "b", "c", "d", "e"]
    assert deal(keys, 2, "ShardedByS3Key") == [["a", "c", "e"], ["b", "d"]]
    assert deal(keys, 2, "FullyReplicated") == [keys, keys]
    assert deal(keys, 3, "ShardedByS3Key") == [["a", "d"], ["b", "e"], ["c"]]
