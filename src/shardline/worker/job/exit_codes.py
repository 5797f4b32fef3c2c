"""The worker's exit codes. Its errors are Shardline's own vocabulary (:mod:`shardline.errors`), shared with the
decision policy that reads what the worker records. The codes themselves are the contract's: the backends read them.
"""

from shardline.contract import EXIT_FENCED, EXIT_FILES_FAILED, EXIT_OK, EXIT_SETUP_ERROR, EXIT_TERMINATED

__all__ = ["EXIT_FENCED", "EXIT_FILES_FAILED", "EXIT_OK", "EXIT_SETUP_ERROR", "EXIT_TERMINATED"]
