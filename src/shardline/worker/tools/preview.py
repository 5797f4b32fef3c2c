"""``python -m shardline.worker --preview ROWS``: the model on a sample, before a job runs.

It runs the step's model, with exactly the settings the job would use, on the first rows of
one input file, in this process, and writes nothing but its report: the passthrough columns,
the features as the model gets them (by name), the predictions, a summary per output
column, and warnings about signs of a wrong setup:

- constant predictions over the sample, or NaN predictions;
- lines the script or the model library printed, logged or warned;
- columns of the file the model does not get, and features with missing values (passed as NaN);
- for a custom script: single-record and multi-record calls that disagree on the same rows
  (a script that breaks when batched), and feature columns whose values do not change any
  prediction (a script that expects other column names and fills the ones it misses).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardline.contract import EXIT_FILES_FAILED, EXIT_OK
from shardline.errors import InputSchemaError, SetupError
from shardline.worker.io import formats
from shardline.worker.io.work_units import InputFile
from shardline.worker.model import guards
from shardline.worker.model.features import FROM_FILE_ORDER, FeatureChoice, check_spec_against_model, choose_features
from shardline.worker.model.loading import load_predictor
from shardline.worker.model.predict import (
    file_failure,
    first_rows,
    numeric_features,
    predict_batch,
    with_script_settings,
)
from shardline.worker.model.script_codec import MULTI_RECORD, SINGLE_RECORD
from shardline.worker.pool.process import JobSettings

log = logging.getLogger(__name__)

SHOWN_FEATURES = 8  # features shown in the table; the JSON report has them all
CELL_WIDTH = 14


@dataclasses.dataclass
class PreviewReport:
    file: str
    model: dict
    rows: int = 0
    features: dict | None = None
    protocol: str | None = None
    columns: list[str] = dataclasses.field(default_factory=list)  # passthrough, features, outputs
    passthrough: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)
    table: list[list[Any]] = dataclasses.field(default_factory=list)
    summary: list[dict] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None  # the file would fail in the job, with this reason


def run_preview(args: argparse.Namespace, files: list[InputFile], job: JobSettings) -> int:
    """Preview ``args.preview`` rows of the first input file with the job's settings (``job``); print the report;
    exit 0, or 3 if the file fails."""
    if not files:
        raise SetupError(f"no input files under {args.input_dir} to preview")
    threads = max(1, os.cpu_count() or 1)
    # One batch of the preview's rows; a NaN prediction is shown (and counted) rather than failing the file.
    settings = dataclasses.replace(
        job, batch_rows=args.preview, gpu_batch_rows=args.preview, allow_nan_predictions=True, tolerate_rows=0
    )
    artifact, protocol = job.artifact, job.protocol
    predictor = load_predictor(
        artifact, threads=threads, device="cpu", probabilities=args.probabilities, protocol=protocol
    )
    check_spec_against_model(args.features, predictor.inputs, by_position=args.csv_names is not None)
    report = preview_file(files[0], predictor, settings, args.preview, allow_nan=args.allow_nan_predictions)
    report.model = {"kind": artifact.kind, "sha256": artifact.sha256}
    sys.stdout.write(render(report))
    sys.stdout.flush()
    if args.preview_json:
        args.preview_json.parent.mkdir(parents=True, exist_ok=True)
        args.preview_json.write_text(json.dumps(dataclasses.asdict(report), indent=2, default=_jsonable))
    return EXIT_FILES_FAILED if report.error else EXIT_OK


def preview_file(file: InputFile, predictor, settings: JobSettings, rows: int, *, allow_nan: bool) -> PreviewReport:
    report = PreviewReport(file=file.relative_path, model={}, passthrough=list(settings.passthrough))
    if predictor.kind == "custom":
        report.protocol = predictor.protocol.describe()
    scratch = Path(settings.scratch_dir)
    tally = guards.OutputTally()
    choice: FeatureChoice | None = None
    try:
        schema = formats.read_schema(file, scratch)
        try:
            choice = choose_features(
                schema, predictor.inputs, settings.features, settings.passthrough, file.relative_path, fmt=file.fmt
            )
        except InputSchemaError as err:
            raise with_script_settings(err, predictor, file, schema, scratch) from err
        report.features = {
            "source": choice.source,
            "columns": list(choice.columns),
            "unused": list(choice.unused),
            "why": choice.describe(),
        }
        if choice.source == FROM_FILE_ORDER:
            report.warnings.append(f"the model gets {choice.describe()}")
        columns = list(dict.fromkeys([*settings.passthrough, *choice.columns]))
        batch = first_rows(file, columns, numeric_features(schema, list(choice.columns)), rows, scratch)
        if batch.num_rows == 0:
            report.notes.append(f"{file.relative_path} has no rows: the job writes an empty output for it")
            return report
        out = predict_batch(predictor, batch, choice, settings, tally)
    except SetupError as err:
        report.error = f"{type(err).__name__}: {err}"
        _add_said(report, tally)
        return report
    except Exception as err:  # noqa: BLE001 - as in the job: the file's failure, with the same hint
        err = file_failure(err, file.relative_path, choice, predictor)
        report.error = f"{type(err).__name__}: {err}"
        _add_said(report, tally)
        return report
    report.rows = batch.num_rows
    report.outputs = [name for name in out.schema.names[len(settings.passthrough) :]]
    report.columns = [*settings.passthrough, *choice.columns, *report.outputs]
    values = {name: batch.column(name) for name in [*settings.passthrough, *choice.columns]}
    values.update({name: out.column(name) for name in report.outputs})
    report.table = [[values[name][i].as_py() for name in report.columns] for i in range(batch.num_rows)]
    report.summary = [_summarise(name, out.column(name)) for name in report.outputs]
    _check_predictions(report, allow_nan)
    _check_inputs(report, batch, choice)
    _add_said(report, tally)
    if predictor.kind == "custom" and batch.num_rows > 1:
        features = batch.select(list(choice.columns))
        _compare_strategies(report, predictor, features, out)
        _check_sensitivity(report, predictor, features, out)
    return report


def _jsonable(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _summarise(name: str, column: pa.Array) -> dict:
    values = column.to_numpy(zero_copy_only=False)
    entry: dict[str, Any] = {"column": name, "rows": len(values)}
    if pa.types.is_floating(column.type) or pa.types.is_integer(column.type) or pa.types.is_boolean(column.type):
        numbers = values.astype(np.float64)
        finite = numbers[~np.isnan(numbers)]
        entry.update(
            nans=int(np.isnan(numbers).sum()),
            distinct=len(np.unique(finite)),
            min=float(finite.min()) if len(finite) else None,
            mean=float(finite.mean()) if len(finite) else None,
            max=float(finite.max()) if len(finite) else None,
        )
    else:
        entry.update(nans=int(column.null_count), distinct=len({str(v) for v in values}))
    return entry


def _check_predictions(report: PreviewReport, allow_nan: bool) -> None:
    for entry in report.summary:
        if entry["rows"] > 1 and entry["distinct"] == 1 and not entry["nans"]:
            report.warnings.append(
                f"{entry['column']} is the same for all {entry['rows']} rows of the sample: check that the model gets "
                "the columns it expects (for a script: the column names and the content type it parses)"
            )
        if entry["nans"]:
            job = (
                "the job writes them as NaN (model.allow_nan_predictions)"
                if allow_nan
                else "the job would fail this file (set model.allow_nan_predictions: true if NaN is valid)"
            )
            report.warnings.append(f"{entry['column']} is NaN for {entry['nans']} of {entry['rows']} rows: {job}")


def _check_inputs(report: PreviewReport, batch: pa.RecordBatch, choice: FeatureChoice) -> None:
    import pyarrow.compute as pc

    if choice.unused:
        report.notes.append(f"columns the model does not get (dropped): {', '.join(choice.unused)}")
    for name in choice.columns:
        column = batch.column(name)
        missing = pc.is_null(column, nan_is_null=True) if pa.types.is_floating(column.type) else pc.is_null(column)
        count = int(pc.sum(missing).as_py() or 0)
        if count:
            report.warnings.append(
                f"feature {name} is missing (null or NaN) in {count} of {batch.num_rows} rows: the model gets NaN there"
            )


def _add_said(report: PreviewReport, tally: guards.OutputTally) -> None:
    """What the model code wrote: warnings, records at WARNING or above and stderr as warnings; its prints and
    routine INFO logs as notes."""
    for line, count, notable in tally.notable():
        times = f" ({count} times)" if count > 1 else ""
        (report.warnings if notable else report.notes).append(f"the model code said{times}: {line[:300]}")


def _compare_strategies(report: PreviewReport, predictor, features: pa.RecordBatch, out: pa.RecordBatch) -> None:
    """Call the script the other way (one record per call, or all at once) and compare."""
    protocol = predictor.protocol
    other = SINGLE_RECORD if protocol.batch_strategy == MULTI_RECORD else MULTI_RECORD
    try:
        with guards.captured(guards.OutputTally()):
            columns = predictor.run(features, protocol.replace(batch_strategy=other))
    except Exception as err:  # noqa: BLE001 - reported, not raised: the configured strategy works
        report.notes.append(
            f"with batch_strategy {other} the script fails ({type(err).__name__}: "
            f"{str(err)[:200]}); it needs {protocol.batch_strategy}, as configured"
        )
        return
    mine = {name: out.column(name).to_numpy(zero_copy_only=False) for name in out.schema.names}
    differing = 0
    for name, values in columns:
        if name not in mine or not _same(mine[name], np.asarray(values)):
            differing += 1
    if differing or len(columns) != len(mine) - len(report.passthrough):
        report.warnings.append(
            f"single-record and multi-record calls disagree on the same {features.num_rows} rows: the script gives "
            f"different predictions when records are {'batched' if other == MULTI_RECORD else 'sent one by one'}. "
            "Check how input_fn splits a body into records, and model.batch_strategy"
        )
    else:
        report.notes.append(f"single-record and multi-record calls agree on all {features.num_rows} rows")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fiub" and b.dtype.kind in "fiub":
        return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-9, atol=0, equal_nan=True))
    return bool(np.array_equal(a.astype(str), b.astype(str)))


def _check_sensitivity(report: PreviewReport, predictor, features: pa.RecordBatch, out: pa.RecordBatch) -> None:
    """Shift each feature column by one row: a column that changes no prediction is likely ignored."""
    if len({tuple(map(str, row.values())) for row in features.to_pylist()}) < 2:
        return  # identical rows: nothing to learn
    baseline = [out.column(name).to_numpy(zero_copy_only=False) for name in report.outputs]
    ignored = []
    for index, name in enumerate(features.schema.names):
        column = features.column(index)
        shifted = pa.concat_arrays([column.slice(1), column.slice(0, 1)])
        if shifted.equals(column):
            continue
        probe = features.set_column(index, name, shifted)
        try:
            with guards.captured(guards.OutputTally()):
                columns = predictor.run(probe, predictor.protocol)
        except Exception:  # noqa: BLE001 - a probe that fails tells nothing about this column
            continue
        if all(_same(before, np.asarray(after)) for before, (_, after) in zip(baseline, columns, strict=False)):
            ignored.append(name)
    if ignored and len(ignored) == features.num_columns:
        report.warnings.append(
            "no feature column changes any prediction: the script ignores every column it is "
            "sent. Does it expect other column names (and fill the ones it misses)?"
        )
    elif ignored:
        report.notes.append(
            f"changing these columns changed no prediction of the sample: {', '.join(ignored)} "
            "(the model may not use them, or the script expects other names)"
        )


# -- rendering --------------------------------------------------------------------------------------------------


def render(report: PreviewReport) -> str:
    lines = [
        f"preview of {report.file}: {report.rows} row(s), model {report.model.get('kind')} "
        f"(sha256 {str(report.model.get('sha256'))[:12]})"
    ]
    if report.protocol:
        lines.append(f"requests: {report.protocol}")
    if report.features:
        lines.append(f"features: {report.features['why']}")
    if report.error:
        lines.append(f"FAILS: {report.error}")
    if report.table:
        lines += ["", *_render_table(report)]
    if report.summary:
        lines += ["", "predictions:"]
        for entry in report.summary:
            stats = f"rows {entry['rows']}, NaN {entry['nans']}, distinct {entry['distinct']}"
            if entry.get("min") is not None:
                stats += f", min {entry['min']:.6g}, mean {entry['mean']:.6g}, max {entry['max']:.6g}"
            lines.append(f"  {entry['column']}: {stats}")
    for warning in report.warnings:
        lines.append(f"WARNING: {warning}")
    for note in report.notes:
        lines.append(f"note: {note}")
    if not report.warnings and not report.error:
        lines.append("no warnings")
    return "\n".join(lines) + "\n"


def _render_table(report: PreviewReport) -> list[str]:
    features = [c for c in report.columns if c not in report.passthrough and c not in report.outputs]
    shown = [*report.passthrough, *features[:SHOWN_FEATURES]]
    hidden = len(features) - SHOWN_FEATURES
    order = [report.columns.index(c) for c in shown]
    headers = list(shown)
    if hidden > 0:
        headers.append(f"(+{hidden} more)")
    headers += ["|", *report.outputs]
    outputs = [report.columns.index(c) for c in report.outputs]
    rows = []
    for row in report.table:
        cells = [_format(row[i]) for i in order] + (["..."] if hidden > 0 else []) + ["|"]
        rows.append(cells + [_format(row[i]) for i in outputs])
    widths = [min(CELL_WIDTH, max(len(h), *(len(r[k]) for r in rows))) for k, h in enumerate(headers)]
    out = ["  ".join(_fit(h, w) for h, w in zip(headers, widths, strict=True))]
    out += ["  ".join(_fit(c, w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "null" if value is None else str(value)


def _fit(text: str, width: int) -> str:
    return text[: width - 1] + "~" if len(text) > width else text.rjust(width)
