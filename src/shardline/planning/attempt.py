"""One attempt of one step of one run: the typed value every layer passes along. Pure.

What the job is called, where its manifest lives and how many instances it runs are derived
from the attempt itself, here and nowhere else. It travels through XCom, a trigger's kwargs and
its events as a JSON dict (:meth:`Attempt.to_xcom` / :meth:`Attempt.from_xcom`), and is rebuilt
from the ledger's STEP item by the CLI and the page (:meth:`Attempt.from_plan`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from shardline.errors import PermanentError
from shardline.ledger.keys import StepRef
from shardline.planning import naming
from shardline.planning.inputs import S3Object, choose_instance_count

# What a step was planned with, as the STEP item keeps it: enough to build any later attempt without XCom.
PLAN_FIELDS = (
    "pipeline",
    "run_id",
    "step",
    "input_prefix",
    "parts_prefix",
    "output_prefix",
    "metadata_prefix",
    "model_uri",
    "model_version",
    "requested_instances",
    "instance_type",
    "capacity_failures",
    "planned_instances",
    "table_partition",
)
# What a capacity failure changes in the attempts after it (orchestration.step.capacity): a resumed watch takes
# these from the STEP item's plan, not from the first attempt's XCom.
CHANGED_BY_CAPACITY = ("instance_type", "capacity_failures", "requested_instances", "planned_instances")
# Derived, so written to XCom for readers (logs, the UI) but never read back as facts.
DERIVED_FIELDS = ("job_name", "manifest_uri", "instance_count")


class AttemptRecordError(PermanentError, ValueError):
    """An attempt's XCom or ledger record that does not describe the attempt it names."""


class PlannedFile(BaseModel):
    """An input of an attempt: its key under the bucket, and its size (what ``sharding: by_size`` deals by)."""

    model_config = ConfigDict(frozen=True)

    key: str
    size: Annotated[int, Field(ge=0)]

    @classmethod
    def of(cls, obj: S3Object) -> PlannedFile:
        return cls(key=obj.key, size=obj.size)


class Attempt(BaseModel):
    """One attempt of one step of one run, its templates already rendered."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipeline: str
    run_id: str
    step: str
    number: Annotated[int, Field(ge=1)]
    input_prefix: str  # the step's input prefix: the manifest's keys are relative to it (see parts_prefix)
    output_prefix: str
    model_uri: str
    requested_instances: Annotated[int, Field(ge=1)] = 1
    model_version: str | None = None  # the run's model_version Param: picks the pinned digest
    metadata_prefix: str | None = None  # output.metadata_prefix, rendered: the instances' manifests go there
    file_count: Annotated[int, Field(ge=0)] = 0
    # The attempt's inputs and their sizes where the planner has them; XCom carries only their count
    # (the manifest and the ledger hold the list, which can be 100,000 keys).
    files: tuple[PlannedFile, ...] = ()
    # The instance type this attempt runs on: the step's own, or a fallback after capacity failures. Set when the
    # step is planned; None only in an attempt an older Shardline planned (see runs_on).
    instance_type: str | None = None
    # An attempt that scores rejected rows again (`shardline resubmit --rejects`) reads rejects parts, files of the
    # rows picked from their sources, under this prefix (the orchestrator's, under _shardline/manifests/): its
    # manifest's keys are relative to it, and its instances name their files by it.
    parts_prefix: str | None = None
    # The jobs of this step that SageMaker could not provision before this attempt, per instance type: each was
    # followed by an attempt that retry.max_attempts does not count.
    capacity_failures: dict[str, int] = Field(default_factory=dict)
    # The instances the step planned on its own type, kept once a capacity failure moves it to another: each move
    # re-plans from this, so rounding up never compounds over a round trip of the fallbacks.
    planned_instances: int | None = None
    submitted_at: float | None = None  # epoch seconds, once the job was submitted or adopted
    planning: dict[str, Any] | None = None  # how long listing and recording took (the plan task logs it)
    # output.table.partition rendered for the run: each column's value, added to every output row by the worker and
    # the partition the step's end commits. None: the step has no table.
    table_partition: dict[str, str] | None = None

    @property
    def output_tag(self) -> str | None:
        """What a table step's data files carry in their names (:func:`naming.output_tag`): None without a table."""
        return naming.output_tag(self.run_id, self.number) if self.table_partition is not None else None

    @property
    def ref(self) -> StepRef:
        """The step this attempt is of."""
        return StepRef(self.pipeline, self.run_id, self.step)

    @property
    def data_prefix(self) -> str:
        """The prefix this attempt's inputs are under: its parts' for an attempt of rejects parts, else the step's."""
        return self.parts_prefix or self.input_prefix

    @property
    def job_name(self) -> str:
        return naming.job_name(self.pipeline, self.run_id, self.step, self.number)

    @property
    def manifest_uri(self) -> str:
        """The s3:// URI of this attempt's ManifestFile."""
        return naming.manifest_key(self.output_prefix, self.run_id, self.step, self.number, self.metadata_prefix)

    def plan_file_uri(self, stamp: str) -> str:
        """The s3:// URI of one plan of this attempt (``stamp`` names the plan): its inputs and their sizes."""
        return naming.plan_file_key(
            self.output_prefix, self.run_id, self.step, self.number, stamp, self.metadata_prefix
        )

    def report_uri(self, suffix: str = "html") -> str:
        """The s3:// URI of this step's run report (``report.html``, or ``report.json`` with ``suffix="json"``)."""
        return naming.report_key(self.output_prefix, self.run_id, self.step, self.metadata_prefix, suffix)

    def runs_on(self, spec_instance_type: str) -> str:
        """The instance type this attempt runs on; an attempt an older Shardline planned recorded none, and runs on
        the spec's."""
        return self.instance_type or spec_instance_type

    @property
    def counted_number(self) -> int:
        """This attempt's number as retry.max_attempts counts it: the attempts that followed a capacity failure
        are not counted (SageMaker had no instances; nothing was tried)."""
        return self.number - sum(self.capacity_failures.values())

    @property
    def instance_count(self) -> int:
        return choose_instance_count(self.requested_instances, self.file_count)

    def plan_json(self) -> str:
        """What the STEP item keeps of the plan (:data:`PLAN_FIELDS`)."""
        return json.dumps({name: getattr(self, name) for name in PLAN_FIELDS})

    def next(self, number: int, files: list[PlannedFile]) -> Attempt:
        """Another attempt of the same step with ``files`` (not yet submitted)."""
        return self.model_copy(
            update={
                "number": number,
                "files": tuple(files),
                "file_count": len(files),
                "submitted_at": None,
                "planning": None,
            }
        )

    def submitted(self, at: float) -> Attempt:
        return self.model_copy(update={"submitted_at": at})

    def to_xcom(self) -> dict[str, Any]:
        """A JSON dict, keyed as XCom, trigger kwargs and events have always carried an attempt."""
        data = self.model_dump(mode="json", exclude={"files", "number", "file_count"})
        return {
            **data,
            "attempt": self.number,
            "files": self.file_count,
            **{name: getattr(self, name) for name in DERIVED_FIELDS},
        }

    @classmethod
    def from_xcom(cls, data: dict[str, Any]) -> Attempt:
        """The attempt a dict from :meth:`to_xcom` (or an earlier Shardline's XCom) describes."""
        known = set(cls.model_fields) - {"number", "file_count", "files"}
        values = {k: v for k, v in data.items() if k in known}
        attempt = cls(**values, number=int(data["attempt"]), file_count=int(data.get("files") or 0))
        # A name that no longer derives the same (naming changed under a run in flight) would have the
        # watch task follow, or submit, another job than the one this attempt is: refuse.
        for name in ("job_name", "manifest_uri"):
            if name in data and data[name] != getattr(attempt, name):
                raise AttemptRecordError(
                    f"attempt {attempt.number} of step {attempt.step} of run {attempt.run_id}: "
                    f"its {name} {data[name]!r} is not the {getattr(attempt, name)!r} it derives"
                )
        return attempt

    @classmethod
    def from_plan(
        cls, plan_json: str, number: int, file_count: int, *, pipeline: str, run_id: str, step: str
    ) -> Attempt:
        """An attempt rebuilt from the ledger alone: the STEP item's plan, its attempt and its file count.

        Raises :class:`AttemptRecordError` naming what a plan lacks (one written by hand, or by a much older Shardline).
        """
        plan = {k: v for k, v in json.loads(plan_json).items() if k in PLAN_FIELDS}
        plan.update(
            pipeline=pipeline, run_id=run_id, step=step, requested_instances=int(plan.get("requested_instances") or 1)
        )
        missing = [name for name in ("input_prefix", "output_prefix", "model_uri") if not plan.get(name)]
        if missing:
            raise AttemptRecordError(f"the recorded plan of step {step} of run {run_id} lacks {', '.join(missing)}")
        return cls(**plan, number=number, file_count=file_count)
