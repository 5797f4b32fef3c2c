"""What runs inside each worker process of the pool.

The initializer loads the model once per process and caps its threads; ``run_unit``
then streams one work unit from input to a temporary output (each batch through the model as
``worker/model/predict.py`` runs it) and renames it into place.
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

import pyarrow as pa

from shardline import contract
from shardline.errors import InputFormatError, InputSchemaError, PredictionError, SetupError
from shardline.worker.io import formats
from shardline.worker.io.rejects import Reject, RejectLog
from shardline.worker.io.text_files import LineMap, header_lines
from shardline.worker.io.work_units import InputFile, WorkUnit
from shardline.worker.model import guards
from shardline.worker.model.features import FeatureChoice, check_spec_against_model, choose_features
from shardline.worker.model.loading import (
    ModelArtifact,
    Predictor,
    import_library,
    import_xgboost_without_sklearn,
    load_predictor,
    sha256_of,
)
from shardline.worker.model.predict import (
    FileProfile,
    PredictionSpread,
    file_failure,
    numeric_features,
    predict_rows,
    with_script_settings,
)
from shardline.worker.model.script_codec import ScriptProtocol
from shardline.worker.pool import preload
from shardline.worker.pool.devices import ENV_SIMULATED_GPUS, WorkerSlot, thread_cap_env
from shardline.worker.pool.forkserver import preload_key

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
    features_by_position: bool = False  # input.features names a headerless CSV's columns, in the file's order
    tolerate_rows: float = 0  # tolerance.rows: rows a file may reject (a count, or a fraction below 1); 0: none
    profile_inputs: tuple[str, ...] = ()  # the input features the step's checks name (checks.features)
    log_format: str = "%(asctime)s %(levelname)s %(message)s"
    table_columns: dict[str, str] = dataclasses.field(default_factory=dict)  # added to every row (--table-columns)
    output_tag: str | None = None  # in each output's name (--output-tag)


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
    profile: dict | None = None  # its columns' profile (report/profile.py, as a dict): the step's checks read it
    features: FeatureChoice | None = None  # the columns the model got, and why
    rejects: tuple[Reject, ...] = ()  # rows rejected (tolerance.rows), in the order found
    model_warnings: int = 0  # lines the model code said that may signal a problem (warnings, WARNING logs, stderr)


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
    forkserver_threads: int = 0  # OS threads the forkserver had before it imported the model's library


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
        check_spec_against_model(settings.features, state.predictor.inputs, by_position=settings.features_by_position)
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
    state.timing.forkserver_threads = loaded.threads_before
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
        return "cuda:0" if import_xgboost_without_sklearn().build_info().get("USE_CUDA") else "cpu"
    return "cpu"


@dataclasses.dataclass
class _UnitProgress:
    """How far a unit got: what its result reports, and the open writer a failure aborts."""

    writer: formats.OutputWriter | None = None
    rows_in: int = 0
    rows_out: int = 0
    rejects: RejectLog | None = None
    model_warnings: int = 0
    choice: FeatureChoice | None = None
    profile: FileProfile = dataclasses.field(default_factory=FileProfile)
    spread: PredictionSpread = dataclasses.field(default_factory=PredictionSpread)


@dataclasses.dataclass(frozen=True)
class _UnitOutput:
    """Where a unit's predictions are written while it runs: a temp name, in the output's format."""

    tmp: Path
    fmt: str
    gz: bool
    header: bool  # a CSV's header line: the first part of a file only
    constants: dict[str, str] = dataclasses.field(default_factory=dict)  # a table's partition, in every row

    def open(self, schema: pa.Schema) -> formats.OutputWriter:
        return formats.OutputWriter(self.tmp, self.fmt, self.gz, schema, header=self.header, constants=self.constants)


def run_unit(unit: WorkUnit) -> UnitResult:
    """Process one unit: stream, predict, write to a temp name, rename when complete."""
    state = _state
    assert state is not None, "run_unit called outside a worker process"
    refused = _refused(state, unit)
    if refused is not None:
        return refused
    settings = state.settings
    started = time.perf_counter()
    out_rel, out_fmt, out_gz = formats.output_target(unit.file, settings.output_format, settings.output_tag)
    final = Path(settings.output_dir) / out_rel
    tmp = formats.temp_path(final, unit.part if unit.is_split else None)
    output = _UnitOutput(tmp, out_fmt, out_gz, header=unit.part == 0, constants=settings.table_columns)
    progress = _UnitProgress(profile=FileProfile(settings.profile_inputs))
    tally = guards.OutputTally()
    try:
        _predict_into(state, unit, output, progress, tally)
        progress.model_warnings = tally.warnings()
        tally.emit(unit.label, _source_name(state.predictor))
        progress.spread.warn_if_constant(unit.label)
        return _written(state, unit, tmp, final, progress, started)
    except Exception as err:  # noqa: BLE001 - the file fails alone, with its reason
        return _failed(state, unit, tmp, progress, tally, err, started)


def _refused(state: _WorkerState, unit: WorkUnit) -> UnitResult | None:
    """The result of a unit this worker cannot run at all: its model did not load, or its file is refused."""
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
    return None


def _predict_into(
    state: _WorkerState, unit: WorkUnit, output: _UnitOutput, progress: _UnitProgress, tally: guards.OutputTally
) -> None:
    """Stream the unit's batches through the model into ``output``, and close it."""
    settings = state.settings
    scratch = Path(settings.scratch_dir)
    # With tolerance.rows a mostly-numbers column stays a number column despite a few bad values; a passthrough
    # column keeps its type, and a model that takes raw text columns gets them as they are.
    keep_types = None if state.predictor.inputs.raw_columns else settings.passthrough
    schema = formats.read_schema(
        unit.file,
        scratch,
        tolerant=settings.tolerate_rows > 0,
        keep_types=keep_types,
        # A rejects part (resubmit --rejects): its rows all failed once, so its features are number columns
        # whatever they hold; only those known by name (a file_order feature keeps the type its values give it).
        numbers=_features_by_name(state.predictor.inputs, settings.features)
        if settings.tolerate_rows >= contract.EVERY_ROW
        else (),
    )
    # A 0-byte text file has no columns at all: nothing to read, and an empty output says so.
    if schema.names:
        try:
            progress.choice = choose_features(
                schema,
                state.predictor.inputs,
                settings.features,
                settings.passthrough,
                unit.file.relative_path,
                fmt=unit.file.fmt,
            )
        except InputSchemaError as err:
            raise with_script_settings(err, state.predictor, unit.file, schema, scratch) from err
    choice = progress.choice
    features = list(choice.columns) if choice else []
    columns = list(dict.fromkeys([*settings.passthrough, *features]))
    batch_rows = settings.gpu_batch_rows if state.predictor.device != "cpu" else settings.batch_rows
    rejects = progress.rejects = _reject_log(settings, unit)
    batches = (
        formats.iter_batches(
            unit,
            columns,
            numeric_features(schema, features),
            batch_rows,
            scratch,
            threads=state.slot.threads,
            rejects=rejects,
            schema=schema,
        )
        if schema.names
        else ()
    )
    text_file = unit.file.fmt != "parquet"
    for batch in batches:
        first_row = progress.rows_in  # the rows read before this batch (before the reader rejected any)
        if settings.profile_inputs:
            progress.profile.add_inputs(batch)
        for out in predict_rows(state.predictor, batch, choice, settings, tally, rejects, first_row, text_file):
            _write(state, output, progress, out, unit)
        progress.rows_in += batch.num_rows
        with state.rows_counter.get_lock():
            state.rows_counter.value += batch.num_rows
    if rejects is not None:
        progress.rows_in += rejects.read_count  # lines the reader could not use are rows in, and rejected
        rejects.check(rows=progress.rows_in)
    if progress.writer is None:  # an empty input still gets an (empty) output
        progress.writer = output.open(_empty_schema(schema, settings.passthrough))
    progress.writer.close()
    progress.writer = None


def _features_by_name(inputs, features) -> tuple[str, ...]:
    """The feature columns known by name before a file is read: the model's recorded names (unless they are hints),
    else input.features as listed; none for a model of raw columns, or with file_order."""
    if inputs.raw_columns:
        return ()
    if inputs.names is not None and not inputs.names_are_hints:
        return tuple(inputs.names)
    return tuple(features) if isinstance(features, tuple) else ()


def _reject_log(settings: JobSettings, unit: WorkUnit) -> RejectLog | None:
    """Where a unit's rejects are kept, when tolerance.rows allows some."""
    if settings.tolerate_rows <= 0:
        return None
    if unit.file.fmt != "parquet":  # a reject names the line an editor shows, found when there is one
        return RejectLog(settings.tolerate_rows, header_lines=header_lines(unit.file), lines=LineMap(unit.file))
    offset = 0
    if unit.row_groups:
        import pyarrow.parquet as pq

        meta = pq.read_metadata(unit.file.path)
        offset = sum(meta.row_group(i).num_rows for i in range(unit.row_groups[0]))
    return RejectLog(settings.tolerate_rows, header_lines=0, row_offset=offset)


def _write(
    state: _WorkerState, output: _UnitOutput, progress: _UnitProgress, out: pa.RecordBatch, unit: WorkUnit
) -> None:
    """One batch of predictions into the unit's output (opened with the first batch's columns)."""
    skip = len(state.settings.passthrough)
    if not state.timing.first_prediction_at:
        state.timing.first_prediction_at = time.time()
    progress.spread.add(out, skip)
    if progress.writer is None:
        progress.writer = output.open(out.schema)
    elif out.schema != progress.writer.schema:
        out = _conform(out, progress.writer.schema, unit)
    progress.profile.add(out, skip)  # what is written, as it is written (after _conform)
    progress.writer.write(out)
    progress.rows_out += out.num_rows


def _written(
    state: _WorkerState, unit: WorkUnit, tmp: Path, final: Path, progress: _UnitProgress, started: float
) -> UnitResult:
    """A written unit's result: a split unit's part stays at its temp name for the merge; a whole file's output
    is renamed into place."""
    output, digest = tmp, None
    if not unit.is_split:
        digest = sha256_of(tmp)
        os.replace(tmp, final)
        output = final
    return UnitResult(
        unit,
        ok=True,
        rows_in=progress.rows_in,
        rows_out=progress.rows_out,
        bytes_out=output.stat().st_size,
        seconds=time.perf_counter() - started,
        output=str(output),
        sha256=digest,
        worker=state.label,
        ready_at=state.ready_at,
        timing=state.timing,
        features=progress.choice,
        profile=progress.profile.to_dict(),
        rejects=_rejects_of(progress),
        model_warnings=progress.model_warnings,
    )


def _rejects_of(progress: _UnitProgress) -> tuple[Reject, ...]:
    return tuple(progress.rejects.rejects) if progress.rejects is not None else ()


def _failed(
    state: _WorkerState,
    unit: WorkUnit,
    tmp: Path,
    progress: _UnitProgress,
    tally: guards.OutputTally,
    err: Exception,
    started: float,
) -> UnitResult:
    """A failed unit leaves no output behind; its result says why, with the hint that fixes it."""
    if progress.writer is not None:
        progress.writer.abort()
    tmp.unlink(missing_ok=True)
    tally.emit(unit.label, _source_name(state.predictor))
    if isinstance(err, SetupError):  # a script's setup problem met while predicting: the job cannot go on
        return UnitResult(
            unit, ok=False, error_class=SetupError.__name__, error_message=str(err), worker=state.label, fatal=True
        )
    err = file_failure(err, unit.label, progress.choice, state.predictor)
    return UnitResult(
        unit,
        ok=False,
        rows_in=progress.rows_in,
        seconds=time.perf_counter() - started,
        error_class=type(err).__name__,
        error_message=str(err),
        worker=state.label,
        ready_at=state.ready_at,
        timing=state.timing,
        features=progress.choice,
    )


def _source_name(predictor: Predictor | None) -> str:
    return "inference.py" if predictor is not None and predictor.kind == "custom" else "the model library"


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


def merge_file(
    file: InputFile, parts: list[str], output_format: str, output_dir: str, output_tag: str | None = None
) -> UnitResult:
    """Join a split file's parts into its final output (runs in a worker process)."""
    state = _state
    started = time.perf_counter()
    out_rel, out_fmt, _ = formats.output_target(file, output_format, output_tag)
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
