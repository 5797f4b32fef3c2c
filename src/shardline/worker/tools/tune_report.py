"""What auto-tune shows: the machine's line, the table, the text it prints and the plot it draws."""

from __future__ import annotations

import logging
from pathlib import Path

from shardline.worker.tools.tune_decisions import Point, within_noise

log = logging.getLogger("shardline.worker")

PLOT_NAME, JSON_NAME = "tune.png", "tune.json"


def machine_line(machine: dict) -> str:
    gpus = ", ".join(machine["gpus"]) or "no GPU"
    if machine["simulated_gpus"]:
        gpus += " (simulated: computing on the CPU)"
    memory = f", {machine['memory_gib']} GiB" if machine["memory_gib"] else ""
    load = (
        f", load average {machine['load_average_1m']} as it started (other work skews the figures)"
        if machine.get("load_average_1m") is not None
        else ""
    )
    return f"{machine['cores']} cores ({machine['cpu']}){memory}, {gpus}{load}"


def render_table(points: list[Point], chosen: Point, *, gpu: bool) -> list[str]:
    head = f"{'phase':<10} {'workers x threads':>17} {'batch_rows':>12} "
    head += f"{'gpu_batch_rows':>14} " if gpu else ""
    head += f"{'rows/s (median)':>16} {'spread':>7} {'runs':>5}"
    lines = [head]
    for p in points:
        line = f"{p.phase:<10} {p.setting.split:>17} {p.setting.batch_rows:>12,} "
        line += f"{p.setting.gpu_batch_rows:>14,} " if gpu else ""
        line += f"{p.median:>16,.0f} {p.spread:>7.1%} {len(p.rates):>5}"
        lines.append(line + ("  <- best" if p is chosen else ""))
    return lines


def render(result: dict, points: list[Point], chosen: Point, *, on_gpu: bool, plot: Path | None, out: Path) -> str:
    sample, machine = result["sample"], result["machine"]
    laid = (
        f", laid out {sample['copies']} times ({sample['rows_per_run']:,} rows a run) so every worker has files"
        if sample["copies"] > 1
        else ""
    )
    lines = [
        f"auto-tune on {machine_line(machine)}",
        f"model {result['model']['kind']} (sha256 {result['model']['sha256'][:12]}...); sample: the first "
        f"{len(sample['files'])} input file(s), {sample['rows']:,} rows{laid}",
        f"each setting run {result['repeat']} time(s); rows/s from every worker ready to the last output (pool "
        "start-up excluded); spread = (max - min) / median",
        "",
        *render_table(points, chosen, gpu=on_gpu),
        "",
        f"best: {chosen.setting.split} (workers x threads), "
        + (
            f"gpu batch rows {chosen.setting.gpu_batch_rows:,}"
            if on_gpu
            else f"batch_rows {chosen.setting.batch_rows:,}"
        )
        + f": {chosen.median:,.0f} rows/s",
        f"{'gpu ' if on_gpu else ''}batch sweep: {result['batch_sweep']}",
    ]
    close = within_noise(points, chosen, result["tolerance"])
    if close:
        lines.append(
            f"as good as the best, as far as the runs tell (within {result['tolerance']:.0%}, or a run as "
            "fast as its slowest): "
            + ", ".join(
                f"{p.setting.split} batch {p.setting.batch_rows:,}"
                + (f" gpu {p.setting.gpu_batch_rows:,}" if on_gpu else "")
                for p in close
            )
        )
    lines += [
        "",
        "paste into the step's entry in the pipeline spec:",
        "",
        *(f"  {line}" for line in result["snippet"].splitlines()),
        "",
    ]
    lines += [f"- {note}" for note in result["notes"]]
    lines += [
        "",
        f"figures: {out / JSON_NAME}",
        f"plot: {plot}" if plot else "plot: none (matplotlib is not installed here: pip install matplotlib)",
    ]
    return "\n".join(lines) + "\n"


def draw_plot(
    split_points: list[Point], batch_points: list[Point], chosen: Point, path: Path, machine: dict, *, on_gpu: bool
) -> Path | None:
    """rows/s per split and per batch size (each run a dot, the median a line); None without matplotlib."""
    try:
        from matplotlib.figure import Figure  # Agg through Figure.savefig: no pyplot, no display
    except ImportError:
        log.warning("tune: matplotlib is not installed, so no plot is drawn (the table and %s are written)", JSON_NAME)
        return None
    panels = [p for p in (split_points, batch_points) if p]
    figure = Figure(figsize=(5.5 * len(panels), 4), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    index = 0
    if split_points:
        ax = axes[index]
        index += 1
        labels = [p.setting.split for p in split_points]
        ax.bar(range(len(labels)), [p.median for p in split_points], color="#9ecae1")
        for i, p in enumerate(split_points):
            ax.plot([i] * len(p.rates), p.rates, "o", color="#08519c", markersize=4)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(f"workers x threads (batch rows {split_points[0].setting.batch_rows:,})")
        ax.set_ylabel("rows/s")
        ax.set_title("split of the cores")
    ax = axes[index]
    sizes = [p.setting.gpu_batch_rows if on_gpu else p.setting.batch_rows for p in batch_points]
    ax.plot(sizes, [p.median for p in batch_points], "-", color="#9ecae1")
    for size, p in zip(sizes, batch_points, strict=True):
        ax.plot([size] * len(p.rates), p.rates, "o", color="#08519c", markersize=4)
    best = chosen.setting.gpu_batch_rows if on_gpu else chosen.setting.batch_rows
    ax.axvline(best, color="#e6550d", linestyle="--", label=f"best {best:,}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{size // 1024}k" if size >= 1024 else str(size) for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel(("GPU batch rows" if on_gpu else "batch rows") + f" ({chosen.setting.split})")
    ax.set_ylabel("rows/s")
    ax.set_title("rows per batch")
    ax.legend()
    for axis in axes:
        axis.set_ylim(bottom=0)
        axis.yaxis.set_major_formatter(lambda value, _pos: f"{value / 1e3:,.0f}k")
        axis.grid(alpha=0.3)
    figure.suptitle(
        f"shardline --tune on {machine['cores']} cores"
        + (f", {', '.join(machine['gpus'])}" if machine["gpus"] else ", no GPU"),
        fontsize=10,
    )
    figure.savefig(path, format="png")
    return path
