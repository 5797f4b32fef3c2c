"""LedgerContext.from_env and to_env: pure, no AWS."""

from __future__ import annotations

import pytest

from shardline.ledger.context import LedgerConfigError, LedgerContext

FULL = {
    "SHARDLINE_LEDGER_TABLE": "ledger",
    "SHARDLINE_PIPELINE": "nightly",
    "SHARDLINE_RUN_ID": "2024-06-01",
    "SHARDLINE_STEP": "score",
    "SHARDLINE_ATTEMPT": "3",
}


def test_no_table_means_no_ledger():
    assert LedgerContext.from_env({}) is None
    assert LedgerContext.from_env({"SHARDLINE_LEDGER_TABLE": "  ", "SHARDLINE_PIPELINE": "p"}) is None


def test_full_environment():
    context = LedgerContext.from_env({**FULL, "SHARDLINE_INPUT_URI": "s3://b/in/", "SHARDLINE_OUTPUT_URI": "s3://b/o"})
    assert context == LedgerContext(
        table="ledger",
        pipeline="nightly",
        run_id="2024-06-01",
        step="score",
        attempt=3,
        input_uri="s3://b/in/",
        output_uri="s3://b/o",
    )
    assert context.input_key("d/a.parquet") == "s3://b/in/d/a.parquet"
    assert context.output_key("d/a.parquet") == "s3://b/o/d/a.parquet"
    bare = LedgerContext.from_env(FULL)
    assert bare.input_key("a.csv") == "a.csv"


@pytest.mark.parametrize(
    "missing",
    [
        ["SHARDLINE_PIPELINE"],
        ["SHARDLINE_ATTEMPT"],
        ["SHARDLINE_RUN_ID", "SHARDLINE_STEP"],
        ["SHARDLINE_PIPELINE", "SHARDLINE_RUN_ID", "SHARDLINE_STEP", "SHARDLINE_ATTEMPT"],
    ],
)
def test_partial_environment_names_what_is_missing(missing):
    env = {k: v for k, v in FULL.items() if k not in missing}
    with pytest.raises(LedgerConfigError) as info:
        LedgerContext.from_env(env)
    message = str(info.value)
    for name in missing:
        assert name in message
    for name in set(FULL) - set(missing) - {"SHARDLINE_LEDGER_TABLE"}:
        assert name not in message, f"{name} is set and must not be reported missing"
    assert "SHARDLINE_LEDGER_TABLE" in message, "the message says why the others are needed"


def test_blank_values_count_as_missing():
    with pytest.raises(LedgerConfigError, match="SHARDLINE_STEP"):
        LedgerContext.from_env({**FULL, "SHARDLINE_STEP": "   "})


@pytest.mark.parametrize("attempt", ["one", "1.5", "0", "-2"])
def test_bad_attempt(attempt):
    with pytest.raises(LedgerConfigError, match="SHARDLINE_ATTEMPT"):
        LedgerContext.from_env({**FULL, "SHARDLINE_ATTEMPT": attempt})


def test_config_error_is_a_value_error():
    assert issubclass(LedgerConfigError, ValueError)


def test_a_context_writes_the_environment_it_reads_back():
    """The request builder sets a job's environment through to_env, so both sides spell the names once."""
    ctx = LedgerContext(
        table="t",
        pipeline="p",
        run_id="manual__2026-11-22T10:00:00+00:00",
        step="score",
        attempt=3,
        input_uri="s3://b/in/",
        output_uri="s3://b/out/",
        retention_days=30,
    )
    assert LedgerContext.from_env(ctx.to_env()) == ctx


def test_the_job_request_environment_is_what_the_worker_reads():
    from shardline.planning.request import build_processing_request
    from tests.planning.test_request import IMAGE, ROLE, attempt, full_spec

    request = build_processing_request(full_spec(), attempt(), image_uri=IMAGE, role_arn=ROLE)
    ctx = LedgerContext.from_env(request["Environment"])
    assert (ctx.pipeline, ctx.step, ctx.attempt, ctx.input_uri) == (
        attempt().pipeline,
        attempt().step,
        attempt().number,
        attempt().input_prefix,
    )
