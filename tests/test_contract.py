"""What the orchestrator and the worker agree on (``shardline.contract``): pure rules both sides import."""

from __future__ import annotations

import pytest

from shardline import contract


@pytest.mark.parametrize(
    ("limit", "rows", "allowed"),
    [
        (0, 1000, 0),
        (-1, 1000, 0),
        (5, 1000, 5),  # a count
        (5, 2, 5),  # a count is not capped by the rows: a file of 2 rows may reject both
        (0.29, 100, 29),  # 0.29 * 100 is 28.999999999999996 in floating point
        (0.5, 3, 1),  # a fraction rounds down
        (0.001, 999, 0),
        (1, 10, 1),  # 1 is a count, not 100%
    ],
)
def test_rows_allowed_by_a_count_or_a_fraction(limit, rows, allowed):
    assert contract.rows_allowed(limit, rows) == allowed


@pytest.mark.parametrize(
    ("limit", "text"), [(0.05, "0.05 of the file's rows"), (3, "3 row(s)"), (3.0, "3 row(s)"), (0, "0 row(s)")]
)
def test_a_rows_limit_in_words(limit, text):
    assert contract.rows_limit_text(limit) == text


def test_a_rows_limit_of_the_steps_rows_names_them():
    assert contract.rows_limit_text(0.1, of="the step's rows") == "0.1 of the step's rows"


def test_instances_are_named_as_sagemaker_names_them():
    assert contract.host_name(0) == "algo-1"
    assert contract.host_names(3) == ["algo-1", "algo-2", "algo-3"]
    assert contract.host_names(0) == []


@pytest.mark.parametrize(
    ("entries", "instances", "dealt"),
    [
        (["a", "b", "c", "d", "e"], 2, [["a", "c", "e"], ["b", "d"]]),  # entry j to instance j % n
        (["a", "b"], 3, [["a"], ["b"], []]),  # more instances than entries: some get none
        ([], 2, [[], []]),
    ],
)
def test_a_manifest_is_dealt_round_robin(entries, instances, dealt):
    assert contract.deal(entries, instances) == dealt


@pytest.mark.parametrize(
    ("key", "reserved"),
    [
        ("part-0.parquet", False),
        ("dt=2026-11-22/part-0.parquet", False),
        ("my_file.csv", False),  # an underscore inside a name is a name
        ("_SUCCESS", True),
        ("_shardline/manifests/attempt-0001.json", True),
        ("dt=1/_temporary/part-0.parquet", True),
        (".hidden.csv", True),
        ("dt=1/.part-0.parquet.crc", True),
    ],
)
def test_shardlines_own_names_and_hidden_files_are_never_inputs(key, reserved):
    assert contract.is_reserved(key) is reserved


@pytest.mark.parametrize(
    ("instance_type", "vcpus", "memory"),
    [
        ("ml.m5.large", 2, 8.0),
        ("ml.t3.medium", 2, 8.0),
        ("ml.c5.xlarge", 4, 8.0),
        ("ml.c5.2xlarge", 8, 16.0),
        ("ml.r5.24xlarge", 96, 768.0),
        ("ml.g5.12xlarge", 48, 192.0),
        ("ml.p3.2xlarge", 8, 60.0),
        ("ml.inf2.xlarge", 4, 8.0),
        ("ml.z9.xlarge", 4, 16.0),  # a family it does not know: 4 GiB per vCPU
        ("m5.large", None, None),
        ("ml.c5.huge", None, None),
        ("local", None, None),
    ],
)
def test_an_instance_types_size_is_read_from_its_name(instance_type, vcpus, memory):
    assert contract.instance_vcpus(instance_type) == vcpus
    assert contract.instance_memory_gib(instance_type) == memory


def test_the_workers_own_ends_are_its_exit_codes_but_a_signal():
    assert {contract.EXIT_OK, contract.EXIT_FILES_FAILED, contract.EXIT_SETUP_ERROR, contract.EXIT_FENCED} == (
        contract.WORKER_ENDS
    )
    assert contract.EXIT_TERMINATED not in contract.WORKER_ENDS
    assert len({contract.EXIT_OK, contract.EXIT_FILES_FAILED, contract.EXIT_SETUP_ERROR, contract.EXIT_FENCED}) == 4
    # the documented values: the backends and anyone's wrapper scripts read them
    assert (contract.EXIT_OK, contract.EXIT_FILES_FAILED, contract.EXIT_SETUP_ERROR, contract.EXIT_FENCED) == (
        0,
        3,
        4,
        5,
    )
    assert contract.EXIT_TERMINATED == 128 + 15  # SIGTERM, as a shell reports it


def test_the_container_layout_is_under_sagemakers_processing_root():
    for path in (contract.DATA_DIR, contract.MODEL_DIR, contract.OUTPUT_DIR, contract.METADATA_DIR):
        assert path.startswith(contract.CONTAINER_ROOT + "/")
    assert len({contract.DATA_DIR, contract.MODEL_DIR, contract.OUTPUT_DIR, contract.METADATA_DIR}) == 4
