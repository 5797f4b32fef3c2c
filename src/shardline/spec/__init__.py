"""Pipeline specs: ``dags/pipelines/*.yaml``, typed and validated on load.

A bad spec raises :class:`SpecError` whose message names the file and the field, so it
shows as a readable import error in the Airflow UI.

This module holds the spec itself: :class:`PipelineSpec` and a step's settings (:class:`StepSpec` and its parts),
:func:`load_spec` and :func:`parse_spec`, and a schedule's data intervals. A field's docstring (or its
``Field(description=...)``) is what docs/spec-reference.md says of it. Its parts are re-exported from here:

- :mod:`.base`: the error, the strict base model and the name patterns.
- :mod:`.step_io`: a step's model, input and output.
- :mod:`.checks`: a step's output checks (``checks:``), held before its ``_SUCCESS``.
- :mod:`.deadline`: the pipeline's deadline and its durations.
- :mod:`.arrival`: ``trigger:``, a pipeline started on arrival of each partition's ready marker.

Beside it:

- :mod:`.templates`: rendering a URI template for a given interval outside a task (the CLI's preview and tune, the
  arrivals DAG).
- :mod:`.conf`: what a run's conf (the trigger form's Params) may hold, checked as the form checks it.
- :mod:`.fleet`: the fleet file, ``dags/fleet.yaml``: the account's quotas per instance type.
- :mod:`.tables`: ``output.table`` (a step's Iceberg table) and the catalogs file, ``dags/catalogs.yaml``.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AliasChoices, Field, PrivateAttr, ValidationError, field_validator, model_validator

from shardline.spec.arrival import ArrivalSpec

# Re-exported: the spec's parts and patterns are imported from shardline.spec.
from shardline.spec.base import (  # noqa: F401
    INSTANCE_TYPE_PATTERN,
    NAME_PATTERN,
    SHA256_PATTERN,
    TRIGGER_PARAMS,
    VERSION_PATTERN,
    VERSION_TEMPLATE,
    SpecError,
    _Strict,
)
from shardline.spec.checks import ChecksSpec, ColumnCheck, FeatureCheck, RowsOutCheck  # noqa: F401
from shardline.spec.deadline import DeadlineSpec
from shardline.spec.step_io import InputSpec, ModelRef, OutputSpec

MAX_INSTANCE_COUNT = 100  # the most instances one job may ask for (resources.instance_count, the Param too)


class Resources(_Strict):
    instance_count: Annotated[int, Field(ge=1, le=MAX_INSTANCE_COUNT)] = 1
    """instances of the processing job (the Param instance_count overrides it)"""
    instance_type: Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)] = "ml.m5.xlarge"
    """the SageMaker instance type (also what the local backend's cost is priced as)"""
    fallback_instance_types: list[Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)]] = []
    """instance types to move to, in order, when SageMaker cannot provision instance_type (CapacityError); the
    instance count is re-planned to keep the vCPUs. Such a retry is not counted against retry.max_attempts"""
    volume_size_gb: Annotated[int, Field(ge=1, le=16384)] = 30
    """each instance's storage volume, GB"""
    workers_per_instance: Annotated[int, Field(ge=1)] | None = None
    """worker processes per instance (unset: one per core, or per GPU)"""
    max_concurrent_instances: Annotated[int, Field(ge=1)] | None = None
    """the most instances this step's jobs use at once, over all the pipeline's runs (unset: only the fleet
    quota limits them); its watch task runs at most max_concurrent_instances // instance_count at once, and the
    instance_count Param may not raise the count"""

    @model_validator(mode="after")
    def _cap_fits_a_job(self) -> Resources:
        if self.max_concurrent_instances is not None and self.max_concurrent_instances < self.instance_count:
            raise ValueError(
                f"max_concurrent_instances ({self.max_concurrent_instances}) is below instance_count "
                f"({self.instance_count}): no job of this step could ever start"
            )
        return self


class RetryPolicy(_Strict):
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    """attempts of a step, the first included, before its unfinished files count as failed"""
    backoff_seconds: Annotated[int, Field(ge=0)] = 60
    """the wait before attempt 2"""
    backoff_multiplier: Annotated[float, Field(ge=1.0)] = 2.0
    """each later wait is this many times the one before"""


class FailureTolerance(_Strict):
    """How many files may fail before the step fails; within it the step ends PARTIAL."""

    max_failed_files: Annotated[int, Field(ge=0)] = 0
    """how many files may fail with the step still ending PARTIAL (not FAILED)"""
    max_failed_percent: Annotated[float, Field(ge=0.0, le=100.0)] = 0.0
    """the same, as a percentage of the step's files (the larger of the two allows)"""
    rows: Annotated[float, Field(ge=0)] = 0
    """rows a file, and the step, may reject with a reason instead of failing: a count (100), or a fraction below
    1 of the rows (0.001). A rejected row (a line that does not parse, a record the model or script raises on) is
    listed with its line or row number and the reason; rows in = rows out + rows rejected. Over it, the file
    fails naming its first rejects (the step: it fails). 0: one bad row fails its file"""

    @field_validator("rows")
    @classmethod
    def _count_or_fraction(cls, value: float) -> float:
        if value >= 1 and not float(value).is_integer():
            raise ValueError("tolerance.rows is a count of rows (1, 2, ...) or a fraction below 1 (0.001)")
        return value


class DriftPolicy(_Strict):
    """How far this step's predictions may move from the previous successful run's before anyone is told."""

    max_psi: Annotated[float, Field(gt=0)] = Field(
        default=0.2,
        description="the population stability index (over 10 bins of the previous run's predictions) "
        "above which the predictions have drifted; 0.1-0.2 is commonly read as moderate",
    )
    action: Literal["warn", "fail"] = Field(
        default="warn",
        description="warn: a warning in the task log and the report; fail: the step fails with the "
        "PSI in its message, and no _SUCCESS marker is written",
    )


# The kinds of AWS request a job's control plane is priced by (ledger.requests counts them; report.cost prices them).
RequestKind = Literal[
    "dynamodb.read",
    "dynamodb.write",
    "dynamodb.transact",
    "s3.put",
    "s3.list",
    "s3.get",
    "s3.delete",
    "sqs.request",
    "cloudwatch.request",
    "other.request",
]


class CostSettings(_Strict):
    """Prices the run report's cost uses (USD per instance-hour)."""

    prices: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default={},
        description="instance type -> USD per hour, over the table shipped with Shardline "
        "(SageMaker Processing, on demand, us-east-1)",
    )
    local_price_per_hour: Annotated[float, Field(ge=0)] | None = Field(
        default=None,
        description="what an hour of the local backend costs; unset: the step's instance type's price, "
        "as if it ran on SageMaker",
    )
    request_prices: dict[RequestKind, Annotated[float, Field(ge=0)]] = Field(
        default={},
        description="the control plane's prices, USD per request of each kind, over the list prices shipped with "
        "Shardline (us-east-1)",
    )


class BudgetSettings(_Strict):
    """What a pipeline may spend (USD at the cost settings' prices), checked before each job starts against its quote
    and while it runs against what its instances have run (docs/cost.md)."""

    run_usd: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="what one run may spend, all its steps together: a job whose quote would pass what is left does "
        "not start, and a running step that passes it is stopped (its finished files kept)",
    )
    daily_usd: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="what the pipeline's runs started on one UTC day may spend together: a job whose quote would "
        "pass what is left of the day's does not start",
    )
    on_exceed: Literal["wait", "fail"] = Field(
        default="fail",
        description="a job the daily budget cannot admit: fail (naming the budget), or wait for the next UTC day's "
        "(the run budget always fails: waiting does not add to it)",
    )


class StepSpec(_Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    """the step's name, in task ids and job names"""
    model: ModelRef
    """the model the step runs"""
    input: InputSpec
    """what the step reads"""
    output: OutputSpec
    """where the step writes"""
    resources: Resources = Resources()
    """the processing job's instances"""
    sharding: Literal["by_key", "by_size"] = "by_size"
    """how inputs are dealt to instances: by_size (balance bytes) or by_key (SageMaker's ShardedByS3Key)"""
    retry: RetryPolicy = RetryPolicy()
    """how often, and how soon, unfinished and transiently failed files go again"""
    tolerance: FailureTolerance = Field(
        default=FailureTolerance(), validation_alias=AliasChoices("tolerance", "tolerate")
    )
    """how many failed files still end the step PARTIAL, and how many rows may be rejected (also spelled
    ``tolerate``)"""
    heartbeat_timeout_seconds: Annotated[int, Field(ge=30)] = 600
    """an instance silent this long counts as lost, and its files go again"""
    max_runtime_seconds: Annotated[int, Field(ge=60, le=432000)] = 3600
    """the job's limit (SageMaker's MaxRuntimeInSeconds)"""
    probabilities: bool = False
    """also write proba_<class> columns (scikit-learn classifiers only: any other model fails at setup)"""
    batch_rows: Annotated[int, Field(ge=1)] | None = None
    """rows per model call (unset: the worker's default, or what `shardline tune` picked)"""
    drift: DriftPolicy = DriftPolicy()
    """how far predictions may move from the previous successful run's"""
    checks: ChecksSpec = ChecksSpec()
    """what the step's outputs must pass before its _SUCCESS is written (docs/checks.md)"""


class VpcConfig(_Strict):
    subnets: tuple[str, ...]
    """subnet ids"""
    security_group_ids: tuple[str, ...]
    """security group ids"""


class SageMakerSettings(_Strict):
    role_arn: str | None = None
    """the IAM role the processing jobs run as"""
    image_uri: str | None = None
    """the worker image in ECR"""
    tags: dict[str, str] = {}
    """tags on every processing job"""
    network_isolation: bool = False
    """refused: the worker reports to DynamoDB (use vpc instead)"""
    vpc: VpcConfig | None = None
    """subnets and security groups for the jobs"""
    kms_key_id: str | None = None
    """the KMS key that encrypts job volumes and outputs (required for backend: sagemaker)"""
    aws_conn_id: str = "aws_default"
    """the Airflow connection the orchestrator's AWS clients use"""


class PipelineSpec(_Strict):
    _catalogs: Any = PrivateAttr(default=None)  # spec.tables.CatalogsFile, set by load_spec
    pipeline: Annotated[str, Field(pattern=NAME_PATTERN)]
    """the DAG id: lowercase letters, digits, _ or - (it goes into job names)"""
    description: str = ""
    """the DAG's description in Airflow's UI"""
    owner: str = "shardline"
    """the DAG's owner in Airflow's UI"""
    schedule: str | None = Field(default=None, description="cron, @hourly, @daily, or null for manual runs")
    catchup: bool = False
    """also run the intervals missed since start_date (Airflow's catchup)"""
    start_date: str = "2026-01-01"
    """the first interval a schedule may run (ISO date, UTC)"""
    backend: Literal["local", "sagemaker"] = "local"
    """where jobs run: local (the emulator on this machine) or sagemaker (SageMaker Processing)"""
    ledger_table: str = "shardline-jobs"
    """the DynamoDB table of the job metadata (the ledger)"""
    ledger_retention_days: Annotated[int, Field(ge=1, le=3650)] = Field(
        default=90, description="ledger items (error text included) expire this many days after their last write"
    )
    cost: CostSettings = CostSettings()
    """prices the run report's cost uses"""
    budget: BudgetSettings = BudgetSettings()
    """what a run, and the pipeline's runs of a day, may spend (unset: no limit)"""
    poll_interval_seconds: Annotated[float, Field(gt=0)] = 15.0
    """how often the trigger polls the ledger and the job"""
    priority: Literal["high", "normal", "low"] = "normal"
    """which pipeline's steps Airflow admits first when their instance type's quota is short (dags/fleet.yaml):
    its tasks' priority weight (high 100, normal 10, low 1); an SLA pipeline is high, a backfill low"""
    unknown_conf: Literal["fail", "warn"] = Field(
        default="fail",
        description="a trigger conf key that is not a Param fails the run at its plan task, or "
        "with `warn` is logged and ignored",
    )
    deadline: DeadlineSpec | None = None
    """by when each run's partition must be scored (an Airflow Deadline Alert); unset: no deadline"""
    partitioned_asset: bool = False
    """the Asset event of a run's report carries the run's partition (its data interval's start, UTC, as
    `2026-11-22T10:00:00`) as Airflow's partition key: a DAG scheduled on the asset with a PartitionedAssetTimetable
    gets one run per scored partition (Airflow's temporal mappers read the key as it is). Airflow starts no DAG
    scheduled on the plain asset from such an event. Needs a schedule; unset, the key is in the event's extra only"""
    trigger: ArrivalSpec | None = None
    """start each partition's run when its ready marker's S3 event arrives on an SQS queue, not on the schedule's
    clock (`{on: ready_marker, queue: ...}`); unset: runs start on the schedule"""
    steps: Annotated[tuple[StepSpec, ...], Field(min_length=1)]
    """the steps, run in order; a step may read an earlier one's outputs (input.from_step)"""
    sagemaker: SageMakerSettings = SageMakerSettings()
    """SageMaker settings, for backend: sagemaker"""

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is None or value.startswith("@"):
            allowed = {None, "@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly"}
            if value not in allowed:
                raise ValueError(f"unknown preset {value!r}; use one of {sorted(a for a in allowed if a)} or cron")
            return value
        if len(value.split()) != 5:
            raise ValueError(f"{value!r} is not a 5-field cron expression")
        return value

    @model_validator(mode="after")
    def _steps(self) -> PipelineSpec:
        seen: list[str] = []
        for step in self.steps:
            if step.name in seen:
                raise ValueError(f"step name {step.name!r} is used twice")
            source = step.input.from_step
            if source is not None and source not in seen:
                raise ValueError(
                    f"step {step.name!r} reads from_step {source!r}, which is not an earlier step "
                    f"(earlier steps: {seen or 'none'})"
                )
            seen.append(step.name)
        for field in ("prefix", "metadata_prefix"):
            places: dict[str, str] = {}
            for step in self.steps:
                value = getattr(step.output, field)
                if value is None:
                    continue
                folder = value.rstrip("/")
                if folder in places:
                    # Their instances' manifests (attempt-N/manifest-HOST.json) and outputs would overwrite each
                    # other's, and each step's check before _SUCCESS would read the other's.
                    raise ValueError(
                        f"steps {places[folder]!r} and {step.name!r} have the same output.{field} "
                        f"{value!r}: give each step its own"
                    )
                places[folder] = step.name
        for step in self.steps:
            table = step.output.table
            taken = set(step.input.passthrough or ()) & set(self.table_partition(step.name) if table else ())
            if taken:
                raise ValueError(
                    f"steps.{step.name}.output.table.partition: {sorted(taken)} is also a passthrough column; the "
                    "worker adds each partition column to every output row: name the partition column otherwise"
                )
        if self.partitioned_asset and self.schedule in (None, "@once"):
            raise ValueError(
                "partitioned_asset needs a schedule: a run's partition is an interval of the schedule, and this "
                f"pipeline has none ({self.schedule!r})"
            )
        self._check_trigger()
        if self.sagemaker.network_isolation:
            # AWS quirk: an isolated container has no network at all, so the worker could not
            # write file status or heartbeats to DynamoDB and every instance would look lost.
            raise ValueError(
                "sagemaker.network_isolation cannot be used: the worker reports to DynamoDB. "
                "Run in a VPC (sagemaker.vpc) with a DynamoDB gateway endpoint instead."
            )
        unpinned = [f"steps[{i}].model.allow_unpinned" for i, s in enumerate(self.steps) if s.model.allow_unpinned]
        if unpinned and self.backend != "local":
            raise ValueError(
                f"{', '.join(unpinned)}: an unpinned model is accepted on the local backend only; "
                "pin it with model.sha256 or model.versions"
            )
        if self.backend == "sagemaker" and not (self.sagemaker.role_arn and self.sagemaker.image_uri):
            raise ValueError("backend 'sagemaker' needs sagemaker.role_arn and sagemaker.image_uri")
        if self.backend == "sagemaker" and not self.sagemaker.kms_key_id:
            # Job volumes and outputs hold input rows and predictions: they are encrypted with the
            # deployment's own key, and infra/'s Airflow role may create no job without it.
            raise ValueError(
                "backend 'sagemaker' needs sagemaker.kms_key_id: the ARN of the KMS key that encrypts "
                "job volumes and outputs (the stack's KmsKeyArn output, see infra/README.md)"
            )
        return self

    def table_partition(self, step: str) -> dict[str, str]:
        """The partition columns of ``step``'s output table, each a template the run renders (empty without one)."""
        table = self.step(step).output.table
        if table is None:
            return {}
        start = dt.datetime.fromisoformat(self.start_date).replace(tzinfo=dt.UTC)
        return table.partition_templates(hourly=_shorter_than_a_day(self.schedule, start))

    def _check_trigger(self) -> None:
        if self.trigger is None:
            return
        if self.schedule in (None, "@once"):
            raise ValueError(
                f"trigger needs a schedule: it names the partitions a marker completes, and this pipeline has none "
                f"({self.schedule!r})"
            )
        if self.catchup:
            raise ValueError(
                "trigger and catchup: true cannot go together: runs start on arrival, not on the clock (score past "
                "partitions with `shardline trigger PIPELINE --partition START`)"
            )
        first = self.steps[0].input
        if not first.prefix or not first.ready_marker:
            raise ValueError(
                "trigger: {on: ready_marker} needs steps[0].input.prefix and steps[0].input.ready_marker: the marker "
                "whose S3 event starts a run"
            )
        bucket = first.prefix.removeprefix("s3://").split("/", 1)[0]
        if "{{" in bucket or "{%" in bucket:
            raise ValueError(
                f"trigger: the bucket of steps[0].input.prefix ({bucket!r}) is a template: the queue's watcher reads "
                "the events of one bucket, so name it as it is"
            )
        from shardline.spec.templates import names_partitions

        start = dt.datetime.fromisoformat(self.start_date).replace(tzinfo=dt.UTC)
        problem = names_partitions(first.prefix, self.steps[0].model.version, self.schedule, start)
        if problem:
            raise ValueError(f"trigger: steps[0].input.prefix {first.prefix!r} names no partition: {problem}")

    @property
    def catalogs(self):
        """The catalogs its tables name (``dags/catalogs.yaml`` beside the specs, read by :func:`load_spec`); only
        the stack's own (``local``) for a spec that was not loaded from a file."""
        from shardline.spec.tables import CatalogsFile

        return self._catalogs if self._catalogs is not None else CatalogsFile()

    def step(self, name: str) -> StepSpec:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


def data_interval(schedule: str | None, logical_date: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The data interval Airflow gives a manual run of a DAG with this schedule at ``logical_date`` (UTC):
    the last whole period of the schedule ending at or before it (``dag_factory.timetable_for``), or the
    logical date itself for an unscheduled DAG. The CLI's preview and tune render templates with it."""
    if schedule is None or schedule == "@once":
        return logical_date, logical_date
    from croniter import croniter

    cron = CRON_PRESETS.get(schedule, schedule)
    naive = logical_date.astimezone(dt.UTC).replace(tzinfo=None)
    # croniter.match compares minutes only: 10:00:30 is not a fire time of an hourly schedule, as in Airflow.
    on_time = naive.second == 0 and naive.microsecond == 0 and croniter.match(cron, naive)
    end = naive if on_time else croniter(cron, naive).get_prev(dt.datetime)
    start = croniter(cron, end).get_prev(dt.datetime)
    return start.replace(tzinfo=dt.UTC), end.replace(tzinfo=dt.UTC)


# How Shardline names a partition everywhere (`shardline runs`, the ledger, the Asset event's partition key, the run
# ids of arrivals): its interval's start in UTC, the format Airflow's temporal partition mappers read.
PARTITION_FORMAT = "%Y-%m-%dT%H:%M:%S"


def partition_interval(schedule: str | None, start: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The interval of a scheduled pipeline that starts at ``start`` (UTC): what its scheduled run with that
    logical date scores, and what a manual run of that partition must name (logical date ``start``, this data
    interval) so that it never takes the logical date of another interval's scheduled run. Raises
    :class:`SpecError` when ``start`` is no start of an interval of the schedule."""
    if schedule is None or schedule == "@once":
        raise SpecError(f"the pipeline has no schedule ({schedule!r}), so it has no intervals to name")
    from croniter import croniter

    cron = CRON_PRESETS.get(schedule, schedule)
    naive = start.astimezone(dt.UTC).replace(tzinfo=None)
    if naive.second or naive.microsecond or not croniter.match(cron, naive):
        before = croniter(cron, naive).get_prev(dt.datetime)
        raise SpecError(
            f"{start.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S}Z starts no interval of the schedule {schedule!r}: the "
            f"interval around it starts at {before:%Y-%m-%dT%H:%M:%S}Z"
        )
    end = croniter(cron, naive).get_next(dt.datetime)
    return start.astimezone(dt.UTC), end.replace(tzinfo=dt.UTC)


def interval_starts(
    schedule: str | None, since: dt.datetime, until: dt.datetime, max_count: int = 10_000
) -> list[dt.datetime]:
    """The starts (UTC), oldest first, of the schedule's intervals that start at or after ``since`` and end at or
    before ``until``: the partitions a scheduled pipeline owes for that span (the newest ``max_count`` of them)."""
    if schedule is None or schedule == "@once" or since >= until:
        return []
    from croniter import croniter

    cron = CRON_PRESETS.get(schedule, schedule)
    floor = since.astimezone(dt.UTC).replace(tzinfo=None)
    end = until.astimezone(dt.UTC).replace(tzinfo=None)
    on_time = end.second == 0 and end.microsecond == 0 and croniter.match(cron, end)
    it = croniter(cron, end if on_time else croniter(cron, end).get_prev(dt.datetime))
    starts: list[dt.datetime] = []
    while len(starts) < max_count:
        start = it.get_prev(dt.datetime)
        if start < floor:
            break
        starts.append(start.replace(tzinfo=dt.UTC))
    return starts[::-1]


def intervals_between(
    schedule: str | None, since: dt.datetime, until: dt.datetime, max_count: int = 10_000
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The intervals (start, end) of :func:`interval_starts`, oldest first: consecutive, so each ends where the
    next starts."""
    starts = interval_starts(schedule, since, until, max_count)
    if not starts:
        return []
    ends = [*starts[1:], partition_interval(schedule, starts[-1])[1]]
    return list(zip(starts, ends, strict=True))


# Airflow's cron presets, as cron expressions.
CRON_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}


def static_prefix(uri: str) -> str:
    """The part of a templated S3 URI before its first template, cut back to a folder (``s3://b/events/``)."""
    head = uri.split("{{", 1)[0]
    return head if head.endswith("/") else head.rsplit("/", 1)[0] + "/"


def _field_path(location: tuple) -> str:
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(str(item))
    return ".".join(parts) or "(top level)"


def parse_spec(data: object, source: str) -> PipelineSpec:
    """Validate spec data; errors name ``source`` and every bad field."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a pipeline spec must be a YAML mapping, got {type(data).__name__}")
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{source}: invalid pipeline spec\n" + "\n".join(problem_lines(err))) from err


def problem_lines(err: ValidationError) -> list[str]:
    """One line per bad field of a validation error, named by its path in the YAML."""
    lines = []
    problems = err.errors()
    nested = {problem["loc"][:depth] for problem in problems for depth in range(1, len(problem["loc"]))}
    for problem in problems:
        if problem["type"] == "too_short" and problem["loc"] in nested:
            continue  # "steps: at least 1 item" only echoes that the steps listed above are invalid
        field = _field_path(problem["loc"])
        message = re.sub(r"^Value error, ", "", problem["msg"])
        lines.append(f"  {field}: {message}")
    return lines


def load_spec(path: Path) -> PipelineSpec:
    """The spec at ``path`` (``dags/pipelines/NAME.yaml``), its tables' catalogs checked against
    ``dags/catalogs.yaml`` and kept with it (:attr:`PipelineSpec.catalogs`)."""
    from shardline.spec.tables import check_catalogs, load_catalogs

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from err
    spec = parse_spec(data, str(path))
    if any(step.output.table for step in spec.steps):
        catalogs = load_catalogs(Path(path).resolve().parent.parent)
        check_catalogs(spec.steps, catalogs, Path(path))
        spec._catalogs = catalogs
    return spec


def _shorter_than_a_day(schedule: str | None, start_date: dt.datetime) -> bool:
    """Whether the schedule's intervals are shorter than a day (an hourly table gets an ``hour`` column)."""
    if schedule in (None, "@once"):
        return False
    first = intervals_between(schedule, start_date, start_date + dt.timedelta(days=8), max_count=2)
    return bool(first) and (first[0][1] - first[0][0]) < dt.timedelta(days=1)
