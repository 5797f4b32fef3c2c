"""cli.py: help, argument errors, setup errors and their exit codes, host identity and the manifest."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from examples import synthetic
from shardline.contract import EXIT_FENCED, EXIT_FILES_FAILED, EXIT_OK, EXIT_SETUP_ERROR
from shardline.worker import __version__
from shardline.worker.job.cli import build_parser, resolve_host
from tests.support.helpers import WORKER, clean_env, describe, load_manifest, run_worker, write_inference_script


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WORKER, *args], env=env or clean_env(), capture_output=True, text=True, timeout=120, check=False
    )


def test_help_exits_0_and_documents_the_exit_codes():
    result = _cli("--help")
    assert result.returncode == 0, describe(result)
    text = result.stdout
    assert "exit codes:" in text
    for code in (EXIT_OK, EXIT_FILES_FAILED, EXIT_SETUP_ERROR, EXIT_FENCED):
        assert f"\n  {code}  " in text, f"exit code {code} is not documented"
    for name in ("SHARDLINE_MODEL_SHA256", "SHARDLINE_LEDGER_TABLE", "AWS_ENDPOINT_URL", "--input-dir", "--workers"):
        assert name in text


def test_version():
    result = _cli("--version")
    assert result.returncode == 0
    assert __version__ in result.stdout


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "-3"], "--workers"),
        (["--workers", "two"], "--workers"),
        (["--batch-rows", "0"], "--batch-rows"),
        (["--output-format", "xml"], "--output-format"),
        (["--features", " , "], "--features"),
        (["--no-such-option"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_exit_2(args, complaint):
    result = _cli(*args)
    assert result.returncode == 2, describe(result)
    assert complaint in result.stderr


def test_parser_splits_column_lists():
    args = build_parser().parse_args(["--features", "a, b,,c", "--passthrough", "id"])
    assert args.features == ("a", "b", "c")
    assert args.passthrough == ("id",)
    assert build_parser().parse_args([]).features is None


def test_missing_input_dir_exits_4_with_a_clear_message(tmp_path, sklearn_model):
    out = tmp_path / "out"
    result = run_worker(tmp_path / "nope", out, sklearn_model.parent)
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert f"input directory {tmp_path / 'nope'} does not exist" in result.stderr
    assert "--input-dir" in result.stderr
    assert not out.exists()


def test_missing_model_dir_exits_4(tmp_path):
    (tmp_path / "in").mkdir()
    result = run_worker(tmp_path / "in", tmp_path / "out", tmp_path / "no-model")
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "model directory" in result.stderr and "does not exist" in result.stderr


def test_no_model_in_model_dir_exits_4(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("hello")
    result = run_worker(tmp_path / "in", tmp_path / "out", tmp_path / "model")
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "no model found" in result.stderr and "notes.txt" in result.stderr


@pytest.mark.slow
def test_a_model_that_cannot_load_in_the_workers_exits_4(tmp_path):
    inputs = tmp_path / "in"
    synthetic.make_dataset(inputs, files=2, rows=200)
    model_dir = tmp_path / "model"
    write_inference_script(
        model_dir,
        """
        def model_fn(model_dir):
            raise RuntimeError("weights are missing")
    """,
    )
    result = run_worker(inputs, tmp_path / "out", model_dir, "--passthrough", "id")
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "weights are missing" in result.stderr
    assert not list((tmp_path / "out").glob("*.parquet"))


@pytest.mark.slow
def test_a_file_that_is_not_torchscript_exits_4(tmp_path):
    inputs = tmp_path / "in"
    synthetic.make_dataset(inputs, files=1, rows=100)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.pt").write_bytes(b"not a zip archive")
    result = run_worker(inputs, tmp_path / "out", tmp_path / "model", "--passthrough", "id")
    assert result.returncode == EXIT_SETUP_ERROR, describe(result)
    assert "not a TorchScript archive" in result.stderr


def test_empty_input_dir_is_nothing_to_do(tmp_path, sklearn_model):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "README.txt").write_text("not data")
    (inputs / "_SUCCESS").write_text("")
    out.mkdir()
    stale = out / ".old.parquet.shardline-tmp"
    stale.write_bytes(b"half a file")
    config = tmp_path / "resourceconfig.json"
    config.write_text(json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}))
    summary = tmp_path / "reports" / "summary.json"
    result = subprocess.run(
        [
            *WORKER,
            "--input-dir",
            str(inputs),
            "--output-dir",
            str(out),
            "--model-dir",
            str(sklearn_model.parent),
            "--resource-config",
            str(config),
            "--scratch-dir",
            str(tmp_path / "scratch"),
            "--summary-json",
            str(summary),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == EXIT_OK, describe(result)
    assert "nothing to do" in result.stderr
    assert "README.txt" in result.stderr, "unknown files are named in a warning"
    assert not stale.exists(), "temp outputs of an earlier run are swept"
    manifest = load_manifest(out, "algo-2")
    assert (manifest["host"], manifest["hosts"]) == ("algo-2", ["algo-1", "algo-2"])
    assert (manifest["files"], manifest["succeeded"], manifest["failed"]) == (0, 0, 0)
    assert json.loads(summary.read_text()) == manifest


def test_resolve_host(tmp_path):
    config = tmp_path / "resourceconfig.json"
    assert resolve_host(config, "algo-9") == ("algo-9", ["algo-9"])
    assert resolve_host(config, None) == (socket.gethostname(), [socket.gethostname()])
    config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1", "algo-2", "algo-3"]}))
    assert resolve_host(config, None) == ("algo-1", ["algo-1", "algo-2", "algo-3"])
    assert resolve_host(config, "override") == ("override", ["override"])
    config.write_text(json.dumps({"current_host": "solo"}))
    assert resolve_host(config, None) == ("solo", ["solo"])
