"""The single-table ledger's key layout (``shardline.ledger.keys``): pure string builders."""

from __future__ import annotations

import pytest

from shardline.ledger.keys import (
    PARTITION_LOCK_SK,
    RUN_SK,
    RUNS_PK,
    StepRef,
    failures_pk,
    file_sk,
    file_sk_prefix,
    is_control_sk,
    partition_lock_pk,
    run_pk,
    runs_index_sk,
    runs_pk,
    shard_sk,
    step_sk,
    step_sk_prefix,
)
from tests.support.helpers import shard_sk_prefix


def test_keys():
    assert run_pk("nightly", "r1") == "RUN#nightly#r1"
    assert step_sk("score") == "STEP#score#"
    assert not step_sk("score2").startswith(step_sk("score"))  # one step's prefix never matches another's
    assert file_sk("score", "s3://b/a.parquet") == "FILE#score#s3://b/a.parquet"
    assert file_sk("score", "a").startswith(file_sk_prefix("score"))
    assert not file_sk("score2", "a").startswith(file_sk_prefix("score"))
    assert shard_sk("score", 7, "algo-1") == "STEP#score#SHARD#0007#algo-1"
    assert shard_sk("score", 7, "algo-1").startswith(step_sk("score"))  # one Query reads a step and its shards
    assert shard_sk("score", 7, "h").startswith(shard_sk_prefix("score"))
    # zero padding keeps attempts in order under a prefix query
    assert sorted([shard_sk("s", 10, "h"), shard_sk("s", 9, "h")]) == [shard_sk("s", 9, "h"), shard_sk("s", 10, "h")]
    assert failures_pk("nightly") == "FAILED#nightly"


def test_a_step_ref_names_the_step_as_every_message_does():
    ref = StepRef("nightly", "r1", "score")
    assert str(ref) == "step score of nightly/r1"
    assert (ref.pipeline, ref.run_id, ref.step) == ref == ("nightly", "r1", "score")  # unpacks as a tuple


def test_the_run_index_sorts_by_start_time_and_keeps_each_pipelines_runs_apart():
    assert runs_pk("nightly") == f"{RUNS_PK}#nightly" != RUNS_PK
    earlier = runs_index_sk("2026-11-22T09:59:59+00:00", "zeta", "r9")
    later = runs_index_sk("2026-11-22T10:00:00+00:00", "alpha", "r1")
    assert earlier == "2026-11-22T09:59:59+00:00#zeta#r9"
    assert sorted([later, earlier]) == [earlier, later]  # the start time decides, not the pipeline's name


@pytest.mark.parametrize(
    ("sk", "control"),
    [
        (RUN_SK, True),
        (step_sk("score"), True),
        (shard_sk("score", 1, "algo-1"), False),
        (file_sk("score", "s3://b/a.parquet"), False),
        (file_sk("score", "s3://b/STEP#x"), False),
        ("RUNNER", False),
    ],
)
def test_a_sort_key_says_whether_the_item_is_the_orchestrators(sk, control):
    assert is_control_sk(sk) is control


def test_an_output_prefix_has_one_lock_item():
    assert partition_lock_pk("s3://b/out/dt=2026-11-22/") == "PARTITION#s3://b/out/dt=2026-11-22/"
    assert PARTITION_LOCK_SK == "LOCK"
    assert step_sk_prefix() == "STEP#" and step_sk("score").startswith(step_sk_prefix())
