"""What the `shardline` commands print (``shardline.oncall.printing``): text from the ledger is printed as
written, never as markup or terminal controls, through the installed command."""

from __future__ import annotations

import json

import pytest

from shardline.ledger.keys import StepRef
from shardline.oncall.printing import preview_reply, tune_reply
from shardline.oncall.tune import TuneResult
from shardline.orchestration.step.preview import PreviewResult
from tests.support.cli import run, write_spec

# What a crafted S3 key, a worker's error message echoing an input row, or a step message could hold: rich
# markup (a fake status, a link), and terminal controls (clear screen, an OSC 8 link, a window title, a cursor
# move, carriage return and backspace that overwrite what was printed, a bidi override that reorders it).
MARKUP = "[bold red]FAKE OK[/bold red]"
LINK = "[link=file:///etc]x[/link]"
CONTROLS = "\x1b[2J\x1b]8;;file:///etc\x1b\\click\x1b]8;;\x1b\\\x1b]0;pwned\x07\x1b[1A\r\b\u202e"
HOSTILE = {
    "key_name": f"part-{MARKUP}{CONTROLS}.parquet",
    "error_class": f"Corrupt{MARKUP}Error",
    "error_message": f"row 7: {LINK} {CONTROLS} :warning:",
    "host": f"algo-1{CONTROLS}",
    "step_message": f"{MARKUP} {LINK}{CONTROLS}",
    "run_message": f"{LINK}{CONTROLS}",
    "step_name": f"sc{MARKUP}{CONTROLS}ore",
}


def assert_printed_as_written(text: str, *expected: str) -> None:
    """No terminal control reached the output, and each expected text is there verbatim (markup not read)."""
    assert not [ch for ch in text if not ch.isprintable() and ch not in "\n"], repr(text)
    for part in expected:
        assert part in text, (part, text)


@pytest.fixture
def hostile_run(aws_env, ledger_table, tmp_path):
    """A failed run whose ledger holds hostile text: written with the ledger's own functions, as a worker would."""
    from shardline.ledger.context import LedgerContext
    from shardline.ledger.job_writes import FinishedFile, WorkerLedger
    from shardline.ledger.states import FileStatus, StepStatus
    from shardline.ledger.step_writes import ensure_run, finish_step, set_run_status, start_attempt
    from shardline.ledger.table import bind_ledger

    write_spec(tmp_path / "dags", ledger_table)
    model = bind_ledger(ledger_table)
    key = "s3://b/in/" + HOSTILE["key_name"]
    ensure_run(model, "p", "run-1")
    start_attempt(
        model,
        StepRef("p", "run-1", "score"),
        1,
        [(key, 10), ("s3://b/in/good.parquet", 10)],
        plan_json=json.dumps(
            {
                "input_prefix": "s3://b/in/",
                "output_prefix": "s3://b/out/",
                "model_uri": "s3://b/model.tar.gz",
                "requested_instances": 1,
            }
        ),
    )
    worker = WorkerLedger(
        LedgerContext(ledger_table, "p", "run-1", "score", 1, input_uri="s3://b/in/"), HOSTILE["host"]
    )
    worker.claim_file(HOSTILE["key_name"])
    worker.finish_file(
        HOSTILE["key_name"],
        FinishedFile(FileStatus.FAILED, error_class=HOSTILE["error_class"], error_message=HOSTILE["error_message"]),
    )
    finish_step(model, StepRef("p", "run-1", "score"), 1, StepStatus.FAILED, HOSTILE["step_message"])
    set_run_status(model, "p", "run-1", StepStatus.FAILED, HOSTILE["run_message"])
    # A second run, still going, with a STEP item of a hostile name: what `cancel` lists.
    ensure_run(model, "p", "run-2")
    start_attempt(model, StepRef("p", "run-2", HOSTILE["step_name"]), 1, [])
    env = {**aws_env, "SHARDLINE_LOCAL_ROOT": str(tmp_path / "local"), "COLUMNS": "400"}  # wide: no cell folds
    return ["--dags-folder", str(tmp_path / "dags")], env, key


def test_ledger_text_is_printed_as_written_never_as_markup_or_terminal_controls(hostile_run):
    folder, env, key = hostile_run
    runs = run(*folder, "runs", env=env)
    assert runs.returncode == 0, runs.stderr
    # Wide enough for the message whole: every control escaped, the carriage return too.
    assert_printed_as_written(runs.stdout, LINK, "\\x1b[2J", "\\r\\x08\\u202e")

    status = run(*folder, "status", "p/run-1", env=env)
    assert status.returncode == 0, status.stderr
    assert_printed_as_written(status.stdout, f"  {LINK}\\x1b[2J", f"step score: {MARKUP} {LINK}\\x1b[2J")

    failed = run(*folder, "failed", "p/run-1", env=env)
    assert failed.returncode == 0, failed.stderr
    printed_key = (
        key.replace("\x1b", "\\x1b")
        .replace("\x07", "\\x07")
        .replace("\r", "\\r")
        .replace("\b", "\\x08")
        .replace("\u202e", "\\u202e")
    )
    # (the ERROR cell may wrap at a space: its parts are looked for one by one)
    assert_printed_as_written(
        failed.stdout,
        printed_key,
        f"Corrupt{MARKUP}Error: row 7: {LINK}",
        "\\x1b[2J\\x1b]8;;",
        ":warning:",
        "algo-1\\x1b[2J",
    )

    resubmit = run(
        *folder, "resubmit", "p/run-1", "--step", "score", "--all-failed", "--dry-run", "--ledger-only", env=env
    )
    assert resubmit.returncode == 0, resubmit.stderr
    assert_printed_as_written(resubmit.stdout, f"  {printed_key}")

    cancel = run(*folder, "cancel", "p/run-2", "--yes", env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert_printed_as_written(cancel.stdout, f"step sc{MARKUP}\\x1b[2J")


def test_json_output_keeps_ledger_text_exact_and_escaped(hostile_run):
    folder, env, key = hostile_run
    failed = run(*folder, "failed", "p/run-1", "--json", env=env)
    assert failed.returncode == 0, failed.stderr
    assert "\x1b" not in failed.stdout and "\r" not in failed.stdout  # JSON writes them as \u001b, \r
    [row] = [r for r in json.loads(failed.stdout) if r["status"] == "FAILED"]
    assert (row["input_key"], row["host"], row["error_class"], row["error_message"]) == (
        key,
        HOSTILE["host"],
        HOSTILE["error_class"],
        HOSTILE["error_message"],
    )
    status = json.loads(run(*folder, "status", "p/run-1", "--json", env=env).stdout)
    assert (status["message"], status["steps"][0]["message"]) == (HOSTILE["run_message"], HOSTILE["step_message"])


def test_an_error_message_prints_terminal_controls_escaped(hostile_run):
    folder, env, _ = hostile_run
    result = run(*folder, "status", f"p/nope{CONTROLS}", env=env)
    assert result.returncode == 1
    assert_printed_as_written(result.stderr, "no run p/nope\\x1b[2J")


def test_a_waiting_step_says_what_it_waits_for_in_status_and_runs(aws_env, ledger_table, tmp_path):
    """A step whose submit waits (the fleet's quota, a refused submit) is PLANNED with no job yet: its note is what
    `status` prints for it (not only `--json`), and what `runs` says of its run."""
    from shardline.decision.fleet import Admission, Waiting
    from shardline.ledger.step_writes import ensure_run, note_step, start_attempt
    from shardline.ledger.table import bind_ledger

    write_spec(tmp_path / "dags", ledger_table)
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", "run-w")
    start_attempt(model, StepRef("p", "run-w", "score"), 1, [])
    waiting = Waiting(admission=Admission("ml.m5.xlarge", 2, quota=4))
    assert note_step(model, StepRef("p", "run-w", "score"), 1, waiting.to_json())  # data, rendered by the views
    note = "waiting for 2 ml.m5.xlarge instance(s) within the account's quota of 4 (pool sagemaker-ml.m5.xlarge"
    env = {**aws_env, "SHARDLINE_LOCAL_ROOT": str(tmp_path / "local"), "COLUMNS": "400"}
    status = run("--dags-folder", str(tmp_path / "dags"), "status", "p/run-w", env=env)
    assert status.returncode == 0, status.stderr
    assert f"step score: {note}" in status.stdout, status.stdout
    runs = run("--dags-folder", str(tmp_path / "dags"), "runs", env=env)
    assert f"step score: {note}" in runs.stdout, runs.stdout
    # Once submitted, the note goes from both.
    assert json.loads(run("--dags-folder", str(tmp_path / "dags"), "status", "p/run-w", "--json", env=env).stdout)[
        "steps"
    ][0]["waiting"] == json.loads(waiting.to_json())
    assert note_step(model, StepRef("p", "run-w", "score"), 1, None)
    assert "waiting for" not in run("--dags-folder", str(tmp_path / "dags"), "runs", env=env).stdout


@pytest.mark.parametrize("columns", ["80", "120", "250"])
def test_runs_never_cuts_a_command_and_names_each_in_its_row(monkeypatch, capsys, columns):
    """A MISSING row's command (and any other a message holds) is printed whole on a line of its own under the
    table, named by its number in the row; at 80 columns each message goes on its own lines under its row."""
    from pathlib import Path

    from shardline.oncall import printing
    from shardline.oncall.values import RunRow

    trigger = "shardline trigger tabular_scoring_hourly --partition 2026-11-22T12:00"
    resubmit = "shardline resubmit tabular_scoring_hourly/manual__2026-11-22T11:00:00+00:00 --step score --all-failed"
    rows = [
        RunRow(
            "tabular_scoring_hourly",
            "-",
            "MISSING",
            None,
            None,
            "no run scores the interval starting 2026-11-22T12:00:00Z, past its settle time: score it with "
            f"`{trigger}` (3 more interval(s) before it are missing too)",
            partition="2026-11-22T12:00:00",
        ),
        RunRow(
            "tabular_scoring_hourly",
            "manual__2026-11-22T11:00:00+00:00",
            "FAILED",
            "2026-11-22T12:05:00+00:00",
            "2026-11-22T12:09:00+00:00",
            f"step score: 1 of 5 file(s) failed; after fixing the cause: `{resubmit}`",
            partition="2026-11-22T11:00:00",
        ),
    ]
    monkeypatch.setenv("COLUMNS", columns)
    printing.show_runs(rows, pipeline=None, dags_folder=Path("dags"), airflow_warning=None)
    lines = capsys.readouterr().out.splitlines()
    assert f"[1] {trigger}" in lines and f"[2] {resubmit}" in lines, lines
    text = "\n".join(lines)
    assert text.count("shardline trigger") == 1 and text.count("shardline resubmit") == 1  # never a cut copy
    assert "score it with [1]" in text and "after fixing the cause: [2]" in text, text
    assert all(line == line.rstrip() for line in lines)
    if columns == "80":
        assert all(len(line) <= 80 for line in lines if line.startswith("    ")), lines


def test_a_worker_tools_json_is_its_result_less_the_rendered_text_and_the_log():
    preview = PreviewResult("score", "s3://m/model.tar.gz", "s3://in/a.csv", 0, "TEXT", {"rows": 20}, "LOG")
    assert preview_reply(preview).data == {
        "step": "score",
        "model_uri": "s3://m/model.tar.gz",
        "sample_uri": "s3://in/a.csv",
        "exit_code": 0,
        "report": {"rows": 20},
    }
    tune = TuneResult(
        "score", "s3://m/model.tar.gz", "s3://in/", "run r1", ["s3://in/a.csv"], 0, "TEXT", {"best": 1}, None, "LOG"
    )
    assert tune_reply(tune).data == {
        "step": "score",
        "model_uri": "s3://m/model.tar.gz",
        "input_uri": "s3://in/",
        "source": "run r1",
        "sample": ["s3://in/a.csv"],
        "exit_code": 0,
        "figures": {"best": 1},
        "plot": None,
    }
