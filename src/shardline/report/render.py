"""The run report as one self-contained HTML page: charts embedded as PNG, no script, no network.

matplotlib draws the charts (its Agg renderer, on Figure objects: no pyplot, no global state) and
is imported inside :func:`render_charts`, so importing :mod:`shardline.report` stays cheap and
the room needs it only where a page is rendered. Every string that comes from the data (keys,
hosts, error messages, run ids) is escaped: input keys and failure reasons are anyone's text.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
import statistics
from collections.abc import Callable
from typing import Any

from shardline.report.model import RunReport, Shard

MAX_FILE_ROWS = 500  # the page lists at most this many files (problems first); the JSON has them all
_DPI = 110
_CURRENT, _REFERENCE, _ALERT, _IDLE, _OK = "#1f6fb2", "#9aa5b1", "#d1495b", "#e0a100", "#2e8b57"


# What the report page may load: its inline styles and data: images (the charts), nothing else, no script.
PAGE_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def render_html(report: RunReport, *, max_file_rows: int = MAX_FILE_ROWS) -> str:
    """The report page: one HTML document with its charts inside."""
    charts = {name: _data_uri(png) for name, png in render_charts(report).items()}
    e = _e
    title = f"{report.pipeline} / {report.run_id} / {report.step}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # The page is opened from a file (`shardline report --open`) or served: in both, no script runs.
        f'<meta http-equiv="Content-Security-Policy" content="{PAGE_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Shardline report: {e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<header><h1>Run report <span class='muted'>{e(title)}</span></h1>",
        f"<p class='muted'>attempt {e(report.attempt)} · backend {e(report.backend)} · "
        f"started {e(_when(report.started_at))} · ended {e(_when(report.ended_at))}"
        f"{' · generated ' + e(_when(report.generated_at)) if report.generated_at else ''}</p></header>",
        _summary(report),
    ]
    if report.notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{e(n)}</li>" for n in report.notes) + "</ul>")
    parts += [
        "<section id='throughput'><h2>Throughput over time per shard</h2>",
        _chart(charts, "throughput", "rows per second per instance over the run"),
        _flags(report),
        _chart(charts, "shards", "files and bytes per instance"),
        _shard_table(report.shards),
        "</section>",
        "<section id='cost'><h2>Cost</h2>",
        _cost(report),
        _chart(charts, "cost", "cost per instance and trend"),
        "</section>",
        "<section id='drift'><h2>Predictions against the previous successful run</h2>",
        _drift(report),
        _chart(charts, "drift", "prediction histograms, this run and the reference"),
        "</section>",
        "<section id='reconciliation'><h2>Reconciliation</h2>",
        _reconciliation(report, max_file_rows),
        "</section>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def render_charts(report: RunReport) -> dict[str, bytes]:
    """Each chart of the page as PNG bytes, by name: throughput, shards, cost, drift (those with data)."""
    from matplotlib.figure import Figure  # lazily: a second or so to import, and only the page needs it

    drawers: dict[str, Callable[[Any, RunReport], bool]] = {
        "throughput": _draw_throughput,
        "shards": _draw_shards,
        "cost": _draw_cost,
        "drift": _draw_drift,
    }
    charts = {}
    for name, draw in drawers.items():
        figure = Figure(figsize=(10, 3.6), dpi=_DPI, layout="constrained")
        if draw(figure, report):
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=_DPI)
            charts[name] = buffer.getvalue()
    return charts


# -- charts ---------------------------------------------------------------------------------------------


def _draw_throughput(figure, report: RunReport) -> bool:
    timeline = report.timeline
    if not timeline.series or not timeline.offsets:
        return False
    ax = figure.add_subplot()
    minutes = (timeline.offsets[-1] + timeline.bucket_seconds) >= 600
    scale, unit = (60.0, "minutes") if minutes else (1.0, "seconds")
    x = [(o + timeline.bucket_seconds / 2) / scale for o in timeline.offsets]
    flagged = set(report.stragglers) | set(report.idle)
    for series in timeline.series:
        straggler, idle = series.instance in report.stragglers, series.instance in report.idle
        label = series.instance + (" (straggler)" if straggler else "") + (" (idle)" if idle else "")
        style = (
            {"linewidth": 2.4, "color": _ALERT if straggler else _IDLE, "zorder": 3}
            if (straggler or idle)
            else {"linewidth": 1.2, "alpha": 0.8 if flagged else 0.9}
        )
        # Markers too: a bucket between two empty ones (a short run, one file) is a point with no line to draw.
        ax.plot(x, series.rows_per_second, label=label, marker="o", markersize=2.5, **style)
    ax.set_xlabel(f"{unit} since the first instance started (buckets of {_duration(timeline.bucket_seconds)})")
    ax.set_ylabel("rows / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        ncols=1 if len(timeline.series) <= 16 else 2,
        frameon=False,
    )
    return True


def _draw_shards(figure, report: RunReport) -> bool:
    shards = report.shards
    if not shards:
        return False
    names = [s.instance for s in shards]
    colors = [_ALERT if s.straggler else _IDLE if s.idle else _CURRENT for s in shards]
    positions = list(range(len(shards)))
    left, right = figure.subplots(1, 2)
    left.bar(positions, [s.files for s in shards], color=colors)
    left.set_title("files per instance", fontsize=10)
    megabytes = [s.bytes_in / 1e6 for s in shards]
    right.bar(positions, megabytes, color=colors)
    right.set_title("MB read per instance", fontsize=10)
    for ax in (left, right):
        _instance_ticks(ax, names)
        ax.grid(axis="y", alpha=0.3)
    return True


def _draw_cost(figure, report: RunReport) -> bool:
    cost = report.cost
    priced = [s for s in report.shards if s.cost is not None]
    trend = [p for p in cost.trend if p.cost_per_million is not None]
    if not priced and not trend:
        return False
    left, right = figure.subplots(1, 2)
    if priced:
        positions = list(range(len(priced)))
        left.bar(
            positions,
            [s.cost for s in priced],
            color=[_ALERT if s.straggler else _IDLE if s.idle else _CURRENT for s in priced],
        )
        _instance_ticks(left, [s.instance for s in priced])
    left.set_title("USD per instance", fontsize=10)
    left.grid(axis="y", alpha=0.3)
    if trend:
        positions = list(range(len(trend)))
        right.plot(positions, [p.cost_per_million for p in trend], marker="o", color=_REFERENCE)
        for i, point in enumerate(trend):
            if point.current:
                right.plot([i], [point.cost_per_million], marker="o", markersize=9, color=_CURRENT, zorder=3)
        right.set_xticks(positions, [_short(p.run_id) for p in trend], rotation=30, ha="right", fontsize=7)
        right.set_ylim(0, 1.15 * max(p.cost_per_million for p in trend) or 1.0)
    right.set_title("USD per 1M predictions, previous runs and this one", fontsize=10)
    right.grid(alpha=0.3)
    return True


def _draw_drift(figure, report: RunReport) -> bool:
    drift = report.drift
    if drift.density is None:
        return False
    left, right = figure.subplots(1, 2, width_ratios=[3, 2]) if drift.bins else (figure.add_subplot(), None)
    density = drift.density
    has_reference = drift.bins is not None
    if density.kind == "values":
        positions = list(range(len(density.edges)))
        width = 0.4 if has_reference else 0.8
        if has_reference:
            left.bar([p - width / 2 for p in positions], density.reference, width, label="reference", color=_REFERENCE)
        left.bar(
            [p + width / 2 if has_reference else p for p in positions],
            density.current,
            width,
            label="this run",
            color=_CURRENT,
        )
        left.set_xticks(positions, [_num(v) for v in density.edges], fontsize=7)
    else:
        edges = density.edges
        if has_reference:
            left.stairs(density.reference, edges, fill=True, alpha=0.45, color=_REFERENCE, label="reference")
        left.stairs(density.current, edges, linewidth=1.8, color=_CURRENT, label="this run")
    left.set_title("share of predictions", fontsize=10)
    left.legend(fontsize=8, frameon=False)
    left.grid(alpha=0.3)
    if right is not None and drift.bins is not None:
        bins = drift.bins
        positions = list(range(len(bins.labels)))
        right.bar([p - 0.2 for p in positions], bins.reference, 0.4, label="reference", color=_REFERENCE)
        right.bar([p + 0.2 for p in positions], bins.current, 0.4, label="this run", color=_CURRENT)
        right.set_xticks(positions, bins.labels, rotation=60, ha="right", fontsize=6)
        color = _ALERT if drift.verdict == "drift" else _IDLE if drift.verdict == "moderate" else _OK
        right.set_title(f"PSI bins: PSI {drift.psi:.3f} ({drift.verdict})", fontsize=10, color=color)
        right.grid(axis="y", alpha=0.3)
    return True


def _instance_ticks(ax, names: list[str]) -> None:
    """One tick per instance, slanted when the names would run into each other."""
    crowded = len(names) * max((len(n) for n in names), default=0) > 60
    ax.set_xticks(
        range(len(names)),
        names,
        rotation=45 if crowded else 0,
        ha="right" if crowded else "center",
        fontsize=7,
        rotation_mode="anchor" if crowded else "default",
    )


# -- HTML parts -------------------------------------------------------------------------------------------


def _summary(report: RunReport) -> str:
    r, c, d = report.reconciliation, report.cost, report.drift
    cards = [
        ("duration", _duration(report.seconds) if report.seconds is not None else "n/a", ""),
        ("files", f"{r.succeeded:,} of {r.files:,} succeeded", "alert" if r.failed else ""),
        ("predictions", f"{c.predictions:,}", "" if r.balanced else "alert"),
        ("cost", _usd(c.total) if c.total is not None else "n/a", "alert" if c.error else ""),
        ("per 1M predictions", _usd(c.cost_per_million) if c.cost_per_million is not None else "n/a", ""),
        (
            "drift (PSI)",
            f"{d.psi:.3f} {d.verdict}" if d.psi is not None else "n/a",
            {"drift": "alert", "moderate": "warn"}.get(d.verdict, ""),
        ),
        ("stragglers", ", ".join(report.stragglers) or "none", "alert" if report.stragglers else ""),
        ("idle", ", ".join(report.idle) or "none", "warn" if report.idle else ""),
    ]
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card {cls}'><div class='label'>{_e(label)}</div><div class='value'>{_e(value)}</div></div>"
            for label, value, cls in cards
        )
        + "</div>"
    )


def _flags(report: RunReport) -> str:
    lines = []
    by_name = {s.instance: s for s in report.shards}
    for name in report.stragglers:
        shard = by_name[name]
        peers = [s for s in report.shards if s.attempt == shard.attempt]
        since = min(s.started_after_seconds for s in peers if s.started_after_seconds is not None)
        finishes = sorted(s.finished_after_seconds - since for s in peers if s.finished_after_seconds is not None)
        took, median = shard.finished_after_seconds - since, statistics.median(finishes)
        lines.append(
            f"<li class='alert'><b>{_e(name)}</b> finished {_e(_duration(took))} after its attempt began, "
            f"the median instance {_e(_duration(median))}: the step waited on it.</li>"
        )
    for name in report.idle:
        shard = by_name[name]
        why = (
            "had no files"
            if shard.files == 0
            else f"had a file in flight {shard.busy_fraction:.0%} of its {_duration(shard.seconds)}"
        )
        lines.append(f"<li class='warn'><b>{_e(name)}</b> {_e(why)}.</li>")
    return "<ul class='flags'>" + "".join(lines) + "</ul>" if lines else ""


def _shard_table(shards: list[Shard]) -> str:
    head = ("instance", "type", "files", "failed", "rows out", "read", "written", "ran", "busy", "rows/s", "cost")
    rows = []
    for s in shards:
        cls = "alert" if s.straggler else "warn" if s.idle else ""
        cells = (
            s.instance,
            s.instance_type,
            f"{s.files:,}",
            f"{s.files_failed:,}",
            f"{s.rows_out:,}",
            _bytes(s.bytes_in),
            _bytes(s.bytes_out),
            _duration(s.seconds),
            f"{s.busy_fraction:.0%}" if s.busy_fraction is not None else "n/a",
            f"{s.rows_per_second:,.0f}" if s.rows_per_second is not None else "n/a",
            _usd(s.cost) if s.cost is not None else "n/a",
        )
        rows.append(f"<tr class='{cls}'>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return _table(head, rows)


def _cost(report: RunReport) -> str:
    c = report.cost
    parts = []
    if c.error:
        parts.append(f"<p class='alert'>{_e(c.error)}</p>")
    head = ("instance type", "instances", "instance-seconds", "USD per hour", "USD")
    rows = [
        f"<tr><td>{_e(line.instance_type)}</td><td>{line.instances}</td><td>{line.seconds:,.1f}</td>"
        f"<td>{_e(_usd(line.price_per_hour))}</td><td>{_e(_usd(line.cost))}</td></tr>"
        for line in c.by_type
    ]
    parts.append(_table(head, rows))
    per_million = _usd(c.cost_per_million) if c.cost_per_million is not None else "n/a (no predictions)"
    parts.append(
        f"<p>{_e(_usd(c.total) if c.total is not None else 'n/a')} for "
        f"{c.instance_seconds:,.0f} instance-seconds and {c.predictions:,} predictions: "
        f"<b>{_e(per_million)} per 1M predictions</b>. "
        f"<span class='muted'>Prices: {_e(c.prices_source)}. Counted from each instance's first file to "
        f"its last heartbeat: start-up is billed too, so the bill is somewhat higher.</span></p>"
    )
    return "\n".join(parts)


def _drift(report: RunReport) -> str:
    d = report.drift
    if d.psi is None:
        return f"<p class='muted'>No drift statistic: {_e(d.note or 'nothing to compare')}.</p>"
    cls = {"drift": "alert", "moderate": "warn"}.get(d.verdict, "ok")
    meaning = {
        "stable": "no real change",
        "moderate": "a moderate shift",
        "drift": f"at or above this pipeline's limit of {d.max_psi:g}",
    }[d.verdict]
    text = (
        f"<p class='{cls}'>PSI <b>{d.psi:.3f}</b> against run <b>{_e(d.reference_run_id or '?')}</b>: "
        f"{_e(d.verdict)} ({_e(meaning)}). <span class='muted'>PSI below 0.1 is usually read as no change, "
        f"0.1 to 0.25 as moderate, above 0.25 as large; an empty bin counts as 0.0001.</span></p>"
    )
    quantiles = [k for k in d.current_quantiles if k in d.reference_quantiles]
    if quantiles:
        head = ("", *quantiles)
        rows = [
            f"<tr><td>{_e(name)}</td>" + "".join(f"<td>{_e(_num(values.get(q)))}</td>" for q in quantiles) + "</tr>"
            for name, values in (("reference", d.reference_quantiles), ("this run", d.current_quantiles))
        ]
        text += _table(head, rows)
    return text


def _reconciliation(report: RunReport, max_rows: int) -> str:
    r = report.reconciliation
    balance = (
        ("every succeeded file wrote one row out per row in" if not r.rows_rejected else "rows in = out + rejected")
        if r.balanced
        else f"{len(r.mismatched)} succeeded file(s) wrote a different number of rows than they read"
    )
    rejected = f"{r.rows_rejected:,} rows rejected, " if r.rows_rejected else ""
    parts = [
        f"<p class='{'ok' if r.balanced and not r.failed else 'alert'}'>{r.files:,} files: {r.succeeded:,} "
        f"succeeded, {r.failed:,} failed, {r.unfinished:,} unfinished; {r.rows_in:,} rows in, "
        f"{r.rows_out:,} rows out, {rejected}({_e(balance)}). {r.retried:,} file(s) needed more than one attempt "
        f"(up to {r.max_attempt}).</p>"
    ]
    problem = [
        row.status != "SUCCEEDED" or not row.balanced or row.attempt > 1 or row.rows_rejected > 0 for row in r.rows
    ]
    problems = [row for row, bad in zip(r.rows, problem, strict=True) if bad]
    others = [row for row, bad in zip(r.rows, problem, strict=True) if not bad] if len(problems) < max_rows else []
    shown = (problems + others)[:max_rows]
    head = ("file", "instance", "attempt", "status", "rows in", "rows out", "reason")
    rows = []
    for row in shown:
        cls = "alert" if row.status == "FAILED" or not row.balanced else "warn" if row.status != "SUCCEEDED" else ""
        cells = (
            row.key,
            row.host or "",
            row.attempt,
            row.status,
            f"{row.rows_in:,}",
            f"{row.rows_out:,}",
            row.error
            or ("" if row.balanced else "rows out differ from rows in")
            or (f"{row.rows_rejected:,} row(s) rejected" if row.rows_rejected else ""),
        )
        rows.append(f"<tr class='{cls}'>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    parts.append(_table(head, rows, cls="files"))
    if len(shown) < len(r.rows):
        parts.append(
            f"<p class='muted'>{len(r.rows) - len(shown):,} more file(s) succeeded with rows balanced; "
            f"report.json lists every file.</p>"
        )
    if r.model_warnings:
        parts.append(
            f"<p class='warn'>The model code said {r.model_warnings:,} warning line(s) (warnings, WARNING logs, "
            "stderr): each is a WARNING in the job's log, once per distinct line per file.</p>"
        )
    if r.rejects:
        parts.append(f"<h3>Rejected rows (tolerance.rows): the first {len(r.rejects):,} of {r.rows_rejected:,}</h3>")
        cells = [f"<tr><td>{_e(x.key)}</td><td>{_e(x.where)}</td><td>{_e(x.reason)}</td></tr>" for x in r.rejects]
        parts.append(_table(("file", "where", "why"), cells, cls="files"))
    return "\n".join(parts)


def _table(head: tuple[str, ...], rows: list[str], cls: str = "") -> str:
    return (
        f"<table class='{cls}'><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _chart(charts: dict[str, str], name: str, alt: str) -> str:
    if name not in charts:
        return ""
    return f"<img class='chart' id='chart-{name}' alt='{_e(alt)}' src='{charts[name]}'>"


# -- formatting -------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "n/a"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _usd(value: float) -> str:
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if abs(value) >= 100 else f"${value:.4g}"


def _bytes(value: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.4g}"


def _short(run_id: str, limit: int = 20) -> str:
    """Airflow's run ids without their kind (scheduled__, manual__) and seconds, to label a trend's points."""
    kind, _, rest = run_id.partition("__")
    text = rest if rest and kind.isalpha() else run_id
    if len(text) >= 16 and text[4:5] == "-" and text[10:11] == "T":  # an ISO date-time: to the minute
        text = text[:16].replace("T", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;color:#1d2733;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea;padding-bottom:4px}
.muted{color:#6b7785;font-weight:normal}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:8px;margin:16px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:8px 10px;background:#f8fafc}
.card .label{font-size:12px;color:#6b7785}.card .value{font-size:16px;font-weight:600;overflow-wrap:anywhere}
.card.alert{border-color:#d1495b;background:#fdf0f2}.card.warn{border-color:#e0a100;background:#fff8e6}
p.alert,li.alert{color:#a3182c}p.warn,li.warn{color:#8a6200}p.ok{color:#1f6b43}
img.chart{width:100%;max-width:1100px;display:block;margin:8px 0}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border-bottom:1px solid #e6ebf0;padding:3px 8px;text-align:left;vertical-align:top}
td{font-variant-numeric:tabular-nums}tr.alert td{background:#fdf0f2}tr.warn td{background:#fff8e6}
table.files td:first-child,table.files td:last-child{overflow-wrap:anywhere;max-width:420px}
ul.notes{color:#8a6200}
"""
