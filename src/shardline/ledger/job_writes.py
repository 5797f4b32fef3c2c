"""What a processing instance writes to the ledger: file status and its own heartbeat.

Fencing: each instance belongs to one attempt of one step. Every write it makes is
conditional on that attempt, so an instance left over from an older attempt (a zombie)
can never overwrite what a newer attempt wrote. A rejected write raises
:class:`StaleAttemptError`, and the worker stops.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging

from pynamodb.connection import Connection
from pynamodb.exceptions import DoesNotExist, PynamoDBException, TransactWriteError, UpdateError
from pynamodb.transactions import TransactWrite

from shardline.ledger.context import LedgerContext, StaleAttemptError
from shardline.ledger.keys import (
    PARTITION_LOCK_SK,
    RUN_SK,
    failures_pk,
    file_sk,
    partition_lock_pk,
    run_pk,
    shard_sk,
    step_sk,
)
from shardline.ledger.partitions import HELD
from shardline.ledger.requests import RequestCounter
from shardline.ledger.states import SETUP_ERROR, FileStatus, ShardStatus, StepStatus
from shardline.ledger.table import MAX_ERROR_CHARS, bind_ledger, condition_failed, endpoint_from_env, region_from_env

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FinishedFile:
    """The figures a worker reports for one finished file."""

    status: FileStatus
    rows_in: int = 0
    rows_out: int = 0
    rows_rejected: int = 0  # tolerance.rows: rows in = rows out + rows rejected
    rejects_key: str | None = None  # s3:// URI of the list of its rejected rows
    model_warnings: int = 0  # lines the model code said that may signal a problem
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    output_key: str | None = None
    sha256: str | None = None  # the output's sha256 (hex), as uploaded
    error_class: str | None = None
    error_message: str | None = None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class WorkerLedger:
    """Conditional, fenced writes of one instance's progress."""

    def __init__(
        self,
        context: LedgerContext,
        host: str,
        *,
        endpoint: str | None = None,
        started_at: dt.datetime | None = None,
        requests: RequestCounter | None = None,
    ):
        self.context = context
        self.host = host
        self.started_at = started_at  # the instance's start: its SHARD item's started_at, written once
        # The instance's AWS requests (its ledger's, and its uploader's when it counts on the same counter): each
        # heartbeat records them, so the run report prices its control plane.
        self.requests = requests
        self._endpoint = endpoint if endpoint is not None else endpoint_from_env()
        self._region = region_from_env()
        self.model = bind_ledger(context.table, self._region, self._endpoint, context.retention_days)
        self.pk = run_pk(context.pipeline, context.run_id)
        # Each of the ledger's connections builds its botocore client on first use (DynamoDB's service model: 50 to
        # 90 ms of CPU) without a lock, so the upload threads and the ledger's own thread, starting together, each
        # built one: about ten an instance, most of a short job's CPU. Built here, once each, before any starts.
        for connection in (self.model._get_connection().connection, self.model.Control._get_connection().connection):
            if requests is not None:
                requests.watch(connection.client)
            else:
                _ = connection.client

    # -- files -----------------------------------------------------------------------

    def claim_file(self, relative_path: str) -> None:
        """Mark a file RUNNING under this attempt, unless a newer attempt owns it."""
        m, ctx = self.model, self.context
        input_key = ctx.input_key(relative_path)
        item = m(self.pk, file_sk(ctx.step, input_key))
        actions = [
            m.status.set(FileStatus.RUNNING.value),
            m.attempt.set(ctx.attempt),
            m.input_key.set(input_key),  # pipeline, run and step are in the keys already
            m.host.set(self.host),
            m.started_at.set(_now()),
            m.finished_at.remove(),
            m.output_sha256.remove(),  # an earlier attempt's output is not this claim's
            m.error_class.remove(),
            m.error_message.remove(),
            m.failed_pk.remove(),
            m.failed_at.remove(),
            m.expires_at.set(m.expiry()),
        ]
        # Claiming may move a record forward to this attempt, never back from a newer one.
        condition = m.attempt.does_not_exist() | (m.attempt <= ctx.attempt)
        self._update(item, actions, condition, what=f"claim {input_key}")

    def confirm_claim(self, relative_path: str) -> None:
        """Raise :class:`StaleAttemptError` unless this attempt still owns the file: asked just before its output
        is uploaded, so an instance of an older attempt (a zombie) never puts its output where a newer attempt's
        goes. It writes only the host, which the claim wrote already. As the claim's, the condition is "no newer
        attempt": the claim itself may still be queued behind this check."""
        m, ctx = self.model, self.context
        input_key = ctx.input_key(relative_path)
        item = m(self.pk, file_sk(ctx.step, input_key))
        condition = m.attempt.does_not_exist() | (m.attempt <= ctx.attempt)
        # The expiry too: should the claim queued behind this check never land, the item still expires.
        actions = [m.host.set(self.host), m.expires_at.set(m.expiry())]
        self._update(item, actions, condition, what=f"upload of {input_key}'s output")
        self.confirm_run_holds(f"upload of {input_key}'s output")

    def confirm_run_holds(self, what: str = "upload") -> None:
        """Raise :class:`StaleAttemptError` unless this instance's run is RUNNING and holds its output prefix:
        asked with :meth:`confirm_claim` before each upload, so a run that ended (its failure callback, a cancel)
        or lost its prefix puts nothing more there, even while its job is being stopped. Two consistent reads of a
        few attributes (the job's grant allows no more): plain reads never conflict with the orchestrator's writes
        to those items, as a transaction over them would. A missing item is a refusal too: absence is no grant."""
        ctx, control = self.context, self.model.Control
        run = self._read(control, self.pk, RUN_SK, [control.status])
        if run is None or run.status != StepStatus.RUNNING.value:
            state = "has no RUN item in the ledger" if run is None else f"is {run.status}"
            raise StaleAttemptError(f"{what} refused: run {ctx.run_id} {state}, so this job writes nothing more")
        if not ctx.output_uri:
            return
        held = [control.status, control.pipeline, control.run_id, control.step]
        lock = self._read(control, partition_lock_pk(ctx.output_uri), PARTITION_LOCK_SK, held)
        holder = (lock.pipeline, lock.run_id, lock.step) if lock is not None else None
        if lock is None or lock.status != HELD or holder != (ctx.pipeline, ctx.run_id, ctx.step):
            now = "nobody" if lock is None or lock.status != HELD else f"run {lock.pipeline}/{lock.run_id}"
            raise StaleAttemptError(
                f"{what} refused: run {ctx.run_id} (step {ctx.step}) no longer holds {ctx.output_uri} ({now} holds "
                "it), so this job writes nothing more there"
            )

    @staticmethod
    def _read(control, pk: str, sk: str, attributes: list):
        try:
            return control.get(pk, sk, consistent_read=True, attributes_to_get=[a.attr_name for a in attributes])
        except DoesNotExist:
            return None
        except PynamoDBException as err:
            if err.cause_response_code == "AccessDeniedException":  # a refusal, not an outage: never upload past it
                raise StaleAttemptError(
                    f"the job role may not read {pk} ({err.cause_response_message}): update the stack "
                    "(its LedgerRunStatus and LedgerOutputPrefixHolder statements) before running this worker image"
                ) from err
            raise

    def finish_file(self, relative_path: str, file_end: FinishedFile) -> None:
        """Record a file's terminal status, if this attempt still owns it.

        A file with no item yet is this attempt's too: its claim was dropped (the endpoint was
        down past the pump's budget), and a newer attempt would have written its fence item first.
        """
        m, ctx = self.model, self.context
        input_key = ctx.input_key(relative_path)
        finished = _now()
        item = m(self.pk, file_sk(ctx.step, input_key))
        actions = [
            m.attempt.set(ctx.attempt),
            m.input_key.set(input_key),
            m.status.set(file_end.status.value),
            m.rows_in.set(file_end.rows_in),
            m.rows_out.set(file_end.rows_out),
            m.rows_rejected.set(file_end.rows_rejected),
            m.model_warnings.set(file_end.model_warnings),
            m.rejects_key.set(file_end.rejects_key) if file_end.rejects_key else m.rejects_key.remove(),
            m.bytes_in.set(file_end.bytes_in),
            m.bytes_out.set(file_end.bytes_out),
            m.seconds.set(round(file_end.seconds, 3)),
            m.host.set(self.host),
            # The claim's, unless it never landed (an uploaded output's record may go before its queued claim, which
            # then leaves the record alone): the file's own seconds say when it started.
            m.started_at.set(m.started_at | (finished - dt.timedelta(seconds=max(0.0, file_end.seconds)))),
            m.finished_at.set(finished),
            m.expires_at.set(m.expiry()),
        ]
        if file_end.output_key:
            actions.append(m.output_key.set(file_end.output_key))
        if file_end.sha256 and file_end.output_key:
            actions.append(m.output_sha256.set(file_end.sha256))
        if file_end.status is FileStatus.FAILED:
            actions += [
                m.error_class.set(file_end.error_class or "Error"),
                m.error_message.set((file_end.error_message or "")[:MAX_ERROR_CHARS]),
                m.failed_pk.set(failures_pk(ctx.pipeline)),
                m.failed_at.set(f"{finished.isoformat()}#{ctx.run_id}#{ctx.step}"),
            ]
        condition = m.attempt.does_not_exist() | (m.attempt == ctx.attempt)
        self._update(item, actions, condition, what=f"finish {input_key}")

    # -- heartbeat -------------------------------------------------------------------

    def heartbeat(
        self,
        status: ShardStatus,
        *,
        files_assigned: int,
        files_done: int,
        files_failed: int,
        rows_done: int,
        setup_error: str | None = None,
        requests_ahead: int = 0,
    ) -> None:
        """Write this instance's SHARD item, fenced on the STEP item's current attempt.

        The STEP item is owned by the orchestrator. When it has moved to a newer attempt,
        the transaction is cancelled and this instance learns it is a zombie. ``setup_error``:
        why the instance could not start (its model, its arguments), recorded so the watch task fails
        the step at once with the worker's own words instead of retrying it as a lost job.
        """
        m, ctx = self.model, self.context
        item = m(self.pk, shard_sk(ctx.step, ctx.attempt, self.host))
        actions = [
            m.status.set(status.value),
            m.attempt.set(ctx.attempt),
            m.pipeline.set(ctx.pipeline),
            m.run_id.set(ctx.run_id),
            m.step.set(ctx.step),
            m.host.set(self.host),
            m.heartbeat_at.set(_now()),
            m.files_assigned.set(files_assigned),
            m.files_done.set(files_done),
            m.files_failed.set(files_failed),
            m.rows_done.set(rows_done),
            m.expires_at.set(m.expiry()),
        ]
        if self.requests is not None:  # with this heartbeat's own, and ``requests_ahead`` S3 PUTs just after it
            counts = self.requests.counts(dynamodb_transact=1, s3_put=requests_ahead)
            actions.append(m.requests.set(json.dumps(counts, separators=(",", ":"))))
        if self.started_at is not None:  # the first heartbeat's: a later one never moves it
            actions.append(m.started_at.set(m.started_at | self.started_at))
        if setup_error:
            actions += [m.error_class.set(SETUP_ERROR), m.error_message.set(setup_error[:MAX_ERROR_CHARS])]
        try:
            with TransactWrite(connection=self._transactions) as transaction:
                transaction.condition_check(  # the STEP item is a control item: its attempt is not ours to write
                    m.Control,
                    self.pk,
                    step_sk(ctx.step),
                    # An attempt whose job goes on beside a newer one (its lost instance's files went on ahead)
                    # is no zombie: its instances keep scoring their own files, each fenced by its FILE item.
                    condition=m.Control.attempt.does_not_exist()
                    | (m.Control.attempt <= ctx.attempt)
                    | (m.Control.live_from <= ctx.attempt),
                )
                transaction.update(item, actions=actions)
        except TransactWriteError as err:
            if condition_failed(err):
                raise StaleAttemptError(
                    f"heartbeat of {self.host} rejected: step {ctx.step} of run {ctx.run_id} has "
                    f"moved past attempt {ctx.attempt}"
                ) from err
            if self.requests is not None and err.cause_response_code == "AccessDeniedException":
                # A stack from before the counts (its job role may not write `rq`): the heartbeat is what matters.
                log.warning(
                    "the job role may not record this instance's AWS request counts on its SHARD item (%s): "
                    "heartbeats go on without them, and the run report prices no control plane; update the stack "
                    "(its LedgerWorkerAttributes statement) to record them",
                    err.cause_response_message,
                )
                self.requests = None
                self.heartbeat(
                    status,
                    files_assigned=files_assigned,
                    files_done=files_done,
                    files_failed=files_failed,
                    rows_done=rows_done,
                    setup_error=setup_error,
                )
                return
            raise

    @property
    def _transactions(self) -> Connection:
        """The connection heartbeats' transactions go through: the ledger table's own (one botocore client fewer to
        build: each loads DynamoDB's service model, 50 to 90 ms of CPU)."""
        return self.model._get_connection().connection

    def _update(self, item, actions, condition, *, what: str) -> None:
        try:
            item.update(actions=actions, condition=condition)
        except UpdateError as err:
            if condition_failed(err):
                raise StaleAttemptError(
                    f"{what} rejected: attempt {self.context.attempt} no longer owns this record"
                ) from err
            raise
