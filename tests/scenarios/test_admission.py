"""Admission within a quota, in the real `airflow standalone`: two pipelines of one instance type with a quota of
1 (tests/conftest.py adds them and their fleet.yaml), a low-priority run triggered first and a high-priority one
after it, both waiting on their closed pool; once `shardline fleet sync` opens it, the high one goes first. Then
AWS's refusals at submit, injected by the emulator, which a run waits out without spending an attempt or failing a
task (a capacity failure's fallback is run through Airflow in tests/scenarios/test_pipeline_e2e.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from shardline.decision.fleet import pool_name
from shardline.planning.naming import job_name
from tests.conftest import PRIORITY_TYPE

pytestmark = pytest.mark.slow
BUCKET = "shardline-demo"


def _states(client, dag_id: str, run_id: str) -> dict[str, dict]:
    return {t["task_id"]: t for t in client.task_instances(dag_id, run_id)}


def _cli_env(stack) -> dict[str, str]:
    """The CLI's environment: the stack's, and this interpreter's module path (a checkout run without install)."""
    return {**stack.cli_env(), **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}


def _shardline(stack, *args: str) -> subprocess.CompletedProcess:
    """The `shardline` CLI against the stack, as an on-call engineer runs it."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("shardline")), "--dags-folder", str(stack.dags), *args],
        env=_cli_env(stack),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _fleet(stack) -> dict:
    shown = _shardline(stack, "fleet", "--json")
    assert shown.returncode == 0, shown.stderr
    [view] = json.loads(shown.stdout)
    return view


def _wait_until(what, check, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout:.0f}s"
        time.sleep(2)


def _stage_inputs(stack, tmp_path, names: tuple[str, ...], gate: Path | None = None, model: Path | None = None) -> None:
    """The bucket, the ledger table, a tiny model, and two input files for each of the named pipelines. With
    ``gate``, the model predicts nothing until that file exists: a job holds its slot until the test has looked;
    otherwise the session's XGBoost ``model``."""
    from examples import synthetic
    from shardline.ledger.table import create_ledger_table
    from tests.scenarios.test_faults import gated_model

    s3 = stack.s3()
    if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)
    create_ledger_table("shardline-jobs", "us-east-1", stack.env["AWS_ENDPOINT_URL"])
    model_dir = gated_model(tmp_path / "gated", gate) if gate else model.parent
    synthetic.pack(model_dir, tmp_path / "model.tar.gz")
    s3.upload_file(str(tmp_path / "model.tar.gz"), BUCKET, "models/xgboost/v1/model.tar.gz")
    for path in synthetic.make_dataset(tmp_path / "data", files=2, rows=2_000):
        for name in names:
            s3.upload_file(str(path), BUCKET, f"priority/{name}/{path.name}")


def test_a_high_priority_step_is_admitted_ahead_of_a_waiting_backfill(airflow_stack, tmp_path):
    stack, client = airflow_stack, airflow_stack.client()
    patch = pytest.MonkeyPatch()
    stack.use_aws(patch)
    gate = tmp_path / "gate"  # the high-priority job holds its slot until the test has seen it running
    _stage_inputs(stack, tmp_path, ("priority_low", "priority_high"), gate)
    pool = pool_name(PRIORITY_TYPE)
    client.put_pool(pool, 0, "closed until the test opens it", create=client.pool(pool) is None)
    try:

        def all_waiting(*runs: tuple[str, str]) -> bool:
            tis = [_states(client, dag_id, run_id) for dag_id, run_id in runs]
            return all(t["plan_score"]["state"] == "success" and t["watch_score"]["state"] == "scheduled" for t in tis)

        # The backfill waits on the pool first, so it has waited longer when the high-priority run joins it.
        client.trigger("priority_low", {}, run_id="backfill-1")
        _wait_until("the backfill planned and waiting on its pool", lambda: all_waiting(("priority_low", "backfill-1")))
        client.trigger("priority_high", {}, run_id="sla-1")
        _wait_until(
            "both steps planned and waiting on their pool",
            lambda: all_waiting(("priority_low", "backfill-1"), ("priority_high", "sla-1")),
        )
        waiting = _states(client, "priority_low", "backfill-1")["watch_score"]
        assert (waiting["pool"], waiting["pool_slots"]) == (pool, 1)
        # `shardline fleet` says who waits on the type, the longest waiting first; neither has a job yet.
        view = _fleet(stack)
        assert (view["instance_type"], view["quota"], view["in_use"], view["running"]) == (PRIORITY_TYPE, 1, 0, [])
        assert [w["step"] for w in view["waiting"]] == [
            "priority_low/backfill-1 watch_score",
            "priority_high/sla-1 watch_score",
        ]
        assert view["oldest_wait_seconds"] == view["waiting"][0]["seconds"] > 0
        assert view["out_of_step"] == "it has 0 slot(s), not the quota of 1", view  # closed by the test
        # Each says so where on-call looks first: its step's line in `shardline status` (and the page).
        for ref in ("priority_low/backfill-1", "priority_high/sla-1"):
            status = _shardline(stack, "status", ref, "--json")
            assert status.returncode == 0, status.stderr
            [step] = json.loads(status.stdout)["steps"]
            assert step["message"].startswith(f"waiting for 1 {PRIORITY_TYPE} instance(s) within the account's quota")
            assert step["message"] in _shardline(stack, "status", ref).stdout.replace("\n", "")
        day = dt.datetime.now(dt.UTC).date()
        assert view["today"] == {"succeeded": 0, "resubmitted_for_capacity": 0, "failed": 0}
        opened = _shardline(stack, "fleet", "sync")
        assert opened.returncode == 0 and f"pool {pool}: 1 slot(s)" in opened.stdout, opened.stderr
        # The high one is admitted: its watch submits its job and defers, holding the one slot; its STEP item no
        # longer says it waits, while the backfill's still does.
        _wait_until(
            "the high-priority watch admitted and deferred",
            lambda: _states(client, "priority_high", "sla-1")["watch_score"]["state"] == "deferred",
        )
        messages = {}
        for ref in ("priority_high/sla-1", "priority_low/backfill-1"):
            status = _shardline(stack, "status", ref, "--json")
            messages[ref] = json.loads(status.stdout)["steps"][0]["message"] or ""
        assert not messages["priority_high/sla-1"].startswith("waiting for"), messages
        assert messages["priority_low/backfill-1"].startswith("waiting for"), messages
        busy = _fleet(stack)
        assert (busy["in_use"], [r["step"] for r in busy["running"]]) == (1, ["priority_high/sla-1 watch_score"])
        assert [w["step"] for w in busy["waiting"]] == ["priority_low/backfill-1 watch_score"]
        gate.touch()
        stack.assert_succeeds("priority_high", "sla-1")
        stack.assert_succeeds("priority_low", "backfill-1")
        if dt.datetime.now(dt.UTC).date() == day:  # today's jobs are those of runs started since midnight (UTC)
            assert _fleet(stack)["today"] == {"succeeded": 2, "resubmitted_for_capacity": 0, "failed": 0}
        # The on-call page's fleet panel reads the same, through its API, as the logged-in user.
        # A generous timeout: on a busy machine the API server can take longer than httpx's default 5 s to answer.
        login = {"username": stack.username, "password": stack.password}
        token = httpx.post(f"{stack.url}/auth/token", json=login, timeout=120)
        token.raise_for_status()
        paneled = httpx.get(
            f"{stack.url}/shardline/fleet",
            headers={"Authorization": f"Bearer {token.json()['access_token']}"},
            timeout=120,
        )
        assert paneled.status_code == 200, paneled.text
        [panel] = paneled.json()
        shown = _fleet(stack)
        for field in ("instance_type", "pool", "quota", "in_use", "running", "waiting", "today"):
            assert panel[field] == shown[field], field
    finally:
        gate.touch()  # release any job still held
        client._call("DELETE", f"/pools/{pool}")
        patch.undo()
    high, low = _states(client, "priority_high", "sla-1"), _states(client, "priority_low", "backfill-1")
    # The high-priority step took the one slot first, and held it from its submit until it ended; only then did
    # the backfill start.
    assert high["watch_score"]["end_date"] <= low["watch_score"]["start_date"]
    assert (high["watch_score"]["priority_weight"], low["watch_score"]["priority_weight"]) == (100, 1)


def test_refused_submits_are_waited_out_in_the_real_scheduler_and_spend_no_attempt(
    airflow_stack, tmp_path, xgboost_model
):
    """The job's first submit is refused for the quota (ResourceLimitExceeded), its second throttled: with
    retry.max_attempts 1, the run still ends green, in one try of its watch task, at attempt 1."""
    from shardline.backends.local_fleet import FLEET_DIR, FLEET_FILE, read_record

    stack, client = airflow_stack, airflow_stack.client()
    patch = pytest.MonkeyPatch()
    stack.use_aws(patch)
    _stage_inputs(stack, tmp_path, ("priority_low",), model=xgboost_model)
    local_root = Path(stack.env["SHARDLINE_LOCAL_ROOT"])
    local_root.mkdir(parents=True, exist_ok=True)
    refusals = {"ResourceLimitExceeded": 1, "ThrottlingException": 1}
    (local_root / FLEET_FILE).write_text(json.dumps({"refuse_first": refusals}))
    pool = pool_name(PRIORITY_TYPE)
    client.put_pool(pool, 1, "the fleet file's quota", create=client.pool(pool) is None)
    try:
        client.trigger("priority_low", {}, run_id="refused-1")
        stack.assert_succeeds("priority_low", "refused-1")
    finally:
        (local_root / FLEET_FILE).unlink()
        client._call("DELETE", f"/pools/{pool}")
        patch.undo()
    first, second = (job_name("priority_low", "refused-1", "score", n) for n in (1, 2))
    held = {e["job"]: e["type"] for e in read_record(local_root) if e["delta"] > 0}
    assert held.get(first) == PRIORITY_TYPE and second not in held, held  # one job: no attempt was spent
    assert int((local_root / FLEET_DIR / "calls" / first).read_text()) == 3  # submitted at the third call
    watch = _states(client, "priority_low", "refused-1")["watch_score"]
    assert (watch["state"], watch["try_number"]) == ("success", 1)  # no refusal failed a try
    status = _shardline(stack, "status", "priority_low/refused-1", "--json")
    [step] = json.loads(status.stdout)["steps"]
    assert (step["status"], step["attempt"]) == ("SUCCEEDED", 1), step
