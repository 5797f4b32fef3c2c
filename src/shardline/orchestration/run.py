"""A run's own records, above its steps: how it ended (:func:`finish_run`), a run that ends or waits before anything
was planned (:func:`record_run_status`), and the DAG's failure callback, which stops the jobs of the life that failed
before it releases their holds (:func:`end_failed_life`)."""

from __future__ import annotations

import logging

from shardline.ledger.keys import StepRef
from shardline.ledger.states import RunStatus, StepStatus
from shardline.ledger.step_reads import read_step, read_step_item
from shardline.ledger.step_writes import end_life, ensure_run, set_run_status
from shardline.orchestration import partitions, services
from shardline.orchestration.step import jobs, outputs
from shardline.orchestration.step.files import attempt_of
from shardline.planning import naming
from shardline.spec import PipelineSpec
from shardline.waiting import wait_for

log = logging.getLogger(__name__)


def record_run_status(
    spec: PipelineSpec, run_id: str, status: RunStatus, message: str, partition: str | None = None
) -> None:
    """A run that ends (skipped or failed) before anything was planned, or waits for its input (RUNNING), is
    still listed, with why."""
    model = services.ledger_model(spec)
    ensure_run(model, spec.pipeline, run_id, partition)
    set_run_status(model, spec.pipeline, run_id, status, message)


# How long a failure callback waits for the run's stopped jobs to end before it leaves their holds to the next run's
# check (the hold is free the moment the backend says the job ended). Well under the DAG processor's time for a
# file's callbacks ([dag_processor] dag_file_processor_timeout, 50 s by default): past it the processor is killed,
# and the other callbacks queued with this one are lost. A local job stops in a second or two; SageMaker's take a
# minute or two, and their holds are then freed by that check.
STOP_WAIT_SECONDS = 20.0


def end_failed_life(
    spec: PipelineSpec, run_id: str, life: int, message: str, *, stop_wait: float = STOP_WAIT_SECONDS
) -> str:
    """What the DAG's failure callback does for the run's Airflow life ``life`` (its clear_number): mark the run
    FAILED, stop every job of it that still runs and wait for them, then release its output prefixes. Nothing at all
    when the run was taken up again since (an on-call resubmission or rerun, however close to the failure): the
    ledger's compare-and-set on the run's lives decides, not clocks. Returns what was done, in words."""
    model = services.ledger_model(spec)
    # The jobs are read before the life is ended: a resubmission that takes the run up right after starts a job of a
    # newer attempt, which this callback must not stop (it stops only the jobs of the life that failed).
    try:
        jobs_of_the_life = _jobs_of(spec, run_id)
    except Exception as err:  # noqa: BLE001 - read again once the life is ended: the run must still be ended
        log.warning("run %s: could not read its jobs before ending it (%s); reading them after", run_id, err)
        jobs_of_the_life = None
    if not end_life(model, spec.pipeline, run_id, life, message):
        return f"run {run_id} was taken up again since its life {life} failed (or ended otherwise): left as it is"
    jobs_of_the_life = jobs_of_the_life if jobs_of_the_life is not None else _jobs_of(spec, run_id)
    _withdraw_unended_markers(spec, run_id)
    running = [name for name in jobs_of_the_life if jobs.stop_job(spec, name) or jobs.is_running(spec, name)]
    if running:
        left = wait_for(
            lambda: [n for n in running if jobs.is_running(spec, n)], lambda n: not n, timeout=stop_wait, interval=2.0
        )
        if left:
            # Its holds stand: the next run of the partition takes them once the backend says the job ended.
            return f"run {run_id} failed; job(s) {', '.join(left)} still stopping, so its output prefixes stay held"
    partitions.release_ended_life(spec, spec.pipeline, run_id, life)
    stopped = f", after stopping {', '.join(running)}" if running else ""
    return f"run {run_id} failed; its output prefixes are released{stopped}"


def _withdraw_unended_markers(spec: PipelineSpec, run_id: str) -> None:
    """A run that failed leaves no ``_SUCCESS`` of a step it never recorded SUCCEEDED (its end wrote the marker,
    then died before recording the step): the marker goes with the step's newest attempt."""
    model = services.ledger_model(spec)
    for step in spec.steps:
        ref = StepRef(spec.pipeline, run_id, step.name)
        records = read_step(model, ref, files=False)
        if records.step is None or records.step.status == StepStatus.SUCCEEDED.value:
            continue
        attempt = attempt_of(records, ref)
        if attempt is not None and outputs.withdraw_own_marker(spec, attempt):
            log.warning("step %s of run %s never recorded SUCCEEDED: its _SUCCESS was withdrawn", step.name, run_id)


def end_run_gone_from_airflow(spec: PipelineSpec, holder) -> str:
    """The run that holds a prefix is gone from Airflow (its DAG run deleted): end it in the ledger (FAILED, saying
    why: its instances then upload nothing more) and stop its jobs that still run, since nobody watches them. Its
    hold is free once the backend says they ended. Says what it did."""
    done = partitions.end_run_gone_from_airflow(spec, holder)
    stopped = [name for name in _jobs_of(spec, holder.run_id) if jobs.stop_job(spec, name)]
    return done + (f"; stopping its job(s) {', '.join(stopped)}" if stopped else "")


def _jobs_of(spec: PipelineSpec, run_id: str) -> list[str]:
    """The newest attempt's job of each step of the run that planned one, and any earlier attempt's job still going
    on beside it (``live_from``: a lost instance's files went ahead; other earlier jobs were stopped and waited for
    before the next attempt was planned)."""
    model = services.ledger_model(spec)
    names = []
    for step in spec.steps:
        item = read_step_item(model, StepRef(spec.pipeline, run_id, step.name))
        if item is not None and item.attempt:
            names += [naming.job_name(spec.pipeline, run_id, step.name, n) for n in item.live_attempts]
    return names


def finish_run(spec: PipelineSpec, pipeline: str, run_id: str, status: RunStatus, message: str = "") -> None:
    """Record how the run ended, and release the output prefixes it held."""
    set_run_status(services.ledger_model(spec), pipeline, run_id, status, message)
    partitions.release_run(spec, pipeline, run_id)
