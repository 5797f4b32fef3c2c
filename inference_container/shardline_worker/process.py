"""What runs inside each worker process of the pool.

The initializer loads the model once per process and caps its threads; ``run_unit``
then streams one work unit from input to a temporary output and renames it into place.
Only small result records cross the process boundary; data never does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardline_worker import formats
from shardline_worker.devices import ENV_SIMULATED_GPUS, WorkerSlot, thread_cap_env
from shardline_worker.errors import FileError, PredictionError
from shardline_worker.models import ModelArtifact, Predictor, load_predictor, sha256_of
from shardline_worker.planning import InputFile, WorkUnit

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """Everything a worker process needs to know about the job, sent once at start."""

    artifact: ModelArtifact
    output_dir: str
    scratch_dir: str
    features: tuple[str, ...] | None
    passthrough: tuple[str, ...]
    batch_rows: int
    gpu_batch_rows: int
    output_format: str
    probabilities: bool
    content_type: str
    accept: str


@dataclasses.dataclass(frozen=True)
class UnitResult:
    unit: WorkUnit
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


_state: _WorkerState | None = None


def init_worker(settings: JobSettings, slots: Any, rows_counter: Any) -> None:
    """Pool initializer: take a slot, pin its GPU, cap threads, load the model once."""
    global _state
    slot: WorkerSlot = slots.get(timeout=120)
    if slot.gpu is not None:
        # Must happen before CUDA initialises in this process (the pool uses spawn for GPUs).
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpu
    # OpenMP and BLAS read these when they initialise, which happens when the model
    # library loads below; threadpoolctl then re-applies the cap to whatever did load.
    os.environ.update(thread_cap_env(slot.threads))
    state = _WorkerState(settings=settings, slot=slot, rows_counter=rows_counter)
    pa.set_cpu_count(slot.threads)
    pa.set_io_thread_count(max(2, slot.threads))
    try:
        device = _resolve_device(slot, settings.artifact.kind)
        state.label = f"pid {os.getpid()} {device}" + (
            f" (CUDA_VISIBLE_DEVICES={slot.gpu})" if slot.gpu is not None else ""
        )
        state.predictor = load_predictor(
            settings.artifact,
            threads=slot.threads,
            device=device,
            probabilities=settings.probabilities,
            content_type=settings.content_type,
            accept=settings.accept,
        )
        from threadpoolctl import threadpool_limits

        state.limits = threadpool_limits(limits=slot.threads)
    except Exception as err:  # noqa: BLE001 - reported to the main process as a fatal setup error
        # Raising here would break the pool, and the runner would blame the files as poison.
        state.setup_error = f"{type(err).__name__}: {err}"
        state.label = state.label or f"pid {os.getpid()}"
    state.ready_at = time.time()
    _state = state


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
        from shardline_worker.models import import_xgboost_without_sklearn

        return "cuda:0" if import_xgboost_without_sklearn().build_info().get("USE_CUDA") else "cpu"
    return "cpu"


def run_unit(unit: WorkUnit) -> UnitResult:
    """Process one unit: stream, predict, write to a temp name, rename when complete."""
    state = _state
    assert state is not None, "run_unit called outside a worker process"
    if state.setup_error is not None:
        return UnitResult(unit, ok=False, error_class="SetupError", error_message=state.setup_error,
                          worker=state.label, fatal=True)
    settings = state.settings
    started = time.perf_counter()
    out_rel, out_fmt, out_gz = formats.output_target(unit.file, settings.output_format)
    final = Path(settings.output_dir) / out_rel
    tmp = formats.temp_path(final, unit.part if unit.is_split else None)
    writer: formats.OutputWriter | None = None
    rows_in = rows_out = 0
    try:
        scratch = Path(settings.scratch_dir)
        schema = formats.read_schema(unit.file, scratch)
        # A 0-byte text file has no columns at all: nothing to read, and an empty output says so.
        features = formats.resolve_columns(schema, settings.features, settings.passthrough,
                                           unit.file.relative_path) if schema.names else []
        columns = list(dict.fromkeys([*settings.passthrough, *features]))
        batch_rows = settings.gpu_batch_rows if state.predictor.device != "cpu" else settings.batch_rows
        batches = formats.iter_batches(unit, columns, features, batch_rows, scratch,
                                       threads=state.slot.threads) if schema.names else ()
        for batch in batches:
            out = _predict_batch(state.predictor, batch, features, settings.passthrough)
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
            writer = formats.OutputWriter(tmp, out_fmt, out_gz, _empty_schema(schema, settings.passthrough),
                                          header=unit.part == 0)
        writer.close()
        writer = None
        if unit.is_split:
            return UnitResult(unit, ok=True, rows_in=rows_in, rows_out=rows_out, bytes_out=tmp.stat().st_size,
                              seconds=time.perf_counter() - started, output=str(tmp), worker=state.label,
                              ready_at=state.ready_at)
        digest = sha256_of(tmp)
        os.replace(tmp, final)
        return UnitResult(unit, ok=True, rows_in=rows_in, rows_out=rows_out, bytes_out=final.stat().st_size,
                          seconds=time.perf_counter() - started, output=str(final), sha256=digest,
                          worker=state.label, ready_at=state.ready_at)
    except Exception as err:  # noqa: BLE001 - the file fails alone, with its reason
        if writer is not None:
            writer.abort()
        tmp.unlink(missing_ok=True)
        if not isinstance(err, FileError):
            err = PredictionError(f"{type(err).__name__} while predicting {unit.label}: {err}")
        return UnitResult(unit, ok=False, rows_in=rows_in, seconds=time.perf_counter() - started,
                          error_class=type(err).__name__, error_message=str(err), worker=state.label,
                          ready_at=state.ready_at)


def _predict_batch(
    predictor: Predictor, batch: pa.RecordBatch, features: list[str], passthrough: tuple[str, ...]
) -> pa.RecordBatch:
    matrix = formats.to_matrix(batch, features, predictor.dtype, predictor.order)
    predicted = predictor.predict(matrix, batch.select(features))
    names = [*passthrough, *(name for name, _ in predicted)]
    arrays = [batch.column(name) for name in passthrough] + [_to_arrow(values) for _, values in predicted]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _to_arrow(values: Any) -> pa.Array:
    array = np.asarray(values)
    if array.dtype == object:
        return pa.array(array.tolist())
    return pa.array(array)


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
        return UnitResult(unit, ok=False, seconds=time.perf_counter() - started,
                          error_class=type(err).__name__, error_message=f"merging parts failed: {err}",
                          worker=label)
    for part in parts:
        Path(part).unlink(missing_ok=True)
    return UnitResult(unit, ok=True, bytes_out=final.stat().st_size, seconds=time.perf_counter() - started,
                      output=str(final), sha256=digest, worker=label)
