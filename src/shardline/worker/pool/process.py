"""What runs inside each worker process of the pool.

The initializer loads the model once per process and caps its threads; ``run_unit``
then streams one work unit from input to a temporary output and renames it into place.
Only small result records cross the process boundary; data never does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardline.errors import FileError, InputFormatError, InputSchemaError, PredictionError, SetupError
from shardline.report.histogram import Histogram
from shardline.worker import formats, guards
from shardline.worker.devices import ENV_SIMULATED_GPUS, WorkerSlot, thread_cap_env
from shardline.worker.features import (
    FROM_FILE_ORDER,
    FeatureChoice,
    check_spec_against_model,
    choose_features,
    is_numeric,
)
from shardline.worker.models import ModelArtifact, Predictor, import_library, load_predictor, sha256_of
from shardline.worker.sagemaker_script import ScriptProtocol
from shardline.worker.work_units import InputFile, WorkUnit

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """Everything a worker process needs to know about the job, sent once at start."""

    artifact: ModelArtifact
    output_dir: str
    scratch_dir: str
    features: tuple[str, ...] | str | None  # input.features (--features), or "file_order"; a model's own names win
    passthrough: tuple[str, ...]
    batch_rows: int
    gpu_batch_rows: int
    output_format: str
    probabilities: bool
    protocol: ScriptProtocol  # how a custom inference.py gets its records
    allow_nan_predictions: bool = False
    log_format: str = "%(asctime)s %(levelname)s %(message)s"


@dataclasses.dataclass(frozen=True)
class UnitResult:
    unit: WorkUnit | None  # None: a warm-up task
    ok: bool
    rows_in: int = 0
    rows_out: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    output: str | None = None  # final path, or the part's temp path for a split unit
    sha256: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    worker: str = ""
    fatal: bool = False  # the worker could not load the model: stop the job
    ready_at: float = 0.0  # wall clock when this worker process had its model loaded
    timing: WorkerTiming | None = None  # how this worker process started (the first pool's report it)
    histogram: dict | None = None  # the first prediction column's histogram (report/histogram.py, as a dict)
    features: FeatureChoice | None = None  # the columns the model got, and why


@dataclasses.dataclass
class WorkerTiming:
    """Wall-clock times of one pool process's start, for the start-up breakdown."""

    started_at: float = 0.0  # our code began where the model loads: the worker, or the forkserver it forked from
    imported_at: float = 0.0  # the model's library is imported
    handed_over_at: float = 0.0  # the forkserver was handed the verified model (0: this worker loaded its own)
    loaded_at: float = 0.0  # the model is loaded
    entered_at: float = 0.0  # this worker's pool initializer began
    ready_at: float = 0.0  # this worker is ready to predict
    first_prediction_at: float = 0.0  # this worker predicted its first batch (0 until then)
    preloaded: bool = False  # the model came loaded from the forkserver
    threads_in_use: int = 0  # the most threads any native pool (OpenMP, BLAS, torch) of this worker may use
    forkserver_threads_started: int = 0  # OS threads the model's library started in the forkserver (0: fork-safe)


@dataclasses.dataclass
class _WorkerState:
    settings: JobSettings
    slot: WorkerSlot
    rows_counter: Any
    predictor: Predictor | None = None
    setup_error: str | None = None
    label: str = ""
    limits: Any = None
    ready_at: float = 0.0
    timing: WorkerTiming = dataclasses.field(default_factory=WorkerTiming)


_state: _WorkerState | None = None


def init_worker(settings: JobSettings, slots: Any, rows_counter: Any) -> None:
    """Pool initializer: take a slot, pin its GPU, cap threads, load the model once."""
    global _state
    entered_at = time.time()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(settings.log_format))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    slot: WorkerSlot = slots.get(timeout=120)
    if slot.gpu is not None:
        # Must happen before CUDA initialises in this process (the pool uses spawn for GPUs).
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpu
    # OpenMP and BLAS read these when they initialise, which happens when the model
    # library loads below; threadpoolctl then re-applies the cap to whatever did load.
    os.environ.update(thread_cap_env(slot.threads))
    state = _WorkerState(settings=settings, slot=slot, rows_counter=rows_counter)
    state.timing.entered_at = entered_at
    pa.set_cpu_count(slot.threads)
    pa.set_io_thread_count(max(2, slot.threads))
    try:
        device = _resolve_device(slot, settings.artifact.kind)
        state.label = f"pid {os.getpid()} {device}" + (
            f" (CUDA_VISIBLE_DEVICES={slot.gpu})" if slot.gpu is not None else ""
        )
        state.predictor = _preloaded_predictor(state, device) or _load(state, device)
        check_spec_against_model(settings.features, state.predictor.inputs)
        from threadpoolctl import threadpool_limits

        state.limits = threadpool_limits(limits=slot.threads)
        state.timing.threads_in_use = _threads_in_use()
    except Exception as err:  # noqa: BLE001 - reported to the main process as a fatal setup error
        # Raising here would break the pool, and the runner would blame the files as poison.
        state.setup_error = f"{type(err).__name__}: {err}"
        state.label = state.label or f"pid {os.getpid()}"
    state.ready_at = state.timing.ready_at = time.time()
    _state = state


def _load(state: _WorkerState, device: str) -> Predictor:
    timing, settings = state.timing, state.settings
    timing.started_at = timing.entered_at
    import_library(settings.artifact.kind)
    timing.imported_at = time.time()
    predictor = load_predictor(
        settings.artifact,
        threads=state.slot.threads,
        device=device,
        probabilities=settings.probabilities,
        protocol=settings.protocol,
    )
    timing.loaded_at = time.time()
    return predictor


def _preloaded_predictor(state: _WorkerState, device: str) -> Predictor | None:
    """The model the forkserver loaded before forking this worker, if it is exactly this job's."""
    from shardline.worker import preload
    from shardline.worker.forkserver import preload_key

    loaded, settings = preload.preloaded, state.settings
    if device != "cpu" or loaded is None or loaded.key != preload_key(settings.artifact, settings.probabilities):
        return None
    loaded.predictor.set_threads(state.slot.threads)  # it was loaded single-threaded (see preload.py)
    state.timing.started_at, state.timing.imported_at, state.timing.loaded_at = (
        loaded.started_at,
        loaded.imported_at,
        loaded.loaded_at,
    )
    state.timing.handed_over_at = loaded.handed_over_at
    state.timing.preloaded = True
    state.timing.forkserver_threads_started = loaded.threads_started
    return loaded.predictor


def _threads_in_use() -> int:
    """The cap each native thread pool loaded in this process actually has (what the tests check)."""
    from threadpoolctl import threadpool_info

    counts = [pool["num_threads"] for pool in threadpool_info()]
    if "torch" in sys.modules:
        counts.append(sys.modules["torch"].get_num_threads())
    return max(counts, default=0)


def warm_up() -> UnitResult:
    """A no-op task that makes the pool start its workers before the first file is ready to send."""
    state = _state
    assert state is not None, "warm_up called outside a worker process"
    return UnitResult(
        None,
        ok=state.setup_error is None,
        error_class=SetupError.__name__ if state.setup_error else None,
        error_message=state.setup_error,
        worker=state.label,
        fatal=state.setup_error is not None,
        ready_at=state.ready_at,
        timing=state.timing,
    )


def _resolve_device(slot: WorkerSlot, kind: str) -> str:
    """The device this worker computes on; falls back to the CPU when no CUDA is usable."""
    if slot.gpu is None:
        return "cpu"
    if os.environ.get(ENV_SIMULATED_GPUS):
        return "cpu"  # simulated devices exist only for the assignment logic
    if kind in ("torch", "custom"):
        try:
            import torch
        except ImportError:
            return "cpu"
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if kind == "xgboost":
        from shardline.worker.models import import_xgboost_without_sklearn

        return "cuda:0" if import_xgboost_without_sklearn().build_info().get("USE_CUDA") else "cpu"
    return "cpu"


def run_unit(unit: WorkUnit) -> UnitResult:
    """Process one unit: stream, predict, write to a temp name, rename when complete."""
    state = _state
    assert state is not None, "run_unit called outside a worker process"
    if state.setup_error is not None:
        return UnitResult(
            unit,
            ok=False,
            error_class=SetupError.__name__,
            error_message=state.setup_error,
            worker=state.label,
            fatal=True,
        )
    if unit.file.refusal:
        return UnitResult(
            unit,
            ok=False,
            error_class=InputFormatError.__name__,
            error_message=unit.file.refusal,
            worker=state.label,
            ready_at=state.ready_at,
            timing=state.timing,
        )
    settings = state.settings
    started = time.perf_counter()
    out_rel, out_fmt, out_gz = formats.output_target(unit.file, settings.output_format)
    final = Path(settings.output_dir) / out_rel
    tmp = formats.temp_path(final, unit.part if unit.is_split else None)
    writer: formats.OutputWriter | None = None
    rows_in = rows_out = 0
    choice: FeatureChoice | None = None
    tally = guards.OutputTally()
    try:
        scratch = Path(settings.scratch_dir)
        schema = formats.read_schema(unit.file, scratch)
        # A 0-byte text file has no columns at all: nothing to read, and an empty output says so.
        if schema.names:
            try:
                choice = choose_features(
                    schema, state.predictor.inputs, settings.features, settings.passthrough, unit.file.relative_path
                )
            except InputSchemaError as err:
                raise with_script_settings(err, state.predictor, unit.file, schema, scratch) from err
        features = list(choice.columns) if choice else []
        columns = list(dict.fromkeys([*settings.passthrough, *features]))
        batch_rows = settings.gpu_batch_rows if state.predictor.device != "cpu" else settings.batch_rows
        batches = (
            formats.iter_batches(
                unit, columns, numeric_features(schema, features), batch_rows, scratch, threads=state.slot.threads
            )
            if schema.names
            else ()
        )
        spread, histogram = _Spread(), PredictionHistogram()
        for batch in batches:
            out = predict_batch(state.predictor, batch, choice, settings, tally)
            histogram.add(out, len(settings.passthrough))
            if not state.timing.first_prediction_at:
                state.timing.first_prediction_at = time.time()
            spread.add(out, len(settings.passthrough))
            if writer is None:
                writer_schema = out.schema
                writer = formats.OutputWriter(tmp, out_fmt, out_gz, writer_schema, header=unit.part == 0)
            elif out.schema != writer_schema:
                out = _conform(out, writer_schema, unit)
            writer.write(out)
            rows_in += batch.num_rows
            rows_out += out.num_rows
            with state.rows_counter.get_lock():
                state.rows_counter.value += batch.num_rows
        if writer is None:  # an empty input still gets an (empty) output
            writer = formats.OutputWriter(
                tmp, out_fmt, out_gz, _empty_schema(schema, settings.passthrough), header=unit.part == 0
            )
        writer.close()
        writer = None
        tally.emit(unit.label, _source_name(state.predictor))
        spread.warn_if_constant(unit.label)
        if unit.is_split:
            return UnitResult(
                unit,
                ok=True,
                rows_in=rows_in,
                rows_out=rows_out,
                bytes_out=tmp.stat().st_size,
                seconds=time.perf_counter() - started,
                output=str(tmp),
                worker=state.label,
                ready_at=state.ready_at,
                timing=state.timing,
                features=choice,
                histogram=histogram.to_dict(),
            )
        digest = sha256_of(tmp)
        os.replace(tmp, final)
        return UnitResult(
            unit,
            ok=True,
            rows_in=rows_in,
            rows_out=rows_out,
            bytes_out=final.stat().st_size,
            seconds=time.perf_counter() - started,
            output=str(final),
            sha256=digest,
            worker=state.label,
            ready_at=state.ready_at,
            timing=state.timing,
            features=choice,
            histogram=histogram.to_dict(),
        )
    except Exception as err:  # noqa: BLE001 - the file fails alone, with its reason
        if writer is not None:
            writer.abort()
        tmp.unlink(missing_ok=True)
        tally.emit(unit.label, _source_name(state.predictor))
        if isinstance(err, SetupError):  # a script's setup problem met while predicting: the job cannot go on
            return UnitResult(
                unit, ok=False, error_class=SetupError.__name__, error_message=str(err), worker=state.label, fatal=True
            )
        err = file_failure(err, unit.label, choice, state.predictor)
        return UnitResult(
            unit,
            ok=False,
            rows_in=rows_in,
            seconds=time.perf_counter() - started,
            error_class=type(err).__name__,
            error_message=str(err),
            worker=state.label,
            ready_at=state.ready_at,
            timing=state.timing,
            features=choice,
        )


def file_failure(err: Exception, label: str, choice: FeatureChoice | None, predictor: Predictor) -> FileError:
    """What a file fails with, and the hint that fixes it: the same for the job and for the preview."""
    if not isinstance(err, FileError):
        err = PredictionError(f"{type(err).__name__} while predicting {label}: {err}" + _feature_hint(choice))
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
    try:
        batch = first_rows(file, list(candidates), numeric_features(schema, list(candidates)), 3, scratch)
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


class PredictionHistogram:
    """The distribution of a file's first prediction column, kept batch by batch as it is written (no second
    pass over the output): the run report compares it with the previous run's (drift)."""

    def __init__(self) -> None:
        self.column: str | None = None
        self.histogram: Histogram | None = None

    def add(self, out: pa.RecordBatch, skip: int) -> None:
        if out.num_columns <= skip:
            return
        name, column = out.schema.names[skip], out.column(skip)
        if self.column is None:
            self.column = name
            numeric = (
                pa.types.is_integer(column.type)
                or pa.types.is_floating(column.type)
                or pa.types.is_boolean(column.type)
            )
            self.histogram = Histogram() if numeric else None  # string labels: no histogram
        if self.histogram is not None and name == self.column:
            self.histogram.add(formats.column_values(column))

    def to_dict(self) -> dict | None:
        if self.histogram is None:
            return None
        return {"column": self.column, **self.histogram.to_dict()}


class _Spread:
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


def _source_name(predictor: Predictor | None) -> str:
    return "inference.py" if predictor is not None and predictor.kind == "custom" else "the model library"


def _feature_hint(choice: FeatureChoice | None) -> str:
    if choice is None:
        return ""
    return f" (the model got {choice.describe()})"


def predict_batch(
    predictor: Predictor, batch: pa.RecordBatch, choice: FeatureChoice, settings: JobSettings, tally: guards.OutputTally
) -> pa.RecordBatch:
    """Predict one record batch: the output's passthrough columns, then the model's output columns.

    What the model library or script prints, logs or warns goes to ``tally``; a warning that
    means the model got the wrong input fails the file, and so does a NaN prediction.
    """
    passthrough = settings.passthrough
    with guards.captured(tally) as caught:
        predicted = predictor.predict(batch.select(list(choice.columns)))
    guards.raise_for_wrong_input(caught, tally, order_vouched=choice.order_vouched, script=predictor.kind == "custom")
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
                raise PredictionError(
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
    names = [*passthrough, *(name for name, _ in predicted)]
    columns = [batch.column(name) for name in passthrough] + arrays
    return pa.RecordBatch.from_arrays(columns, names=names)


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


def _conform(out: pa.RecordBatch, schema: pa.Schema, unit: WorkUnit) -> pa.RecordBatch:
    try:
        return out.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as err:
        raise PredictionError(
            f"the model's output changed shape or type within {unit.label}: {out.schema} vs {schema}"
        ) from err


def _empty_schema(schema: pa.Schema, passthrough: tuple[str, ...]) -> pa.Schema:
    present = [schema.field(name) for name in passthrough if name in schema.names]
    return pa.schema([*present, pa.field("prediction", pa.float64())])


def merge_file(file: InputFile, parts: list[str], output_format: str, output_dir: str) -> UnitResult:
    """Join a split file's parts into its final output (runs in a worker process)."""
    state = _state
    started = time.perf_counter()
    out_rel, out_fmt, _ = formats.output_target(file, output_format)
    final = Path(output_dir) / out_rel
    tmp = formats.temp_path(final)
    unit = WorkUnit(file, est_bytes=0)
    label = state.label if state else f"pid {os.getpid()}"
    try:
        formats.merge_parts([Path(p) for p in parts], tmp, out_fmt)
        digest = sha256_of(tmp)
        os.replace(tmp, final)
    except Exception as err:  # noqa: BLE001 - the file fails alone
        tmp.unlink(missing_ok=True)
        return UnitResult(
            unit,
            ok=False,
            seconds=time.perf_counter() - started,
            error_class=type(err).__name__,
            error_message=f"merging parts failed: {err}",
            worker=label,
        )
    for part in parts:
        Path(part).unlink(missing_ok=True)
    return UnitResult(
        unit,
        ok=True,
        bytes_out=final.stat().st_size,
        seconds=time.perf_counter() - started,
        output=str(final),
        sha256=digest,
        worker=label,
    )
