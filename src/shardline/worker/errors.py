"""The worker's small exception hierarchy, and the exit codes it maps to."""

# Exit codes of `python -m shardline.worker`. The orchestrator reads them, so keep them stable.
EXIT_OK = 0  # every file succeeded (or there was nothing to do)
EXIT_FILES_FAILED = 3  # the job ran; some files failed (see the manifest and the ledger)
EXIT_SETUP_ERROR = 4  # nothing ran: bad model, bad arguments, integrity check failed
EXIT_FENCED = 5  # a newer attempt owns this step; this instance stopped as a zombie
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), as a shell reports it


class WorkerError(Exception):
    """Base class of the worker's own errors."""


class SetupError(WorkerError):
    """A fatal problem before any file can be processed (exit code 4).

    In a pipeline the instance records it, and the step fails at once without a retry: the same model and
    settings fail the same way on every attempt. A problem of this host alone is a :class:`HostSetupError`.
    """

    permanent = True


class HostSetupError(SetupError):
    """A setup problem of this instance's host, not of the model or settings (a full disk, a pool that could
    not start): the job exits 4, and its files are retried on a next attempt like a lost instance's."""

    permanent = False


class ModelIntegrityError(SetupError):
    """The model artifact does not match its pinned sha256."""


class FileError(WorkerError):
    """One input file cannot be processed. It fails alone; the others go on."""


class InputSchemaError(FileError):
    """A feature or passthrough column is missing or has the wrong type."""


class CorruptInputError(FileError):
    """The file cannot be read in its format."""


class InputFormatError(FileError):
    """The file's name says another format than the step reads, or none the worker knows."""


class PredictionError(FileError):
    """The model raised, or returned something that cannot be written, for this file."""
