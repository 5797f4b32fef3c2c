"""One instance's job (``shardline.worker.job.run``): the parts that read its arguments and its folders, in this
process; whole jobs run in the worker's own tests (tests/worker/job/test_cli.py and the scenarios)."""

from __future__ import annotations

import argparse
import logging

import pytest

from shardline.errors import SetupError
from shardline.worker.io.formats import TEMP_MARKER
from shardline.worker.job.run import headerless_csv_names, script_protocol, sweep_temp_files, warn_of_requirements


def _args(**given) -> argparse.Namespace:
    flags = {
        "input_csv_header": None,
        "features": None,
        "passthrough": (),
        "content_type": None,
        "accept": None,
        "batch_strategy": None,
        "json_layout": None,
        "max_payload_mb": None,
        "csv_header": None,
        "derives_features": None,
    }
    return argparse.Namespace(**{**flags, **given})


def test_a_headerless_csv_is_named_by_features_and_the_model_gets_only_the_non_passthrough_ones():
    args = _args(input_csv_header="false", features=("id", "f0", "f1"), passthrough=("id",))
    assert headerless_csv_names(args) == ("id", "f0", "f1")
    assert args.features == ("f0", "f1")
    with_header = _args(input_csv_header="true", features=("id", "f0"), passthrough=("id",))
    assert headerless_csv_names(with_header) is None and with_header.features == ("id", "f0")


@pytest.mark.parametrize(
    ("features", "passthrough", "words"),
    [
        (None, (), "nothing in the files names their columns"),
        ("file_order", (), "file_order has no names to take"),
        (("f0", "f1"), ("id",), "passthrough column(s) id are not in input.features"),
        (("id",), ("id",), "input.features names only passthrough columns"),
    ],
)
def test_a_headerless_csv_without_names_for_every_column_is_a_setup_error(features, passthrough, words):
    with pytest.raises(SetupError) as refused:
        headerless_csv_names(_args(input_csv_header="false", features=features, passthrough=passthrough))
    assert words in str(refused.value)


def test_temp_outputs_left_by_an_earlier_try_are_swept_and_nothing_else(tmp_path):
    (tmp_path / "dt=1").mkdir()
    left = [tmp_path / f".a.parquet{TEMP_MARKER}", tmp_path / "dt=1" / f".b.csv.part0002{TEMP_MARKER}"]
    for path in [*left, tmp_path / "a.parquet", tmp_path / "dt=1" / "b.csv"]:
        path.write_bytes(b"x")
    assert sweep_temp_files(tmp_path) == 2
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "a.parquet",
        "dt=1/b.csv",
    ]
    assert sweep_temp_files(tmp_path) == 0


def test_a_custom_scripts_protocol_comes_from_the_flags(caplog):
    args = _args(content_type="application/json", batch_strategy="single-record", max_payload_mb=2.0)
    with caplog.at_level(logging.INFO, logger="shardline.worker"):
        protocol = script_protocol(args, "custom")
    assert (protocol.content_type, protocol.batch_strategy, protocol.max_payload_mb) == (
        "application/json",
        "single_record",
        2.0,
    )
    assert protocol.json_layout == "records" and protocol.accept is None  # what the flags leave unset: the defaults
    assert [r.getMessage() for r in caplog.records] == [f"custom inference.py: requests are {protocol.describe()}"]


def test_the_scripts_flags_for_a_model_that_is_no_script_are_named_as_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="shardline.worker"):
        script_protocol(_args(content_type="text/csv", json_layout="array"), "xgboost")
        script_protocol(_args(accept="text/csv"), "sklearn")
    assert [r.getMessage() for r in caplog.records] == [
        "--content-type, --json-layout apply only to a custom inference.py; ignored for this xgboost model",
        "--accept applies only to a custom inference.py; ignored for this sklearn model",
    ]


def test_a_bad_flag_is_a_setup_error_naming_it():
    with pytest.raises(SetupError, match="--content-type"):
        script_protocol(_args(content_type="text/plain"), "custom")


def test_requirements_are_never_installed_and_what_the_image_lacks_is_named(tmp_path, caplog):
    script = tmp_path / "code" / "inference.py"
    script.parent.mkdir()
    script.write_text("")
    with caplog.at_level(logging.INFO, logger="shardline.worker"):
        warn_of_requirements(script)  # no requirements.txt: nothing to say
        (script.parent / "requirements.txt").write_text("numpy\n")
        warn_of_requirements(script)
        (script.parent / "requirements.txt").write_text("shardline-no-such-package==1.0\n")
        warn_of_requirements(script)
    (met, unmet) = caplog.records
    assert met.levelno == logging.INFO and met.getMessage().endswith("the image already meets every line of it")
    assert unmet.levelno == logging.WARNING
    assert "does not meet: shardline-no-such-package==1.0 (not installed)" in unmet.getMessage()
