"""One record batch through the model, and what its output is checked for.

:func:`predict_batch` is what a pool process runs on each batch of a file (``worker/pool/process.py``) and
what the preview runs on its sample (``worker/tools/preview.py``): the same columns, the same checks (the
model's warnings, NaN predictions, output names), the same failure and its hint (:func:`file_failure`).
The per-file statistics of the output live here too: the profile the step's checks and the run report read,
and the spread that tells a model that does not see its inputs.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from shardline.errors import FileError, InputSchemaError, OutputWriteError, PredictionError, SetupError, clipped
from shardline.report.profile import Profile
from shardline.worker.io import formats
from shardline.worker.io.rejects import PREDICT, RejectLog
from shardline.worker.io.tolerant import ROW_COLUMN
from shardline.worker.io.work_units import InputFile, WorkUnit
from shardline.worker.model import guards
from shardline.worker.model.features import FROM_FILE_ORDER, FeatureChoice, is_numeric, trial_columns
from shardline.worker.model.loading import Predictor
from shardline.worker.model.script_runner import ScriptError

log = logging.getLogger(__name__)

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})  # a write that failed for want of room, not for its data


class OutputSettings(Protocol):
    """What :func:`predict_batch` reads of the job's settings (``process.JobSettings`` has them)."""

    passthrough: tuple[str, ...]
    allow_nan_predictions: bool


def file_failure(err: Exception, label: str, choice: FeatureChoice | None, predictor: Predictor) -> FileError:
    """What a file fails with, and the hint that fixes it: the same for the job and for the preview."""
    if isinstance(err, OSError) and err.errno in DISK_FULL:
        # The disk, not the model: said so, with the setting that gives the instance more room.
        return OutputWriteError(
            f"the instance's disk is full ({os.strerror(err.errno)}) while {label} was read or its output written: "
            f"{err}. Give each instance more room with resources.volume_size_gb (or fewer "
            "resources.workers_per_instance, each holding a file at once); a next attempt scores it again"
        )
    if not isinstance(err, FileError):
        err = PredictionError(
            f"{type(err).__name__} while predicting {label}: {clipped(str(err))}" + _feature_hint(choice)
        )
    if (
        isinstance(err, PredictionError)
        and predictor.kind == "custom"
        and choice is not None
        and choice.source == FROM_FILE_ORDER
    ):
        # The script failed on columns taken in the file's order: say which it got, and how to send others.
        err = type(err)(
            f"{err}. The script got {choice.describe()}. If it expects other columns, or another "
            "order, name them with input.features (--features)"
        )
    return err


def with_script_settings(
    err: InputSchemaError, predictor: Predictor, file: InputFile, schema: pa.Schema, scratch: Path
) -> InputSchemaError:
    """A custom script stopped because nothing names its features: also name the request settings it needs,
    found by trying its first records, so that one failed run names every setting to change."""
    candidates = getattr(err, "candidates", None)
    if predictor.kind != "custom" or not candidates:
        return err
    columns = trial_columns(predictor.inputs, candidates)
    try:
        batch = first_rows(file, columns, numeric_features(schema, columns), 3, scratch)
        hint = predictor.other_settings_needed(batch) if batch.num_rows else ""
    except Exception:  # noqa: BLE001 - the hint is a courtesy: the error stands without it
        return err
    return InputSchemaError(f"{err}. {hint}") if hint else err


def first_rows(file: InputFile, columns: list[str], features: list[str], rows: int, scratch: Path) -> pa.RecordBatch:
    """The first ``rows`` rows of ``file`` (``columns`` only), read as a job reads them."""
    unit = WorkUnit(file, est_bytes=file.size)
    collected, have = [], 0
    for batch in formats.iter_batches(unit, columns, features, rows, scratch):
        collected.append(batch.slice(0, rows - have))
        have += collected[-1].num_rows
        if have >= rows:
            break
    if not collected:
        return pa.RecordBatch.from_pylist([], schema=pa.schema([]))
    return pa.Table.from_batches(collected).combine_chunks().to_batches()[0]


def numeric_features(schema: pa.Schema, features: list[str]) -> list[str]:
    """The features that text readers read as float64: the numeric ones. A string feature (a pipeline's
    category, a script's text column) stays a string."""
    return [name for name in features if is_numeric(schema.field(name).type)]


class FileProfile:
    """A file's :class:`~shardline.report.profile.Profile`, kept batch by batch as it is written (no second pass over
    the output or the input): every output column the model wrote, and the input features the step's checks name.
    The step's end merges every file's for its checks, and the run report compares the first prediction column's
    histogram with the previous run's (drift)."""

    def __init__(self, inputs: tuple[str, ...] = ()) -> None:
        self.profile = Profile()
        self.profile.files = 1
        self.input_names = inputs

    def add(self, out: pa.RecordBatch, skip: int) -> None:
        """Count one batch of output: its columns after the ``skip`` passthrough ones."""
        for name, column in zip(out.schema.names[skip:], out.columns[skip:], strict=True):
            self.profile.add_column("outputs", name, column, formats.column_values)

    def add_inputs(self, batch: pa.RecordBatch) -> None:
        """Count one batch of input: the features the checks name (those the batch has)."""
        names = batch.schema.names
        for name in self.input_names:
            if name in names:
                self.profile.add_column("inputs", name, batch.column(name), formats.column_values)

    def to_dict(self) -> dict:
        return self.profile.to_dict()  # an empty file's too: its step's checks count it as one file of no rows


class PredictionSpread:
    """Min and max of each float output column over a file: a float prediction that never varies over many
    rows is the mark of a model that does not see its inputs (a script filling columns it misses)."""

    MIN_ROWS = 100

    def __init__(self) -> None:
        self.rows = 0
        self.ranges: dict[str, list[float]] = {}

    def add(self, out: pa.RecordBatch, skip: int) -> None:
        import pyarrow.compute as pc

        self.rows += out.num_rows
        for name, column in zip(out.schema.names[skip:], out.columns[skip:], strict=True):
            if not pa.types.is_floating(column.type) or not len(column):
                continue
            low, high = pc.min_max(column).values()
            low, high = low.as_py(), high.as_py()
            if low is None:
                continue
            seen = self.ranges.setdefault(name, [low, high])
            seen[0], seen[1] = min(seen[0], low), max(seen[1], high)

    def warn_if_constant(self, where: str) -> None:
        constant = [name for name, (low, high) in self.ranges.items() if low == high]
        if self.rows >= self.MIN_ROWS and constant and len(constant) == len(self.ranges):
            log.warning(
                "%s: every prediction (%s) is %s over all %d rows: check that the model gets the columns "
                "it expects (run `shardline preview` on this step)",
                where,
                ", ".join(constant),
                self.ranges[constant[0]][0],
                self.rows,
            )


def _feature_hint(choice: FeatureChoice | None) -> str:
    if choice is None:
        return ""
    return f" (the model got {choice.describe()})"


def predict_batch(
    predictor: Predictor,
    batch: pa.RecordBatch,
    choice: FeatureChoice,
    settings: OutputSettings,
    tally: guards.OutputTally,
) -> pa.RecordBatch:
    """Predict one record batch: the output's passthrough columns, then the model's output columns.

    What the model library or script prints, logs or warns goes to ``tally``; a warning that
    means the model got the wrong input fails the file, and so does a NaN prediction.
    """
    passthrough = settings.passthrough
    with guards.captured(tally) as caught:
        predicted = predictor.predict(batch.select(list(choice.columns)))
    order_note = choice.order_note() if caught and choice.order_vouched else None  # only read when it warned
    guards.raise_for_wrong_input(caught, tally, order_note, script=predictor.kind == "custom")
    clashes = [name for name, _ in predicted if name in passthrough]
    if clashes:
        raise PredictionError(
            f"the model's output column(s) {clashes} have the name of passthrough column(s); "
            "rename them in the script, or change input.passthrough"
        )
    arrays = [_to_arrow(values) for _, values in predicted]
    if not settings.allow_nan_predictions:
        for (name, _), array in zip(predicted, arrays, strict=True):
            nans = _nan_count(array)
            if nans:
                rows_with_nulls = _rows_with_missing_features(batch, choice.columns)
                raise _row_level(
                    PredictionError(
                        f"the model returned NaN for {nans} of {batch.num_rows} row(s) in column {name!r}"
                        + (
                            f"; {rows_with_nulls} row(s) of this batch have a missing (null or NaN) feature, which the "
                            "model does not handle"
                            if rows_with_nulls
                            else ""
                        )
                        + ". Fill or drop the missing values upstream, or set model.allow_nan_predictions: true "
                        "(--allow-nan-predictions) if NaN is a valid prediction"
                    )
                )
    names = [*passthrough, *(name for name, _ in predicted)]
    columns = [batch.column(name) for name in passthrough] + arrays
    return pa.RecordBatch.from_arrays(columns, names=names)


def _row_level(err: PredictionError) -> PredictionError:
    """Mark an error that a record may cause alone (a NaN prediction): isolating the record can reject it."""
    err.row_level = True
    return err


def is_row_level(err: Exception) -> bool:
    """Whether an error may come from one record: the script or the model library raised, or returned NaN. A
    setting's error (a response of another length, a record that cannot be encoded, rows returned out of order, a
    warning that the columns may be wrong) is never a row's, and fails the file as it is."""
    if isinstance(err, ScriptError) or getattr(err, "row_level", False):
        return True
    return not isinstance(err, (FileError, SetupError, MemoryError))


def predict_rows(
    predictor: Predictor,
    batch: pa.RecordBatch,
    choice: FeatureChoice,
    settings: OutputSettings,
    tally: guards.OutputTally,
    rejects: RejectLog | None,
    first_row: int,
    text_file: bool,
) -> list[pa.RecordBatch]:
    """:func:`predict_batch`, or with ``rejects`` (``tolerance.rows``): when the batch fails with an error that may
    be one record's, it is split in halves until each record that fails alone is found and rejected, and the
    outputs of the rest are returned, in order. About log2(batch rows) extra calls per rejected row.

    A setting's error fails every record: when the first, middle and last records each fail alone, or no record
    of the batch succeeds, the batch's own error stands and the file fails with it, as without ``rejects``.

    ``first_row``: the batch's first row's number among the rows the reader parsed, when the batch carries no
    :data:`tolerant.ROW_COLUMN`."""
    try:
        return [predict_batch(predictor, batch, choice, settings, tally)]
    except Exception as err:
        if rejects is None or not is_row_level(err):
            raise
        batch_error = err
    rows = batch.num_rows
    probes = (0, rows // 2, rows - 1)
    retake = rejects.retake  # a rejects part: rows that failed once may all fail again, each its own reject
    if rows >= 3 and not retake and not any(_succeeds(predictor, batch.slice(i, 1), choice, settings) for i in probes):
        raise batch_error
    numbers = (
        batch.column(ROW_COLUMN).to_pylist()
        if ROW_COLUMN in batch.schema.names
        else list(range(first_row, first_row + rows))
    )
    outputs: list[pa.RecordBatch] = []

    def split(part: pa.RecordBatch, offset: int) -> None:
        try:
            # What the model says here, it said already on the whole batch (in ``tally``): counted once, not once
            # per half.
            outputs.append(predict_batch(predictor, part, choice, settings, guards.OutputTally()))
            return
        except Exception as err:
            if not is_row_level(err):
                raise
            if part.num_rows == 1:
                values = {name: part.column(name)[0].as_py() for name in settings.passthrough}
                rejects.add(numbers[offset], PREDICT, f"{type(err).__name__}: {err}", values, text_file=text_file)
                rejects.check()
                return
        half = part.num_rows // 2
        split(part.slice(0, half), offset)
        split(part.slice(half), offset + half)

    half = max(1, rows // 2)
    split(batch.slice(0, half), 0)
    if half < rows:
        split(batch.slice(half), half)
    if not outputs and rows > 1 and not retake:
        raise batch_error  # no record of the batch works alone: a setting's error, not the rows'
    return outputs


def _succeeds(predictor: Predictor, row: pa.RecordBatch, choice: FeatureChoice, settings: OutputSettings) -> bool:
    """Whether one record goes through the model alone (a probe: its output and what it says are not kept)."""
    try:
        predict_batch(predictor, row, choice, settings, guards.OutputTally())
        return True
    except Exception:  # noqa: BLE001 - any failure means "this record fails too"
        return False


def _nan_count(array: pa.Array) -> int:
    if pa.types.is_floating(array.type):
        import pyarrow.compute as pc

        return int(pc.sum(pc.is_nan(array)).as_py() or 0) + array.null_count
    return array.null_count


def _rows_with_missing_features(batch: pa.RecordBatch, features) -> int:
    import pyarrow.compute as pc

    missing = None
    for name in features:
        column = batch.column(name)
        flags = pc.is_null(column, nan_is_null=True) if pa.types.is_floating(column.type) else pc.is_null(column)
        missing = flags if missing is None else pc.or_(missing, flags)
    return int(pc.sum(missing).as_py() or 0) if missing is not None else 0


def _to_arrow(values: Any) -> pa.Array:
    array = np.asarray(values)
    if array.dtype == object:
        return pa.array(array.tolist())
    return formats.values_to_arrow(array)
