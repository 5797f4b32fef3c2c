"""Every message an on-call engineer reads, rendered from sample inputs and read as a stranger at 3 a.m. would.

The CLI's prints, the resubmit policy's reasons, the watch's and operators' exceptions and warnings, the
REST client's errors and the on-call page's notices are rendered here through the same pure functions the
code uses, and each is checked against plain rules: no doubled words, no "no every"-style garble, no doubled
spaces, no unfilled ``{placeholder}``, no ``None`` leaking, and every failure or refusal says what to do next
(a ``shardline`` command, a flag, a spec field, or an instruction). Pure and fast: no AWS, no Airflow server,
no network. ``pytest -s`` prints the catalogue.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from shardline.decision import policy
from shardline.decision.policy import Action, JobStatus, Policy, StepSnapshot
from shardline.decision.resubmit import Next, NextStep, choose_next
from shardline.decision.run_end import rows_mismatch_text
from shardline.ledger.records import FileRecord, RunRecord, StepRecord
from shardline.ledger.states import FileStatus, StepStatus
from shardline.oncall import messages, printing, views
from shardline.oncall.airflow_client import AirflowApiError, AirflowClient, api_refused, find_settings, login_refused
from shardline.oncall.errors import OnCallError
from shardline.oncall.messages import CANCEL_LINES
from shardline.oncall.service import OnCall
from shardline.oncall.values import FileChoice, ResubmitPlan, ResubmitResult, RunRef
from shardline.orchestration.step import end as step_end
from shardline.orchestration.step import jobs as step_jobs
from shardline.orchestration.step import watch as polls
from shardline.planning.attempt import Attempt
from tests.support.records import POLL_AT, heard

PAGE = Path(__file__).resolve().parents[2] / "src" / "shardline" / "airflow" / "ui" / "static" / "oncall.html"
RUN_ID, STEP = "manual__2026-11-22T10:00:00+00:00", "score"
REF = f"tabular_scoring_hourly/{RUN_ID}"
ATTEMPT = Attempt(
    pipeline="tabular_scoring_hourly",
    run_id=RUN_ID,
    step=STEP,
    number=2,
    input_prefix="s3://shardline-demo/events/dt=2026-11-22/hour=10/",
    output_prefix="s3://shardline-demo/scores/dt=2026-11-22/hour=10/",
    model_uri="s3://shardline-demo/models/xgboost/v1/model.tar.gz",
    file_count=1,
)
FIX = f"shardline resubmit {REF} --step score --all-failed"

# --- the rules ----------------------------------------------------------------------------------------------

DOUBLED_WORD = re.compile(r"\b(\w+)\s+\1\b")  # same case: "--step STEP" is a flag and its value
# "nothing to resubmit: no every file that has not succeeded remains": a quantifier after "no" is a garble.
GARBLE = re.compile(r"\bno\s+(every|all|each|none|any)\b|\bnot\s+no\b|\b(a|an)\s+(a|an|the)\b", re.IGNORECASE)
PLACEHOLDER = re.compile(r"\{[A-Za-z_][\w.\[\]'\"]*(![rsa])?(:[^{}\s]*)?\}")
LEAK = re.compile(r"\bNone\b|\bnull\b|\bundefined\b|\bNaN\b|<object at|\bobject at 0x")
DOUBLED_PUNCTUATION = re.compile(r"(?<![.])[,;:]\s*[,;:]|\.\s+\.|\(\s*\)")
# A next step: a command, a flag, a spec field, or an instruction ("run" and "trigger" only as verbs: "the DAG
# run failed" says nothing about what to do).
NEXT_STEP = re.compile(
    r"`?shardline [a-z]+|(?<![\w-])--[a-z][a-z-]+|\b(input|model|retry|tolerance|sagemaker)\.[a-z_]+\b|"
    r"\b[a-z_]+_seconds\b|\bunknown_conf\b|\brun (the|this|it|`)|\btrigger (the|again|it)\b|"
    r"\b(wait|set|clear|check|pass|fix|ask|log in|rename|exclude|raise|mark|press|pick|copy|give|restart|choose|"
    r"send)\b",
    re.IGNORECASE,
)

PLAIN_WORD = re.compile(r"(?<![\w/.:'-])[a-z]+(?:'[a-z]+)?(?![\w/:-])", re.IGNORECASE)


def repeated_phrase(text: str, n: int = 5) -> str | None:
    """A run of ``n`` plain words said twice ("run the same command again ... Run the same command again")."""
    words = [w.lower() for w in PLAIN_WORD.findall(text)]
    seen = set()
    for i in range(len(words) - n + 1):
        phrase = " ".join(words[i : i + n])
        if phrase in seen:
            return phrase
        seen.add(phrase)
    return None


def said(name: str, message: object, *, failure: bool = False, lists: bool = False) -> str:
    """Check ``message`` against the rules (``failure``: it must also say what to do next; ``lists``: it
    lists files, whose errors may repeat) and keep it."""
    text = str(message)
    print(f"\n[{name}]{' (failure)' if failure else ''}\n  {text}")
    assert text.strip(), f"{name}: empty message"
    assert not DOUBLED_WORD.search(text), f"{name}: doubled word {DOUBLED_WORD.search(text).group(0)!r}: {text}"
    assert not GARBLE.search(text), f"{name}: garbled {GARBLE.search(text).group(0)!r}: {text}"
    assert not PLACEHOLDER.search(text), f"{name}: unfilled {PLACEHOLDER.search(text).group(0)!r}: {text}"
    assert not LEAK.search(text), f"{name}: leaks {LEAK.search(text).group(0)!r}: {text}"
    assert not DOUBLED_PUNCTUATION.search(text), (
        f"{name}: doubled punctuation {DOUBLED_PUNCTUATION.search(text).group(0)!r}: {text}"
    )
    if not lists:
        assert not repeated_phrase(text), f"{name}: says {repeated_phrase(text)!r} twice: {text}"
    for line in text.splitlines():
        assert "  " not in line.strip(), f"{name}: doubled space in {line!r}"
        assert line == line.rstrip(), f"{name}: trailing white space in {line!r}"
    if failure:
        assert NEXT_STEP.search(text), f"{name}: says what happened but not what to do next: {text}"
    return text


def raised(name: str, call, error=Exception, *, failure: bool = True) -> str:
    with pytest.raises(error) as caught:
        call()
    return said(name, caught.value, failure=failure)


def test_the_rules_catch_what_they_are_for():
    for bad in (
        "nothing to resubmit: no every file that has not succeeded remains",
        "the the run",
        "step {step} failed",
        "job None",
        "clear  it",
        "a run, , here",
        "run (): x",
        "check the log, then run the same command again. Run the same command again once it answers",
    ):
        with pytest.raises(AssertionError):
            said("a bad example", bad)
    with pytest.raises(AssertionError):
        said("a failure with no next step", "the step failed", failure=True)
    with pytest.raises(AssertionError):
        said("a failure with no next step", "the DAG run failed", failure=True)


# --- the on-call policy: choose_next over every branch, disagreement over every pair ----------------------


def test_every_resubmit_decision_reads_well_and_a_refusal_says_what_to_do():
    seen: set[tuple[Next, bool, str]] = set()
    for running, status, watch, files, force in itertools.product(
        (False, True),
        (None, "PLANNED", "RUNNING", "SUCCEEDED", "PARTIAL", "FAILED", "CANCELLED", "SKIPPED"),
        (None, "none", "deferred", "up_for_retry", "running", "failed", "success", "skipped", "upstream_failed"),
        (0, 3),
        (False, True),
    ):
        got = choose_next(
            attempt=2,
            job=ATTEMPT.job_name,
            job_running=running,
            step_status=status,
            watch_state=watch,
            files=files,
            force=force,
            watch="watch_score",
        )
        seen.add((got.next, got.clear_watch, got.reason))
    kinds = {(n, c) for n, c, _ in seen}
    assert kinds == {
        (Next.SUBMIT, True),
        (Next.SUBMIT, False),
        (Next.TAKE_UP, True),
        (Next.NOTHING, False),
        (Next.REFUSE, False),
    }, kinds
    for nxt, clear, reason in sorted(seen, key=lambda k: (k[0], k[1], k[2])):
        text = said(f"choose_next {nxt.value}{' +clear' if clear else ''}", reason, failure=nxt is Next.REFUSE)
        assert "none)" not in text and "is none" not in text, text  # Airflow's "no state" is said in words
        if nxt is Next.NOTHING:
            assert text.startswith(("nothing to resubmit", "attempt 2")), text
    # A refusal names the flag that overrides it, except when the flag was given and nothing is left to run.
    refusals = [r for n, _, r in seen if n is Next.REFUSE]
    assert any("--force" in r for r in refusals) and any("--force" not in r for r in refusals)
    # The step's status is never misstated: a PARTIAL step has failed files, so it is not "every file succeeded".
    partial = choose_next(
        attempt=2,
        job="j",
        job_running=False,
        step_status="PARTIAL",
        watch_state="success",
        files=0,
        force=False,
        watch="watch_score",
    )
    assert "every file" not in partial.reason and "PARTIAL" in partial.reason, partial.reason


def test_a_disagreement_between_airflow_and_the_ledger_says_how_to_settle_it():
    for ledger, airflow, step in itertools.product(
        ("PLANNED", "SUBMITTED", "RUNNING", "SUCCEEDED", "PARTIAL", "SKIPPED", "FAILED", "CANCELLED", "UNKNOWN"),
        ("queued", "running", "success", "failed"),
        (STEP, None),
    ):
        text = views.disagreement(ledger, airflow, REF, step)
        if text is not None:
            said(f"disagreement ledger={ledger} airflow={airflow} step={step}", text, failure=True)
            assert "shardline" in text and REF in text, text


# --- what a resubmission, a cancel and the on-call service say -------------------------------------------


class FakeAirflow:
    """Answers as Airflow's REST API would, from a script: a state, or an error per call."""

    base_url, source = "http://airflow.internal:8080", "SHARDLINE_AIRFLOW_URL"

    def __init__(self, *, state="failed", task_error=None, clear_error=None):
        self.state, self.task_error, self.clear_error = state, task_error, clear_error

    def task_instance(self, dag_id, run_id, task_id):
        if self.task_error:
            raise self.task_error
        return {"state": self.state}

    def clear_tasks(self, dag_id, run_id, task_ids, include_downstream=True, dry_run=False):
        if self.clear_error:
            raise self.clear_error
        return [{"task_id": t} for t in (*task_ids, "report")]


def _refused(status: int, detail: str = "Forbidden") -> AirflowApiError:
    return AirflowApiError(
        api_refused(
            FakeAirflow.base_url,
            FakeAirflow.source,
            "POST",
            "/dags/tabular_scoring_hourly/clearTaskInstances",
            status,
            detail,
        ),
        status,
    )


def test_a_missing_malformed_expired_or_unauthorised_token_each_has_its_own_fix():
    from shardline.oncall.airflow_client import INVALID_TOKEN, NOT_AUTHENTICATED, TOKEN_EXPIRED

    path = "/dags/tabular_scoring_hourly/clearTaskInstances"
    cases = {
        "missing": (401, NOT_AUTHENTICATED, False, "none was sent"),
        "missing, Airflow's word": (401, NOT_AUTHENTICATED, True, "none was sent"),
        "expired": (401, TOKEN_EXPIRED, True, "has expired"),
        "malformed": (403, INVALID_TOKEN, True, "cannot read the token"),
        "unauthorised": (403, "Forbidden", True, "lacks that permission"),
    }
    texts = {}
    for name, (status, detail, sent, expected) in cases.items():
        texts[name] = said(
            f"token {name}",
            api_refused(FakeAirflow.base_url, FakeAirflow.source, "POST", path, status, detail, sent_token=sent),
            failure=True,
        )
        assert expected in texts[name], texts[name]
    assert "admin" not in texts["malformed"] and "expired" not in texts["missing"], texts
    assert "admin" in texts["unauthorised"] and "shardline login" in texts["expired"], texts


def test_the_on_call_service_says_what_went_wrong_and_what_to_do():
    ref = RunRef.parse(REF)
    specs = {"tabular_scoring_hourly": object(), "daily_churn": object()}
    raised("RunRef.parse without a slash", lambda: RunRef.parse("tabular_scoring_hourly"), OnCallError)
    raised("OnCall with no specs", lambda: OnCall({}), OnCallError)
    raised("OnCall.spec of an unknown pipeline", lambda: OnCall(specs).spec("tabular_scoring"), OnCallError)
    said(
        "unknown step",
        messages.unknown_step("tabular_scoring_hourly", "postprocess", ["score", "calibrate"]),
        failure=True,
    )

    service = OnCall(specs)
    raised("resubmit without Airflow", lambda: service._watch_state(ref, "watch_score"), OnCallError)
    service.airflow = FakeAirflow(task_error=AirflowApiError("GET ... answered 404: not found", 404))
    raised("resubmit: Airflow has no such task", lambda: service._watch_state(ref, "watch_score"), OnCallError)
    service.airflow = FakeAirflow(task_error=_refused(500, "Internal Server Error"))
    raised("resubmit: Airflow cannot be asked", lambda: service._watch_state(ref, "watch_score"), OnCallError)
    for status in (403, 409):
        service.airflow = FakeAirflow(clear_error=_refused(status))
        raised(
            f"resubmit: Airflow would not clear ({status})", lambda: service._may_clear(ref, "watch_score"), OnCallError
        )
    service.airflow = FakeAirflow(state="failed")
    said("resubmit: the watch task is cleared", service._rerun_watch(ref, "watch_score"))
    service.airflow = FakeAirflow(state="running")
    stuck = raised(
        "resubmit: the watch task never finished",
        lambda: service._rerun_watch(ref, "watch_score", 0),
        OnCallError,
        failure=False,
    )
    service.airflow = FakeAirflow(state=None)
    raised(
        "resubmit: the watch task has no state",
        lambda: service._rerun_watch(ref, "watch_score", 0),
        OnCallError,
        failure=False,
    )

    again = messages.repeat_resubmit_command(ref, STEP, FileChoice(all_failed=True), force=False)
    for attempt, job in ((3, "sl-tabular-scoring-hourly-score-0123456789-a3"), (None, None)):
        for err in (_refused(403), OnCallError(stuck)):
            text = said(
                f"resubmit half done (attempt {attempt})",
                messages.half_done_text(attempt, job, "watch_score", err, again),
                failure=True,
            )
            assert text.endswith(again) and "the same command again" in text
    said("ResubmitResult: Airflow follows", messages.followed_text("watch_score", "deferred"))
    said("ResubmitResult: Airflow not started yet", messages.followed_text("watch_score", "none"))
    said("ResubmitResult: --ledger-only", messages.followed_text("watch_score", None))
    said("ResubmitResult: cleared", messages.cleared_text("watch_score", "failed", 2))
    take_up = NextStep(
        Next.TAKE_UP,
        True,
        choose_next(
            attempt=2,
            job="j",
            job_running=False,
            step_status="PLANNED",
            watch_state="failed",
            files=0,
            force=False,
            watch="watch_score",
        ).reason,
    )
    said("dry run: take up", messages.dry_run_text(take_up, "watch_score", RUN_ID, None, "failed"))
    for clear, state in ((True, "failed"), (False, "deferred"), (False, None)):
        text = said(
            f"dry run: submit (clear={clear}, watch={state})",
            messages.dry_run_text(NextStep(Next.SUBMIT, clear, "x"), "watch_score", RUN_ID, 3, state),
        )
        assert "nothing was changed" in text and "attempt 3" in text
    said("Airflow left out of runs/status", messages.airflow_left_out(_refused(500, "Internal Server Error")))

    lines = {
        "already": {"step": STEP, "status": "SUCCEEDED"},
        "moved_on": {"step": STEP, "ref": ref},
        "stopped": {"step": STEP, "job": ATTEMPT.job_name},
        "cancelled": {"step": STEP},
        "dag_run_failed": {"run_id": RUN_ID},
        "airflow_error": {"run_id": RUN_ID, "err": _refused(403)},
    }
    assert set(lines) == set(CANCEL_LINES)
    for key, values in lines.items():
        said(f"cancel: {key}", CANCEL_LINES[key].format(**values), failure=key in ("moved_on", "airflow_error"))


# --- the REST client ------------------------------------------------------------------------------------


def _client(handler, **kwargs) -> AirflowClient:
    client = AirflowClient("http://airflow.internal:8080/", source="SHARDLINE_AIRFLOW_URL", **kwargs)
    client._http = httpx.Client(transport=httpx.MockTransport(handler))
    return client


def test_a_cli_looking_in_another_local_root_is_told_what_to_set():
    said(
        "resubmit: the job ran under another local root",
        messages.local_root_mismatch(
            "sl-tabular-scoring-hourly-score-0123456789-a1", 1, "/home/oncall/airflow/shardline-local"
        ),
        failure=True,
    )


def test_a_half_done_resubmission_prints_the_command_that_repeats_it():
    ref = RunRef("p", "manual__2026-11-22T10:00:00+00:00")
    assert (
        messages.repeat_resubmit_command(ref, "score", FileChoice(all_failed=True), force=False)
        == "shardline resubmit p/manual__2026-11-22T10:00:00+00:00 --step score --all-failed"
    )
    assert messages.repeat_resubmit_command(ref, "score", FileChoice(files=["a b.parquet", "c"]), force=True).endswith(
        "--file 'a b.parquet' --file c --force"
    )
    assert messages.repeat_resubmit_command(ref, "score", FileChoice(instance="algo-2"), force=False).endswith(
        "--step score --instance algo-2"
    )


def test_every_airflow_api_error_names_airflow_and_what_to_do(tmp_path):
    broken = tmp_path / "airflow.json"
    broken.write_text("{not json")
    raised(
        "login file unreadable", lambda: find_settings(env={"SHARDLINE_AIRFLOW_CONFIG": str(broken)}), AirflowApiError
    )

    for status, body in (
        (401, {"detail": "Invalid JWT token"}),
        (403, {"detail": "Forbidden"}),
        (500, {"detail": "Internal Server Error"}),
    ):
        client = _client(
            lambda request, status=status, body=body: httpx.Response(status, json=body), token="t", sleep=lambda _: None
        )
        raised(f"REST API answered {status}", lambda client=client: client.dag_run("p", RUN_ID), AirflowApiError)
    for status, body in (
        (404, {"detail": "DagRun not found"}),
        (409, {"detail": "conflict"}),
        (400, {"detail": [{"loc": ["body", "state"], "msg": "bad"}]}),
    ):
        client = _client(lambda request, status=status, body=body: httpx.Response(status, json=body), token="t")
        raised(
            f"REST API answered {status} (the caller adds what to do)",
            lambda client=client: client.dag_run("p", RUN_ID),
            AirflowApiError,
            failure=False,
        )
    client = _client(lambda request: httpx.Response(200, text="<html>login</html>"), token="t")
    raised("REST API answered HTML", lambda: client.dag_run("p", RUN_ID), AirflowApiError)

    def unreachable(request):
        raise httpx.ConnectError("connection refused", request=request)

    raised("Airflow unreachable", lambda: _client(unreachable, token="t").dag_run("p", RUN_ID), AirflowApiError)
    raised(
        "login refused",
        lambda: _client(
            lambda r: httpx.Response(401, text="bad credentials"), username="oncall", password="pw"
        ).dag_run("p", RUN_ID),
        AirflowApiError,
    )
    raised(
        "login refused, no detail",
        lambda: _client(lambda r: httpx.Response(401, text=""), username="oncall", password="pw").dags_page(),
        AirflowApiError,
    )
    raised(
        "login answered no token",
        lambda: _client(lambda r: httpx.Response(200, json={}), username="oncall", password="pw").dags_page(),
        AirflowApiError,
    )
    said("login_refused", login_refused("http://airflow.internal:8080", "oncall", 403, "Forbidden"), failure=True)


# --- the watch's policy, the step functions and the trigger -------------------------------------------


POLICY = Policy(
    max_attempts=3,
    backoff_seconds=60,
    backoff_multiplier=2,
    max_failed_files=1,
    max_failed_percent=5,
    heartbeat_timeout_seconds=600,
)


def _files(statuses: str, attempt: int = 1) -> list[FileRecord]:
    codes = {
        "S": (FileStatus.SUCCEEDED, None, None),
        "P": (FileStatus.PENDING, None, None),
        "R": (FileStatus.RUNNING, None, None),
        "C": (FileStatus.FAILED, "CorruptInputError", "not a parquet file: magic bytes missing"),
        "T": (FileStatus.FAILED, "ThrottlingError", "SlowDown"),
        "N": (FileStatus.FAILED, None, None),
    }
    return [
        FileRecord(
            f"s3://b/in/part-{i}.parquet", codes[c][0], attempt, error_class=codes[c][1], error_message=codes[c][2]
        )
        for i, c in enumerate(statuses)
    ]


def _snapshot(*args, **kwargs) -> StepSnapshot:
    return StepSnapshot(*args, **kwargs, now=POLL_AT)


SNAPSHOTS = {
    "waiting": _snapshot(1, JobStatus.IN_PROGRESS, 30, _files("SSRP"), (heard("algo-1", 5),)),
    "waiting, files not read": _snapshot(
        2,
        JobStatus.IN_PROGRESS,
        30,
        None,
        (
            heard("algo-1", 5, files_assigned=3, files_done=2, files_failed=1),
            heard("algo-2", 9, files_assigned=3, files_done=1),
        ),
    ),
    "waiting, no heartbeat yet": _snapshot(1, JobStatus.IN_PROGRESS, 30, None),
    "one file, done": _snapshot(1, JobStatus.COMPLETED, 300, _files("S")),
    "all done": _snapshot(1, JobStatus.COMPLETED, 300, _files("SSSS")),
    "cancelled": _snapshot(1, JobStatus.IN_PROGRESS, 300, _files("SSRP"), cancelled=True),
    "stale instance": _snapshot(
        1, JobStatus.IN_PROGRESS, 900, _files("SSRP"), (heard("algo-1", 5), heard("algo-2", 700))
    ),
    "no heartbeat at all": _snapshot(1, JobStatus.IN_PROGRESS, 900, _files("PPPP")),
    "transient failure": _snapshot(1, JobStatus.COMPLETED, 300, _files("SSTS")),
    "job failed": _snapshot(2, JobStatus.FAILED, 300, _files("SSPP", attempt=2), job_failure_reason="exit 137"),
    "corrupt, past the tolerance": _snapshot(1, JobStatus.COMPLETED, 300, _files("CCSSSS")),
    "corrupt, within the tolerance": _snapshot(1, JobStatus.COMPLETED, 300, _files("CSSSSS")),
    "out of attempts": _snapshot(3, JobStatus.COMPLETED, 300, _files("SPNS", attempt=3)),
    "an instance could not start": _snapshot(
        1,
        JobStatus.FAILED,
        60,
        _files("PPPP"),
        (
            heard(
                "algo-1",
                5,
                finished=True,
                setup_error="no model file under /opt/ml/processing/input/model (model "
                "s3://shardline-demo/models/xgboost/v9/model.tar.gz)",
            ),
        ),
    ),
}


def test_every_decision_reason_reads_well_and_a_failure_says_what_to_do():
    actions = set()
    for name, snapshot in SNAPSHOTS.items():
        decision = policy.decide(snapshot, POLICY)
        actions.add(decision.action)
        said(f"decide: {name} -> {decision.action.value}", decision.reason)
        for f in decision.failed_files:
            said(f"decide: {name}: failed file", step_end.file_error(f.error_class, f.error_message))
        if decision.action in (Action.FAIL, Action.PARTIAL):
            from shardline.airflow.operators.messages import partial_text, step_failed_text
            from shardline.orchestration.step.watch import StepEvent

            event = StepEvent.of(decision, ATTEMPT).to_event()
            if decision.action is Action.FAIL:
                text = said(
                    f"watch fails: {name}",
                    step_failed_text(ATTEMPT, "FAIL", decision.reason, event["failed_files"]),
                    failure=True,
                    lists=True,
                )
                assert text.endswith(FIX), text
            else:
                said(
                    f"watch warns: {name}",
                    partial_text(STEP, decision.reason, event["failed_files"], FIX),
                    failure=True,
                    lists=True,
                )
            status = StepStatus.FAILED if decision.action is Action.FAIL else StepStatus.PARTIAL
            step_message = said(
                f"ledger STEP message: {name}", step_end.outcome_message(ATTEMPT, status, decision.reason), failure=True
            )
            said(f"ledger RUN message: {name}", step_end.run_outcome_message(ATTEMPT, step_message), failure=True)
    # decide() reaches every action but the two the trigger itself ends on (each rendered below).
    assert actions == set(Action) - {Action.TIMEOUT, Action.UNREACHABLE}, actions
    assert "past the tolerance" in policy.decide(SNAPSHOTS["corrupt, past the tolerance"], POLICY).reason
    assert policy.decide(SNAPSHOTS["one file, done"], POLICY).reason == "its 1 file succeeded"


def test_the_step_functions_and_the_trigger_say_what_to_do():
    from shardline.decision.policy import deadline_reason

    inner = ConnectionError("Could not connect to the endpoint URL: http://localhost:5000/")
    try:
        try:
            raise inner
        except ConnectionError as err:
            raise RuntimeError("query failed") from err
    except RuntimeError as err:
        wrapped = err
    said("describe_error", polls.describe_error(wrapped))
    assert said("describe_error of an empty error", polls.describe_error(TimeoutError())) == "TimeoutError"
    text = said("unreachable_reason", polls.unreachable_reason(ATTEMPT, 661, wrapped), failure=True)
    assert text.endswith(FIX)
    said("stop_and_wait gave up", step_jobs.stop_timeout_text(ATTEMPT.job_name, "Stopping", 900), failure=True)
    assert step_end.file_error(None, None) == "no error recorded"
    said("file error without a class", step_end.file_error(None, "killed"))
    said(
        "ledger STEP message: succeeded",
        step_end.outcome_message(ATTEMPT, StepStatus.SUCCEEDED, "all 4 files succeeded"),
    )
    reason = said("trigger: timeout", deadline_reason(POLICY, "job InProgress: 3/10 files succeeded"))
    assert "600s of heartbeat_timeout_seconds" in reason and "max_runtime_seconds" in reason
    said("trigger: unreachable event", polls.unreachable_reason(ATTEMPT, 601, inner), failure=True)

    from shardline.airflow.operators.messages import step_failed_text

    said("watch fails: timeout", step_failed_text(ATTEMPT, Action.TIMEOUT, reason, []), failure=True)
    said("watch fails: unreachable", step_failed_text(ATTEMPT, Action.UNREACHABLE, text, []), failure=True)
    said("watch fails: no file failed", step_failed_text(ATTEMPT, "FAIL", "cancelled by on-call", []), failure=True)


# --- the operators ---------------------------------------------------------------------------------------


def test_the_operators_say_what_happened_and_what_to_do():
    from shardline.airflow.operators import messages as step_operators
    from shardline.spec.conf import unknown_conf_problem

    why = "no input file under s3://shardline-demo/events/dt=2026-11-22/hour=10/ (matching ['*.parquet']) yet"
    for action, waited, chosen, run_type in itertools.product(
        ("wait", "fail", "skip"), (False, True), (False, True), ("scheduled", "manual", "asset_triggered", "")
    ):
        if action == "skip" and waited:
            continue
        text = said(
            f"plan: missing input ({action}, waited={waited}, chosen={chosen}, run_type={run_type!r})",
            step_operators.missing_input_text(
                STEP, REF, why, action, waited=waited, wait_seconds=3600, chosen=chosen, run_type=run_type
            ),
            failure=action == "fail" or waited,
        )
        assert "input.when_missing" in text or "input.wait_timeout_seconds" in text, text
    said(
        "plan: Param refused",
        step_operators.param_problem_text(
            "Param model_version 'v9' is not pinned in model.versions of step score (pinned: v1, v2)", REF
        ),
        failure=True,
    )
    said(
        "plan: unknown conf key",
        step_operators.param_problem_text(unknown_conf_problem({"instance_cnt": 3}), REF),
        failure=True,
    )
    failed = [
        {"input": "s3://b/in/corrupt-0.parquet", "error_class": "CorruptInputError", "error_message": "bad"},
        {"input": "s3://b/in/part-3.parquet", "error_class": None, "error_message": ""},
    ]
    said("failed files list", step_operators._list(failed))
    said("failed files list, long", step_operators._list(failed * 8), lists=True)
    said("failed files list, empty", step_operators._list([]))
    said("mark_run_failed", step_operators.run_failed_text("task_failure"), failure=True)
    said("mark_run_failed without a reason", step_operators.run_failed_text(None), failure=True)
    said("report: rows in != rows out", rows_mismatch_text([["s3://b/in/part-1.parquet"]]), failure=True)
    said(
        "plan: no model",
        step_operators.model_missing_text(
            STEP,
            "no model at s3://shardline-demo/models/xgboost/"
            "v9/model.tar.gz (check the Param model_version or "
            "model.uri); under s3://shardline-demo/models/xgboost/ "
            "there are: v1, v2",
            REF,
        ),
        failure=True,
    )
    said("rerun: not finished", messages.rerun_not_finished_text(RunRef.parse(REF), "running"), failure=True)
    for given in (False, True):
        said(
            f"rerun: bad conf (given={given})",
            messages.rerun_conf_text(
                RunRef.parse(REF), "Param model_version '..' must match a plain segment", given=given
            ),
            failure=True,
        )
    for action in ("wait", "fail"):
        text = said(
            f"dry run: no input ({action})",
            step_operators.dry_run_empty_text(ATTEMPT.input_prefix, ["*.parquet"], action, 3600),
            failure=True,
        )
        assert ATTEMPT.input_prefix in text, text


def test_readiness_and_late_inputs_say_what_to_set():
    import datetime as dt

    from shardline.decision import readiness

    end = dt.datetime(2026, 11, 22, 11, tzinfo=dt.UTC)
    text = said("plan: partition not complete", readiness.not_ready_reason(end + dt.timedelta(seconds=300), 300))
    assert "input.settle_seconds" in text and "11:05:00" in text, text
    late = [f"{ATTEMPT.input_prefix}late-{i}.parquet" for i in range(7)]
    for attempt in (1, POLICY.max_attempts):
        decision = policy.for_late_inputs(late, attempt, POLICY, ATTEMPT.input_prefix)
        said(f"late inputs at attempt {attempt} -> {decision.action.value}", decision.reason, lists=True)
        for f in decision.failed_files:
            said("late input: failed file", step_end.file_error(f.error_class, f.error_message), failure=True)
        if decision.action is Action.FAIL:
            from shardline.airflow.operators.messages import step_failed_text
            from shardline.orchestration.step.watch import StepEvent

            event = StepEvent.of(decision, ATTEMPT).to_event()
            said(
                "watch fails: late inputs",
                step_failed_text(ATTEMPT, "FAIL", decision.reason, event["failed_files"]),
                failure=True,
                lists=True,
            )


# --- the CLI ---------------------------------------------------------------------------------------------


def test_the_cli_says_what_happened_and_what_to_do():
    dags = Path("/opt/airflow/dags")
    said("runs: none yet", messages.no_runs_text(None, dags))
    said("runs: none yet for a pipeline", messages.no_runs_text("tabular_scoring_hourly", dags))
    said("failed: error cell", messages.error_text("CorruptInputError", None))
    assert messages.error_text(None, None) == "-"
    said(
        "preview: no such pipeline",
        messages.preview_no_pipeline("tabular_scoring", dags, ["daily_churn"]),
        failure=True,
    )
    said("preview: no pipeline at all", messages.preview_no_pipeline("tabular_scoring", dags, []), failure=True)
    said(
        "preview: no such step",
        messages.preview_no_step("tabular_scoring_hourly", "rank", ["score", "calibrate"]),
        failure=True,
    )
    for env in ({"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}, {"AWS_PROFILE": "prod", "AWS_REGION": "eu-west-1"}, {}):
        said(
            f"AWS error ({', '.join(env) or 'no settings'})",
            messages.aws_error_text(
                "runs",
                "An error occurred (ResourceNotFoundException) when calling the Query "
                "operation: Requested resource not found",
                env,
                dags,
            ),
            failure=True,
        )


# --- the on-call page and its API ------------------------------------------------------------------------


def test_the_on_call_api_details_say_what_to_do():
    api = pytest.importorskip("shardline.airflow.ui.api")
    said("page API: unknown pipeline", api.unknown_pipeline_detail("tabular_scoring"), failure=True)
    said("page API: resubmit body", api.CHOOSE_FILES_DETAIL, failure=True)
    for summary in [*api._AWS_SUMMARIES, api._aws_summary(RuntimeError("x"))]:
        said(f"page API: AWS failed ({summary[:30]}...)", api.aws_error_detail(summary, "a1b2c3d4e5f6"), failure=True)


def _script() -> str:
    page = PAGE.read_text(encoding="utf-8")
    return page[page.index("<script") : page.index("</script>")]


def test_the_page_texts_read_well():
    # Every string literal the page's script holds (labels, notices, the dialog's sentences).
    for literal in re.findall(r'"((?:[^"\\\n]|\\.)*)"', _script()):
        if len(literal.split()) >= 3:  # words, not a selector or a key
            said("page literal", literal.strip())


@pytest.mark.skipif(shutil.which("node") is None, reason="node renders the page's notices")
def test_the_page_notices_say_what_to_do():
    script = _script()
    said_block = script[script.index("const sentence") : script.index("function failure")]
    refusal = json.dumps(
        choose_next(
            attempt=2,
            job="j",
            job_running=False,
            step_status="RUNNING",
            watch_state="deferred",
            files=1,
            force=False,
            watch="watch_score",
        ).reason
    )
    half_done = json.dumps(messages.half_done_text(2, "j-a2", "watch_score", _refused(403), FIX))
    render = (
        said_block
        + f"""
const out = {{
  loggedOut: SAID.loggedOut + " Log in again",
  refused: SAID.refused("Forbidden") + " Log in again",
  refusedDot: SAID.refused("Access denied.") + " Log in again",
  loadFailed: SAID.failed("Could not load this page", "Failed to fetch", "Press Refresh to try again."),
  resubmitRefused: SAID.failed("Cannot resubmit step score", {refusal}, "Nothing was changed."),
  resubmitFailed: SAID.failed("Resubmitting step score failed", {half_done}),
  cancelled: SAID.cancelled, notEnded: SAID.notEnded, allSucceeded: SAID.allSucceeded,
}};
console.log(JSON.stringify(out));
"""
    )
    out = json.loads(
        subprocess.run(["node", "-e", render], capture_output=True, text=True, check=True, timeout=30).stdout
    )
    for name, text in out.items():
        said(f"page notice: {name}", text, failure=name not in ("cancelled", "allSucceeded"))


def _printed(show) -> str:
    """What a CLI command's reply prints for a person (stdout, then stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        show()
    return (out.getvalue() + err.getvalue()).strip()


def test_the_cli_commands_print_whole_sentences(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    key = "s3://shardline-demo/events/dt=2026-11-22/hour=10/part-late.parquet"
    job = "sl-tabular-scoring-hourly-score-0123456789-a2"
    why = "every file that has not succeeded"
    submit = choose_next(
        attempt=1,
        job="j",
        job_running=False,
        step_status="FAILED",
        watch_state="failed",
        files=1,
        force=False,
        watch="watch_score",
    )
    take_up = choose_next(
        attempt=2,
        job="j",
        job_running=False,
        step_status="PLANNED",
        watch_state="failed",
        files=0,
        force=False,
        watch="watch_score",
    )
    nothing = choose_next(
        attempt=2,
        job="j",
        job_running=False,
        step_status="SUCCEEDED",
        watch_state="success",
        files=0,
        force=False,
        watch="watch_score",
    )
    cases = {
        "dry run, submit": (
            ResubmitResult(
                ResubmitPlan(REF, STEP, [key], f"{why}; {submit.reason}"),
                2,
                job,
                messages.dry_run_text(submit, "watch_score", RUN_ID, 2, "failed"),
            ),
            {"dry_run": True},
        ),
        "submit": (
            ResubmitResult(
                ResubmitPlan(REF, STEP, [key], f"{why}; {submit.reason}"),
                2,
                job,
                messages.cleared_text("watch_score", "failed", 2),
            ),
            {},
        ),
        "take up, dry run": (
            ResubmitResult(
                ResubmitPlan(REF, STEP, [], f"{why}; {take_up.reason}"),
                None,
                None,
                messages.dry_run_text(take_up, "watch_score", RUN_ID, None, "failed"),
                action="take_up",
            ),
            {"dry_run": True},
        ),
        "take up": (
            ResubmitResult(
                ResubmitPlan(REF, STEP, [], f"{why}; {take_up.reason}"),
                None,
                None,
                messages.cleared_text("watch_score", "failed", 2),
                action="take_up",
            ),
            {},
        ),
        "nothing": (
            ResubmitResult(
                ResubmitPlan(REF, STEP, [], f"{why}; {nothing.reason}"), None, None, nothing.reason, action="nothing"
            ),
            {},
        ),
        "half done": (
            ResubmitResult(
                ResubmitPlan(REF, STEP, [key], f"{why}; {submit.reason}"),
                2,
                job,
                messages.half_done_text(2, job, "watch_score", _refused(403), FIX),
                complete=False,
            ),
            {},
        ),
    }
    for name, (result, overrides) in cases.items():
        reply = printing.resubmit_reply(result, dry_run=overrides.get("dry_run", False))
        assert reply.code == (1 if name == "half done" else 0), name
        assert reply.data is result  # what --json prints
        text = said(f"shardline resubmit: {name}", _printed(reply.show), failure=name != "nothing")
        if name == "nothing":
            assert text.count("nothing to resubmit") == 1, text  # said once, not in a selection line too
        if "dry run" in name:
            assert "without --dry-run" in text, text
        if "submit" in name and "dry run" not in name:
            assert text.endswith(f"follow it with: shardline status {REF}"), text

    lines = [
        CANCEL_LINES["stopped"].format(step=STEP, job=job),
        CANCEL_LINES["cancelled"].format(step=STEP),
        CANCEL_LINES["dag_run_failed"].format(run_id=RUN_ID),
    ]
    said("shardline cancel", _printed(printing.lines_reply(lines).show))
    said(
        "shardline failed: nothing failed", _printed(lambda: printing.show_failed([], ref=RunRef.parse(REF), step=STEP))
    )
    red = RunRecord("FAILED", message="DAG run failed (task_failure); check the failed task's log in Airflow for why")
    lost = StepRecord("FAILED", 2, message="the run no longer holds the lock on its output prefix")
    note = views.failed_note(RunRef.parse(REF), red, {STEP: lost}, [])
    said(
        "shardline failed: every file scored, the run red",
        _printed(lambda: printing.show_failed([], ref=RunRef.parse(REF), step=STEP, note=note)),
        failure=True,
    )
    for status in ("FAILED", "RUNNING", "SKIPPED"):
        said(
            f"shardline failed: no step planned, the run {status}",
            messages.not_planned_text(RunRef.parse(REF), None, status, "model s3://b/m.tar.gz is not there"),
            failure=status != "SKIPPED",
        )
    said(
        "shardline runs: none",
        _printed(lambda: printing.show_runs([], pipeline=None, dags_folder=Path("dags"), airflow_warning=None)),
    )
