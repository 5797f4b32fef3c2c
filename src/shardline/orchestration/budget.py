"""A run's budget and what it has spent, read from the ledger: what a step's watch holds the run to
(``budget_for``), and what the pipeline's runs of a day have spent (``spent_today``). The arithmetic is
:mod:`shardline.decision.budget`'s."""

from __future__ import annotations

import dataclasses
import datetime as dt

from shardline.decision.budget import RUN_SETTING, RunBudget, spend_of
from shardline.errors import InvalidArgument
from shardline.ledger.keys import runs_pk
from shardline.ledger.step_reads import read_run, read_run_item
from shardline.orchestration import services
from shardline.planning.attempt import Attempt
from shardline.report.cost import Prices, UnknownPriceError
from shardline.spec import PipelineSpec

RAISED_SETTING = "raised by `shardline resubmit --budget-usd`"


def prices_for(spec: PipelineSpec, step: str) -> tuple[Prices, str | None]:
    """The spec's prices over the shipped table, and a note when the local backend's price is unknown.

    The local backend costs its instance type's SageMaker price unless cost.local_price_per_hour says
    otherwise: what the same run would cost in the cloud.
    """
    local = spec.cost.local_price_per_hour
    prices = Prices.default(spec.cost.prices, local_per_hour=local or 0.0)
    if spec.backend != "local" or local is not None:
        return prices, None
    instance_type = spec.step(step).resources.instance_type
    try:
        return dataclasses.replace(prices, local_per_hour=prices.hourly(instance_type)), None
    except UnknownPriceError as err:
        return prices, f"the local run is priced at 0: {err} (or set cost.local_price_per_hour)"


def step_price(spec: PipelineSpec, step: str, instance_type: str | None = None) -> float:
    """USD an hour of one of the step's instances (its own type, or ``instance_type``), as its report prices it.
    Raises InvalidArgument naming the setting when it cannot be priced: a budget that counted such an instance at 0
    would never stop it."""
    prices, note = prices_for(spec, step)
    if note is not None:  # the local backend, an instance type with no price, and no cost.local_price_per_hour
        raise InvalidArgument(f"step {step}: {note}; a budget cannot hold a run it cannot price")
    try:
        return prices.hourly(instance_type or spec.step(step).resources.instance_type, spec.backend)
    except UnknownPriceError as err:
        raise InvalidArgument(f"step {step}: {err}; a budget cannot hold a run it cannot price") from None


def run_spent(spec: PipelineSpec, run_id: str, *, except_step: str | None = None) -> float:
    """USD the run's instances have cost so far (every step's but ``except_step``'s), each to its last heartbeat:
    one Query of the run."""
    records = read_run(services.ledger_model(spec), spec.pipeline, run_id)
    spent = 0.0
    for step in {s.step for s in records.shards if s.step and s.step != except_step}:
        if step not in {s.name for s in spec.steps}:
            continue  # a step the spec no longer has: its price is unknown
        shards = [s for s in records.shards if s.step == step]
        spent += spend_of(shards, step_price(spec, step))  # ended steps: each instance to its last heartbeat
    return spent


def run_budget(spec: PipelineSpec, run_id: str) -> tuple[float, str] | None:
    """The run's budget and where it came from: on-call's raise (the RUN item), else the spec's, else None."""
    run = read_run_item(services.ledger_model(spec), spec.pipeline, run_id)
    if run is not None and run.budget_usd:
        return run.budget_usd, RAISED_SETTING
    if spec.budget.run_usd is not None:
        return spec.budget.run_usd, RUN_SETTING
    return None


def budget_for(spec: PipelineSpec, attempt: Attempt) -> RunBudget | None:
    """What the watch of ``attempt`` holds its run to, or None when the run has no budget."""
    found = run_budget(spec, attempt.run_id)
    if found is None:
        return None
    budget, setting = found
    return RunBudget(
        run_usd=budget,
        spent_before_usd=run_spent(spec, attempt.run_id, except_step=attempt.step),
        price_per_hour=step_price(spec, attempt.step, attempt.instance_type),
        setting=setting,
    )


def spent_today(spec: PipelineSpec, now: dt.datetime | None = None) -> float:
    """USD the pipeline's runs started on this UTC day have spent so far (``budget.daily_usd`` counts these)."""
    now = now or dt.datetime.now(dt.UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    model = services.ledger_model(spec)
    runs = model.query(runs_pk(spec.pipeline), model.sk >= midnight.isoformat())  # the pipeline's run index
    return sum(run_spent(spec, r.run_id) for r in runs)
