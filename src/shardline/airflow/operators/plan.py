"""The plan task: check the run's conf and model, wait for a partition to be complete or its input to land,
and plan attempt 1 (or, with dry_run, preview the step and submit nothing)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardline.airflow.operators.base import SpecMixin, TaskRun, fails_fast, note_life
from shardline.airflow.operators.messages import (
    dry_run_empty_text,
    missing_input_text,
    model_missing_text,
    param_problem_text,
)
from shardline.airflow.triggers.step import InputTrigger, PartitionTrigger, settle_until
from shardline.decision import readiness
from shardline.decision.fleet import Admission, Waiting
from shardline.ledger.keys import StepRef
from shardline.ledger.states import RunStatus  # pure: no AWS client library at DAG parse
from shardline.spec.conf import conf_problem, instance_count_override, unknown_conf_problem

# While a plan waits for another run's hold on its output prefix, it comes back this often to ask Airflow whether
# that run still exists (a deleted DAG run never ends its hold itself).
RECHECK_HOLDER_SECONDS = 300.0


class PlanStepOperator(SpecMixin, BaseOperator):
    """List a step's inputs, write attempt 1's manifest, plan file and STEP item. Skips on empty input."""

    template_fields = (
        "input_prefix",
        "output_prefix",
        "metadata_prefix",
        "model_uri",
        "model_version",
        "dry_run",
        "table_partition",
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
        takes_input_param: bool = False,
        dry_run: Any = False,
        metadata_prefix: str = "",
        admission: dict | None = None,
        table_partition: dict[str, str] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.table_partition = table_partition  # output.table's partition columns, each rendered for the run
        # How Airflow admits the step's watch task (decision.fleet.Admission, as JSON), when anything counts its
        # instances: what the step says until then, and the most instances a run may ask for.
        self.admission = Admission.from_json(admission) if admission else None
        self.spec_path, self.step = spec_path, step
        self.input_prefix, self.output_prefix, self.model_uri = input_prefix, output_prefix, model_uri
        self.metadata_prefix = metadata_prefix
        self.model_version = model_version
        # The first step takes the run's input_prefix Param (a later one reads its earlier step's outputs); every step
        # takes its instance_count Param. Both are read from the run's params where used (``TaskRun.param``).
        self.takes_input_param, self.dry_run = takes_input_param, dry_run

    @fails_fast
    def execute(self, context):
        run = TaskRun.of(context)
        spec = self.spec
        step = spec.step(self.step)
        note_life(spec, run)  # first: a late failure callback of the run's earlier life must not end this one
        conf = run.conf
        if spec.unknown_conf != "fail" and (unknown := unknown_conf_problem(conf)):
            self.log.warning("%s", unknown)
        override, input_prefix, version = self._input_param(run), self._input_prefix(run), self._version()
        # The Params' own schema refuses these at trigger time; checked again here, where they are used,
        # because a conf can also reach a run by other ways (an old run cleared, a Param edited in code).
        params = {**run.params, "input_prefix": override, "model_version": version}
        admitted = {step.name: self.admission.max_instances} if self.admission else None
        problem = conf_problem(spec, conf, params=params, steps=[step], run_prefix=self.input_prefix, admitted=admitted)
        if problem:
            message = param_problem_text(problem, run.ref(spec.pipeline))
            self._record(run, RunStatus.FAILED, message)  # listed by `shardline runs` and `failed`, with why
            raise AirflowFailException(message)
        if readiness.blocks_the_next_interval(
            run_type=run.run_type,
            scheduled_pipeline=spec.schedule not in (None, "@once"),
            logical_date=run.logical_date,
            interval_end=run.interval_end,
        ):
            # This run scores its interval; the harm is to the next one, whose scheduled run the scheduler will not
            # create while this run exists. Said loudly here, and `shardline runs` shows that interval MISSING.
            self.log.warning(
                "%s", readiness.blocks_text(spec.pipeline, run.run_id, run.logical_date, run.interval_start)
            )
        if not (step.model.sha256 or step.model.versions):
            self.log.warning(
                "step %s: the model is NOT pinned (model.allow_unpinned): whoever can write %s "
                "chooses the code this job runs; pin it with model.sha256 or model.versions",
                self.step,
                self.model_uri,
            )
        if str(self.dry_run).lower() == "true":
            self._dry_run(run, spec, input_prefix, self._instances(step, run), version)
        return self._plan(run, input_prefix, version, waited=False)

    @fails_fast
    def execute_after_wait(self, context, event: dict):
        """Back from :class:`InputTrigger`: plan now that the input is there, or fail naming the prefix."""
        run = TaskRun.of(context)
        input_prefix, version = self._input_prefix(run), self._version()
        if not event["ready"]:
            # It waited for the input (when_missing: wait) or for the ready marker, or only for the partition's
            # settle time (fail, skip): then when_missing decides now.
            step = self.spec.step(self.step)
            waited = step.input.missing_input_action(run.input_run_type) == "wait" or bool(step.input.ready_marker)
            self._missing(run, input_prefix, event["reason"], waited=waited)
        self.log.info("step %s: %s", self.step, event["reason"])
        return self._plan(run, input_prefix, version, waited=True)

    def _record(self, run: TaskRun, status: RunStatus, message: str) -> None:
        """How the run stands, as `shardline runs` and the page show it while (or because) this task waits or ends."""
        from shardline.orchestration.run import record_run_status

        record_run_status(self.spec, run.run_id, status, message, run.partition)

    def _instances(self, step, run: TaskRun) -> int:
        return instance_count_override(run.param("instance_count"), step.resources.instance_count)[0]

    def _input_prefix(self, run: TaskRun) -> str:
        """Where the step reads: the run's input_prefix Param (first step only), else the spec's, rendered."""
        return self._input_param(run) or self.input_prefix

    def _version(self) -> str:
        """The model version the run scores with: its model_version Param, else the step's own."""
        return (self.model_version or "").strip() or self.spec.step(self.step).model.version

    def _input_param(self, run: TaskRun) -> str:
        """The run's input_prefix Param, for the first step only ("" when unset)."""
        return str(run.param("input_prefix") or "").strip() if self.takes_input_param else ""

    def _ready_at(self, run: TaskRun) -> dt.datetime | None:
        """When the run's partition is complete (its interval's end plus input.settle_seconds)."""
        step = self.spec.step(self.step)
        if step.input.from_step:
            return None
        return readiness.ready_at(
            run_type=run.run_type,
            interval_end=run.interval_end,
            settle_seconds=step.input.settle_seconds,
            ready_marker=step.input.ready_marker,
            scheduled_pipeline=self.spec.schedule not in (None, "@once"),
        )

    def _plan(self, run: TaskRun, input_prefix: str, version: str, *, waited: bool):
        """Plan attempt 1 once :func:`~shardline.orchestration.step.plan.readiness` says the run is ready, or wait
        (defer) for what it names; a run whose input never comes fails or skips as ``input.when_missing`` says."""
        from shardline.orchestration.model_check import model_problem  # at run time: parsing loads no boto3
        from shardline.orchestration.run import end_run_gone_from_airflow
        from shardline.orchestration.step import plan as step_plan
        from shardline.orchestration.step.upstream import UpstreamError

        spec = self.spec
        problem = model_problem(spec, self.step, self.model_uri)
        if problem:
            # A setup error is the same on every try: fail now, naming the URI, with no retry and no job.
            message = model_missing_text(self.step, problem, run.ref(spec.pipeline))
            self._record(run, RunStatus.FAILED, message)
            raise AirflowFailException(message)
        request = step_plan.PlanRequest(
            run_id=run.run_id,
            input_prefix=input_prefix,
            output_prefix=self.output_prefix,
            model_uri=self.model_uri,
            model_version=version,
            instance_count=self._instances(spec.step(self.step), run),
            metadata_prefix=(self.metadata_prefix or "").strip() or None,
            partition=run.partition,
            life=run.life,
            ready_at=self._ready_at(run),
            table_partition=dict(self.table_partition) if self.table_partition else None,
        )
        try:
            ready = step_plan.readiness(spec, self.step, request, waited=waited)
            if isinstance(ready, step_plan.Held) and self._holder_gone(run, ready.held):
                # The run holding the prefix was deleted from Airflow (a `dag.test()` killed and started again
                # deletes it): end it in the ledger and stop its jobs, and plan at once (or wait for its job's end)
                # instead of waiting hours for its lease.
                self.log.warning("step %s: %s", self.step, end_run_gone_from_airflow(spec, ready.held.holder))
                ready = step_plan.readiness(spec, self.step, request, waited=waited)
        except UpstreamError as err:  # the earlier step's outputs are not there to read: no retry finds them
            raise AirflowFailException(f"step {self.step}: {err}") from err
        if isinstance(ready, step_plan.WaitUntil):
            self._wait_until_complete(run, input_prefix, ready.ready_at)
        elif isinstance(ready, step_plan.WaitForMarker):
            # The marker is when a partition is complete, whatever when_missing says, for a scheduled run and a
            # manual one alike: wait for it (up to input.wait_timeout_seconds); when_missing decides only if it
            # never comes.
            self._wait_for_marker(run, input_prefix, ready.reason)
        elif isinstance(ready, step_plan.Held):  # another run writes this output prefix now: wait until it ended
            self._wait_for_partition(run, ready.held)
        elif isinstance(ready, step_plan.Missing):
            # With files: its ready marker (if any) is there, but no file yet (a marker written before its files):
            # what waits now is the files.
            self._missing(run, input_prefix, ready.reason, waited=waited, files=ready.files)
        attempt = ready.attempt
        from shardline.orchestration.quote import attempt_quote_lines

        for line in attempt_quote_lines(spec, attempt):
            self.log.info("step %s: %s", self.step, line)
        if self.admission is not None:
            from shardline.orchestration.step.capacity import note_waiting

            waiting = Waiting(admission=self.admission)
            note_waiting(spec, attempt, waiting)
            # Said in the task log too: a pool that does not exist in Airflow holds the watch task back forever.
            self.log.info(
                "step %s: %s. If it waits long, `shardline fleet` names a pool fleet.yaml needs that Airflow lacks "
                "(`shardline fleet sync` creates it)",
                self.step,
                waiting.text(),
            )
        return attempt.to_xcom()

    def _wait_until_complete(self, run: TaskRun, input_prefix: str, ready: dt.datetime):
        """A run whose partition is not complete yet waits until it is, whatever input.when_missing
        says (the partition is not missing, it is still being written); then, with when_missing: wait, up to
        input.wait_timeout_seconds more for its first file. Never returns: it defers."""
        step = self.spec.step(self.step)
        why = readiness.not_ready_reason(ready, step.input.settle_seconds)
        self.log.info("step %s: %s", self.step, why)
        self._record(run, RunStatus.RUNNING, f"step {self.step}: waiting: {why}")
        waits = step.input.missing_input_action(run.input_run_type) == "wait"
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

    def _wait_for_marker(self, run: TaskRun, input_prefix: str, why: str):
        """A run waits for its partition's ready marker up to input.wait_timeout_seconds. Defers."""
        step = self.spec.step(self.step)
        self.log.info("step %s: %s; waiting up to %ds for it", self.step, why, step.input.wait_timeout_seconds)
        self._record(run, RunStatus.RUNNING, f"step {self.step}: waiting: {why}")
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

    def _holder_gone(self, run: TaskRun, held) -> bool:
        """Whether the run holding the prefix (or the run whose job still writes it) is a run of this DAG that Airflow
        no longer has."""
        holder = held.holder
        if holder.pipeline != self.spec.pipeline or holder.run_id == run.run_id:
            return False
        try:
            return run.ti.get_dr_count(dag_id=self.spec.pipeline, run_ids=[holder.run_id]) == 0
        except Exception:  # Airflow could not say: wait, as for a run that exists
            self.log.warning("could not ask Airflow whether DAG run %s exists", holder.run_id, exc_info=True)
            return False

    def _wait_for_partition(self, run: TaskRun, held) -> None:
        """Another run of this partition writes the step's output prefix: wait, visibly, until it ends (or its lease
        runs out), then plan. Two runs never write one prefix at once. Defers."""
        from shardline.orchestration.partitions import held_text
        from shardline.orchestration.step.watch import PartitionWatch

        ref = StepRef(self.spec.pipeline, run.run_id, self.step)
        text = held_text(held, ref)
        self.log.warning("%s", text)
        self._record(run, RunStatus.RUNNING, text)
        watch = PartitionWatch.of(self.spec, held.output_prefix, ref)
        self.defer(
            trigger=PartitionTrigger(
                watch.to_json(),
                poll_interval=self.spec.poll_interval_seconds,
                not_before=settle_until(),
                recheck_seconds=RECHECK_HOLDER_SECONDS,
            ),
            method_name="execute_after_partition",
        )

    @fails_fast
    def execute_after_partition(self, context, event: dict):
        """Back from :class:`PartitionTrigger`: the run that held the output prefix has ended, or it is time to ask
        Airflow again whether that run still exists; plan now (or wait again)."""
        run = TaskRun.of(context)
        self.log.info("step %s: %s", self.step, event["reason"])
        input_prefix, version = self._input_prefix(run), self._version()
        return self._plan(run, input_prefix, version, waited=False)

    def _input_watch(self, input_prefix: str, *, files: bool = False) -> dict:
        """What says the input landed: its ready marker (or files, when the spec names none); ``files``: its files,
        whatever the marker says (the marker is there already)."""
        from shardline.orchestration.step.watch import InputWatch

        watch = InputWatch.of(self.spec, self.step, input_prefix)
        return (dataclasses.replace(watch, ready_marker=None) if files else watch).to_json()

    def _missing(self, run: TaskRun, input_prefix: str, why: str, *, waited: bool, files: bool = False):
        """No input (yet): wait for it (``files``: for its files, its marker being there), fail naming the prefix, or
        skip, as ``input.when_missing`` says. Never returns: it defers, or raises."""
        spec, step = self.spec, self.spec.step(self.step)
        if step.input.from_step:
            raise AirflowSkipException(f"{why}: the earlier step wrote nothing, so there is nothing to do")
        run_type = run.input_run_type
        action = step.input.missing_input_action(run_type)
        message = missing_input_text(
            self.step,
            run.ref(spec.pipeline),
            why,
            action,
            waited=waited,
            wait_seconds=step.input.wait_timeout_seconds,
            chosen=bool(step.input.when_missing),
            run_type=run_type,
        )
        if action == "skip":
            self._record(run, RunStatus.SKIPPED, message)
            raise AirflowSkipException(message)
        if action == "fail" or waited:
            self._record(run, RunStatus.FAILED, message)
            raise AirflowFailException(message)
        deadline = time.time() + step.input.wait_timeout_seconds
        self.log.warning("%s", message)
        # Listed by `shardline runs` while it waits: RUNNING, with what it waits for.
        self._record(run, RunStatus.RUNNING, message)
        self.defer(
            trigger=InputTrigger(
                self._input_watch(input_prefix, files=files),
                deadline,
                poll_interval=spec.poll_interval_seconds,
                not_before=settle_until(),
            ),
            method_name="execute_after_wait",
            timeout=dt.timedelta(seconds=step.input.wait_timeout_seconds + 600),
        )

    def _dry_run(self, run: TaskRun, spec, input_prefix: str, instances: int, model_version: str) -> None:
        """List the inputs and preview the model on a sample of the first one (:func:`~shardline.orchestration.
        step.plan.dry_run`); submit nothing. Never returns: it skips, or fails saying what to fix."""
        from shardline.orchestration.step.plan import dry_run

        s = spec.step(self.step)
        found = dry_run(
            spec, self.step, input_prefix, instances=instances, model_uri=self.model_uri, model_version=model_version
        )
        if not found.files:
            # As a real run would: skip only where input.when_missing says so; else fail, naming the prefix.
            action = s.input.missing_input_action(run.input_run_type)
            if action == "skip":
                raise AirflowSkipException(f"{found.plan} (input.when_missing: skip)")
            raise AirflowFailException(
                dry_run_empty_text(input_prefix, list(s.input.include), action, s.input.wait_timeout_seconds)
            )
        if found.not_previewed:
            # On AWS the job role reads models and inputs; Airflow's role lists them only. The plan stands.
            raise AirflowSkipException(
                f"{found.plan}. The model was not previewed: {found.not_previewed}. Airflow's role lists the inputs, "
                f"the job's role reads them: preview the model where your own role reads both (`shardline preview "
                f"{spec.pipeline} --step {self.step}`)"
            )
        if found.error:
            raise AirflowFailException(
                f"{found.plan}. The preview could not run: {found.error}. Fix that, then run the dry run "
                f"again: `shardline rerun {run.ref(spec.pipeline)}`"
            )
        preview = found.preview
        self.log.info("%s", preview.render())
        if not preview.ok:
            raise AirflowFailException(
                f"{found.plan}. The preview shows the job would fail on {preview.sample_uri}: see the preview above; "
                "fix the model settings or the input, then run the dry run again: "
                f"`shardline rerun {run.ref(spec.pipeline)}`"
            )
        for warning in preview.warnings:
            self.log.warning("preview: %s", warning)
        raise AirflowSkipException(
            f"{found.plan}; preview of {preview.sample_uri}: "
            + (f"{len(preview.warnings)} warning(s), see the log" if preview.warnings else "no warnings")
        )
