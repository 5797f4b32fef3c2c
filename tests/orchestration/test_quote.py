"""A quote before launch, against moto_server and the local backend: two real runs of an XGBoost step, then a quote of
a third input from their reports (the figures by hand from those reports), the CLI's words and JSON, the plan task's
lines, a pipeline with no history (a sample run here, or a refusal naming the command), and the instance's start
recorded on its SHARD item so that the report bills its start-up."""

from __future__ import annotations

import json

import boto3
import pytest
import yaml

from shardline.decision.policy import Action
from shardline.ledger.keys import StepRef
from shardline.ledger.step_reads import read_step
from shardline.oncall.tune import sample_rates
from shardline.orchestration import services
from shardline.orchestration.quote import QuoteError, attempt_quote_lines, quote, quote_lines
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.orchestration.step.files import latest_attempt
from shardline.report.cost import SAGEMAKER_PROCESSING_PRICES
from shardline.report.model import RunReport
from shardline.s3uri import parse_s3_uri
from tests.orchestration.conftest import QUOTED_ROWS as ROWS
from tests.support.cli import run
from tests.support.pipelines import plan_request, wait_for_job


def run_to_end(spec, bucket: str, run_id: str, folder: str):
    request = plan_request(run_id, bucket, output=f"out/{folder}", input_prefix=f"s3://{bucket}/in/{folder}/")
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", request)).attempt
    wait_for_job(spec, attempt)
    assert step_end.finish(spec, attempt, Action.ADVANCE, "every file succeeded").value == "SUCCEEDED"
    return attempt


def report_of(spec, run_id: str) -> RunReport:
    attempt = latest_attempt(spec, StepRef(spec.pipeline, run_id, "score"))
    bucket, key = parse_s3_uri(attempt.report_uri("json"))
    return RunReport.from_json(services.s3_client(spec).get_object(Bucket=bucket, Key=key)["Body"].read())


def test_a_quote_from_two_runs_is_their_fit_priced_and_names_them(quoted, tmp_path):
    spec, bucket = quoted
    first = run_to_end(spec, bucket, "run-a", "a")
    run_to_end(spec, bucket, "run-b", "b")

    # The instance bills from its start: its SHARD item says when it started, before its first file's claim.
    records = read_step(services.ledger_model(spec), first.ref, file_attributes=None)
    shard = records.shards[0]
    first_claim = min(f.started_at for f in records.files)
    assert shard.started_at is not None and shard.started_at < first_claim
    report = report_of(spec, "run-a")
    assert report.instances[0].started_at == shard.started_at

    found = quote(spec, [None], input_prefix=f"s3://{bucket}/in/c/")
    step = found.partitions[0].steps[0]
    assert (step.work.files, step.work.instances, step.rows_known) == (3, 1, True)
    assert step.rows.expected == 3 * ROWS  # from the footers, exactly
    # By hand, from the two reports: the fit through (1 instance, 6,000 rows, S_a) and (1, 15,000, S_b)
    a, b = (report_of(spec, r) for r in ("run-a", "run-b"))
    per_row = (b.cost.instance_seconds - a.cost.instance_seconds) / (
        b.reconciliation.rows_out - a.reconciliation.rows_out
    )
    per_instance = a.cost.instance_seconds - per_row * a.reconciliation.rows_out
    assert step.rates.basis == "history" and set(step.rates.runs) == {"run-a", "run-b"}
    if per_instance >= 0 and per_row > 0:  # else the fit falls back to the runs' time outside files
        assert step.instance_seconds.expected == pytest.approx(per_instance + per_row * 3 * ROWS)
    price = SAGEMAKER_PROCESSING_PRICES[spec.step("score").resources.instance_type]  # the local run's price
    assert step.usd.expected == pytest.approx(step.instance_seconds.expected * price / 3600)
    assert step.usd.low < step.usd.expected < step.usd.high
    lines = quote_lines(found)
    assert "3 file(s)" in lines[1] and "9,000 predictions" in lines[1] and "1 x ml.m5.xlarge" in lines[1]
    assert any("2 earlier run(s) with the same model and instance type (run-" in line for line in lines)

    # The CLI says the same, and --json carries the figures
    dags = tmp_path / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "pipelines" / "quoted.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    prefix = f"s3://{bucket}/in/c/"
    shown = run("--dags-folder", str(dags), "quote", "quoted", "--input-prefix", prefix, "--no-sample")
    assert shown.returncode == 0, shown.stderr
    assert "quote of quoted: 1 run(s)" in shown.stdout and "9,000 predictions" in shown.stdout
    data = json.loads(run("--dags-folder", str(dags), "quote", "quoted", "--input-prefix", prefix, "--json").stdout)
    assert data["usd"]["expected"] == pytest.approx(step.usd.expected, rel=1e-3)
    assert data["partitions"][0]["steps"][0]["runs"] == list(step.rates.runs)

    # The plan task logs the quote of what it planned: rows guessed from the runs' rows per byte, not read
    planned = step_plan.plan(spec, "score", plan_request("run-c", bucket, output="out/c", input_prefix=prefix))
    said = attempt_quote_lines(spec, planned)
    assert said[0].startswith("quote: step score: 3 file(s)") and "(guessed from bytes)" in said[0]
    assert f"{step.rates.rows_per_second:,.0f} predictions/s an instance" in said[1]


def test_with_no_history_the_quote_times_a_sample_here_or_says_which_command_does(quoted):
    spec, bucket = quoted
    prefix = f"s3://{bucket}/in/c/"
    with pytest.raises(QuoteError, match=r"no successful run on ml\.m5\.xlarge .*`shardline quote quoted`"):
        quote(spec, [None], input_prefix=prefix)
    found = quote(spec, [None], input_prefix=prefix, sampler=sample_rates)
    step = found.partitions[0].steps[0]
    assert step.rates.basis == "sample" and step.rates.runs == ("9,000 rows",)
    assert step.instance_seconds.expected > 0 and step.usd.high > step.usd.expected > step.usd.low
    assert any("a sample run on this machine, not on that instance type" in line for line in quote_lines(found))
    planned = step_plan.plan(spec, "score", plan_request("run-c", bucket, output="out/c", input_prefix=prefix))
    assert attempt_quote_lines(spec, planned) == [
        "quote: step score has no successful run on ml.m5.xlarge yet, so no quote; `shardline quote quoted` quotes "
        "it from a sample run"
    ]


def test_an_empty_or_unreadable_input_is_said_not_quoted_as_free(quoted):
    spec, bucket = quoted
    found = quote(spec, [None], input_prefix=f"s3://{bucket}/in/nothing/", sampler=sample_rates)
    assert found.partitions[0].steps == [] and found.total.usd.expected == 0
    assert any("no input under" in note for note in found.notes)
    boto3.client("s3").put_object(Bucket=bucket, Key="in/bad/part-0.parquet", Body=b"not parquet at all")
    with pytest.raises(QuoteError, match="sample run could not run"):
        quote(spec, [None], input_prefix=f"s3://{bucket}/in/bad/", sampler=sample_rates)


def test_the_cli_quotes_a_scheduled_pipelines_partitions_and_says_what_it_cannot(aws_env, ledger_table, tmp_path):
    """Partitions by interval start (`--partition`, `--from`/`--to`), an hour with no input quoted as nothing, a
    bucket that is not there said as such, and flags that do not go together refused before anything is read."""
    boto3.client("s3").create_bucket(Bucket="quote-cli")
    dags = tmp_path / "dags"
    (dags / "pipelines").mkdir(parents=True)
    hour = "dt={{ data_interval_start | ds }}/hour={{ data_interval_start.strftime('%H') }}/"
    spec = {
        "pipeline": "hourly_q",
        "ledger_table": ledger_table,
        "schedule": "@hourly",
        "steps": [
            {
                "name": "score",
                "model": {"uri": "s3://quote-cli/model.tar.gz", "allow_unpinned": True},
                "input": {"prefix": f"s3://quote-cli/in/{hour}"},
                "output": {"prefix": f"s3://quote-cli/out/{hour}"},
            }
        ],
    }
    (dags / "pipelines" / "hourly_q.yaml").write_text(yaml.safe_dump(spec))
    quoted = run(
        "--dags-folder", str(dags), "quote", "hourly_q", "--from", "2026-11-22T10:00", "--to", "2026-11-22T13:00"
    )
    assert quoted.returncode == 0, quoted.stderr
    assert quoted.stdout.startswith("quote of hourly_q: 3 run(s)"), quoted.stdout
    notes = [line for line in quoted.stdout.splitlines() if line.startswith("note: ")]
    assert notes and all("no input under s3://quote-cli/in/dt=2026-11-22/hour=" in n for n in notes), notes
    for args, said in (
        (("--partition", "2026-11-22T10:00", "--from", "2026-11-22T10:00"), "give --partition, or --from and --to"),
        (("--from", "2026-11-22T10:00"), "--from and --to go together"),
        (("--partition", "2026-11-22T10:30"), "2026-11-22T10:30"),  # no start of an hourly interval
    ):
        refused = run("--dags-folder", str(dags), "quote", "hourly_q", *args)
        assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    spec["steps"][0]["input"]["prefix"] = f"s3://quote-cli-missing/in/{hour}"
    (dags / "pipelines" / "hourly_q.yaml").write_text(yaml.safe_dump(spec))
    missing = run("--dags-folder", str(dags), "quote", "hourly_q", "--partition", "2026-11-22T10:00")
    assert missing.returncode != 0 and "quote-cli-missing" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
