"""Cost of a run and per 1M predictions, by hand; the price table and its overrides."""

from __future__ import annotations

import pytest

from shardline.report.cost import (
    PRICE_SETTING,
    SAGEMAKER_PROCESSING_PRICES,
    InstanceUsage,
    Prices,
    UnknownPriceError,
    cost_per_million,
    instance_cost,
    run_cost,
)


def test_the_cost_of_a_run_by_hand():
    prices = Prices.default()
    # 4 x ml.m5.xlarge ($0.23/h) for 900, 900, 1200 and 1800 s: 4800 s x 0.23 / 3600 = $0.306667
    usages = [InstanceUsage("ml.m5.xlarge", s) for s in (900, 900, 1200, 1800)]
    assert run_cost(usages, prices) == pytest.approx(4800 * 0.23 / 3600)
    assert run_cost(usages, prices) == pytest.approx(0.306667, abs=1e-6)
    # plus one ml.g4dn.xlarge ($0.736/h) for an hour: 0.306667 + 0.736 = 1.042667
    assert run_cost([*usages, InstanceUsage("ml.g4dn.xlarge", 3600)], prices) == pytest.approx(1.042667, abs=1e-6)
    assert instance_cost(InstanceUsage("ml.c5.xlarge", 1800), prices) == pytest.approx(0.204 / 2)


def test_cost_per_million_predictions_by_hand():
    # $0.306667 for 2,500,000 predictions: 0.306667 / 2.5e6 x 1e6 = $0.122667 per 1M
    assert cost_per_million(4800 * 0.23 / 3600, 2_500_000) == pytest.approx(0.122667, abs=1e-6)
    assert cost_per_million(1.0, 1_000_000) == 1.0
    assert cost_per_million(0.5, 0) is None  # no predictions: n/a, not a division by zero
    with pytest.raises(ValueError):
        cost_per_million(1.0, -1)


def test_overrides_replace_or_add_prices_and_the_local_backend_has_its_own():
    prices = Prices.default({"ml.m5.xlarge": 0.1, "ml.custom.large": 2.0}, local_per_hour=0.05)
    assert prices.hourly("ml.m5.xlarge") == 0.1 and prices.hourly("ml.custom.large") == 2.0
    assert prices.hourly("ml.c5.xlarge") == SAGEMAKER_PROCESSING_PRICES["ml.c5.xlarge"]
    assert PRICE_SETTING in prices.source
    # the local backend prices every instance at its own rate, whatever type the spec names
    assert prices.hourly("ml.m5.xlarge", backend="local") == 0.05
    assert run_cost([InstanceUsage("ml.whatever", 7200)], prices, backend="local") == pytest.approx(0.1)
    assert run_cost([InstanceUsage("ml.m5.xlarge", 7200)], Prices.default(), backend="local") == 0.0
    assert SAGEMAKER_PROCESSING_PRICES["ml.m5.xlarge"] == 0.23  # the shipped table is left alone


def test_an_unknown_instance_type_names_the_setting_to_change():
    with pytest.raises(UnknownPriceError) as caught:
        run_cost([InstanceUsage("ml.z9.huge", 60)], Prices.default())
    message = str(caught.value)
    assert "ml.z9.huge" in message and PRICE_SETTING in message and "USD per instance-hour" in message


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "0.2", True])
def test_a_bad_price_is_refused_naming_its_setting(bad):
    with pytest.raises(ValueError, match=r"cost\.prices\.ml\.m5\.xlarge"):
        Prices.default({"ml.m5.xlarge": bad})
    with pytest.raises(ValueError, match=r"cost\.local_price_per_hour"):
        Prices.default(local_per_hour=bad)


def test_the_shipped_table_is_sane():
    assert len(SAGEMAKER_PROCESSING_PRICES) >= 30
    assert all(name.startswith("ml.") and 0 < price < 100 for name, price in SAGEMAKER_PROCESSING_PRICES.items())
    # within a family, a bigger size costs more
    family = [SAGEMAKER_PROCESSING_PRICES[f"ml.m5.{s}"] for s in ("large", "xlarge", "2xlarge", "4xlarge", "12xlarge")]
    assert family == sorted(family)
    with pytest.raises(ValueError, match="backend"):
        Prices.default().hourly("ml.m5.xlarge", backend="ec2")
    with pytest.raises(ValueError):
        instance_cost(InstanceUsage("ml.m5.xlarge", -1), Prices.default())
