"""The worker's exit codes (``shardline.worker.job.exit_codes``): the contract's codes, which the backends read, by
the names the worker uses."""

from __future__ import annotations

from shardline import contract
from shardline.worker.job import exit_codes


def test_the_worker_exits_with_the_contracts_codes():
    assert {name: getattr(exit_codes, name) for name in exit_codes.__all__} == {
        name: getattr(contract, name) for name in exit_codes.__all__
    }
    assert (exit_codes.EXIT_OK, exit_codes.EXIT_FILES_FAILED, exit_codes.EXIT_SETUP_ERROR, exit_codes.EXIT_FENCED) == (
        0,
        3,
        4,
        5,
    )
    assert exit_codes.EXIT_TERMINATED == 128 + 15  # SIGTERM, as a shell reports it
