"""Which table, run, step and attempt an instance writes as, read from its environment.

Kept free of pynamodb and boto imports, so a worker that runs standalone pays nothing
for the ledger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from shardline.errors import PermanentError, ShardlineError

# Environment a pipeline sets on each processing job. Without SHARDLINE_LEDGER_TABLE the
# worker runs standalone and touches no AWS at all.
ENV_TABLE = "SHARDLINE_LEDGER_TABLE"
ENV_PIPELINE = "SHARDLINE_PIPELINE"
ENV_RUN_ID = "SHARDLINE_RUN_ID"
ENV_STEP = "SHARDLINE_STEP"
ENV_ATTEMPT = "SHARDLINE_ATTEMPT"
ENV_INPUT_URI = "SHARDLINE_INPUT_URI"
ENV_OUTPUT_URI = "SHARDLINE_OUTPUT_URI"
# Where the instance puts its own manifest (a folder keyed by run, step and attempt), and the KMS key its uploads
# use: the instance uploads each output itself as its file finishes (worker/job/uploads.py).
ENV_MANIFEST_URI = "SHARDLINE_MANIFEST_URI"
ENV_OUTPUT_KMS_KEY_ID = "SHARDLINE_OUTPUT_KMS_KEY_ID"
ENV_RETENTION_DAYS = "SHARDLINE_LEDGER_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 90  # as shardline.ledger.table's; repeated here to keep this module import-free
REQUIRED_ENV = (ENV_PIPELINE, ENV_RUN_ID, ENV_STEP, ENV_ATTEMPT)


class LedgerConfigError(PermanentError, ValueError):
    """The ledger environment is incomplete or malformed."""


class StaleAttemptError(ShardlineError):
    """A newer attempt owns the step (or this record of it): the caller's attempt is stale. A worker of the old
    attempt (a zombie) stops; an orchestrator that lost the fenced write (a watch's retry, or an on-call engineer
    who resubmitted or cancelled first) follows the step where it is now."""


@dataclasses.dataclass(frozen=True)
class LedgerContext:
    """Which table, run, step and attempt an instance writes as."""

    table: str
    pipeline: str
    run_id: str
    step: str
    attempt: int
    input_uri: str = ""  # S3 prefix the instance's input dir mirrors; prefixes file keys
    output_uri: str = ""
    retention_days: int = DEFAULT_RETENTION_DAYS  # the items it writes expire this long after
    manifest_uri: str = ""  # the S3 folder of this attempt's instance manifests
    output_kms_key_id: str = ""  # SSE-KMS for what the instance uploads ("" = the bucket's default)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LedgerContext | None:
        """Read the context from the environment; ``None`` when no ledger is configured."""
        table = env.get(ENV_TABLE, "").strip()
        if not table:
            return None
        missing = [name for name in REQUIRED_ENV if not env.get(name, "").strip()]
        if missing:
            raise LedgerConfigError(
                f"{ENV_TABLE}={table} is set, so the worker writes to the ledger, but "
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not. Set them all, "
                f"or unset {ENV_TABLE} to run standalone."
            )
        try:
            attempt = int(env[ENV_ATTEMPT])
        except ValueError as err:
            raise LedgerConfigError(f"{ENV_ATTEMPT} must be an integer, got {env[ENV_ATTEMPT]!r}") from err
        if attempt < 1:
            raise LedgerConfigError(f"{ENV_ATTEMPT} must be >= 1, got {attempt}")
        retention = env.get(ENV_RETENTION_DAYS, "").strip() or str(DEFAULT_RETENTION_DAYS)
        if not retention.isdigit() or int(retention) < 1:
            raise LedgerConfigError(f"{ENV_RETENTION_DAYS} must be a whole number of days >= 1, got {retention!r}")
        return cls(
            table=table,
            pipeline=env[ENV_PIPELINE],
            run_id=env[ENV_RUN_ID],
            step=env[ENV_STEP],
            attempt=attempt,
            input_uri=env.get(ENV_INPUT_URI, ""),
            output_uri=env.get(ENV_OUTPUT_URI, ""),
            retention_days=int(retention),
            manifest_uri=env.get(ENV_MANIFEST_URI, ""),
            output_kms_key_id=env.get(ENV_OUTPUT_KMS_KEY_ID, ""),
        )

    def to_env(self) -> dict[str, str]:
        """The environment :meth:`from_env` reads back: what a job's request sets for its instances."""
        return {
            ENV_TABLE: self.table,
            ENV_PIPELINE: self.pipeline,
            ENV_RUN_ID: self.run_id,
            ENV_STEP: self.step,
            ENV_ATTEMPT: str(self.attempt),
            ENV_INPUT_URI: self.input_uri,
            ENV_OUTPUT_URI: self.output_uri,
            ENV_RETENTION_DAYS: str(self.retention_days),
            ENV_MANIFEST_URI: self.manifest_uri,
            **({ENV_OUTPUT_KMS_KEY_ID: self.output_kms_key_id} if self.output_kms_key_id else {}),
        }

    def input_key(self, relative_path: str) -> str:
        return join_uri(self.input_uri, relative_path)

    def output_key(self, relative_path: str) -> str:
        return join_uri(self.output_uri, relative_path)


def join_uri(prefix: str, relative_path: str) -> str:
    if not prefix:
        return relative_path
    return prefix.rstrip("/") + "/" + relative_path
