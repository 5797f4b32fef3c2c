import re

from shardline.planning.naming import MAX_JOB_NAME, job_name, manifest_key

SAGEMAKER_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def test_job_name_is_deterministic_and_valid():
    a = job_name("tabular_scoring", "scheduled__2026-11-22T10:00:00+00:00", "score", 1)
    assert a == job_name("tabular_scoring", "scheduled__2026-11-22T10:00:00+00:00", "score", 1)
    assert SAGEMAKER_NAME.match(a) and len(a) <= MAX_JOB_NAME
    assert a.endswith("-a1")


def test_job_names_differ_by_run_step_and_attempt_even_when_truncated():
    long = "p" * 80
    names = {
        job_name(long, "run-1", "score", 1),
        job_name(long, "run-2", "score", 1),
        job_name(long, "run-1", "postprocess", 1),
        job_name(long, "run-1", "score", 2),
    }
    assert len(names) == 4
    assert all(SAGEMAKER_NAME.match(n) and len(n) <= MAX_JOB_NAME for n in names)


def test_manifest_key_sits_under_a_reserved_prefix():
    key = manifest_key("s3://b/out/dt=2026-11-22/", "manual__2026-11-22T10:00:00", "score", 2)
    assert key.startswith("s3://b/out/dt=2026-11-22/_shardline/manifests/")
    assert key.endswith("/score/attempt-0002.manifest")


def test_run_ids_that_differ_never_share_s3_keys():
    from shardline.planning.naming import outputs_manifest_key, report_key, run_folder

    ids = [
        "run-1",
        "Run-1",
        "run+1",
        "run 1",
        "manual__2026-11-22T10:00:00",
        "manual__2026-11-22T10-00-00",
        "x" * 80 + "a",
        "x" * 80 + "b",
    ]
    for key_of in (
        lambda r: manifest_key("s3://b/out/", r, "score", 1),
        lambda r: outputs_manifest_key("s3://b/out/", r, "score"),
        lambda r: report_key("s3://b/out/", r, "score"),
    ):
        assert len({key_of(r) for r in ids}) == len(ids)
    assert run_folder("run-1").startswith("run-1-") and "/" not in run_folder("a/../b")
