"""End to end through real Airflow (dag.test) on moto_server and the local backend.

`python -m examples.airflow_demo` is what `make demo` runs: it kills one instance of the first
attempt, and the watch task must resubmit exactly the unfinished files and finish green
with every row accounted for.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_pipeline_recovers_a_killed_instance(tmp_path):
    # The demo's own dataset is larger (for its overhead figure); 24 files keep the suite quick.
    result = _demo(tmp_path, "--files", "24", "--rows", "1200000")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "killed instance algo-2 of attempt 1" in out
    # Only the killed instance's unfinished files went again (the demo fails otherwise). Whether the watch saw the
    # instance die while its job went on, or only once the job had ended, depends on how busy the machine is; both
    # say so.
    assert re.search(r"start now as attempt 2 of 3, beside the job's other instances|go to attempt 2 of 3", out)
    assert re.search(r"^  recovery +attempt 2 scored \d+ file\(s\) again: algo-2 was killed", out, re.M)
    assert "files             24 (24 succeeded, 0 failed)" in out
    assert "rows in / out     1,200,000 / 1,200,000" in out
    assert "attempts          2 (2 processing job(s))" in out
    # The step's run report, fetched to a local file as `shardline report` does.
    assert re.search(r"^  report +\S*\.shardline/reports/tabular_scoring_hourly/\S+/score/report\.html$", out, re.M)
    # Its OpenLineage events, in a file whose path it prints: the watch task names the step's datasets and the
    # ledger's rows (the demo fails where they differ from its summary).
    lineage = re.search(r"^  lineage +\d+ OpenLineage events in (\S+/lineage\.jsonl); watch_score: (.*)$", out, re.M)
    assert lineage, out[-3000:]
    assert lineage.group(2) == (
        "s3://shardline-demo/events/dt=2026-11-22/hour=10 (1,200,000 rows) -> "
        "s3://shardline-demo/scores/dt=2026-11-22/hour=10 (1,200,000 rows)"
    )


def _dags_with_tolerance(tmp_path, max_failed_files: int):
    import shutil
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    dags = tmp_path / "dags"
    shutil.copytree(repo / "dags", dags)
    path = dags / "pipelines" / "tabular_scoring_hourly.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["steps"][0]["tolerance"]["max_failed_files"] = max_failed_files
    path.write_text(yaml.safe_dump(spec))
    return dags


def _demo(tmp_path, *args):
    """`python -m examples.airflow_demo` with ``args``, in its own work folder."""
    return subprocess.run(
        [sys.executable, "-m", "examples.airflow_demo", "--workdir", str(tmp_path / "demo"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _run_demo(tmp_path, dags, *args):
    return _demo(tmp_path, "--dags-folder", str(dags), "--no-failure", "--files", "6", "--rows", "60000", *args)


@pytest.mark.slow
def test_a_corrupt_file_past_the_tolerance_fails_the_step_and_names_the_file(tmp_path):
    result = _run_demo(tmp_path, _dags_with_tolerance(tmp_path, 0), "--corrupt", "1")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-5000:]
    assert "DAG run" in out and ": failed" in out
    assert "past the tolerance" in out
    assert "corrupt-0.parquet (CorruptInputError" in out  # the failure message lists the file and why
    assert "files             7 (6 succeeded, 1 failed)" in out
    assert "attempts          1" in out  # a corrupt file is not worth another attempt


@pytest.mark.slow
def test_a_corrupt_file_within_the_tolerance_ends_partial(tmp_path):
    result = _run_demo(tmp_path, _dags_with_tolerance(tmp_path, 1), "--corrupt", "1")
    out = result.stdout + result.stderr
    assert "ended PARTIAL" in out, out[-5000:]
    assert ": success" in out
    assert "files             7 (6 succeeded, 1 failed)" in out
    assert "rows in / out     60,000 / 60,000" in out
    assert "failed file       s3://shardline-demo/events/dt=2026-11-22/hour=10/corrupt-0.parquet" in out


@pytest.mark.slow
def test_the_churn_demo_runs_both_steps_and_joins_every_row(tmp_path):
    """`make demo DEMO_ARGS="--pipeline daily_churn"`: score, then calibrate what score committed."""
    result = _demo(tmp_path, "--pipeline", "daily_churn", "--files", "2", "--rows", "8000")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "step score       2/2 files, rows in / out 8,000 / 8,000, attempts 1" in out
    assert "step calibrate   2/2 files, rows in / out 8,000 / 8,000, attempts 1" in out
    assert "8,000 calibrated rows for 8,000 scored customers: each the calibration of its own score" in out
    # In the lineage, the second step reads the dataset the first one wrote.
    assert "watch_calibrate: s3://shardline-demo/churn/scores/dt=2026-11-22 (8,000 rows) -> " in out, out[-3000:]


@pytest.mark.slow
def test_refused_submits_and_capacity_failures_never_fail_a_run_nor_spend_an_attempt(tmp_path, monkeypatch):
    """With retry.max_attempts: 1, every job's first two submit calls refused (a quota in use, a throttle) and the
    step's own instance type never provisioned, the run ends green: twice on its type, then on its fallback."""
    import json
    import shutil
    from pathlib import Path

    import yaml

    from shardline.backends.local_fleet import FLEET_ENV, read_record

    repo = Path(__file__).resolve().parents[2]
    dags = tmp_path / "dags"
    shutil.copytree(repo / "dags", dags)
    path = dags / "pipelines" / "tabular_scoring_hourly.yaml"
    spec = yaml.safe_load(path.read_text())
    step = spec["steps"][0]
    step["resources"]["fallback_instance_types"] = ["ml.m5.2xlarge"]
    step["retry"]["max_attempts"] = 1
    path.write_text(yaml.safe_dump(spec))
    fleet = {
        "refuse_first": {"ResourceLimitExceeded": 1, "ThrottlingException": 1},
        "capacity_errors": {"ml.c5.2xlarge": 1},
    }
    monkeypatch.setenv(FLEET_ENV, json.dumps(fleet))
    monkeypatch.setenv("SHARDLINE_SUBMIT_WAIT_FIRST_SECONDS", "1")
    result = _run_demo(tmp_path, dags)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert ": success" in out and "files             6 (6 succeeded, 0 failed)" in out
    assert "attempts          3 (3 processing job(s))" in out
    # Each of the 3 jobs: refused twice, then submitted; none of it an attempt.
    assert len(re.findall(r"not submitted yet: the account's quota of this instance type is in use", out)) == 3
    assert len(re.findall(r"not submitted yet: SageMaker throttled the request", out)) == 3
    assert "This wait is not an attempt and fails nothing" in out
    assert out.count("not counted against retry.max_attempts; resubmitting") == 2
    fallback = "the files go again on 2 ml.m5.2xlarge (resources.fallback_instance_types: 16 vCPUs for the 16 planned)"
    assert fallback in out
    # The emulator's own record: each job took its instances once and gave them back.
    record = read_record(tmp_path / "demo" / "local")
    assert [(e["type"], e["delta"]) for e in record] == [
        ("ml.c5.2xlarge", 2),
        ("ml.c5.2xlarge", -2),
        ("ml.c5.2xlarge", 2),
        ("ml.c5.2xlarge", -2),
        ("ml.m5.2xlarge", 2),
        ("ml.m5.2xlarge", -2),
    ]
