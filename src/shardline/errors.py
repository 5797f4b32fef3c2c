"""Shardline's error vocabulary: one definition of each error the layers share. Pure: no IO.

Every error Shardline raises on purpose is a :class:`ShardlineError`. A :class:`PermanentError` is one the
same input or settings will raise again: Airflow's operators fail such a task at once instead of retrying it
(:func:`shardline.airflow.operators.base.fails_fast`), and the step's decision policy
(:mod:`shardline.decision.policy`) never spends an attempt on such a file. Everything else may pass on a retry.

Whether an error is permanent is its ``permanent`` attribute, which every check reads (a subclass may turn it
off: :class:`HostSetupError` is a :class:`SetupError` a next attempt on another host may not meet).

A failure is recorded in the ledger by its class's name (a FILE or SHARD item's ``error_class``), so the worker
that records it and the policy that reads it agree through these classes, never through names written out:
:func:`is_permanent_file_failure` answers for a recorded name. Renaming a class here renames it for both. Every
reader says a recorded failure the same way, "Class: message" (:func:`error_line`).

The tree (each class under its first base of the package's own, its other bases in brackets; a class defined
outside this module named by its module; :data:`SIGNALS`, the exceptions that are not errors, left out; a test
checks that it is the source's):

    ShardlineError
      oncall.airflow_client.AirflowApiError
      backends.local_container.ContainerRuntimeError
      local.embedded_aws.EmbeddedAwsError
      FileError
        CorruptInputError [PermanentError]
        InputFormatError
        InputSchemaError [PermanentError]
        LateInputError
        OutputUploadError
        OutputWriteError
        PoisonFileError [PermanentError]
        PredictionError
          worker.model.script_codec.ResponseShapeError
          worker.model.script_runner.RowOrderError
          worker.model.script_runner.ScriptError
        worker.model.script_codec.RecordEncodingError
        RowCountMismatch [PermanentError]
        TooManyRejectsError [PermanentError]
        UnsafeKeyError [PermanentError]
        UnvouchedOutputError
      GaveUpWaiting
      grant.session.JobCredentialsError
      backends.JobNotFound [LookupError]
      orchestration.step.outputs.LateInputsFound
      ledger.step_writes.LedgerThrottledError
      oncall.errors.OnCallError
        oncall.errors.BadRequest
        oncall.errors.Conflict
        oncall.errors.NotFound
        oncall.errors.Refused
        oncall.errors.Unavailable
      ledger.partitions.PartitionHeld
      PermanentError
        planning.attempt.AttemptRecordError [ValueError]
        backends.local_fleet.FleetConfigError [ValueError]
        report.histogram.HistogramFormatError [ValueError]
        InputRefused
        InvalidArgument [ValueError]
          orchestration.step.approval.NotApprovable
        s3uri.InvalidS3Uri [ValueError]
        ledger.context.LedgerConfigError [ValueError]
        LedgerRecordMissing
        OverBudgetRefused
        ledger.partitions.PartitionLost
        ledger.partitions.PartitionMovedOn
        planning.inputs.PlanError [ValueError]
        planning.inputs.PlanFileError
        orchestration.step.rejects.RejectsPartError
        orchestration.step.preview.SampleTooLarge [ValueError]
        SetupError
          HostSetupError
          ModelIntegrityError
        spec.base.SpecError [ValueError]
        local.moto_state.StateError
        TableError
        orchestration.step.upstream.UpstreamError
      orchestration.step.preview.PreviewError
        orchestration.step.preview.PreviewDenied
      orchestration.quote.QuoteError
      ledger.context.StaleAttemptError
      SubmitRefused
      TableCommitFailed
      report.cost.UnknownPriceError [KeyError]
"""

from __future__ import annotations

from typing import ClassVar


class ShardlineError(Exception):
    """Base of every error Shardline raises on purpose. Trying again may succeed (see :class:`PermanentError`)."""

    permanent: ClassVar[bool] = False


class PermanentError(ShardlineError):
    """The same input or settings fail the same way on every try: no retry, fail fast, say what to change."""

    permanent = True


# Exceptions that are not errors: each carries a refusal or a stop inside its own room, which turns it into an answer
# (an HTTP status, an exit code, a job's end) and never shows it as an error of Shardline's. By qualified name.
SIGNALS = frozenset(
    {
        "backends.local_supervisor._Stop",  # a stop asked of one emulated job: its instances are ended
        "grant.proxy.Refused",  # a job's request outside its grant: answered AccessDenied
        "grant.proxy._Unframed",  # a request its headers let be read two ways: answered 400
        "grant.requests.Unreadable",  # a request the grant cannot read as IAM would: refused
        "local.moto_atomic.Refused",  # a request the embedded endpoint answers as S3 would, before moto
        "worker.pool.runner.Terminated",  # SIGTERM: the worker ends its files and exits 143
        "worker.pool.runner.Stopped",  # the job was told to stop (fenced out): the pool winds down
    }
)


# --- a file's failure, as the ledger records it -----------------------------------------------------------


class FileError(ShardlineError):
    """One input file cannot be processed. It fails alone; the others go on."""


class InputSchemaError(FileError, PermanentError):
    """A feature or passthrough column is missing or has the wrong type."""


class CorruptInputError(FileError, PermanentError):
    """The file cannot be read in its format."""


class InputFormatError(FileError):
    """The file's name says another format than the step reads, or none the worker knows."""


class PredictionError(FileError):
    """The model raised, or returned something that cannot be written, for this file."""


class TooManyRejectsError(FileError, PermanentError):
    """The file rejected more rows than ``tolerance.rows`` allows (the message names its first rejects)."""


class PoisonFileError(FileError, PermanentError):
    """The file took down the worker process that held it, on its own, twice: it is not tried a third time."""


class RowCountMismatch(FileError, PermanentError):
    """The model returned another number of predictions than the file has rows."""


class UnsafeKeyError(FileError, PermanentError):
    """Recorded by the planner: a key no download could write safely (it would land outside the input folder)."""


class LateInputError(FileError):
    """Recorded when an input landed after planning and no attempt of the step is left to take it."""


class UnvouchedOutputError(FileError):
    """Recorded at the step's end: the ledger says SUCCEEDED, but the object in S3 is missing or is not the one the
    worker uploaded (its size or sha256 differ from the ledger's), so ``resubmit --all-failed`` scores it again."""


class OutputUploadError(FileError):
    """The worker wrote the file's output but could not upload it (S3 refused or did not answer within the
    client's retries): a next attempt scores it again."""


class OutputWriteError(FileError):
    """The instance's disk was full (or its quota reached) while the file's input or output was written: nothing of
    the model's doing, so a next attempt scores it again; the message names the volume setting."""


# --- an instance that could not start ----------------------------------------------------------------------


class SetupError(PermanentError):
    """A fatal problem before any file can be processed (the worker exits 4).

    In a pipeline the instance records it on its SHARD item, and the step fails at once without a retry: the
    same model and settings fail the same way on every attempt. A problem of one host is a :class:`HostSetupError`.
    """


class HostSetupError(SetupError):
    """A setup problem of this instance's host, not of the model or settings (a full disk, a pool that could
    not start): the job exits 4, and its files are retried on a next attempt like a lost instance's."""

    permanent = False


class ModelIntegrityError(SetupError):
    """The model artifact does not match its pinned sha256."""


def error_line(error_class: str | None, error_message: str | None) -> str:
    """A recorded failure in one line, ``Class: message`` (either part may be missing; "" when both are): how the
    watch task, the run report, the on-call views and the page all show one."""
    return ": ".join(x for x in (error_class, error_message) if x)


# The most characters a message quotes of what it did not write itself: a request body, a line of an input, a
# script's or a library's own error text (the ledger keeps 2,000 of a whole message too).
QUOTED_CHARS = 2000


def clipped(text: str, limit: int = QUOTED_CHARS) -> str:
    """``text`` as a message quotes it: its first ``limit`` characters, and how many more there were. A script's
    error may hold its whole request body (scikit-learn's "Expected 2D array ... array=" does): quoted whole, one
    file's failure was a 583 KB log line, written again in the summary."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


# The classes a FILE or SHARD item's error_class can name, by that name.
RECORDED: dict[str, type[ShardlineError]] = {
    cls.__name__: cls
    for cls in (
        InputSchemaError,
        CorruptInputError,
        InputFormatError,
        PredictionError,
        PoisonFileError,
        TooManyRejectsError,
        RowCountMismatch,
        UnsafeKeyError,
        LateInputError,
        UnvouchedOutputError,
        OutputUploadError,
        OutputWriteError,
        SetupError,
        HostSetupError,
        ModelIntegrityError,
    )
}


def is_permanent_file_failure(error_class: str | None) -> bool:
    """Whether a file recorded FAILED as ``error_class`` will fail the same way again (so no attempt retries it).
    A name this vocabulary does not hold as a file's failure (a throttle, a library's own error, an instance's
    setup error, which fails the step by itself) is worth a retry."""
    known = RECORDED.get(error_class or "")
    return bool(known and issubclass(known, FileError) and known.permanent)


class InvalidArgument(PermanentError, ValueError):
    """A value a Shardline function cannot work with (a price that is no number, a quantile outside 0..1, a
    misuse by a caller): the message names it. Still a ValueError, as callers of the builtin expect."""


class InputRefused(PermanentError):
    """An input Shardline will not take as given (a plan whose every key is an unsafe path, a manifest entry or
    local path outside its box): the message names it and what to change."""


class LedgerRecordMissing(PermanentError):
    """A record a step's end counts on is not in the ledger (its STEP item, or the attempt it names): absence is
    never read as success, nor as a newer attempt that moved on. Most often the embedded endpoint lost its state
    (restarted without its data folder). Permanent: no retry brings the record back; the message says what to run."""


class OverBudgetRefused(PermanentError):
    """A job not started: its quote would pass what is left of its run's or its pipeline's day's budget
    (``orchestration.admission``). The message names the budget, the quote and what to do."""


class SubmitRefused(ShardlineError):
    """AWS said "not now" to a job's submit (its quota of the instance type in use, a throttle, a service blip):
    the submit waits and tries again (``decision.fleet.submit_wait``); the wait is no attempt and no failure.

    ``code`` is AWS's error code, ``message`` its words; ``planned`` is the attempt the submit was for (its XCom
    form), planned already and recorded in the ledger: the next try submits that same attempt.
    """

    def __init__(self, code: str, message: str, job_name: str, planned: dict | None = None):
        super().__init__(f"{code}: {message} (job {job_name})")
        self.code, self.message, self.job_name, self.planned = code, message, job_name, planned


class GaveUpWaiting(ShardlineError):
    """Something did not happen in the time Shardline waits for it (a job that would not stop): a retry may see it
    done."""


class TableError(PermanentError):
    """A step's output table refused its commit (a column whose type changed or that is gone, a partition that
    renders empty, a file that is not parquet): the message names the column or value and the way forward."""


class TableCommitFailed(ShardlineError):
    """A step's commit to its output table did not land (the catalog or the warehouse could not be reached, or
    other writers kept winning): nothing was committed, no ``_SUCCESS`` written; the message says how to retry."""
