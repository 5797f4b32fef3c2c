"""The worker's exit codes. Its errors are Shardline's own vocabulary (:mod:`shardline.errors`), shared with the
decision policy that reads what the worker records."""

# Exit codes of `python -m shardline.worker`. The orchestrator reads them, so keep them stable.
EXIT_OK = 0  # every file succeeded (or there was nothing to do)
EXIT_FILES_FAILED = 3  # the job ran; some files failed (see the manifest and the ledger)
EXIT_SETUP_ERROR = 4  # nothing ran: bad model, bad arguments, integrity check failed
EXIT_FENCED = 5  # a newer attempt owns this step; this instance stopped as a zombie
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), as a shell reports it
