"""`shardline local`: the embedded AWS stack (moto_server on loopback) a laptop or CI runs the pipelines
against: start it with the buckets and ledger tables the specs name, stop it, say whether it is up. Its S3
objects and ledger tables are kept on disk (:func:`aws_state_dir`): a restart finds them.

Its pid and URL are kept in one place per user (:func:`default_state_dir`), so `down` and `status` find it from
any directory. The embedded endpoint itself is :mod:`shardline.local.embedded_aws`, imported only when used.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from shardline.local import embedded_aws
from shardline.local.embedded_aws import is_moto_command
from shardline.local.provision import apply, make_plan
from shardline.oncall.printing import EXIT_ERROR, EXIT_OK, Reply, lines_reply


def default_state_dir() -> Path:
    """Where `shardline local` keeps the stack's pid, URL and log: one place per user, so `down` and
    `status` find the stack from any directory ($SHARDLINE_STATE_DIR, else $XDG_STATE_HOME/shardline/local,
    else ~/.local/state/shardline/local)."""
    if os.environ.get("SHARDLINE_STATE_DIR"):
        return Path(os.environ["SHARDLINE_STATE_DIR"])
    base = Path(os.environ["XDG_STATE_HOME"]) if os.environ.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "shardline" / "local"


def _stack_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def aws_state_dir(state_dir: Path) -> Path:
    """Where the endpoint keeps its S3 objects and ledger tables across restarts (wiped by deleting it)."""
    return state_dir / "aws"


def _is_moto(pid: int) -> bool:
    """Whether ``pid`` is still the moto_server we started (a pid can be reused after a reboot)."""
    import psutil

    try:
        return is_moto_command(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _exports(url: str) -> list[str]:

    return [
        "point this shell at it with:",
        *(f"  export {name}={value}" for name, value in embedded_aws.env_for(url).items()),
    ]


def _create_resources(dags_folder: Path) -> list[str]:
    """The buckets and ledger tables every pipeline spec refers to."""
    return apply(make_plan(dags_folder / "pipelines"))


def up(state_dir: Path, port: int | None, dags_folder: Path) -> Reply:
    """Start the stack (or adopt the one already up) and create what the specs under ``dags_folder`` name."""
    state_file = _stack_file(state_dir)
    if state_file.exists():
        state = json.loads(state_file.read_text())
        if embedded_aws.answers(state["url"]):
            return lines_reply(
                [f"the embedded stack is already up at {state['url']} (pid {state['pid']})", *_exports(state["url"])]
            )
    proc, url = embedded_aws.start_moto(state_dir / "moto.log", port=port, state_dir=aws_state_dir(state_dir))
    state_dir.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps({"pid": proc.pid, "url": url}))
    embedded_aws.apply_env(embedded_aws.env_for(url))
    created = _create_resources(dags_folder)
    return lines_reply(
        [
            f"embedded AWS endpoint (moto_server) up at {url}, pid {proc.pid}, log {state_dir / 'moto.log'}",
            *(f"  {line}" for line in created),
            f"its S3 objects and ledger tables are kept in {aws_state_dir(state_dir)} across restarts; to start "
            f"empty: shardline local down && rm -rf {aws_state_dir(state_dir)}",
            *_exports(url),
            "stop it with: shardline local down",
        ]
    )


def down(state_dir: Path) -> Reply:
    """Stop the stack recorded in ``state_dir``, if it is still the moto_server we started."""
    state_file = _stack_file(state_dir)
    if not state_file.exists():
        return lines_reply(["no embedded stack recorded as running; nothing to stop"])
    state = json.loads(state_file.read_text())
    said = f"the embedded stack (pid {state['pid']}) had already stopped"
    if _is_moto(state["pid"]):
        try:
            os.killpg(state["pid"], signal.SIGTERM)
            said = f"stopped the embedded stack at {state['url']} (pid {state['pid']})"
        except ProcessLookupError:
            pass
    state_file.unlink()
    return lines_reply([said])


def status(state_dir: Path) -> Reply:
    """Whether the stack recorded in ``state_dir`` answers (exit 1 when it is down or not answering)."""
    state_file = _stack_file(state_dir)
    if not state_file.exists():
        return lines_reply(["the embedded stack is down; start it with: shardline local up"], EXIT_ERROR)
    state = json.loads(state_file.read_text())
    is_up = embedded_aws.answers(state["url"])
    said = f"embedded stack at {state['url']}: {'up' if is_up else 'not answering'} (pid {state['pid']})" + (
        "" if is_up else "; restart it with: shardline local down && shardline local up"
    )
    return lines_reply([said, *(_exports(state["url"]) if is_up else [])], EXIT_OK if is_up else EXIT_ERROR)
