"""Key layout of the single-table ledger. Pure string builders, no IO.

    pk = RUN#{pipeline}#{run_id}
    sk = RUN | STEP#{step}# | STEP#{step}#SHARD#{attempt:04d}#{host} | FILE#{step}#{input_key}

    pk = RUNS | RUNS#{pipeline}   sk = {started_at}#{pipeline}#{run_id}   (the run index the CLI and UI list)

    pk = PARTITION#{output_prefix}   sk = LOCK   (which run writes an output prefix now: ledger.partitions)

    pk = BASELINE#{pipeline}   sk = STEP#{step}#   (a step's reference profile for its checks: ledger.baselines)

A step's SHARD items sort right after its STEP item, so one Query on the prefix
``STEP#{step}#`` returns the step and every heartbeat. Attempts are zero-padded so that
the query returns them in order.
"""

from typing import NamedTuple

RUN_SK = "RUN"
# One partition indexes every run by start time. Runs start a few times an hour per
# pipeline, far below a partition's write limit, and listing recent runs is one Query.
RUNS_PK = "RUNS"


class StepRef(NamedTuple):
    """One step of one run of one pipeline: what the ledger keys a step's items by, and how every layer names a
    step (an :class:`~shardline.planning.attempt.Attempt`'s ``ref``)."""

    pipeline: str
    run_id: str
    step: str

    def __str__(self) -> str:
        return f"step {self.step} of {self.pipeline}/{self.run_id}"


def run_pk(pipeline: str, run_id: str) -> str:
    return f"RUN#{pipeline}#{run_id}"


def step_sk(step: str) -> str:
    return f"STEP#{step}#"


def file_sk(step: str, input_key: str) -> str:
    return f"FILE#{step}#{input_key}"


def file_sk_prefix(step: str) -> str:
    return f"FILE#{step}#"


def shard_sk(step: str, attempt: int, host: str) -> str:
    return f"{step_sk(step)}SHARD#{attempt:04d}#{host}"


def failures_pk(pipeline: str) -> str:
    """Partition key of the sparse failures index: one partition per pipeline."""
    return f"FAILED#{pipeline}"


def runs_pk(pipeline: str) -> str:
    """One pipeline's runs, so listing them never reads the other pipelines'."""
    return f"{RUNS_PK}#{pipeline}"


def runs_index_sk(started_at: str, pipeline: str, run_id: str) -> str:
    """``started_at`` is an ISO-8601 UTC timestamp, so the index sorts by start time."""
    return f"{started_at}#{pipeline}#{run_id}"


def is_control_sk(sk: str) -> bool:
    """Whether an item with this sort key is a RUN or STEP item (the orchestrator's), not a FILE or SHARD item."""
    return sk == RUN_SK or (sk.startswith("STEP#") and "#SHARD#" not in sk)


def step_sk_prefix() -> str:
    """Every step of a run and their SHARD items (not the FILE items)."""
    return "STEP#"


PARTITION_LOCK_SK = "LOCK"


def partition_lock_pk(output_prefix: str) -> str:
    """The lock item of one output prefix (``s3://bucket/prefix/``): one run writes it at a time."""
    return f"PARTITION#{output_prefix}"


def baseline_pk(pipeline: str) -> str:
    """The partition of a pipeline's reference profiles (one item per step, keyed by its step_sk)."""
    return f"BASELINE#{pipeline}"
