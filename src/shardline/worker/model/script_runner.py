"""Run a SageMaker-style ``inference.py`` exactly as a SageMaker endpoint or Batch Transform would.

The script is imported as SageMaker's containers import it (``model_fn``, then ``input_fn``,
``predict_fn`` and ``output_fn``, or ``transform_fn``), and sees the request bodies those services
would send for the same records (``worker/model/script_codec.py``); its responses are read the way they
are read there. Every response must hold exactly one prediction per record, or the file fails with
the likely cause and the settings under which the first records work (the diagnosis).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardline.contract import JSON_LAYOUTS, JSON_LINES_LAYOUTS
from shardline.errors import PredictionError, SetupError, clipped
from shardline.worker.io.formats import to_matrix
from shardline.worker.model.features import ModelInputs, is_numeric, recorded_inputs
from shardline.worker.model.guards import OutputTally, captured
from shardline.worker.model.script_codec import (
    CONTENT_TYPES,
    CSV,
    JSON,
    JSONLINES,
    MULTI_RECORD,
    NPY,
    SINGLE_RECORD,
    Columns,
    RecordEncodingError,
    ResponseShapeError,
    ScriptProtocol,
    concatenate,
    decode_response,
    encode_records,
    request_ranges,
)


class ScriptError(PredictionError):
    """The script raised while handling a request."""


@dataclasses.dataclass
class ScriptContext:
    """What a handler that takes a ``context`` argument gets (a small stand-in for the toolkit's)."""

    system_properties: dict


def _arity(function) -> int:
    try:
        return _cached_arity(function)
    except TypeError:  # an unhashable callable: not cached
        return _signature_arity(function)


@functools.lru_cache(maxsize=64)
def _cached_arity(function) -> int:
    # Cached: inspect.signature costs about 50 us, a tenth of a single-record call to a small model.
    return _signature_arity(function)


def _signature_arity(function) -> int:
    try:
        return len(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return -1


class InferenceScript:
    """A user's ``inference.py``, imported as SageMaker's containers import it, with its model loaded."""

    def __init__(self, path: str, model_dir: str, device: str):
        code_dir = str(Path(path).parent)
        if code_dir not in sys.path:
            sys.path.insert(0, code_dir)  # sibling modules in code/ import as in SageMaker's containers
        os.environ.setdefault("SM_MODEL_DIR", model_dir)
        spec = importlib.util.spec_from_file_location("inference", path)
        if spec is None or spec.loader is None:
            raise SetupError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs, like a normal import: objects pickled with classes from
        # inference.py, and siblings that import it, then resolve to this module.
        sys.modules["inference"] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            sys.modules.pop("inference", None)
            raise SetupError(
                f"importing {path} failed: {type(err).__name__}: {clipped(str(err))}{requirements_hint(path)}"
            ) from err
        self.path, self.module = path, module
        self.transform_fn = getattr(module, "transform_fn", None)
        self.input_fn = getattr(module, "input_fn", None)
        self.predict_fn = getattr(module, "predict_fn", None)
        self.output_fn = getattr(module, "output_fn", None)
        if self.transform_fn and (self.input_fn or self.predict_fn or self.output_fn):
            raise SetupError(
                f"{path} defines transform_fn and also input_fn/predict_fn/output_fn; SageMaker refuses "
                "that too: keep transform_fn alone, or the other three"
            )
        if not hasattr(module, "model_fn"):
            raise SetupError(f"{path} defines no model_fn(model_dir)")
        self.context = ScriptContext({"model_dir": model_dir, "gpu_id": 0 if device.startswith("cuda") else None})
        try:
            self.model = self.call(module.model_fn, model_dir)
        except SetupError:
            raise
        except Exception as err:
            raise SetupError(
                f"model_fn in {path} failed: {type(err).__name__}: {clipped(str(err))}{requirements_hint(path)}"
            ) from err

    @property
    def takes_body(self) -> bool:
        """False when the script defines neither input_fn nor transform_fn: predict_fn gets the features."""
        return bool(self.input_fn or self.transform_fn)

    def call(self, function, *args):
        """Call a handler with or without the trailing ``context`` argument, as the toolkit does."""
        arity = _arity(function)
        if arity == len(args) + 1:
            return function(*args, self.context)
        if arity not in (-1, len(args)):
            raise SetupError(
                f"{function.__name__} in {self.path} takes {arity} argument(s); SageMaker passes "
                f"{len(args)} (or {len(args) + 1} with context)"
            )
        return function(*args)

    def handle(self, body: Any, data: Any, protocol: ScriptProtocol) -> tuple[Any, str]:
        """One request: the response and its content type. ``data`` is used when there is no input_fn."""
        ct, accept = protocol.content_type, protocol.response_type
        stage = "transform_fn"
        try:
            if self.transform_fn:
                result = self.call(self.transform_fn, self.model, body, ct, accept)
            else:
                if self.input_fn:
                    stage = "input_fn"
                    data = self.call(self.input_fn, body, ct)
                # Named as what ran: a script without predict_fn gets the toolkit's default, model.predict(data).
                stage = "predict_fn" if self.predict_fn else "the default predict_fn (model.predict(data))"
                prediction = (
                    self.call(self.predict_fn, data, self.model)
                    if self.predict_fn
                    else default_predict(self.model, data)
                )
                check_row_order(prediction, data, stage)
                if not self.output_fn:
                    return prediction, accept
                stage = "output_fn"
                result = self.call(self.output_fn, prediction, accept)
        except (SetupError, RowOrderError):
            raise
        except Exception as err:
            # The script's own words, clipped: they may hold the whole request body (scikit-learn's "array=...").
            raise ScriptError(
                f"{Path(self.path).name} raised in {stage}: {type(err).__name__}: {clipped(str(err))}"
            ) from err
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str):
            return result[0], result[1]  # (body, content_type), as the toolkit allows
        return result, accept


class RowOrderError(PredictionError):
    """The script returned its predictions in another order than the request's records."""


def check_row_order(prediction: Any, data: Any, stage: str) -> None:
    """Refuse a pandas DataFrame or Series whose index says its rows are not in the request's order.

    A predict_fn that groups, sorts or concatenates rows keeps each row's original position in the index;
    output_fn then writes the values in the new order, and every prediction would land on another record. An index
    that holds the request's positions (0 to n-1), or the index of the DataFrame the script was given, in another
    order is refused. An index of the script's own (it set ids as the index) says nothing of the order, and passes.
    """
    if not type(prediction).__module__.startswith("pandas") or not hasattr(prediction, "index"):
        return
    index, rows = prediction.index, len(prediction)
    positions = _positions(rows)
    given = getattr(data, "index", None) if type(data).__module__.startswith("pandas") else None
    if index.equals(positions) or (given is not None and index.equals(given)):
        return
    for reference in (positions, given):
        if reference is None or len(reference) != rows or not index.is_unique:
            continue
        try:
            moved = index.sort_values().equals(reference.sort_values())
        except TypeError:  # values that do not sort together are not the same rows
            moved = False
        if moved:
            shown = ", ".join(str(value) for value in list(index[:5]))
            raise RowOrderError(
                f"{stage} returned a {type(prediction).__name__} whose rows are not in the request's order: its "
                f"index begins {shown}, where the request's records are 0 to {rows - 1}. The script reordered the rows "
                "(a groupby, sort or concat keeps each row's original position in the index), so each prediction "
                "would be written against another record. Return the predictions in the request's order, e.g. with "
                ".sort_index() or .reindex(data.index) before returning them"
            )


def _positions(rows: int) -> Any:
    import pandas as pd

    return pd.RangeIndex(rows)


def default_predict(model: Any, data: Any) -> Any:
    """What SageMaker's framework containers do without a predict_fn: ``model.predict(data)``, or call a
    torch module on a float32 tensor."""
    if hasattr(model, "predict"):
        return model.predict(data)
    if type(model).__module__.startswith("torch"):
        import torch

        tensor = data if isinstance(data, torch.Tensor) else torch.as_tensor(np.asarray(data), dtype=torch.float32)
        with torch.inference_mode():
            return model(tensor)
    if callable(model):
        return model(data)
    raise ScriptError(
        f"the model model_fn returned is a {type(model).__name__}, with no predict() and not callable: "
        "define predict_fn(data, model)"
    )


def requirements_hint(script_path: str) -> str:
    requirements = Path(script_path).parent / "requirements.txt"
    if not requirements.is_file():
        return ""
    return (
        f". Note: {requirements} is not installed at run time (the worker image is the pinned environment); "
        "build those packages into the image"
    )


def check_requirements(script_path: str) -> list[str]:
    """What ``code/requirements.txt`` asks for that the image does not have (nothing is installed here)."""
    requirements = Path(script_path).parent / "requirements.txt"
    if not requirements.is_file():
        return []
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    unmet = []
    for raw in requirements.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            unmet.append(f"{line} (not understood)")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # e.g. `pywin32; sys_platform == "win32"`: not for this image
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{line} (not installed)")
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{line} (the image has {installed})")
    return unmet


def model_inputs_of_script(script: InferenceScript, protocol: ScriptProtocol) -> ModelInputs:
    """What the script's model says about its inputs: the recorded feature names of the object
    model_fn returned, when it is one estimator that recorded them."""
    recorded = recorded_inputs(script.model)
    raw = protocol.content_type != NPY and script.takes_body
    return ModelInputs(
        names=recorded.names,
        # The script sits between the file and the model: what the model takes is not what the script is sent,
        # so the model's own count is only a width for the settings trial.
        count=None,
        width=recorded.count,
        raw_columns=raw,
        names_are_hints=protocol.derives_features,
        from_script=True,
        described_as=f"the model that {Path(script.path).name}'s model_fn returned",
    )


class ScriptPredictor:
    """A custom ``inference.py`` as a predictor: records in, one prediction per record out, or a clear error."""

    kind = "custom"
    order = "C"
    dtype = np.dtype(np.float64)  # what the feature matrix is, for x-npy bodies and scripts without input_fn

    def __init__(self, artifact_path: str, model_dir: str, protocol: ScriptProtocol, device: str):
        self.script = InferenceScript(artifact_path, model_dir, device)
        self.protocol = protocol
        self.device = device
        self._settings_found: dict[tuple, str | None] = {}
        self.inputs = model_inputs_of_script(self.script, protocol)

    def predict(self, batch: pa.RecordBatch) -> Columns:
        try:
            return self.run(batch, self.protocol)
        except (ScriptError, ResponseShapeError, RecordEncodingError) as err:
            raise type(err)(f"{str(err).rstrip('.')}. {self.diagnose(batch, err)}") from err

    def run(self, batch: pa.RecordBatch, protocol: ScriptProtocol) -> Columns:
        """Send ``batch`` (the feature columns, in order) through the script under ``protocol``."""
        rows = batch.num_rows
        needs_matrix = protocol.content_type == NPY or not self.script.takes_body
        matrix = None
        if needs_matrix:
            _require_numeric(
                batch,
                "application/x-npy"
                if self.script.takes_body
                else "a script without input_fn (predict_fn gets a float64 matrix)",
            )
            matrix = to_matrix(batch, batch.schema.names, self.dtype, "C")
        if self.script.takes_body:
            encoded = encode_records(batch, protocol, matrix)
            ranges = request_ranges(encoded.sizes, rows, int(protocol.max_payload_mb * 2**20), protocol.single)
        else:
            encoded = None
            ranges = [(i, i + 1) for i in range(rows)] if protocol.single else [(0, rows)]
        parts = []
        for start, stop in ranges:
            body = encoded.body(start, stop) if encoded is not None else None
            data = None if matrix is None else (matrix[start] if protocol.single else matrix[start:stop])
            response, content_type = self.script.handle(body, data, protocol)
            parts.append(decode_response(response, content_type, stop - start))
        return concatenate(parts)

    def diagnose(self, batch: pa.RecordBatch, err: Exception) -> str:
        """Find the settings under which the first records work, to name them all in the error. Runs on
        failure only."""
        # A script that returned several predictions for several records handles them: one record per
        # call would only turn its extra values into extra columns, not fix it.
        many = isinstance(err, ResponseShapeError) and err.got is not None and err.got > 1
        found = self.settings_that_work(batch, single=not many)
        if found:
            return (
                f"The same records work with {found}: this script seems to expect that; set it in the "
                "step's model settings"
            )
        # What the script was really given: a body when it has input_fn (or transform_fn), else the matrix.
        given = f"a float64 matrix of the feature columns ({self.protocol.batch_strategy})"
        hints = [
            f"Sent as: {self.protocol.describe()}" if self.script.takes_body else f"No input_fn: predict_fn got {given}"
        ]
        if isinstance(err, ResponseShapeError) and err.got == 1 and err.records > 1:
            hints.append(
                "one value came back for several records: a script that handles one record per request "
                "needs model.batch_strategy: single_record (--batch-strategy single-record)"
            )
        if (
            isinstance(err, ResponseShapeError)
            and err.got is not None
            and err.got == err.records - 1
            and self.protocol.content_type == CSV
            and not self.protocol.csv_header
        ):
            hints.append(
                "one prediction short: did the script read the first line as a header? Read with "
                "header=None, or set model.csv_header: true (--csv-header)"
            )
        if isinstance(err, ResponseShapeError) and err.got is not None and err.got == err.records + 1:
            hints.append(
                "one prediction too many: does the script predict on the empty line after a body's last "
                "line break, or add a header or summary value to its response?"
            )
        if (self.script.takes_body and _names_a_missing_key(err)) or _is_bare_assertion(err):
            hints.append(
                f"the script looks for a key or shape in the request that is not there: the JSON layouts "
                f"the worker can send are {JSON_LAYOUT_SHAPES} (model.json_layout, --json-layout, with "
                "model.content_type: application/json)"
            )
        return "; ".join(hints)

    def other_settings_needed(self, batch: pa.RecordBatch) -> str:
        """When the features are not named yet: the request settings the script needs besides, found on the
        first records of ``batch`` (the file's candidate columns), so one failed run names every setting."""
        try:
            with captured(OutputTally()):
                self.run(batch.slice(0, min(3, batch.num_rows)), self.protocol)
            return ""
        except Exception:  # noqa: BLE001 - the settings as they are do not work: look for others
            pass
        found = self.settings_that_work(batch)
        return (
            (f"Tried on the first records (in the file's column order), the script also needs {found}: set that too")
            if found
            else ""
        )

    def settings_that_work(self, batch: pa.RecordBatch, single: bool = True) -> str | None:
        """The fewest setting changes (one, else two) under which the script handles the first few records of
        ``batch``, named as a user sets them; None if none does. Runs on failure only, and once per worker for
        the same columns and settings: a job whose every file fails the same way does not search again for each."""
        cache_key = (batch.schema, self.protocol, single)
        if cache_key not in self._settings_found:
            self._settings_found[cache_key] = self._search_settings(batch, single)
        return self._settings_found[cache_key]

    def _search_settings(self, batch: pa.RecordBatch, single: bool) -> str | None:

        sample = batch.slice(0, min(3, batch.num_rows))
        for setting, alternative in self._alternatives(sample.num_rows, single=single):
            try:
                with captured(OutputTally()):  # the alternatives' output is not the file's
                    self.run(sample, alternative)
            except Exception:  # noqa: BLE001 - any failure means "not this setting"
                continue
            return setting
        return None

    def _alternatives(self, rows: int, single: bool = True) -> list[tuple[str, ScriptProtocol]]:
        """Protocols to try, fewest changes first: each request setting, each accept type, then each request
        setting with each accept type (a script whose output_fn ignores accept needs both)."""
        requests = self._request_alternatives(rows, single)
        accepts = [(f"model.accept: {a} (--accept {a})", a) for a in CONTENT_TYPES if a != self.protocol.response_type]
        both = [
            (f"{setting} and {accept_setting}", alternative.replace(accept=accept))
            for setting, alternative in requests
            for accept_setting, accept in accepts
        ]
        return [*requests, *[(setting, self.protocol.replace(accept=a)) for setting, a in accepts], *both]

    def _request_alternatives(self, rows: int, single: bool = True) -> list[tuple[str, ScriptProtocol]]:
        p, options = self.protocol, []
        if p.content_type == CSV:
            options.append(
                (
                    "model.csv_header: true (--csv-header)" if not p.csv_header else "model.csv_header: false",
                    p.replace(csv_header=not p.csv_header),
                )
            )
        if p.content_type in (JSON, JSONLINES):
            for layout in JSON_LAYOUTS:
                if layout != p.json_layout and (p.content_type == JSON or layout in JSON_LINES_LAYOUTS):
                    options.append(
                        (f"model.json_layout: {layout} (--json-layout {layout})", p.replace(json_layout=layout))
                    )
        if not p.single:
            if single:
                options.append(
                    (
                        "model.batch_strategy: single_record (--batch-strategy single-record)",
                        p.replace(batch_strategy=SINGLE_RECORD),
                    )
                )
        elif rows > 1:
            options.append(
                (
                    "model.batch_strategy: multi_record (--batch-strategy multi-record)",
                    p.replace(batch_strategy=MULTI_RECORD),
                )
            )
        if self.script.takes_body:  # another content type (and its layouts), for a script that parses the body
            for content_type in CONTENT_TYPES:
                if content_type == p.content_type:
                    continue
                setting = f"model.content_type: {content_type} (--content-type {content_type})"
                if content_type not in (JSON, JSONLINES):
                    options.append((setting, p.replace(content_type=content_type)))
                    continue
                for layout in JSON_LAYOUTS:
                    if content_type == JSONLINES and layout not in JSON_LINES_LAYOUTS:
                        continue
                    options.append(
                        (
                            setting
                            if layout == "records"
                            else f"{setting} and model.json_layout: {layout} (--json-layout {layout})",
                            p.replace(content_type=content_type, json_layout=layout),
                        )
                    )
        return options


def _names_a_missing_key(err: Exception) -> bool:
    """The script's own KeyError (or TypeError indexing a list by a string): it looked for a JSON key."""
    cause = err.__cause__
    return isinstance(cause, KeyError) or (isinstance(cause, TypeError) and "indices must be" in str(cause))


def _is_bare_assertion(err: Exception) -> bool:
    return isinstance(err.__cause__, AssertionError)


JSON_LAYOUT_SHAPES = (
    'records [{"column": value, ...}, ...], instances {"instances": [[...], ...]}, '
    'inputs {"inputs": [[...], ...]}, array [[...], ...] and lines {"column": value, ...} on each line'
)


def _require_numeric(batch: pa.RecordBatch, what: str) -> None:
    bad = [f"{f.name} ({f.type})" for f in batch.schema if not is_numeric(f.type)]
    if bad:
        raise RecordEncodingError(
            f"{what} carries numbers only, but these feature columns are not numeric: "
            f"{', '.join(bad)}. Leave them out with input.features, or use a text content type"
        )
