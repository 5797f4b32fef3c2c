"""One DAG per pipeline spec: plan -> watch (it submits and follows the step's jobs) for each step, then a report.

A DAG file in ``dags/`` is two lines::

    from shardline.airflow.dag_factory import dag_from_spec
    dag = dag_from_spec(__file__, "tabular_scoring_hourly.yaml")

One file per spec, so a bad spec breaks only its own DAG: its import error names the
spec file and the field.
"""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path
from urllib.parse import quote

from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, Param

from shardline.airflow.arrivals import build_arrivals_dag
from shardline.airflow.deadlines import deadline_alert
from shardline.airflow.operators.plan import PlanStepOperator
from shardline.airflow.operators.report import ReportOperator
from shardline.airflow.operators.step import WatchStepOperator, mark_run_failed
from shardline.airflow.timetables import ArrivalTimetable
from shardline.airflow.ui.plugin import URL_PREFIX
from shardline.airflow.ui.root import airflow_root_path
from shardline.decision.fleet import PRIORITY_WEIGHTS, Admission
from shardline.spec import (
    MAX_INSTANCE_COUNT,
    TRIGGER_PARAMS,
    VERSION_PATTERN,
    PipelineSpec,
    SpecError,
    StepSpec,
    load_spec,
    static_prefix,
)
from shardline.spec.conf import input_prefix_param_pattern
from shardline.spec.fleet import FleetSpec, check_quotas, load_fleet, quota_of
from shardline.spec.tables import LOCAL_CATALOG

SPEC_DIR = "pipelines"


def params_for(spec: PipelineSpec, fleet: FleetSpec | None = None) -> dict[str, Param]:
    """The trigger form. Each Param's schema allows only what the spec allows, so a bad conf is a 400
    at trigger time that names the field, before anything runs (an instance count within every step's quota,
    and no more than a step with resources.max_concurrent_instances plans, too)."""
    first = spec.steps[0]
    # A pooled step's watch holds the spec's instance_count of its pool's slots, and a capped step's watch may run
    # max_concurrent_instances // instance_count times at once: for both a run may ask for fewer instances, never
    # more, or its job would use instances no slot admitted.
    bounded = [bound for s in spec.steps if (bound := admission_of(s, fleet).max_instances) is not None]
    version_schema = {"enum": sorted(first.model.versions)} if first.model.versions else {"pattern": VERSION_PATTERN}
    params = {
        # Optional: Airflow's form counts a field whose type leaves out null as required, and an empty one as missing
        # (its Trigger button stays disabled until something is typed there).
        "input_prefix": Param(
            None,
            type=["null", "string"],
            title="Input prefix",
            description=f"a folder under {static_prefix(first.input.prefix or '')} to read instead of the spec's "
            f"({first.input.prefix}); empty keeps it",
            pattern=input_prefix_param_pattern(first),
        ),
        "model_version": Param(
            first.model.version,
            type="string",
            title="Model version",
            description="used where the model URI says {{ params.model_version }}"
            + ("; one of the versions the spec pins" if first.model.versions else ""),
            **version_schema,
        ),
        "instance_count": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=min([MAX_INSTANCE_COUNT, *bounded]),
            title="Instance count",
            description="overrides every step's resources.instance_count",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            # Markdown (the form renders description_md when there is no plain description): what the run will cost,
            # quoted from its history on Shardline's page, one click from the form that starts it.
            description_md="list the inputs and show the plan; submit nothing. What the run will cost: "
            f"[quote it]({quote_link(spec.pipeline)}) from its earlier runs (or `shardline quote {spec.pipeline}`)",
        ),
    }
    assert tuple(params) == TRIGGER_PARAMS  # the plan task refuses any other conf key
    return params


def quote_link(pipeline: str) -> str:
    """The on-call page's quote of the pipeline's next run, which the trigger form links to."""
    return f"{airflow_root_path()}{URL_PREFIX}/#/pipelines/{quote(pipeline)}/quote"


def timetable_for(schedule: str | None, on_arrival: bool = False):
    """A scheduled pipeline gets a data-interval timetable: the run for 09:00-10:00 starts once 10:00 has
    passed, and templates read that hour as ``data_interval_start``. (Airflow 3's default for a cron string,
    ``CronTriggerTimetable``, starts the 10:00 run at 10:00 for the hour that is only beginning.) A manual
    run of such a DAG scores the last whole interval before its logical date. Started ``on_arrival``, the schedule
    only names the intervals (:class:`~shardline.airflow.timetables.ArrivalTimetable`)."""
    if schedule is None or schedule == "@once":
        return schedule
    if on_arrival:
        return ArrivalTimetable(schedule, "UTC")
    return CronDataIntervalTimetable(schedule, timezone="UTC")


def admission_of(step: StepSpec, fleet: FleetSpec | None) -> Admission:
    """How Airflow admits the step's watch task: within its type's quota in ``dags/fleet.yaml`` and its own
    resources.max_concurrent_instances (:class:`~shardline.decision.fleet.Admission`)."""
    resources = step.resources
    return Admission(
        resources.instance_type, resources.instance_count, quota_of(step, fleet), resources.max_concurrent_instances
    )


def build_dag(spec: PipelineSpec, spec_path: Path, fleet: FleetSpec | None = None) -> DAG:
    """The pipeline's DAG; ``fleet``: the account's quotas (``dags/fleet.yaml``), which admit its steps."""
    check_quotas(spec, fleet, spec_path)
    start = dt.datetime.fromisoformat(spec.start_date).replace(tzinfo=dt.UTC)
    with DAG(
        dag_id=spec.pipeline,
        description=spec.description or f"Shardline batch inference: {spec.pipeline}",
        schedule=timetable_for(spec.schedule, on_arrival=spec.trigger is not None),
        start_date=start,
        catchup=spec.catchup,
        params=params_for(spec, fleet),
        tags=["shardline", spec.backend],
        default_args={
            "owner": spec.owner,
            "retries": 2,
            "retry_delay": dt.timedelta(seconds=30),
            # Absolute: a step's weight is its pipeline's priority, not summed over the tasks after it.
            "priority_weight": PRIORITY_WEIGHTS[spec.priority],
            "weight_rule": "absolute",
        },
        max_active_runs=4,
        deadline=deadline_alert(spec, spec_path),
        on_failure_callback=functools.partial(mark_run_failed, str(spec_path)),
        doc_md=f"Generated from `{spec_path.name}` by Shardline. Steps: " + " -> ".join(s.name for s in spec.steps),
    ) as dag:
        previous = None
        watch_ids = []
        outputs = {}
        for step in spec.steps:
            input_prefix = outputs[step.input.from_step] if step.input.from_step else step.input.prefix
            admission = admission_of(step, fleet)
            plan = PlanStepOperator(
                task_id=f"plan_{step.name}",
                spec_path=str(spec_path),
                step=step.name,
                input_prefix=input_prefix,
                output_prefix=step.output.prefix,
                metadata_prefix=step.output.metadata_prefix or "",
                model_uri=step.model.uri,
                model_version="{{ params.model_version }}",
                takes_input_param=previous is None,
                dry_run="{{ params.dry_run }}",
                admission=admission.to_json() if admission.counted else None,
                table_partition=spec.table_partition(step.name) or None,
            )
            watch = WatchStepOperator(
                task_id=f"watch_{step.name}",
                spec_path=str(spec_path),
                plan_task_id=plan.task_id,
                poll_interval=spec.poll_interval_seconds,
                admission=admission.to_json() if admission.counted else None,
                **admission.task_arguments(),
            )
            plan >> watch
            if previous is not None:
                previous >> plan
            previous = watch
            watch_ids.append(watch.task_id)
            outputs[step.name] = step.output.prefix
        last = spec.steps[-1]
        report = ReportOperator(
            task_id="report",
            spec_path=str(spec_path),
            watch_task_ids=watch_ids,
            outlets=[Asset(static_prefix(last.output.prefix))],
        )
        previous >> report
    if spec.trigger is not None:
        build_arrivals_dag(spec, spec_path)  # registered with Airflow by its `with DAG(...)` block
    return dag


def dag_from_spec(dag_file: str, spec_name: str) -> DAG:
    """Load ``pipelines/<spec_name>`` next to ``dag_file`` and build its DAG (import error if invalid), its steps
    admitted within the quotas of ``fleet.yaml`` beside it, if there is one."""
    folder = Path(dag_file).resolve().parent
    path = folder / SPEC_DIR / spec_name
    spec = load_spec(path)
    if spec.trigger is not None:
        check_queue_alone(spec, path)
    check_tables_alone(spec, path)
    return build_dag(spec, path, load_fleet(folder))


def _specs_beside(path: Path, names: set[str]):
    """Each other spec in the folder of ``path`` whose text holds one of ``names``, as (file, its YAML as a dict):
    the others are not parsed (this runs at every parse of the DAG file). One that does not read is skipped: its own
    DAG file reports it."""
    import yaml

    for other in sorted(path.parent.glob("*.y*ml")):
        if other.resolve() == path.resolve():
            continue
        try:
            text = other.read_text()
            if not any(name in text for name in names):
                continue
            data = yaml.safe_load(text)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            yield other, data


def check_tables_alone(spec: PipelineSpec, path: Path) -> None:
    """Refuse an ``output.table`` that another spec beside this one commits to as well, where either replaces its
    partitions (the default): each run would replace the other pipeline's rows of the partition."""
    mine = {s.output.table.catalog_table: s for s in spec.steps if s.output.table is not None}
    if not mine:
        return
    for other, data in _specs_beside(path, {name for _, _, name in mine}):
        for index, step in enumerate(data.get("steps") or []):
            table = ((step or {}).get("output") or {}).get("table") if isinstance(step, dict) else None
            if not isinstance(table, dict):
                continue
            key = (table.get("catalog", LOCAL_CATALOG), table.get("namespace"), table.get("name"))
            ours = mine.get(key)
            if ours is not None and "append" not in (ours.output.table.mode, table.get("mode")):
                raise SpecError(
                    f"{path}: step {ours.name!r} output.table {key[1]}.{key[2]} (catalog {key[0]!r}) is also "
                    f"steps[{index}].output.table of {other.name}: each would replace the other's rows of a "
                    "partition. Give each pipeline a table of its own, or set output.table.mode: append on both"
                )


def check_queue_alone(spec: PipelineSpec, path: Path) -> None:
    """Refuse a ``trigger.queue`` that another spec beside this one names too: each pipeline's watcher deletes every
    message it reads, so two on one queue would each lose the other's markers."""
    for other, data in _specs_beside(path, {spec.trigger.queue}):
        trigger = data.get("trigger")
        if isinstance(trigger, dict) and trigger.get("queue") == spec.trigger.queue:
            raise SpecError(
                f"{path}: trigger.queue {spec.trigger.queue!r} is also the queue of {other.name}: give each pipeline "
                "a queue of its own (each deletes every message it reads)"
            )
