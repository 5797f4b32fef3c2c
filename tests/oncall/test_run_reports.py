"""A run's reports for on-call (``shardline.oncall.run_reports``): `shardline report`, the installed command in a
subprocess, against a step that really ran (moto_server, the local backend, the real worker) and whose end wrote its
run report, and against a run whose step has not ended; and where a fetched page is put, under what policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml

from shardline.decision.policy import Action
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import plan as step_plan
from shardline.planning.naming import run_folder
from tests.airflow.ui.conftest import browser  # noqa: F401  (the UI tests' headless Chromium, a module-scoped fixture)
from tests.support.pipelines import parquet_bytes, plan_request, stage_step, wait_for_job

CLI = Path(sys.executable).with_name("shardline")
PIPELINE = "report_cli"


def run(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    here = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "BROWSER")}
    return subprocess.run(
        [str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**here, "COLUMNS": "160", **env},
        cwd=cwd,
    )


def write_dags(spec, folder: Path) -> list[str]:
    """The spec as a DAGs folder's YAML, where the CLI finds it; the CLI's --dags-folder arguments."""
    (folder / "pipelines").mkdir(parents=True)
    (folder / "pipelines" / f"{spec.pipeline}.yaml").write_text(
        yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
    )
    return ["--dags-folder", str(folder)]


@pytest.fixture
def staged(aws_env, ledger_table, xgboost_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLINE_LOCAL_ROOT", str(tmp_path / "local"))
    spec, bucket = stage_step(
        PIPELINE,
        ledger_table,
        xgboost_model.parent,
        tmp_path,
        {f"part-{i}.parquet": parquet_bytes(300, i * 300) for i in range(3)},
    )
    work = tmp_path / "cwd"
    work.mkdir()
    return spec, bucket, write_dags(spec, tmp_path / "dags"), aws_env, work


def s3_body(bucket: str, key: str) -> bytes:
    return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


def test_help_names_the_options():
    result = subprocess.run([str(CLI), "report", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "usage: shardline report" in result.stdout
    for option in ("--step", "--open", "--out", "--json"):
        assert option in result.stdout, option


@pytest.mark.slow
def test_report_fetches_a_finished_step_s_report_to_a_local_file(staged, tmp_path):
    spec, bucket, dags, env, cwd = staged
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-1", bucket))).attempt
    wait_for_job(spec, attempt)
    assert step_end.finish(spec, attempt, Action.ADVANCE, "3 files succeeded").value == "SUCCEEDED"  # writes the report
    html = s3_body(bucket, f"out/_shardline/reports/{run_folder('run-1')}/score/report.html")
    stored_json = json.loads(s3_body(bucket, f"out/_shardline/reports/{run_folder('run-1')}/score/report.json"))

    fetched = run(*dags, "report", f"{PIPELINE}/run-1", "--step", "score", env=env, cwd=cwd)
    assert fetched.returncode == 0, fetched.stderr
    path = cwd / ".shardline" / "reports" / PIPELINE / "run-1" / "score" / "report.html"
    assert fetched.stdout.splitlines() == [str(path)]
    assert path.read_bytes() == html and b"<img" in html  # rendered from report.json: the same page

    # Without --step: every step of the run that has a report (here the one step).
    path.unlink()
    every = run(*dags, "report", f"{PIPELINE}/run-1", env=env, cwd=cwd)
    assert every.returncode == 0 and every.stdout.splitlines() == [str(path)], every.stderr
    assert path.read_bytes() == html

    # --json prints report.json's content, and still writes the page.
    path.unlink()
    as_json = run(*dags, "report", f"{PIPELINE}/run-1", "--step", "score", "--json", env=env, cwd=cwd)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == stored_json
    assert stored_json["reconciliation"]["rows_out"] == 900 and path.read_bytes() == html
    listed = run(*dags, "report", f"{PIPELINE}/run-1", "--json", env=env, cwd=cwd)
    assert json.loads(listed.stdout) == [stored_json]

    # --out writes where it is told; --open hands the file's URI to the browser ($BROWSER, as webbrowser reads it).
    opened = tmp_path / "opened.txt"
    fake_browser = tmp_path / "browser.sh"
    fake_browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {opened}\n')
    fake_browser.chmod(0o755)
    out = tmp_path / "elsewhere" / "r.html"
    chosen = run(
        *dags,
        "report",
        f"{PIPELINE}/run-1",
        "--step",
        "score",
        "--out",
        str(out),
        "--open",
        env={**env, "BROWSER": f"{fake_browser} %s"},
        cwd=cwd,
    )
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.splitlines() == [str(out)] and out.read_bytes() == html
    assert opened.read_text() == out.resolve().as_uri()


def test_a_step_without_a_report_is_not_found_and_says_when_reports_are_written(staged):
    spec, bucket, dags, env, cwd = staged
    step_plan.plan(spec, "score", plan_request("run-2", bucket))  # planned, never run: no report yet

    result = run(*dags, "report", f"{PIPELINE}/run-2", "--step", "score", env=env, cwd=cwd)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"shardline report: step score of {PIPELINE}/run-2 has not ended (PLANNED)")
    assert "a step's run report is written when the step ends" in result.stderr
    every = run(*dags, "report", f"{PIPELINE}/run-2", env=env, cwd=cwd)
    assert every.returncode == 1 and f"run {PIPELINE}/run-2 has no run report yet" in every.stderr
    assert not (cwd / ".shardline").exists()

    unknown = run(*dags, "report", f"{PIPELINE}/nope", env=env, cwd=cwd)
    assert unknown.returncode == 1 and f"no run {PIPELINE}/nope" in unknown.stderr
    step = run(*dags, "report", f"{PIPELINE}/run-2", "--step", "postprocess", env=env, cwd=cwd)
    assert step.returncode == 1 and "has no step 'postprocess'" in step.stderr
    malformed = run(*dags, "report", "run-2", env=env, cwd=cwd)
    assert malformed.returncode == 2 and "is not a run name" in malformed.stderr


def test_report_open_never_runs_a_script_someone_wrote_to_the_bucket(staged, tmp_path, browser):  # noqa: F811
    """report.html and report.json are objects in the data bucket: whoever can write there chooses their bytes.
    The CLI renders the page itself from report.json (every value escaped, a CSP that allows no script), so
    what it opens runs no script, whatever either object holds."""
    spec, bucket, dags, env, cwd = staged
    attempt = step_jobs.submit(spec, step_plan.plan(spec, "score", plan_request("run-h", bucket))).attempt
    wait_for_job(spec, attempt)
    assert step_end.finish(spec, attempt, Action.ADVANCE, "3 files succeeded").value == "SUCCEEDED"
    s3 = boto3.client("s3")
    folder = f"out/_shardline/reports/{run_folder('run-h')}/score/"
    script = "<script>document.title='RAN'; window.ran = true</script>"
    s3.put_object(Bucket=bucket, Key=folder + "report.html", Body=f"<html><head><title>page</title>{script}".encode())
    report = json.loads(s3_body(bucket, folder + "report.json"))
    report["notes"].append(f'</p>{script}<img src=x onerror="window.ran=true">')
    s3.put_object(Bucket=bucket, Key=folder + "report.json", Body=json.dumps(report).encode())

    # `--open` hands the page's URI to the web browser ($BROWSER): recorded here, then opened in Chromium.
    opened, fake_browser = tmp_path / "opened.txt", tmp_path / "browser.sh"
    fake_browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {opened}\n')
    fake_browser.chmod(0o755)
    fetched = run(
        *dags,
        "report",
        f"{PIPELINE}/run-h",
        "--step",
        "score",
        "--open",
        env={**env, "BROWSER": f"{fake_browser} %s"},
        cwd=cwd,
    )
    assert fetched.returncode == 0, fetched.stderr
    out = Path(fetched.stdout.splitlines()[0])
    assert opened.read_text() == out.resolve().as_uri()
    page = out.read_text()
    assert "<script" not in page.lower() and "&lt;script&gt;" in page
    browser.get(opened.read_text())
    assert browser.execute_script("return window.ran === undefined && document.title !== 'RAN'")
    assert browser.title.startswith("Shardline report")
    # A page that did carry a script (a renderer bug) would still be refused it: the page's own CSP.
    out.write_text(page.replace("</head>", f"{script}</head>"))
    browser.get(out.resolve().as_uri())
    assert browser.execute_script("return window.ran === undefined && document.title !== 'RAN'")

    # Without the report's libraries (a core install: no numpy, no matplotlib) the stored page is served behind
    # the same policy, placed first: the script in it does not run either.
    from shardline.oncall.run_reports import no_script_page

    fallback = tmp_path / "fallback.html"
    fallback.write_bytes(no_script_page(s3_body(bucket, folder + "report.html")))
    browser.get(fallback.resolve().as_uri())
    assert browser.execute_script("return window.ran === undefined && document.title !== 'RAN'")

    # A report.json that is not a run report renders nothing, and says so.
    s3.put_object(Bucket=bucket, Key=folder + "report.json", Body=b"<html>" + script.encode())
    refused = run(*dags, "report", f"{PIPELINE}/run-h", "--step", "score", "--out", str(out), env=env, cwd=cwd)
    assert refused.returncode != 0 and "is not a run report" in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("scheduled__2026-11-22T10:00:00+00:00", "scheduled__2026-11-22T10:00:00+00:00"),
        ("a/b", "a_b"),  # a separator never makes a folder
        ("..", "_.."),
        (".", "_."),
        ("x..y", "x..y"),
        ("run 1;rm", "run_1_rm"),
        ("caf\u00e9", "caf_"),  # only ASCII
    ],
)
def test_each_name_becomes_one_plain_folder(text, part):
    from shardline.oncall.run_reports import path_part

    assert path_part(text) == part


def test_a_fetched_report_goes_under_the_current_directorys_shardline_folder(tmp_path):
    from shardline.oncall.run_reports import local_report_path

    path = local_report_path(tmp_path, "p", "manual__2026-11-22T10:00:00+00:00", "../score")
    assert path == tmp_path / ".shardline/reports/p/manual__2026-11-22T10:00:00+00:00/.._score/report.html"
    assert path.resolve().is_relative_to(tmp_path / ".shardline" / "reports")


def test_a_stored_page_is_led_by_a_policy_that_allows_no_script():
    from shardline.oncall.run_reports import NO_SCRIPT_POLICY, no_script_page

    page = no_script_page(b"<html><script>alert(1)</script></html>")
    first, rest = page.split(b"\n", 1)
    assert first == f'<meta http-equiv="Content-Security-Policy" content="{NO_SCRIPT_POLICY}">'.encode()
    assert rest == b"<html><script>alert(1)</script></html>"  # the page itself, unchanged, after it
    assert "default-src 'none'" in NO_SCRIPT_POLICY and "script-src" not in NO_SCRIPT_POLICY
