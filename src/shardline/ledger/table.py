"""The pynamodb model of the ledger table, and how to bind it to a real table.

Two model classes share the one table: :class:`LedgerItem` for the items a worker writes
(FILE, SHARD) and the run index, :class:`ControlItem` for the orchestrator's (RUN, STEP), whose
attributes are stored under names a job's IAM grant never lists. The sort key says which an
item is. The table name and endpoint are deployment settings, so both are bound at run time
with :func:`bind_ledger` rather than hard-coded in `Meta`.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import threading

import botocore.session
from pynamodb.attributes import (
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
    UnicodeSetAttribute,
    UTCDateTimeAttribute,
)
from pynamodb.exceptions import PynamoDBException, TransactWriteError, UpdateError
from pynamodb.indexes import AllProjection, GlobalSecondaryIndex
from pynamodb.models import Model

# DynamoDB items are capped at 400 KB; error text is the only unbounded field we store.
MAX_ERROR_CHARS = 2000
FAILURES_INDEX_NAME = "failures"
# Every item expires this long after its last write (DynamoDB TTL), so error text that echoes
# input rows does not outlive its use. A pipeline sets its own with `ledger_retention_days`.
DEFAULT_RETENTION_DAYS = 90
# Every DynamoDB call gives up in bounded time: an endpoint that freezes or goes away never
# blocks a worker, the watch task or the CLI forever. 5 tries of at most 5 s to connect and 20 s
# to answer ride out a pause of about a minute; longer is an outage the caller reports.
CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 20
MAX_RETRY_ATTEMPTS = 4
CLIENT_SETTINGS = {
    "connect_timeout_seconds": CONNECT_TIMEOUT_SECONDS,
    "read_timeout_seconds": READ_TIMEOUT_SECONDS,
    "max_retry_attempts": MAX_RETRY_ATTEMPTS,
}


class _Expiring:
    """Items expire ``retention_days`` after their last write; :func:`bind_ledger` sets the days."""

    retention_days: int = DEFAULT_RETENTION_DAYS

    @classmethod
    def expiry(cls) -> dt.datetime:
        """The expiry an item written now gets."""
        return dt.datetime.now(dt.UTC) + dt.timedelta(days=cls.retention_days)


class LedgerItem(_Expiring, Model):
    """Schema of every ledger item. Use :func:`bind_ledger` to get a class bound to a table.

    Stored attribute names are short on purpose: a Query page holds 1 MB of items, and
    names count toward item size, so a watch poll on a 10,000-file step stays a few pages.
    """

    class Meta:
        table_name = None  # set by bind_ledger
        billing_mode = "PAY_PER_REQUEST"

    pk = UnicodeAttribute(hash_key=True)
    sk = UnicodeAttribute(range_key=True)

    status = UnicodeAttribute(null=True, attr_name="st")
    # Fencing token: the attempt that owns this item. Every worker write is conditional on it.
    attempt = NumberAttribute(null=True, attr_name="at")

    pipeline = UnicodeAttribute(null=True, attr_name="pl")
    run_id = UnicodeAttribute(null=True, attr_name="ri")
    step = UnicodeAttribute(null=True, attr_name="sp")
    host = UnicodeAttribute(null=True, attr_name="ho")

    # FILE items
    input_key = UnicodeAttribute(null=True, attr_name="ik")
    output_key = UnicodeAttribute(null=True, attr_name="ok")
    rows_in = NumberAttribute(null=True, attr_name="rin")
    rows_out = NumberAttribute(null=True, attr_name="rout")
    rows_rejected = NumberAttribute(null=True, attr_name="rrej")  # tolerance.rows: rows in = out + rejected
    rejects_key = UnicodeAttribute(null=True, attr_name="rjk")  # s3:// URI of the file's rejects list
    model_warnings = NumberAttribute(null=True, attr_name="mw")  # warning lines the model code said
    # A rejects part (`shardline resubmit --rejects`): the rows its source rejected, picked again into a file of
    # their own. part_of is the source's input key, source_etag the ETag of the source the rows were picked from.
    # The orchestrator writes both when it plans the part; no worker write touches them.
    part_of = UnicodeAttribute(null=True, attr_name="pof")
    source_etag = UnicodeAttribute(null=True, attr_name="setag")
    bytes_in = NumberAttribute(null=True, attr_name="bin")
    bytes_out = NumberAttribute(null=True, attr_name="bout")
    # The output's sha256 (hex) as the worker uploaded it: the check before _SUCCESS compares it with S3's own
    # checksum of the object, so an object another run or writer put at that key never passes for this one.
    output_sha256 = UnicodeAttribute(null=True, attr_name="osha")
    seconds = NumberAttribute(null=True, attr_name="sec")
    error_class = UnicodeAttribute(null=True, attr_name="ec")
    error_message = UnicodeAttribute(null=True, attr_name="em")
    started_at = UTCDateTimeAttribute(null=True, attr_name="sa")
    finished_at = UTCDateTimeAttribute(null=True, attr_name="fa")

    # RUN and STEP items are ControlItems (below), with attribute names of their own.

    # SHARD items (one per instance and attempt)
    heartbeat_at = UTCDateTimeAttribute(null=True, attr_name="hb")
    files_assigned = NumberAttribute(null=True, attr_name="fas")
    files_done = NumberAttribute(null=True, attr_name="fd")
    files_failed = NumberAttribute(null=True, attr_name="ff")
    rows_done = NumberAttribute(null=True, attr_name="rd")
    requests = UnicodeAttribute(null=True, attr_name="rq")  # SHARD items: the instance's AWS requests by kind (JSON)

    # Sparse failures index: only FAILED files carry these two attributes.
    failed_pk = UnicodeAttribute(null=True)
    failed_at = UnicodeAttribute(null=True)

    # When DynamoDB may delete the item: set on every write, from the binding's retention.
    expires_at = TTLAttribute(null=True, attr_name="ttl")


class ControlItem(_Expiring, Model):
    """RUN and STEP items: written by the orchestrator alone (plan, attempt, outcome).

    Their attributes are stored under names of their own (``ost``, ``oat``, ...), never under
    the FILE and SHARD items' names the worker writes: IAM's ``dynamodb:Attributes`` cannot tell
    items apart, so this is what keeps a job's role from moving a step's attempt or status.
    Use ``bind_ledger(...).Control``.
    """

    class Meta:
        table_name = None  # set by bind_ledger
        billing_mode = "PAY_PER_REQUEST"

    pk = UnicodeAttribute(hash_key=True)
    sk = UnicodeAttribute(range_key=True)
    status = UnicodeAttribute(null=True, attr_name="ost")
    attempt = NumberAttribute(null=True, attr_name="oat")  # the step's newest attempt: the fencing token
    # The oldest attempt whose job still runs beside the newest (a lost instance's files went on as a next attempt
    # while its job's other instances went on); absent when only the newest runs. Its instances' heartbeats pass.
    live_from = NumberAttribute(null=True, attr_name="olv")
    # While earlier jobs run beside the newest: their lost instances ("attempt/host") whose unfinished files a later
    # attempt took. The watch needs no file of the step for those any more (see orchestration/watch._jobs_beside).
    lost_taken = UnicodeSetAttribute(null=True, attr_name="olk")
    pipeline = UnicodeAttribute(null=True, attr_name="opl")
    run_id = UnicodeAttribute(null=True, attr_name="ori")
    step = UnicodeAttribute(null=True, attr_name="osp")
    started_at = UTCDateTimeAttribute(null=True, attr_name="osa")
    finished_at = UTCDateTimeAttribute(null=True, attr_name="ofa")
    # RUN items: when the run was last set RUNNING: after its DAG run failed, that is a reopening (set_run_status).
    reopened_at = UTCDateTimeAttribute(null=True, attr_name="ora")
    # RUN items: the run's lives in Airflow (its DAG run's clear_number): the newest one a task of the run started in,
    # and the newest one known to be over (ended by its failure callback, or taken up again by on-call after it
    # failed). A failure callback for a life at or below either is late, and ends nothing (step_writes.end_life).
    airflow_life = NumberAttribute(null=True, attr_name="oal")
    ended_life = NumberAttribute(null=True, attr_name="oel")
    plan_json = UnicodeAttribute(null=True, attr_name="pj")
    # STEP items: each attempt's plan file, as JSON {"1": "s3://...", ...}; see ledger.step_writes.start_attempt.
    plan_files = UnicodeAttribute(null=True, attr_name="opf")
    message = UnicodeAttribute(null=True, attr_name="msg")
    # STEP items: an on-call engineer accepted the outputs its blocking checks held back (`shardline approve`): who,
    # when, why and at which attempt, as JSON (orchestration.step.approval.Approval); the step's end honours it.
    approval = UnicodeAttribute(null=True, attr_name="apv")
    # STEP items: what the step's end committed to its output table (orchestration.tables.TableCommit as JSON: the
    # table, the partition, the snapshot, files and rows): the views, the report task's Asset event and lineage
    # read it. Set by a SUCCEEDED end of a step with `output.table`, removed by any other end.
    table_commit = UnicodeAttribute(null=True, attr_name="otc")
    # BASELINE items: a step's reference profile for its output checks, with where it was made from (JSON;
    # ledger.baselines).
    baseline = UnicodeAttribute(null=True, attr_name="obl")
    # STEP and RUN items: why the step's planned job is not running yet (decision.fleet.Waiting as JSON), and on the
    # RUN item which step that is; the views render it. Removed once the job is submitted.
    waiting = UnicodeAttribute(null=True, attr_name="owt")
    waiting_step = UnicodeAttribute(null=True, attr_name="ows")
    # RUN items: the partition the run scores (its data interval's start, UTC), for `shardline runs`.
    partition = UnicodeAttribute(null=True, attr_name="opt")
    # RUN items: the run missed its deadline (spec deadline:): what the views show, and how often the alert fired.
    missed_deadline = UnicodeAttribute(null=True, attr_name="olt")
    deadline_misses = NumberAttribute(null=True, attr_name="odm")
    budget_usd = NumberAttribute(null=True, attr_name="obu")  # RUN items: the run's budget as on-call raised it
    # PARTITION lock items (ledger.partitions): taken over only by raising the fence; the lease says until when the
    # holder vouched for itself.
    fence = NumberAttribute(null=True, attr_name="ofn")  # STEP items: the fence of the take the step holds
    lease_until = UTCDateTimeAttribute(null=True, attr_name="olu")
    renewed_at = UTCDateTimeAttribute(null=True, attr_name="orn")
    expires_at = TTLAttribute(null=True, attr_name="ttl")  # one TTL attribute per table


def endpoint_from_env() -> str | None:
    """The DynamoDB endpoint override, honouring the same variables boto3 does."""
    return os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or os.environ.get("AWS_ENDPOINT_URL") or None


def region_from_env() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


@functools.cache
def bind_ledger(
    table_name: str, region: str | None = None, host: str | None = None, retention_days: int = DEFAULT_RETENTION_DAYS
) -> type[LedgerItem]:
    """Return a :class:`LedgerItem` subclass bound to ``table_name`` at ``host``.

    ``region`` and ``host`` default to the AWS environment variables, so code inside a
    container and code on the Airflow side resolve the same endpoint. Items written through
    it expire ``retention_days`` after their last write.
    """
    region = region or region_from_env()
    host = host if host is not None else endpoint_from_env()

    class FailuresIndex(GlobalSecondaryIndex):
        class Meta:
            index_name = FAILURES_INDEX_NAME
            projection = AllProjection()

        failed_pk = UnicodeAttribute(hash_key=True)
        failed_at = UnicodeAttribute(range_key=True)

    meta = type(
        "Meta",
        (),
        {
            "table_name": table_name,
            "region": region,
            "host": host,
            "billing_mode": "PAY_PER_REQUEST",
            **CLIENT_SETTINGS,
        },
    )
    control = type(
        f"ControlItem[{table_name}]",
        (ControlItem,),
        {"Meta": meta, "retention_days": retention_days, "__module__": __name__},
    )
    bound = type(
        f"LedgerItem[{table_name}]",
        (LedgerItem,),
        {
            "Meta": meta,
            "failures": FailuresIndex(),
            "retention_days": retention_days,
            "Control": control,
            "__module__": __name__,
        },
    )
    for model in (bound, control):
        _share_session(model)
    return bound


# One botocore session per thread and AWS_* environment, shared by the ledger's connections (see _shared_session).
_SESSIONS = threading.local()
_SESSIONS_KEPT = 4  # the environments a thread keeps a session for: a process's tests each set their own


def _shared_session() -> botocore.session.Session:
    """A botocore session for this thread and this process's AWS_* environment. pynamodb builds a new session for
    every connection, and each new one loads DynamoDB's service model and the endpoint rules again: about 90 ms of
    CPU a connection, 2 ms from a session that has them. Keyed on the AWS_* variables (credentials, profile,
    endpoints), which a new session would read; per thread, as pynamodb keeps its own (building clients from one
    session is not thread-safe)."""
    key = tuple(sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_")))
    kept: dict = _SESSIONS.__dict__.setdefault("by_environment", {})
    if key not in kept:
        while len(kept) >= _SESSIONS_KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = botocore.session.get_session()
    return kept[key]


def _share_session(model: type[Model]) -> None:
    """Hand the model's connection this thread's shared session, unless it has one (a client built already)."""
    local = getattr(model._get_connection().connection, "_local", None)  # pynamodb keeps its sessions per thread
    if local is not None and getattr(local, "session", None) is None:
        local.session = _shared_session()


def create_ledger_table(table_name: str, region: str | None = None, host: str | None = None) -> None:
    """Create the ledger table (on-demand, failures GSI, TTL) if it does not exist yet."""
    model = bind_ledger(table_name, region, host)
    if not model.exists():
        model.create_table(wait=True)
    # DynamoDB refuses to enable TTL when it is already enabled, so look first: running this twice is fine.
    client = model._get_connection().connection.client
    ttl = client.describe_time_to_live(TableName=table_name).get("TimeToLiveDescription", {})
    if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
        model.update_ttl(ignore_update_ttl_errors=False)


CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailedException"


def condition_failed(err: PynamoDBException) -> bool:
    """Whether a write was refused by its condition (a fenced write that lost), a transaction's by any of its
    items' conditions: never a fault, and never retried as one."""
    if isinstance(err, TransactWriteError):
        return any(
            reason is not None and reason.code == "ConditionalCheckFailed"
            for reason in (err.cancellation_reasons or [])
        )
    return err.cause_response_code == CONDITIONAL_CHECK_FAILED


def update_if(item: Model, actions: list, condition=None) -> bool:
    """Apply ``actions`` to ``item`` if ``condition`` holds (a fenced write): True when applied, False when the
    condition failed (the item moved on, or is not there). Any other error is raised."""
    try:
        item.update(actions=actions, condition=condition)
    except UpdateError as err:
        if condition_failed(err):
            return False
        raise
    return True
