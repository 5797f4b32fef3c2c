"""The run report's charts: SVG drawn by hand, well formed, every string from the data escaped."""

from __future__ import annotations

import dataclasses
from xml.etree import ElementTree

import pytest

from shardline.report.build import build_report
from shardline.report.charts import _ticks, render_charts
from shardline.report.cost import Prices
from shardline.report.inputs import PreviousRun
from tests.report.example import example_histograms, example_records

SVG = "{http://www.w3.org/2000/svg}"


def test_each_chart_is_well_formed_svg_with_every_string_escaped():
    """A chart is an image the page embeds: an instance, run or bin name with markup in it stays text in it."""

    identity, files, instances = example_records()
    hostile = "<script>alert(1)</script>&\"'"
    instances = [dataclasses.replace(i, host=f"{i.host}{hostile}") for i in instances]
    files = [dataclasses.replace(f, host=f"{f.host}{hostile}") for f in files]
    current, reference = example_histograms(10_000)
    report = build_report(
        identity,
        files,
        instances,
        current,
        reference=reference,
        reference_run_id="before",
        previous_runs=[PreviousRun(run_id=f"manual__{hostile}", cost_per_million=0.01)],
        prices=Prices.default(),
    )
    charts = render_charts(report)
    assert set(charts) == {"throughput", "instances", "cost", "drift"}
    for name, svg in charts.items():
        root = ElementTree.fromstring(svg)  # raises on anything but well-formed XML
        assert not list(root.iter(f"{SVG}script")), name
        texts = "".join(t.text or "" for t in root.iter(f"{SVG}text"))
        assert "<script>" not in svg.decode() and ("algo-1" in texts or name == "drift"), name


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.0, 9400.0, [0.0, 2000.0, 4000.0, 6000.0, 8000.0, 10000.0]),
        (0.0, 0.0117, [0.0, 0.005, 0.01, 0.015]),
        (0.02, 0.85, [0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (1.0, 1.0, [1.0]),  # nothing to span: one tick, never a division by zero
    ],
)
def test_axis_ticks_are_round_steps_that_cover_the_range(low, high, ticks):
    assert _ticks(low, high) == ticks
