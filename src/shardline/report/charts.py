"""The run report's charts as SVG, drawn by hand: axes, bars, lines, steps and legends, nothing more.

A chart is a few hundred elements of text, so a step's end draws its four in milliseconds; matplotlib took a second of
CPU per step's end, most of it its own import and layout. Every string from the data (instance names, run ids, bin
labels) is escaped; the page embeds each chart as an ``<img>``, where an SVG runs no script and loads nothing.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from shardline.report.model import InstanceSummary, RunReport

WIDTH, HEIGHT = 1100, 396
_CURRENT, _REFERENCE, _ALERT, _IDLE, _OK = "#1f6fb2", "#9aa5b1", "#d1495b", "#e0a100", "#2e8b57"
# Colours for the instances' lines (matplotlib's ten, which the charts used before).
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


def render_charts(report: RunReport) -> dict[str, bytes]:
    """Each chart of the page as SVG bytes, by name: throughput, instances, cost, drift (those with data)."""
    drawers = {"throughput": _throughput, "instances": _instances, "cost": _cost, "drift": _drift}
    charts = {}
    for name, draw in drawers.items():
        parts = draw(report)
        if parts:
            charts[name] = _svg(parts).encode()
    return charts


# -- the charts -------------------------------------------------------------------------------------------------


def _throughput(report: RunReport) -> list[str]:
    timeline = report.timeline
    if not timeline.series or not timeline.offsets:
        return []
    minutes = (timeline.offsets[-1] + timeline.bucket_seconds) >= 600
    scale, unit = (60.0, "minutes") if minutes else (1.0, "seconds")
    x = [(o + timeline.bucket_seconds / 2) / scale for o in timeline.offsets]
    columns = 1 if len(timeline.series) <= 16 else 2
    panel = _Panel(
        70,
        30,
        WIDTH - 70 - 230 * columns,
        HEIGHT - 100,
        (0.0, max(x) * 1.02 or 1.0),
        _top(max((v for s in timeline.series for v in s.rows_per_second if v is not None), default=0)),
    )
    parts = panel.frame(x_ticks=_ticks(0.0, max(x) * 1.02 or 1.0))
    legend = []
    for i, series in enumerate(timeline.series):
        straggler, idle = series.instance in report.stragglers, series.instance in report.idle
        color = _ALERT if straggler else _IDLE if idle else _PALETTE[i % len(_PALETTE)]
        width = 2.4 if (straggler or idle) else 1.2
        parts += panel.line(x, series.rows_per_second, color, width, markers=True)
        legend.append((series.instance + (" (straggler)" if straggler else "") + (" (idle)" if idle else ""), color))
    parts += _legend(legend, WIDTH - 225 * columns, 36, columns=columns)
    parts.append(
        _text(
            panel.x0 + panel.width / 2,
            HEIGHT - 30,
            f"{unit} since the first instance started (buckets of {duration_text(timeline.bucket_seconds)})",
            anchor="middle",
        )
    )
    parts.append(_text(18, panel.y0 + panel.height / 2, "rows / s", anchor="middle", rotate=-90))
    return parts


def _instances(report: RunReport) -> list[str]:
    summaries = report.instances
    if not summaries:
        return []
    names = [s.instance for s in summaries]
    colors = [_instance_color(s) for s in summaries]
    parts = []
    for (x0, title), values in zip(
        ((70, "files per instance"), (WIDTH / 2 + 40, "MB read per instance")),
        ([s.files for s in summaries], [s.bytes_in / 1e6 for s in summaries]),
        strict=True,
    ):
        panel = _Panel(x0, 30, WIDTH / 2 - 100, HEIGHT - 130, (-0.6, len(summaries) - 0.4), _top(max(values)))
        parts += panel.frame(title=title)
        parts += panel.bars(range(len(values)), values, colors)
        parts += panel.labels(names)
    return parts


def _cost(report: RunReport) -> list[str]:
    priced = [s for s in report.instances if s.cost is not None]
    trend = [p for p in report.cost.trend if p.cost_per_million is not None]
    if not priced and not trend:
        return []
    parts = []
    costs = [s.cost or 0.0 for s in priced]
    left = _Panel(70, 30, WIDTH / 2 - 100, HEIGHT - 130, (-0.6, max(len(priced), 1) - 0.4), _top(max(costs, default=0)))
    parts += left.frame(title="USD per instance")
    if priced:
        parts += left.bars(range(len(priced)), costs, [_instance_color(s) for s in priced])
        parts += left.labels([s.instance for s in priced])
    values = [p.cost_per_million for p in trend]
    right = _Panel(
        WIDTH / 2 + 40,
        30,
        WIDTH / 2 - 100,
        HEIGHT - 130,
        (-0.3, max(len(trend), 1) - 0.7),
        _top(max(values, default=0) * 1.15),
    )
    parts += right.frame(title="USD per 1M predictions, previous runs and this one")
    if trend:
        positions = list(range(len(trend)))
        parts += right.line(positions, values, _REFERENCE, 1.5, markers=True)
        parts += [right.dot(i, p.cost_per_million, 6, _CURRENT) for i, p in enumerate(trend) if p.current]
        parts += right.labels([short_run(p.run_id) for p in trend], slant=30)
    return parts


def _drift(report: RunReport) -> list[str]:
    drift = report.drift
    density = drift.density
    if density is None:
        return []
    has_reference = drift.bins is not None
    width = WIDTH * 0.55 - 110 if has_reference else WIDTH - 140
    parts = []
    if density.kind == "values":
        top = _top(max([*density.current, *(density.reference if has_reference else [])], default=0))
        left = _Panel(70, 30, width, HEIGHT - 100, (-0.6, len(density.edges) - 0.4), top)
        parts += left.frame(title="share of predictions")
        if has_reference:
            parts += left.bars([p - 0.2 for p in range(len(density.edges))], density.reference, _REFERENCE, 0.4)
        shift = 0.2 if has_reference else 0.0
        parts += left.bars(
            [p + shift for p in range(len(density.edges))], density.current, _CURRENT, 0.4 if has_reference else 0.8
        )
        parts += left.labels([number_text(v) for v in density.edges], slant=0)
    else:
        edges = density.edges
        top = _top(max([*density.current, *(density.reference if has_reference else [])], default=0))
        left = _Panel(70, 30, width, HEIGHT - 100, (edges[0], edges[-1]), top)
        parts += left.frame(title="share of predictions", x_ticks=_ticks(edges[0], edges[-1]))
        if has_reference:
            parts += left.stairs(edges, density.reference, _REFERENCE, filled=True)
        parts += left.stairs(edges, density.current, _CURRENT)
    parts += _legend(
        [("reference", _REFERENCE), ("this run", _CURRENT)] if has_reference else [("this run", _CURRENT)],
        70 + width - 110,
        40,
    )
    if drift.bins is not None:
        bins = drift.bins
        right = _Panel(
            WIDTH * 0.55 + 20,
            30,
            WIDTH * 0.45 - 60,
            HEIGHT - 150,
            (-0.6, len(bins.labels) - 0.4),
            _top(max([*bins.current, *bins.reference], default=0)),
        )
        color = _ALERT if drift.verdict == "drift" else _IDLE if drift.verdict == "moderate" else _OK
        parts += right.frame(title=f"PSI bins: PSI {drift.psi:.3f} ({drift.verdict})", title_color=color)
        parts += right.bars([p - 0.2 for p in range(len(bins.labels))], bins.reference, _REFERENCE, 0.4)
        parts += right.bars([p + 0.2 for p in range(len(bins.labels))], bins.current, _CURRENT, 0.4)
        parts += right.labels(bins.labels, slant=60, size=9)
    return parts


def _instance_color(summary: InstanceSummary) -> str:
    return _ALERT if summary.straggler else _IDLE if summary.idle else _CURRENT


# -- drawing ----------------------------------------------------------------------------------------------------


class _Panel:
    """One plot area: data coordinates ``x_range`` x ``y_range`` mapped onto a box of the canvas."""

    def __init__(self, x0: float, y0: float, width: float, height: float, x_range, y_range):
        self.x0, self.y0, self.width, self.height = x0, y0, width, height
        self.x_range, self.y_range = x_range, y_range

    def x(self, value: float) -> float:
        low, high = self.x_range
        return self.x0 + (value - low) / ((high - low) or 1.0) * self.width

    def y(self, value: float) -> float:
        low, high = self.y_range
        return self.y0 + self.height - (value - low) / ((high - low) or 1.0) * self.height

    def frame(self, *, title: str = "", title_color: str = "#222", x_ticks: Sequence[float] = ()) -> list[str]:
        """The box, the y axis's grid and labels, numeric x ticks when given, and the title."""
        parts = [
            f"<rect x='{self.x0:.1f}' y='{self.y0:.1f}' width='{self.width:.1f}' height='{self.height:.1f}' "
            "fill='none' stroke='#444' stroke-width='0.8'/>"
        ]
        for tick in _ticks(*self.y_range):
            y = self.y(tick)
            parts.append(
                f"<line x1='{self.x0:.1f}' y1='{y:.1f}' x2='{self.x0 + self.width:.1f}' y2='{y:.1f}' "
                "stroke='#ddd' stroke-width='0.6'/>"
            )
            parts.append(_text(self.x0 - 6, y + 4, _tick(tick), anchor="end"))
        for tick in (t for t in x_ticks if self.x_range[0] <= t <= self.x_range[1]):
            x = self.x(tick)
            parts.append(
                f"<line x1='{x:.1f}' y1='{self.y0:.1f}' x2='{x:.1f}' y2='{self.y0 + self.height:.1f}' "
                "stroke='#eee' stroke-width='0.6'/>"
            )
            parts.append(_text(x, self.y0 + self.height + 16, _tick(tick), anchor="middle"))
        if title:
            parts.append(_text(self.x0 + self.width / 2, self.y0 - 10, title, anchor="middle", color=title_color))
        return parts

    def line(self, xs: Sequence[float], ys: Sequence[float | None], color: str, width: float, markers: bool = False):
        """A line through the points, broken where a value is None (an empty bucket)."""
        parts, run = [], []
        for a, b in [*zip(xs, ys, strict=True), (None, None)]:
            if b is not None:
                run.append(f"{self.x(a):.1f},{self.y(b):.1f}")
                continue
            if len(run) > 1:
                parts.append(
                    f"<polyline points='{' '.join(run)}' fill='none' stroke='{color}' stroke-width='{width}'/>"
                )
            run = []
        if markers:  # a bucket between two empty ones (a short run, one file) is a point with no line to draw
            parts += [self.dot(a, b, 2.2, color) for a, b in zip(xs, ys, strict=True) if b is not None]
        return parts

    def dot(self, x: float, y: float, radius: float, color: str) -> str:
        return f"<circle cx='{self.x(x):.1f}' cy='{self.y(y):.1f}' r='{radius}' fill='{color}'/>"

    def bars(self, positions, heights: Sequence[float], colors, width: float = 0.8) -> list[str]:
        colors = colors if isinstance(colors, list) else [colors] * len(heights)
        parts = []
        for position, height, color in zip(positions, heights, colors, strict=True):
            left, right = self.x(position - width / 2), self.x(position + width / 2)
            top, bottom = self.y(max(height, 0.0)), self.y(0.0)
            parts.append(
                f"<rect x='{left:.1f}' y='{top:.1f}' width='{right - left:.1f}' height='{bottom - top:.1f}' "
                f"fill='{color}'/>"
            )
        return parts

    def stairs(self, edges: Sequence[float], heights: Sequence[float], color: str, filled: bool = False) -> list[str]:
        points = [(self.x(edges[0]), self.y(0.0))]
        for i, height in enumerate(heights):
            points += [(self.x(edges[i]), self.y(height)), (self.x(edges[i + 1]), self.y(height))]
        points.append((self.x(edges[-1]), self.y(0.0)))
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in points)
        if filled:
            return [f"<polygon points='{path}' fill='{color}' fill-opacity='0.45' stroke='none'/>"]
        return [f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='1.8'/>"]

    def labels(self, names: Sequence[str], slant: int | None = None, size: int = 10) -> list[str]:
        """One label under each category (0, 1, ...), slanted when they would run into each other."""
        if slant is None:
            crowded = len(names) * max((len(n) for n in names), default=0) > 60
            slant = 45 if crowded else 0
        y = self.y0 + self.height + 14
        return [
            _text(self.x(i), y, name, anchor="end" if slant else "middle", rotate=-slant, size=size)
            for i, name in enumerate(names)
        ]


def _legend(entries: list[tuple[str, str]], x: float, y: float, columns: int = 1) -> list[str]:
    rows = -(-len(entries) // columns)
    parts = []
    for i, (label, color) in enumerate(entries):
        left, top = x + (i // rows) * 225, y + (i % rows) * 15
        parts.append(f"<line x1='{left}' y1='{top}' x2='{left + 18}' y2='{top}' stroke='{color}' stroke-width='3'/>")
        parts.append(_text(left + 24, top + 4, label, size=10))
    return parts


def _svg(parts: list[str]) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' {_FONT} font-size='11'>"
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>" + "".join(parts) + "</svg>"
    )


def _text(
    x: float, y: float, text: str, *, anchor: str = "start", rotate: float = 0, size: int = 11, color: str = "#222"
) -> str:
    turn = f" transform='rotate({rotate} {x:.1f} {y:.1f})'" if rotate else ""
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' font-size='{size}' fill='{color}'{turn}>"
        f"{html.escape(str(text), quote=True)}</text>"
    )


def _tick(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else number_text(value)


def _top(value: float) -> tuple[float, float]:
    """A y range from 0 to a round number at or above ``value``."""
    ticks = _ticks(0.0, value if value > 0 else 1.0)
    return 0.0, max(ticks[-1], value) if ticks else 1.0


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]: steps of 1, 2 or 5 times a power of ten."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    last = math.ceil(high / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(round((last - first) / step) + 1)]


# -- text, shared with the page (shardline.report.render) -------------------------------------------------------


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def number_text(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.4g}"


def short_run(run_id: str, limit: int = 20) -> str:
    """Airflow's run ids without their kind (scheduled__, manual__) and seconds, to label a trend's points."""
    kind, _, rest = run_id.partition("__")
    text = rest if rest and kind.isalpha() else run_id
    if len(text) >= 16 and text[4:5] == "-" and text[10:11] == "T":  # an ISO date-time: to the minute
        text = text[:16].replace("T", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
