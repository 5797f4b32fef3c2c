"""Thin Airflow operators for a pipeline step: plan, submit, watch, and the final report.

Each calls into :mod:`shardline.orchestration.steps` (plain functions) and holds no policy of its own.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardline.airflow.triggers.step import (
    UNREACHABLE,
    BackoffTrigger,
    InputTrigger,
    StepEvent,
    StepTrigger,
    settle_until,
)
from shardline.decision import readiness
from shardline.decision.policy import Action, attempt_deadline
from shardline.errors import PermanentError
from shardline.ledger.states import StepStatus  # pure: no AWS client library at DAG parse
from shardline.orchestration.outcome import run_outcome  # pure, as the line above
from shardline.planning.attempt import Attempt
from shardline.planning.naming import resubmit_command
from shardline.spec import (
    input_override_problem,
    instance_count_override,
    load_spec,
    model_version_problem,
    unknown_conf_problem,
)


def _steps():
    """The step functions, imported when a task runs: DAG parsing never loads boto3 or pynamodb."""
    from shardline.orchestration import steps

    return steps


def fails_fast(method):
    """An operator method whose :class:`~shardline.errors.PermanentError` fails the task at once, with its message:
    the same input or settings would fail every retry the same way. Any other error is Airflow's to retry."""

    @functools.wraps(method)
    def run(self, context, *args, **kwargs):
        try:
            return method(self, context, *args, **kwargs)
        except PermanentError as err:
            raise AirflowFailException(str(err)) from err

    return run


def _polls():
    """What a poll reads and the values a trigger carries (:mod:`shardline.orchestration.watch`), imported when a
    task runs, as :func:`_steps` is."""
    from shardline.orchestration import watch

    return watch


class _SpecMixin:
    spec_path: str

    @functools.cached_property
    def spec(self):
        """The pipeline spec, parsed once per task: its services (shardline.orchestration.services) are then
        built once too."""
        return load_spec(Path(self.spec_path))


class PlanStepOperator(_SpecMixin, BaseOperator):
    """List a step's inputs, write attempt 1's manifest, plan file and STEP item. Skips on empty input."""

    template_fields = (
        "input_prefix",
        "output_prefix",
        "metadata_prefix",
        "model_uri",
        "model_version",
        "input_override",
        "instances_override",
        "dry_run",
    )

    def __init__(
        self,
        *,
        spec_path: str,
        step: str,
        input_prefix: str,
        output_prefix: str,
        model_uri: str,
        model_version: str = "",
        input_override: str = "",
        instances_override: Any = None,
        dry_run: Any = False,
        metadata_prefix: str = "",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.spec_path, self.step = spec_path, step
        self.input_prefix, self.output_prefix, self.model_uri = input_prefix, output_prefix, model_uri
        self.metadata_prefix = metadata_prefix
        self.model_version = model_version
        self.input_override, self.instances_override, self.dry_run = input_override, instances_override, dry_run

    @fails_fast
    def execute(self, context):
        spec = self.spec
        step = spec.step(self.step)
        unknown = unknown_conf_problem(getattr(context.get("dag_run"), "conf", None))
        if unknown and spec.unknown_conf == "fail":
            raise AirflowFailException(param_problem_text(unknown, _ref(spec, context)))
        if unknown:
            self.log.warning("%s", unknown)
        override = (self.input_override or "").strip()
        version = (self.model_version or "").strip() or step.model.version
        # The Params' own schema refuses these at trigger time; checked again here, where they are used,
        # because a conf can also reach a run by other ways (an old run cleared, a Param edited in code).
        problem = (
            (input_override_problem(step, override) if override else None)
            or model_version_problem(step, version)
            or instance_count_override(self.instances_override, 1)[1]
        )
        if problem:
            raise AirflowFailException(param_problem_text(problem, _ref(spec, context)))
        if not (step.model.sha256 or step.model.versions):
            self.log.warning(
                "step %s: the model is NOT pinned (model.allow_unpinned): whoever can write %s "
                "chooses the code this job runs; pin it with model.sha256 or model.versions",
                self.step,
                self.model_uri,
            )
        input_prefix = override or self.input_prefix
        if str(self.dry_run).lower() == "true":
            self._dry_run(context, spec, input_prefix, self._instances(step), version)
        return self._plan(context, input_prefix, version, waited=False)

    @fails_fast
    def execute_after_wait(self, context, event: dict):
        """Back from :class:`InputTrigger`: plan now that the input is there, or fail naming the prefix."""
        input_prefix = (self.input_override or "").strip() or self.input_prefix
        version = (self.model_version or "").strip() or self.spec.step(self.step).model.version
        if not event["ready"]:
            # It waited for the input (when_missing: wait) or for the ready marker, or only for the partition's
            # settle time (fail, skip): then when_missing decides now.
            step = self.spec.step(self.step)
            waited = step.input.missing_input_action(_run_type(context)) == "wait" or bool(step.input.ready_marker)
            self._missing(context, input_prefix, event["reason"], waited=waited)
        self.log.info("step %s: %s", self.step, event["reason"])
        return self._plan(context, input_prefix, version, waited=True)

    def _instances(self, step) -> int:
        return instance_count_override(self.instances_override, step.resources.instance_count)[0]

    def _ready_at(self, context) -> dt.datetime | None:
        """When a scheduled run's partition is complete (its interval's end plus input.settle_seconds)."""
        step = self.spec.step(self.step)
        if step.input.from_step:
            return None
        return readiness.ready_at(
            run_type=_run_type(context),
            interval_end=context.get("data_interval_end"),
            settle_seconds=step.input.settle_seconds,
            ready_marker=step.input.ready_marker,
        )

    def _plan(self, context, input_prefix: str, version: str, *, waited: bool):
        spec, step = self.spec, self.spec.step(self.step)
        problem = _steps().model_problem(spec, self.step, self.model_uri)
        if problem:
            # A setup error is the same on every try: fail now, naming the URI, with no retry and no job.
            message = model_missing_text(self.step, problem, _ref(spec, context))
            _steps().record_run_status(spec, context["run_id"], StepStatus.FAILED, message, _partition(context))
            raise AirflowFailException(message)
        ready = self._ready_at(context)
        if ready is not None and dt.datetime.now(dt.UTC) < ready:
            self._wait_until_complete(context, input_prefix, ready)
        if step.input.ready_marker:
            ready, why = _polls().input_ready(_polls().InputWatch.of(spec, self.step, input_prefix))
            if not ready and not waited and _run_type(context) == readiness.SCHEDULED:
                # The marker is when a scheduled partition is complete, whatever when_missing says: wait for it
                # (up to input.wait_timeout_seconds); when_missing decides only if it never comes.
                self._wait_for_marker(context, input_prefix, why)
            if not ready:
                self._missing(context, input_prefix, why, waited=waited)
        # An earlier step's outputs that are not there to read (UpstreamError) are permanent: no retry finds them.
        attempt = _steps().plan(
            spec,
            self.step,
            context["run_id"],
            input_prefix=input_prefix,
            output_prefix=self.output_prefix,
            model_uri=self.model_uri,
            instance_count=self._instances(step),
            model_version=version,
            metadata_prefix=(self.metadata_prefix or "").strip() or None,
            partition=_partition(context),
        )
        if attempt is None:
            self._missing(
                context,
                input_prefix,
                f"no input file under {input_prefix} (matching {list(step.input.include)})",
                waited=waited,
            )
        return attempt.to_xcom()

    def _wait_until_complete(self, context, input_prefix: str, ready: dt.datetime):
        """A scheduled run whose partition is not complete yet waits until it is, whatever input.when_missing
        says (the partition is not missing, it is still being written); then, with when_missing: wait, up to
        input.wait_timeout_seconds more for its first file. Never returns: it defers."""
        step = self.spec.step(self.step)
        why = readiness.not_ready_reason(context["data_interval_end"], ready)
        self.log.info("step %s: %s", self.step, why)
        _steps().record_run_status(
            self.spec, context["run_id"], StepStatus.RUNNING, f"step {self.step}: waiting: {why}", _partition(context)
        )
        waits = step.input.missing_input_action(_run_type(context)) == "wait"
        deadline = ready.timestamp() + (step.input.wait_timeout_seconds if waits else 0)
        self.defer(
            trigger=InputTrigger(
                self._input_watch(input_prefix),
                deadline,
                poll_interval=self.spec.poll_interval_seconds,
                not_before=settle_until(),
                ready_at=ready.timestamp(),
            ),
            method_name="execute_after_wait",
            timeout=dt.timedelta(seconds=deadline - time.time() + 600),
        )

    def _wait_for_marker(self, context, input_prefix: str, why: str):
        """A scheduled run waits for its partition's ready marker up to input.wait_timeout_seconds. Defers."""
        step = self.spec.step(self.step)
        self.log.info("step %s: %s; waiting up to %ds for it", self.step, why, step.input.wait_timeout_seconds)
        _steps().record_run_status(
            self.spec, context["run_id"], StepStatus.RUNNING, f"step {self.step}: waiting: {why}", _partition(context)
        )
        self.defer(
            trigger=InputTrigger(
                self._input_watch(input_prefix),
                time.time() + step.input.wait_timeout_seconds,
                poll_interval=self.spec.poll_interval_seconds,
                not_before=settle_until(),
            ),
            method_name="execute_after_wait",
            timeout=dt.timedelta(seconds=step.input.wait_timeout_seconds + 600),
        )

    def _input_watch(self, input_prefix: str) -> dict:
        return _polls().InputWatch.of(self.spec, self.step, input_prefix).to_json()

    def _missing(self, context, input_prefix: str, why: str, *, waited: bool):
        """No input (yet): wait for it, fail naming the prefix, or skip, as ``input.when_missing`` says.
        Never returns: it defers, or raises."""
        spec, step = self.spec, self.spec.step(self.step)
        if step.input.from_step:
            raise AirflowSkipException(f"{why}: the earlier step wrote nothing, so there is nothing to do")
        run_type = _run_type(context)
        action = step.input.missing_input_action(run_type)
        message = missing_input_text(
            self.step,
            _ref(spec, context),
            why,
            action,
            waited=waited,
            wait_seconds=step.input.wait_timeout_seconds,
            chosen=bool(step.input.when_missing),
            run_type=run_type,
        )
        if action == "skip":
            _steps().record_run_status(spec, context["run_id"], StepStatus.SKIPPED, message, _partition(context))
            raise AirflowSkipException(message)
        if action == "fail" or waited:
            _steps().record_run_status(spec, context["run_id"], StepStatus.FAILED, message, _partition(context))
            raise AirflowFailException(message)
        deadline = time.time() + step.input.wait_timeout_seconds
        self.log.warning("%s", message)
        # Listed by `shardline runs` while it waits: RUNNING, with what it waits for.
        _steps().record_run_status(spec, context["run_id"], StepStatus.RUNNING, message, _partition(context))
        self.defer(
            trigger=InputTrigger(
                self._input_watch(input_prefix),
                deadline,
                poll_interval=spec.poll_interval_seconds,
                not_before=settle_until(),
            ),
            method_name="execute_after_wait",
            timeout=dt.timedelta(seconds=step.input.wait_timeout_seconds + 600),
        )

    def _dry_run(self, context, spec, input_prefix: str, instances: int, model_version: str) -> None:
        """List the inputs and preview the model on a sample of the first one; submit nothing."""
        from shardline.oncall.preview import PreviewError, preview_step
        from shardline.orchestration import services
        from shardline.planning.inputs import choose_instance_count, list_inputs

        s = spec.step(self.step)
        s3 = services.s3_client(spec)
        objects = list_inputs(s3, input_prefix, s.input.include, s.input.exclude)
        plan = (
            f"dry run: {len(objects)} file(s), {sum(o.size for o in objects) / 2**20:.1f} MiB under "
            f"{input_prefix}; would run {choose_instance_count(instances, len(objects))} instance(s) of "
            f"{s.resources.instance_type}; nothing submitted"
        )
        if not objects:
            # As a real run would: skip only where input.when_missing says so; else fail, naming the prefix.
            action = s.input.missing_input_action(_run_type(context))
            if action == "skip":
                raise AirflowSkipException(f"{plan} (input.when_missing: skip)")
            raise AirflowFailException(
                dry_run_empty_text(input_prefix, list(s.input.include), action, s.input.wait_timeout_seconds)
            )
        try:
            preview = preview_step(
                spec,
                self.step,
                s3,
                model_uri=self.model_uri,
                input_uri=input_prefix,
                objects=objects,
                model_version=model_version,
            )
        except PreviewError as err:
            raise AirflowFailException(
                f"{plan}. The preview could not run: {err}. Fix that, then run the dry run "
                f"again: `shardline rerun {_ref(spec, context)}`"
            ) from err
        self.log.info("%s", preview.render())
        if not preview.ok:
            raise AirflowFailException(
                f"{plan}. The preview shows the job would fail on {preview.sample_uri}: see the preview above; fix "
                f"the model settings or the input, then run the dry run again: `shardline rerun {_ref(spec, context)}`"
            )
        for warning in preview.warnings:
            self.log.warning("preview: %s", warning)
        raise AirflowSkipException(
            f"{plan}; preview of {preview.sample_uri}: "
            + (f"{len(preview.warnings)} warning(s), see the log" if preview.warnings else "no warnings")
        )


class SubmitStepOperator(_SpecMixin, BaseOperator):
    """Submit the planned attempt; a retried try adopts the job its earlier try started."""

    def __init__(self, *, spec_path: str, plan_task_id: str, **kwargs):
        super().__init__(**kwargs)
        self.spec_path, self.plan_task_id = spec_path, plan_task_id

    @fails_fast
    def execute(self, context):
        attempt = Attempt.from_xcom(context["ti"].xcom_pull(task_ids=self.plan_task_id))
        return _steps().submit(self.spec, attempt).to_xcom()


class WatchStepOperator(_SpecMixin, BaseOperator):
    """The step's sensor, as a deferrable operator: defers to :class:`StepTrigger` (all polling happens there)
    and acts on its decision: advance, resubmit, or fail."""

    def __init__(self, *, spec_path: str, submit_task_id: str, poll_interval: float = 15.0, **kwargs):
        super().__init__(**kwargs)
        self.spec_path, self.submit_task_id, self.poll_interval = spec_path, submit_task_id, poll_interval
        self._attempt: Attempt | None = None

    @fails_fast
    def execute(self, context):
        attempt = Attempt.from_xcom(context["ti"].xcom_pull(task_ids=self.submit_task_id))
        # A retried watch task picks up the newest attempt, not the one its submit task started.
        return self._watch(context, _steps().resume(self.spec, attempt))

    def _watch(self, context, attempt: Attempt):
        self._attempt = attempt
        # The attempt is watched with the policy the spec sets now; the trigger carries it, so an edit of the
        # spec while the attempt runs does not change it.
        watch = _polls().StepWatch.of(self.spec, attempt.step)
        # A step that has already ended (a retried watch, a job quicker than the hand-over) is acted on
        # here: deferring would only bring the answer straight back.
        decision = _polls().decide_now(watch, attempt)
        if decision.action is not Action.WAIT:
            return self.execute_complete(context, StepEvent.of(decision, attempt, watch.policy).to_event())
        self.defer(
            trigger=StepTrigger(
                attempt.to_xcom(),
                watch.to_json(),
                self.poll_interval,
                attempt_deadline(watch.policy, time.time()),
                not_before=settle_until(),
            ),
            method_name="execute_complete",
        )

    @fails_fast
    def execute_complete(self, context, event: dict):
        spec, step_event = self.spec, StepEvent.from_event(event)
        attempt, action, reason = step_event.attempt, step_event.action, step_event.reason
        self._attempt = attempt
        if action == UNREACHABLE:
            # Neither the ledger nor the job can be reached: record nothing, fail the task with what to do.
            raise AirflowFailException(step_failed_text(attempt, action, reason, []))
        if step_event.stop_job:
            _steps().stop(spec, attempt)
        late_sizes: dict[str, int] = {}
        if action in ("ADVANCE", "PARTIAL"):
            # Before the outputs are marked complete: input files that landed after planning go to a next
            # attempt, or fail the step naming them; _SUCCESS never covers a partial set.
            late = _steps().late_inputs_decision(spec, attempt, step_event.policy)
            if late is not None:
                step_event, late_sizes = StepEvent.of(late[0], attempt, step_event.policy), late[1]
                action, reason = step_event.action, step_event.reason
        if action != "RESUBMIT":
            status = _steps().finish(spec, attempt, action, reason)
            if action in ("ADVANCE", "PARTIAL") and status == "FAILED":
                # The outputs are there, but the run report's drift check (drift.action: fail) failed the step.
                raise AirflowFailException(_steps().step_message(spec, attempt))
        fix = resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
        failed = list(step_event.failed_files)
        if action in ("ADVANCE", "PARTIAL"):
            summary = _steps().report(spec, attempt.pipeline, attempt.run_id, attempt.step)
            if action == "PARTIAL":
                self.log.warning("%s", partial_text(attempt.step, reason, failed, fix))
            else:
                self.log.info("step %s succeeded: %s", attempt.step, reason)
            return {**summary, "outcome": action}
        if action == "RESUBMIT":
            self.log.warning("step %s: %s; resubmitting in %.0fs", attempt.step, reason, step_event.delay_seconds)
            payload = {
                "attempt": attempt.to_xcom(),
                "retry_files": list(step_event.retry_files),
                "retry_sizes": late_sizes,
            }
            if step_event.delay_seconds > 0:
                # The state rides in the trigger's event, not in defer kwargs, which dag.test() drops.
                self.defer(
                    trigger=BackoffTrigger(step_event.delay_seconds, payload, not_before=settle_until()),
                    method_name="resubmit",
                )
            return self.resubmit(context, payload)
        raise AirflowFailException(step_failed_text(attempt, action, reason, failed))

    @fails_fast
    def resubmit(self, context, event: dict):
        from shardline.ledger.step_writes import StaleOrchestratorError

        attempt = Attempt.from_xcom(event["attempt"])
        try:
            nxt = _steps().resubmit(self.spec, attempt, event["retry_files"], sizes=event.get("retry_sizes"))
        except StaleOrchestratorError as err:
            # An operator resubmitted (or cancelled) first: follow the step where it is now.
            self.log.warning("%s; following the step where it is now", err)
            return self._watch(context, _steps().resume(self.spec, attempt))
        self.log.info("attempt %d submitted as %s with %d file(s)", nxt.number, nxt.job_name, nxt.file_count)
        return self._watch(context, nxt)

    def on_kill(self):
        if self._attempt is not None:
            _steps().stop(self.spec, self._attempt)


def _ref(spec, context) -> str:
    """The run as the `shardline` commands name it: PIPELINE/RUN_ID."""
    return f"{spec.pipeline}/{context['run_id']}"


def _run_type(context) -> str:
    run_type = getattr(context.get("dag_run"), "run_type", None) or ""
    return str(getattr(run_type, "value", run_type))  # the task SDK's DagRunType is a (str, Enum)


def _partition(context) -> str | None:
    """What the run scores, as `shardline runs` shows it: its data interval's start (UTC), else its logical date."""
    when = context.get("data_interval_start") or context.get("logical_date")
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") if when else None


def mark_run_failed(spec_path: str, context) -> None:
    """DAG ``on_failure_callback``: a run that failed outside the sensor (say, in planning) shows as FAILED
    in `shardline runs` and the page too, unless something already recorded how it ended."""
    from shardline.ledger.step_writes import set_run_status
    from shardline.orchestration import services

    spec = load_spec(Path(spec_path))
    run = context["dag_run"]
    # The callback runs a while after the run failed: a resubmission meanwhile has reopened the run, and stands.
    set_run_status(
        services.ledger_model(spec),
        spec.pipeline,
        run.run_id,
        StepStatus.FAILED,
        run_failed_text(context.get("reason")),
        only_if_running=True,
        unless_reopened_since=getattr(run, "end_date", None) or getattr(run, "start_date", None),
    )


# --- messages (pure: tests/oncall/test_messages.py renders each) -------------------------------


def _list(failed: list[dict], limit: int = 10) -> str:
    def one(f: dict) -> str:
        error = ": ".join(x for x in (f.get("error_class"), f.get("error_message")) if x)
        return f"{f['input']} ({error})" if error else f["input"]

    shown = "; ".join(one(f) for f in failed[:limit])
    more = f"; and {len(failed) - limit} more" if len(failed) > limit else ""
    return (shown + more) or "none"


def step_failed_text(attempt: Attempt, action: str, reason: str, failed_files: list[dict]) -> str:
    """Why the watch task fails, and the command (or spec field) that fixes it."""
    where = f"step {attempt.step} of {attempt.pipeline} run {attempt.run_id}"
    if action == "UNREACHABLE":
        return f"{where}: {reason}"
    fix = resubmit_command(attempt.pipeline, attempt.run_id, attempt.step)
    if action == "TIMEOUT":
        return (
            f"{where} failed: {reason}. If the step needs longer, raise max_runtime_seconds in the spec; then "
            f"resubmit what did not finish (the run turns green when it succeeds): {fix}"
        )
    if not failed_files:
        return (
            f"{where} failed: {reason}. Fix the cause, then resubmit what did not finish (the run turns green "
            f"when it succeeds): {fix}"
        )
    return (
        f"{where} failed: {reason}. Failed files: {_list(failed_files)}. Fix the inputs or the model, then "
        f"resubmit just these files (the run turns green when they succeed): {fix}"
    )


def partial_text(step: str, reason: str, failed_files: list[dict], fix: str) -> str:
    return (
        f"step {step} ended PARTIAL: {reason}; failed: {_list(failed_files)}. To retry them after fixing the "
        f"cause: {fix}"
    )


def missing_input_text(
    step: str, ref: str, why: str, action: str, *, waited: bool, wait_seconds: int, chosen: bool, run_type: str
) -> str:
    """What a plan task says when its input is not there: ``action`` is what ``input.when_missing`` chose
    (``chosen``: the spec set it; else the default for ``run_type``)."""
    kind = run_type or "manual"
    default = "" if chosen else f", the default for {'an' if kind[:1] in 'aeiou' else 'a'} {kind} run"
    again = (
        f"once the input is there, `shardline rerun {ref}` plans this run again; input.when_missing and "
        "input.wait_timeout_seconds in the spec choose what a run without input does"
    )
    if action == "skip":
        return f"step {step}: skipped: {why} (input.when_missing: skip)"
    if waited:
        return f"step {step}: waited {wait_seconds}s for its input and gave up: {why}. Nothing was processed; {again}"
    if action == "fail":
        return (
            f"step {step}: {why}, so nothing was processed (input.when_missing: {action}{default}). Check the "
            f"partition's prefix; {again}"
        )
    return f"step {step}: {why}; waiting up to {wait_seconds}s for its input (input.when_missing: wait{default})"


def model_missing_text(step: str, problem: str, ref: str) -> str:
    """A plan that found no model: the same on every try, so no retry; how to run the partition once it is there."""
    return (
        f"step {step}: {problem}. Nothing was planned or submitted: upload the model there and run "
        f'`shardline rerun {ref}`, or `shardline rerun {ref} --conf \'{{"model_version": "..."}}\'` for '
        "another version"
    )


def dry_run_empty_text(input_prefix: str, include: list[str], action: str, wait_seconds: int) -> str:
    """A dry run that found no input: what a real run would have done instead of going green."""
    real = (
        f"a real run would wait up to {wait_seconds}s for it"
        if action == "wait"
        else "a real run would fail the same way"
    )
    return (
        f"dry run: no input file under {input_prefix} (matching {include}), so nothing could be checked; {real} "
        f"(input.when_missing: {action}). Check the partition's prefix, or the Param input_prefix"
    )


def param_problem_text(problem: str, ref: str) -> str:
    """A conf the run cannot use (the spec's check says why): nothing was planned; how to run the partition again."""
    return (
        f"{problem}. Nothing was planned: `shardline rerun {ref} --conf '{{...}}'` runs this partition again "
        "with a valid conf (or change the spec to allow this one)"
    )


def run_failed_text(reason: object) -> str:
    """The ledger's message for a DAG run that failed outside the sensor (say, in planning)."""
    said = f"DAG run failed ({reason})" if reason else "DAG run failed"
    return f"{said}; check the failed task's log in Airflow for why"


class ReportOperator(_SpecMixin, BaseOperator):
    """Reconcile every step's rows in against rows out; the summary goes to the log and XCom."""

    def __init__(self, *, spec_path: str, watch_task_ids: list[str], **kwargs):
        # A failed step leaves this task upstream_failed, so the DAG run fails; a step skipped
        # for empty input still lets the others be reported.
        kwargs.setdefault("trigger_rule", "none_failed")
        super().__init__(**kwargs)
        self.spec_path, self.watch_task_ids = spec_path, watch_task_ids

    @fails_fast
    def execute(self, context):
        results = [context["ti"].xcom_pull(task_ids=t) for t in self.watch_task_ids]
        summaries = [r for r in results if r]
        for s in summaries:
            self.log.info(
                "step %s: %d/%d files succeeded, %d failed, rows in %d, rows out %d, attempts %d",
                s["step"],
                s["succeeded"],
                s["files"],
                s["failed"],
                s["rows_in"],
                s["rows_out"],
                s["attempts"],
            )
            if s.get("report"):
                from shardline.oncall.views import report_command

                self.log.info(
                    "step %s: run report %s (%s)",
                    s["step"],
                    s["report"],
                    report_command(self.spec.pipeline, context["run_id"], s["step"]),
                )
        outcome = run_outcome(results)
        if outcome.steps_skipped:
            self.log.info("%d step(s) skipped (no input)", outcome.steps_skipped)
        if outcome.status is None:
            raise AirflowSkipException(outcome.message)
        self._finish_run(context, outcome.status, outcome.message)
        if outcome.status is StepStatus.FAILED:
            raise AirflowFailException(outcome.message)
        status = outcome.status.value
        self._tell_downstream(context, status, summaries)
        return {"steps": summaries}

    def _tell_downstream(self, context, status: str, summaries: list[dict]) -> None:
        """The Asset event carries what the output prefix's own markers say: per step, whether it
        SUCCEEDED (and so wrote ``_SUCCESS``), its rows, and where its outputs manifest is."""
        from shardline.planning import naming

        steps = []
        for s in summaries:
            attempt = _steps().latest_attempt(self.spec, self.spec.pipeline, context["run_id"], s["step"])
            prefix = attempt.output_prefix if attempt else None
            steps.append(
                {
                    "step": s["step"],
                    "outcome": s.get("outcome"),
                    "files": s["files"],
                    "succeeded": s["succeeded"],
                    "failed": s["failed"],
                    "rows_out": s["rows_out"],
                    "attempts": s["attempts"],
                    "output_prefix": prefix,
                    "outputs_manifest": naming.outputs_manifest_key(
                        prefix, context["run_id"], s["step"], attempt.metadata_prefix
                    )
                    if prefix
                    else None,
                    "success_marker": naming.success_marker_key(prefix)
                    if prefix and s.get("outcome") == "ADVANCE"
                    else None,
                }
            )
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {"run_id": context["run_id"], "status": status, "steps": steps}

    def _finish_run(self, context, status: StepStatus, message: str) -> None:
        _steps().finish_run(self.spec, self.spec.pipeline, context["run_id"], status, message)
