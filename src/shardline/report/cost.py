"""What a step cost: instance-seconds per instance type times its hourly price. Pure.

The shipped table (:data:`SAGEMAKER_PROCESSING_PRICES`) is on-demand SageMaker Processing in
us-east-1, USD per instance-hour. Prices change and differ per region, savings plan and
discount, so a pipeline overrides any of them (the spec's :data:`PRICE_SETTING`, a mapping of
instance type to USD per hour), and the local backend, which runs on a machine of its own, is
priced at ``local_per_hour`` (0 unless set).

SageMaker bills an instance from its start-up to its end, rounded up to the second; the report
sees only what the ledger recorded (first claim to last heartbeat), so its figure is a lower
bound of the bill: provisioning and image download are not in it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from shardline.errors import InvalidArgument, ShardlineError

# The setting a DAG author changes to price an instance type (named in every error).
PRICE_SETTING = "cost.prices"
LOCAL_PRICE_SETTING = "cost.local_price_per_hour"
BACKENDS = ("sagemaker", "local")

# Source: https://aws.amazon.com/sagemaker/pricing/ (on-demand, "Processing", US East (N. Virginia)),
# as listed in 2024-2025. Written down by hand, not fetched: check the page, and override what differs.
PRICES_SOURCE = "aws.amazon.com/sagemaker/pricing, on-demand SageMaker Processing, us-east-1, 2024-2025 list prices"
SAGEMAKER_PROCESSING_PRICES: Mapping[str, float] = MappingProxyType(
    {
        # burstable
        "ml.t3.medium": 0.05,
        "ml.t3.large": 0.10,
        "ml.t3.xlarge": 0.20,
        "ml.t3.2xlarge": 0.399,
        # general purpose
        "ml.m5.large": 0.115,
        "ml.m5.xlarge": 0.23,
        "ml.m5.2xlarge": 0.461,
        "ml.m5.4xlarge": 0.922,
        "ml.m5.12xlarge": 2.765,
        "ml.m5.24xlarge": 5.53,
        # compute optimised
        "ml.c5.xlarge": 0.204,
        "ml.c5.2xlarge": 0.408,
        "ml.c5.4xlarge": 0.816,
        "ml.c5.9xlarge": 1.836,
        "ml.c5.18xlarge": 3.672,
        # memory optimised
        "ml.r5.large": 0.151,
        "ml.r5.xlarge": 0.302,
        "ml.r5.2xlarge": 0.605,
        "ml.r5.4xlarge": 1.21,
        "ml.r5.8xlarge": 2.419,
        "ml.r5.12xlarge": 3.629,
        "ml.r5.16xlarge": 4.838,
        "ml.r5.24xlarge": 7.258,
        # GPU
        "ml.g4dn.xlarge": 0.736,
        "ml.g4dn.2xlarge": 0.94,
        "ml.g4dn.4xlarge": 1.505,
        "ml.g4dn.8xlarge": 2.72,
        "ml.g4dn.12xlarge": 4.89,
        "ml.g4dn.16xlarge": 5.44,
        "ml.g5.xlarge": 1.408,
        "ml.g5.2xlarge": 1.515,
        "ml.g5.4xlarge": 2.03,
        "ml.g5.8xlarge": 3.06,
        "ml.g5.12xlarge": 7.09,
        "ml.p3.2xlarge": 3.825,
        "ml.p3.8xlarge": 14.688,
        "ml.p3.16xlarge": 28.152,
    }
)


class UnknownPriceError(ShardlineError, KeyError):
    """No price for an instance type: the message names the setting that gives one."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class Prices:
    """Hourly prices per instance type (USD), the local backend's price, and where they came from."""

    per_hour: Mapping[str, float]
    local_per_hour: float = 0.0
    source: str = PRICES_SOURCE

    @classmethod
    def default(cls, overrides: Mapping[str, float] | None = None, *, local_per_hour: float = 0.0) -> Prices:
        """The shipped table with ``overrides`` (instance type -> USD per hour) on top."""
        for setting, price in [
            *((f"{PRICE_SETTING}.{k}", v) for k, v in (overrides or {}).items()),
            (LOCAL_PRICE_SETTING, local_per_hour),
        ]:
            if isinstance(price, bool) or not (isinstance(price, int | float) and math.isfinite(price) and price >= 0):
                raise InvalidArgument(f"{setting} must be a number of USD per instance-hour >= 0, got {price!r}")
        source = PRICES_SOURCE + (f"; {len(overrides)} overridden by {PRICE_SETTING}" if overrides else "")
        return cls(
            per_hour=MappingProxyType({**SAGEMAKER_PROCESSING_PRICES, **(overrides or {})}),
            local_per_hour=float(local_per_hour),
            source=source,
        )

    def hourly(self, instance_type: str, backend: str = "sagemaker") -> float:
        """USD per hour of one instance of ``instance_type`` on ``backend`` (the local backend: its own price)."""
        if backend not in BACKENDS:
            raise InvalidArgument(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
        if backend == "local":
            return self.local_per_hour
        try:
            return float(self.per_hour[instance_type])
        except KeyError:
            raise UnknownPriceError(
                f"no price for instance type {instance_type!r}: give one in the pipeline spec's {PRICE_SETTING} "
                f"(e.g. `{PRICE_SETTING}: {{{instance_type}: 1.23}}`, USD per instance-hour); the shipped table "
                f"has {len(self.per_hour)} types, e.g. {', '.join(sorted(self.per_hour)[:3])}"
            ) from None


@dataclasses.dataclass(frozen=True)
class InstanceUsage:
    """How long one instance of a type ran."""

    instance_type: str
    seconds: float


def instance_cost(usage: InstanceUsage, prices: Prices, backend: str = "sagemaker") -> float:
    """USD for one instance: seconds x price per hour / 3600."""
    if usage.seconds < 0:
        raise InvalidArgument(f"an instance cannot run {usage.seconds} s")
    return usage.seconds * prices.hourly(usage.instance_type, backend) / 3600.0


def run_cost(usages: Iterable[InstanceUsage], prices: Prices, backend: str = "sagemaker") -> float:
    """USD for a run: the sum over its instances of instance-seconds x price per hour / 3600."""
    return sum(instance_cost(usage, prices, backend) for usage in usages)


def cost_per_million(cost: float, predictions: int) -> float | None:
    """USD per 1,000,000 predictions (cost / rows x 1e6); None when there were no predictions."""
    if predictions < 0:
        raise InvalidArgument(f"a run cannot make {predictions} predictions")
    return cost / predictions * 1_000_000 if predictions else None


# -- the control plane: the requests a job makes --------------------------------------------------------------------

REQUEST_PRICE_SETTING = "cost.request_prices"
# Source: aws.amazon.com/dynamodb/pricing/on-demand, aws.amazon.com/s3/pricing, aws.amazon.com/sqs/pricing and
# aws.amazon.com/cloudwatch/pricing, us-east-1, as listed in 2025 (DynamoDB on demand after its November 2024 cut).
# Written down by hand: check the pages, and override what differs. USD per request of each kind (ledger.requests):
# a DynamoDB read or write of a small item is one request unit (the ledger's items are under 1 KB to write and 4 KB
# to read); a heartbeat's transaction is two items at two write units each.
REQUEST_PRICES_SOURCE = (
    "aws.amazon.com/{dynamodb,s3,sqs,cloudwatch}/pricing, us-east-1, 2025 list prices (DynamoDB on demand)"
)
REQUEST_PRICES: Mapping[str, float] = MappingProxyType(
    {
        "dynamodb.read": 0.125 / 1_000_000,
        "dynamodb.write": 0.625 / 1_000_000,
        "dynamodb.transact": 4 * 0.625 / 1_000_000,
        "s3.put": 0.005 / 1_000,  # PUT, COPY, POST, LIST
        "s3.list": 0.005 / 1_000,
        "s3.get": 0.0004 / 1_000,  # GET, HEAD and the rest
        "s3.delete": 0.0,
        "sqs.request": 0.40 / 1_000_000,
        "cloudwatch.request": 0.01 / 1_000,
        "other.request": 0.0,
    }
)


def request_prices(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """The shipped request prices with ``overrides`` (kind -> USD per request) on top; a kind that is none, or a
    price that is no price, is refused naming the setting."""
    for kind, price in (overrides or {}).items():
        if kind not in REQUEST_PRICES:
            raise InvalidArgument(
                f"{REQUEST_PRICE_SETTING}.{kind} is no kind of request: one of {', '.join(REQUEST_PRICES)}"
            )
        if isinstance(price, bool) or not (isinstance(price, int | float) and math.isfinite(price) and price >= 0):
            raise InvalidArgument(f"{REQUEST_PRICE_SETTING}.{kind} must be USD per request >= 0, got {price!r}")
    return {**REQUEST_PRICES, **(overrides or {})}


def requests_cost(requests: Mapping[str, int], prices: Mapping[str, float] | None = None) -> float:
    """USD for ``requests`` (kind -> count) at ``prices`` (the shipped ones by default)."""
    prices = prices if prices is not None else REQUEST_PRICES
    return sum(count * prices.get(kind, 0.0) for kind, count in requests.items())
