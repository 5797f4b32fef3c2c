"""Every on-call message, as text: what a resubmission, a rerun, a cancel, a run report and the CLI say.

Pure functions over plain values (``tests/oncall/test_messages.py`` renders each and reads it as a stranger
would): the service and the CLI raise or print what these return.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from shardline.decision.resubmit import NextStep, task_state
from shardline.errors import error_line
from shardline.ledger.states import STEP_TERMINAL
from shardline.oncall.values import FileChoice, RunRef

# --- what a resubmission or a cancel says, as text (tests/oncall/test_messages.py renders each) ----------


def dry_run_text(choice: NextStep, watch: str, run_id: str, attempt: int | None, watch_state: str | None) -> str:
    """What a dry run says it would do: ``attempt`` is the one it would submit (``None``: it submits none)."""
    if attempt is None:
        return f"dry run, nothing was changed: {choice.reason}"
    if choice.clear_watch:
        return (
            f"dry run, nothing was changed: for real, it would submit attempt {attempt}, then clear {watch} of "
            f"DAG run {run_id} so the run follows it"
        )
    return (
        f"dry run, nothing was changed: for real, it would submit attempt {attempt} and clear nothing in "
        f"Airflow ({followed_text(watch, watch_state)})"
    )


def followed_text(watch: str, watch_state: str | None) -> str:
    """Who follows a new attempt when no watch task needs clearing."""
    if watch_state:
        return f"{watch} is {task_state(watch_state)} and follows the new attempt"
    return "Airflow was left out (--ledger-only): no DAG run follows this attempt"


def half_done_text(attempt: int | None, job_name: str | None, watch: str, err: Exception, again: str) -> str:
    """A resubmission whose clear failed: what was done, and the command that finishes it."""
    if attempt:
        done = f"attempt {attempt} is submitted as job {job_name}, but the DAG run does not follow it yet"
    else:
        done = "nothing was submitted, and the DAG run does not follow the step yet"
    return (
        f"{done}: clearing {watch} failed: {err}. To finish, run the same command again once Airflow lets "
        f"you; it clears {watch} and submits nothing twice: {again}"
    )


def cleared_text(watch: str, state: str, cleared: int) -> str:
    """What clearing a finished watch task did."""
    return (
        f"{watch} had ended ({state}): cleared it and what follows it ({cleared} task instance(s)), so the DAG "
        "run follows the step again and turns green when it succeeds"
    )


def not_finished_text(watch: str, wait_seconds: float, state: str | None) -> str:
    """A watch task that was still running when the resubmission came to clear it."""
    return f"{watch} has not finished after {wait_seconds:.0f}s (it is {task_state(state)})"


def airflow_left_out(err: Exception) -> str:
    """Why `shardline runs` and `status` show no Airflow column."""
    return f"Airflow's DAG run states are left out (the ledger's are shown): {err}"


def unknown_step(pipeline: str, step: str, steps: Sequence[str]) -> str:
    return f"pipeline {pipeline} has no step {step!r}; its steps are {', '.join(steps)}: pass one of them as --step"


def local_root_mismatch(job: str, attempt: int, local_root: object) -> str:
    """The local backend's jobs live in a directory; a CLI that looks in another one must not submit."""
    return (
        f"job {job} of attempt {attempt} ran, but not under {local_root}, where this shell's local "
        "backend looks, so nothing was submitted (a job started here would run beside Airflow's). Run the "
        "command with the same AIRFLOW_HOME (or SHARDLINE_LOCAL_ROOT) as the Airflow that runs the pipeline"
    )


def repeat_resubmit_command(ref: RunRef, step: str, choice: FileChoice, *, force: bool) -> str:
    """The resubmit command that repeats this call, its selection and --force included, to print when something
    is left half done (``naming.resubmit_command`` is the plain ``--all-failed`` one a failed step prints)."""
    words = ["shardline", "resubmit", str(ref), "--step", step, *choice.words()]
    if force:
        words.append("--force")
    return shlex.join(words)


# What `shardline cancel` prints, a line per thing it did (or left alone).
CANCEL_LINES = {
    "already": "step {step}: already {status}, left as it is",
    "moved_on": "step {step}: moved on while being cancelled (resubmitted, or ended), so it was left as it is; "
    "`shardline status {ref}` shows where it is now",
    "stopped": "step {step}: stopped {job}",
    "cancelled": "step {step}: CANCELLED",
    "dag_run_failed": "Airflow: DAG run {run_id} marked failed",
    "airflow_error": "Airflow: DAG run {run_id} was not marked failed ({err}); the ledger says CANCELLED, so no "
    "watch task resubmits; mark the DAG run failed in Airflow's UI",
}


# --- run reports -----------------------------------------------------------------------------------------------


REPORTS_WHEN = "a step's run report is written when the step ends"


def report_not_planned_text(ref: RunRef, step: str) -> str:
    return (
        f"step {step} of {ref} was never planned, so it has no run report ({REPORTS_WHEN}); `shardline status "
        f"{ref}` shows where the run is"
    )


def report_missing_text(ref: RunRef, step: str, status: str | None, uri: str) -> str:
    """A planned step whose report is not (yet) on S3: still running, or ended without one."""
    if status not in STEP_TERMINAL:
        return (
            f"step {step} of {ref} has not ended ({status or 'no status'}), so it has no run report yet: "
            f"{REPORTS_WHEN}; `shardline status {ref}` shows its progress"
        )
    return (
        f"step {step} of {ref} ended {status}, but its run report is not at {uri}: {REPORTS_WHEN}, so a run "
        f"from before Shardline wrote reports has none, and if writing it failed the step's watch_{step} task "
        "log says why"
    )


def no_reports_text(ref: RunRef, missing: Sequence[str]) -> str:
    """No step of the run has a report: each one's reason."""
    return f"run {ref} has no run report yet: " + "; ".join(missing)


def out_needs_step_text(ref: RunRef, steps: Sequence[str]) -> str:
    return f"--out names one file, and run {ref} has reports for steps {', '.join(steps)}: pass --step with --out"


# --- rerun -------------------------------------------------------------------------------------------------


def rerun_not_finished_text(ref: RunRef, state: str | None) -> str:
    return (
        f"DAG run {ref.run_id} is {state or 'in no known state'}, not finished, so nothing was rerun: wait for it "
        f"to end (`shardline status {ref}`), or stop it with `shardline cancel {ref}` first"
    )


def rerun_conf_text(ref: RunRef, problem: str, *, given: bool) -> str:
    whose = "the conf given" if given else f"the conf of DAG run {ref.run_id}"
    return (
        f"{whose} would fail the plan task again ({problem}), so nothing was rerun: pass a valid one with "
        f"`shardline rerun {ref} --conf '{{...}}'`"
    )


# --- the CLI ------------------------------------------------------------------------------------------------


def not_planned_text(ref: RunRef, step: str | None, status: str | None, message: str | None) -> str:
    """`shardline failed` of a run that exists but planned no step (or not ``step``): what its RUN item says
    happened, and what to run. A plan task that failed (a bad conf, a model not where the spec says) leaves this."""
    what = f"step {step} of {ref} was never planned" if step else f"no step of {ref} was planned"
    said = f": {message}" if message else ""
    if status in ("FAILED", "CANCELLED"):
        return (
            f"{what}, so no file failed: the run ended {status}{said}. Once that is fixed (the failed task's log "
            f"in Airflow has the details), `shardline rerun {ref}` plans it again"
        )
    if status in STEP_TERMINAL:
        return f"{what}, and no file failed: the run ended {status}{said}"
    return f"{what} yet: the run is {status or 'recorded, with no status'}{said}; `shardline status {ref}` shows it"


def all_scored_text(ref: RunRef, missing: Sequence[str], run_status: str | None, run_message: str | None) -> str:
    """`shardline failed` of a run whose every file was scored and which still ended badly: nothing to resubmit,
    what is missing (``missing``: each step's end that is not there) and the command that mends it. ``run_status``:
    the run's, when it ended FAILED or CANCELLED."""
    how = f"the run ended {run_status}" + (f" ({run_message})" if run_message else "") + ": " if run_status else ""
    return (
        f"every file of {ref} was scored, so there is nothing to resubmit; yet {how}"
        + "; ".join(missing)
        + f". `shardline rerun {ref}` runs its failed tasks again, which check the outputs and commit them"
    )


def no_runs_text(pipeline: str | None, dags_folder: Path) -> str:
    if pipeline:
        return f"no runs recorded yet for pipeline {pipeline} in its ledger table"
    return f"no runs recorded yet in the ledger tables of the pipelines under {dags_folder}"


def error_text(error_class: str | None, error_message: str | None) -> str:
    """A file's error in one line: class and message, either of which may be missing."""
    return error_line(error_class, error_message) or "-"


def preview_no_pipeline(pipeline: str, dags_folder: Path, known: list[str]) -> str:
    return (
        f"no pipeline {pipeline!r} in {dags_folder}/pipelines (known: {', '.join(known) or 'none'}); check the "
        "name, or pass --dags-folder with the folder that holds its spec"
    )


def preview_no_step(pipeline: str, step: str, names: list[str]) -> str:
    return f"pipeline {pipeline} has no step {step!r} (steps: {', '.join(names)}); pass one of them as --step"


def aws_error_text(command: str, err: str, env, dags_folder: Path) -> str:
    """AWS refused or could not be reached: where the CLI looked, and what to check."""
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        where = (
            f"the endpoint {endpoint} (AWS_ENDPOINT_URL; for the embedded stack, `shardline local status` "
            "says whether it is up)"
        )
    else:
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        where = f"AWS (profile {env.get('AWS_PROFILE') or 'default'}, " + (
            f"region {region})" if region else "the profile's region)"
        )
    return (
        f"shardline {command}: AWS refused or could not be reached: {err}\n"
        f"  it talked to {where}; check AWS_PROFILE / AWS_REGION / AWS_ENDPOINT_URL and the ledger table's name "
        f"in the pipeline specs under {dags_folder}"
    )


def plain_http_warning(url: str) -> str | None:
    """A warning for plain http:// to a host other than this machine: the password and the token would cross
    the network unencrypted. None for https:// and for loopback (the local stack)."""
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        return None
    host = (parts.hostname or "").lower()
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost" or host.endswith(".localhost")
    if loopback:
        return None
    return (
        f"WARNING: {url} is plain http://: the password and the token cross the network to {host} unencrypted. "
        "Use https:// for an Airflow that is not on this machine"
    )


def missing_pool_text(pool: str) -> str:
    """A waiting step whose pool (dags/fleet.yaml names its quota) does not exist in Airflow: the fix."""
    return (
        f"pool {pool} does not exist in Airflow, so this step waits for it forever: `shardline fleet sync` creates "
        "the pools dags/fleet.yaml names"
    )
