"""What every `shardline` command shares: its usage line, its option types, and the global options' values
(:class:`Globals`: the DAGs folder, Airflow's URL and token, and the on-call service over them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from shardline.oncall.errors import NotFound
from shardline.oncall.messages import preview_no_pipeline, preview_no_step

if TYPE_CHECKING:
    from shardline.oncall.service import OnCall
    from shardline.spec import PipelineSpec

ENV_DAGS_FOLDER = "SHARDLINE_DAGS_FOLDER"

# How `shardline --help` lists the commands: the on-call flow first, then before launch and the machine.
COMMAND_ORDER = (
    "runs", "status", "failed", "report", "resubmit", "login", "rerun", "trigger", "cancel",
    "preview", "tune", "local", "fleet",
)  # fmt: skip


def default_dags_folder() -> Path:
    for candidate in (os.environ.get(ENV_DAGS_FOLDER), os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")):
        if candidate:
            return Path(candidate)
    return Path.cwd() / "dags"


class Command(click.Command):
    """A command whose usage line reads ``usage: shardline COMMAND ...``, as the README and scripts quote it."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, " ".join(self.collect_usage_pieces(ctx)), prefix="usage: ")


class Group(click.Group):
    command_class = Command

    format_usage = Command.format_usage

    def list_commands(self, ctx: click.Context) -> list[str]:
        # In the on-call flow's order, not the alphabet's: a run's commands, then those for before launch.
        known = [name for name in COMMAND_ORDER if name in self.commands]
        return known + [name for name in self.commands if name not in COMMAND_ORDER]

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.epilog:  # as written: its columns line up
            formatter.write_paragraph()
            formatter.write(self.epilog)


class ShownDefault(click.Option):
    """An option whose help shows its default as it resolves now, from the environment."""

    def get_help_extra(self, ctx: click.Context):
        extra = super().get_help_extra(ctx)
        extra["default"] = str(self.get_default(ctx, call=True))
        return extra


class IsoDate(click.ParamType):
    name = "DATE"

    def convert(self, value, param, ctx) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            self.fail(f"expected an ISO date or time like 2026-11-22T10:00, got {value!r}", param, ctx)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


class JsonObject(click.ParamType):
    """A JSON object given on the command line (a run's conf)."""

    name = "JSON"

    def convert(self, value, param, ctx) -> dict:
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except ValueError as err:
            self.fail(f"not JSON ({err}): give an object such as '{{}}'", param, ctx)
        if not isinstance(parsed, dict):
            self.fail("give a JSON object, such as '{}'", param, ctx)
        return parsed


@dataclasses.dataclass(frozen=True)
class Globals:
    dags_folder: Path
    airflow_url: str | None
    airflow_token: str | None

    def oncall(self) -> OnCall:
        """The service over the specs of the DAGs folder, with Airflow when the CLI can find it."""
        from shardline.oncall.airflow_client import find_settings
        from shardline.oncall.service import OnCall

        settings = find_settings(self.airflow_url, self.airflow_token)
        return OnCall.from_folder(self.dags_folder, airflow=settings.client() if settings else None)

    def pipeline_step(self, pipeline: str, step: str | None) -> tuple[PipelineSpec, str]:
        """The pipeline's spec and the named step (default: its first); NotFound naming what exists otherwise."""
        from shardline.oncall.reads import load_specs

        specs = load_specs(self.dags_folder)
        if pipeline not in specs:
            raise NotFound(preview_no_pipeline(pipeline, self.dags_folder, sorted(specs)))
        names = [s.name for s in specs[pipeline].steps]
        if step and step not in names:
            raise NotFound(preview_no_step(pipeline, step, names))
        return specs[pipeline], step or names[0]


def airflow_token_from(token_file: Path | None, token_on_command_line: str | None) -> str | None:
    """The global token: read from ``--airflow-token-file``; a token on the command line is refused."""
    if token_on_command_line is not None:
        raise click.BadParameter(
            "a token on the command line is visible in ps and kept in shell history: put it in a file only you "
            "can read and pass --airflow-token-file, or set SHARDLINE_AIRFLOW_TOKEN, or run `shardline login`",
            param_hint="--airflow-token",
        )
    return (token_file.read_text().strip() or None) if token_file else None
