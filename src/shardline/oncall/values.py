"""The on-call values, as plain data: a run's name (:class:`RunRef`) and the views built from the ledger's
records (:mod:`shardline.ledger.records`; the CLI prints the views, the page serves them as JSON).

What the views show is built in :mod:`shardline.oncall.views`; what is said, in :mod:`shardline.oncall.messages`.
"""

from __future__ import annotations

import dataclasses

from shardline.decision.resubmit import Next
from shardline.oncall.errors import BadRequest
from shardline.planning import naming


@dataclasses.dataclass(frozen=True)
class RunRef:
    pipeline: str
    run_id: str

    @classmethod
    def parse(cls, text: str) -> RunRef:
        pipeline, sep, run_id = text.partition("/")
        if not sep or not pipeline or not run_id:
            raise BadRequest(
                f"{text!r} is not a run name: a run is named PIPELINE/RUN_ID; copy it from the RUN "
                "column of `shardline runs`"
            )
        return cls(pipeline, run_id)

    def __str__(self) -> str:
        return naming.run_ref(self.pipeline, self.run_id)


@dataclasses.dataclass(frozen=True)
class FileChoice:
    """Which files a resubmission takes, chosen exactly one way: ``all_failed`` (every file not succeeded),
    ``instance`` (that instance's unfinished or failed files in the newest attempt), ``files`` (the named input
    keys) or ``rejects`` (the rows succeeded files rejected). :meth:`check` refuses any other choice."""

    instance: str | None = None
    files: tuple[str, ...] = ()
    all_failed: bool = False
    rejects: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))

    def check(self) -> None:
        """Raise :class:`BadRequest` unless exactly one way is chosen."""
        if sum(bool(x) for x in (self.instance, self.files, self.all_failed, self.rejects)) != 1:
            raise BadRequest(ONE_CHOICE)

    def words(self) -> list[str]:
        """The choice as ``shardline resubmit`` options."""
        if self.all_failed:
            return ["--all-failed"]
        if self.rejects:
            return ["--rejects"]
        if self.instance:
            return ["--instance", self.instance]
        return [word for key in self.files for word in ("--file", key)]


ONE_CHOICE = "choose what to resubmit with exactly one of --all-failed, --instance NAME, --file KEY or --rejects"


# --- views (plain data: the CLI prints them, the UI serves them as JSON) ---------------------


@dataclasses.dataclass(frozen=True)
class RunRow:
    pipeline: str
    run_id: str
    status: str
    started_at: str | None
    finished_at: str | None
    message: str | None = None
    airflow_state: str | None = None  # the DAG run's state in Airflow, when the CLI can ask
    disagreement: str | None = None  # set when Airflow and the ledger tell different stories
    partition: str | None = None  # what the run scores: its data interval's start (UTC)


@dataclasses.dataclass(frozen=True)
class InstanceView:
    """One instance of an attempt as its heartbeat (its SHARD item) last told it."""

    host: str
    attempt: int
    status: str
    files_assigned: int
    files_done: int
    files_failed: int
    rows_done: int
    heartbeat_age_seconds: float | None


@dataclasses.dataclass(frozen=True)
class FileView:
    step: str
    input_key: str
    status: str
    attempt: int
    host: str | None
    rows_in: int | None
    rows_out: int | None
    error_class: str | None
    error_message: str | None
    rows_rejected: int = 0  # tolerance.rows: rows in = rows out + rows rejected
    rejects_key: str | None = None  # s3:// URI of its rejected rows' list
    rejects: list[dict] = dataclasses.field(default_factory=list)  # the first of them, as `failed` shows them


@dataclasses.dataclass(frozen=True)
class FailedView:
    """`shardline failed`: the files, and what is said besides them when none is left to resubmit and yet the run
    ended badly (``views.failed_note``)."""

    files: list[FileView]
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class StepView:
    name: str
    status: str
    attempt: int
    job_name: str | None
    job_status: str | None
    files: int
    succeeded: int
    failed: int
    running: int
    pending: int
    rows_in: int
    rows_out: int
    rows_per_second: float | None
    eta_seconds: float | None
    started_at: str | None
    message: str | None
    instances: list[InstanceView]
    file_rows: list[FileView]
    rows_rejected: int = 0
    waiting: dict | None = None  # why its job is not running yet, as data (decision.fleet.Waiting); message says it
    table: dict | None = None  # what its end committed to its output table: table, partition, snapshot_id, rows


@dataclasses.dataclass(frozen=True)
class RunView:
    ref: str
    pipeline: str
    run_id: str
    status: str
    started_at: str | None
    finished_at: str | None
    message: str | None
    steps: list[StepView]
    airflow_state: str | None = None
    disagreement: str | None = None


@dataclasses.dataclass(frozen=True)
class ResubmitPlan:
    ref: str
    step: str
    files: list[str]
    reason: str  # why these files (or why none)


@dataclasses.dataclass(frozen=True)
class ResubmitResult:
    plan: ResubmitPlan
    attempt: int | None
    job_name: str | None
    airflow: str  # what happened on the Airflow side, in words
    complete: bool = True  # False: something is left half done; ``airflow`` says what, and how to finish it
    action: str = Next.SUBMIT.value  # what was (or, in a dry run, would be) done: a Next value
    # AWS said "not now" to the new attempt's submit: why, and when it goes again. The attempt is planned and recorded,
    # and the step's watch task submits it once the wait is over; None when the job was submitted.
    waiting: str | None = None


@dataclasses.dataclass(frozen=True)
class StepReportRef:
    """Where one step's run report is on S3: derived from the STEP item's plan, never given by a caller."""

    step: str
    status: str | None
    html_uri: str
    json_uri: str


@dataclasses.dataclass(frozen=True)
class SavedReport:
    """A step's report fetched to a local file (``report`` holds report.json's content when it was asked for)."""

    step: str
    status: str | None
    uri: str
    path: str
    report: dict | None = None
