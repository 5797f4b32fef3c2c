"""Which columns of a file the model receives, in which order, and why. Pure policy, no I/O.

The rule, in order of precedence:

1. **The model's own names.** A model that recorded its feature names when it was fitted
   (scikit-learn's ``feature_names_in_``, an XGBoost Booster's ``feature_names``, a pipeline
   whose first step recorded them, or the object a custom ``model_fn`` returned) gets exactly
   those columns, by name, in its order, whatever the file's column order and whatever extra
   columns the file has. A missing one fails the file. ``input.features``, when set, must be
   that set in that order. Only a custom script that computes the model's features itself
   from other columns (``model.derives_features: true``) is sent ``input.features`` instead.
2. **The spec's** ``input.features`` (``--features``), in the order given.
3. **Nothing else.** A model that records no names (fitted on a numpy array, a torch module,
   most custom scripts) and no ``input.features`` fails each file with an error naming that
   setting: a file's column order says nothing about the order the model was trained with,
   and guessing it gives wrong numbers with no error. Only ``input.features: file_order``
   takes every numeric non-passthrough column (for a custom script with a text body: every
   non-passthrough column) in the file's own order, and the job log and the preview say so as
   a WARNING. A model that knows how many features it wants gets exactly that many.

Types: integers, floats, decimals and booleans are cast to the model's float type (a boolean
is 1.0 or 0.0, a decimal its nearest float); a null becomes NaN, which tree models treat as
missing and other models refuse. Any other type (string, timestamp, binary) is refused as a
feature unless the model takes raw columns (a scikit-learn pipeline, a custom script with a
text body), which then receives it unchanged.

:func:`recorded_inputs` reads what a fitted model recorded of its features (rule 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from shardline.contract import FEATURES_FILE_ORDER
from shardline.errors import InputSchemaError, SetupError

# Where the columns came from, as logged and written to the manifest.
FROM_MODEL = "model"
FROM_SPEC = "spec"
FROM_FILE_ORDER = "file_order"  # input.features: file_order, the one opt-in to the file's own column order

WHY = {
    FROM_MODEL: "by the names the model recorded when it was fitted, in its order",
    FROM_SPEC: "from input.features (--features), in that order",
    FROM_FILE_ORDER: "in the file's own order, as input.features is file_order (nothing checks that this is the "
    "order the model was trained with): every {kind} column",
}


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """What a loaded model says about the inputs it wants."""

    names: tuple[str, ...] | None = None  # recorded feature names, in the model's order
    count: int | None = None  # how many features it wants, when it knows
    raw_columns: bool = False  # takes non-numeric columns as they are (pipelines, text bodies)
    # A custom script whose spec says it computes the model's features itself (model.derives_features): the
    # recorded names then decide only when the file has every one of them, and input.features, when set, wins.
    names_are_hints: bool = False
    from_script: bool = False  # the names are those of the object a custom script's model_fn returned
    width: int | None = None  # how many features the model itself takes, when known (count may be None for scripts)
    described_as: str = "the model"  # how messages name it, e.g. "the model (HistGradientBoostingClassifier)"

    @property
    def known_width(self) -> int | None:
        if self.count is not None:
            return self.count
        if self.width is not None:
            return self.width
        return len(self.names) if self.names is not None else None


@dataclasses.dataclass(frozen=True)
class FeatureChoice:
    """The columns one file gives the model, and why those."""

    columns: tuple[str, ...]
    source: str  # FROM_MODEL | FROM_SPEC | INFERRED
    unused: tuple[str, ...] = ()  # columns of the file that are neither features nor passthrough
    raw_columns: bool = False  # non-numeric columns were allowed (a pipeline, a script with a text body)

    derived: bool = False  # a custom script computes the model's features from these (model.derives_features)

    @property
    def order_vouched(self) -> bool:
        """True when something other than the file's own column order fixed the feature order."""
        return self.source in (FROM_MODEL, FROM_SPEC)

    def order_note(self) -> str:
        """What is true of the order the columns were sent in, for a script whose model warns that it got no
        feature names (the script passed it an array)."""
        if self.derived:
            return (
                "the script derives the model's features from input.features (model.derives_features): the order "
                "the model gets them in is the script's"
            )
        if self.source == FROM_MODEL:
            return "Shardline sent the columns in the order the model recorded"
        return "Shardline sent the columns in input.features' order, which the spec says is the training order"

    def describe(self) -> str:
        why = WHY[self.source].format(kind="non-passthrough" if self.raw_columns else "numeric non-passthrough")
        listing = _listing(self.columns)
        unused = f"; not used: {_listing(self.unused)}" if self.unused else ""
        return f"{len(self.columns)} feature column(s), {why}: {listing}{unused}"


def is_numeric(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_decimal(dtype)
        # CSV and JSON infer `null` for a column with no values at all; it reads as NaN.
        or pa.types.is_null(dtype)
    )


def check_spec_against_model(
    spec_features: Sequence[str] | None, model: ModelInputs, *, by_position: bool = False
) -> None:
    """A spec that names other features than the model recorded is a setup error: every file would fail, or
    (a script's model, which Shardline cannot see fed) every file would be scored on the wrong columns.

    ``by_position``: input.features names a headerless CSV's columns in the file's order (input.csv_header:
    false), so its order is the file's, and the model's names pick the columns by name whatever it is."""
    if model.names_are_hints:
        return
    if spec_features == FEATURES_FILE_ORDER:
        return  # the model's names, when it has them, win; else the file's order, with a warning
    if not spec_features or model.names is None:
        if spec_features and model.count is not None and len(spec_features) != model.count:
            raise SetupError(
                f"input.features (--features) names {len(spec_features)} column(s), but {model.described_as} "
                f"expects {model.count}: fix input.features"
            )
        return
    if set(spec_features) != set(model.names):
        missing = [n for n in model.names if n not in spec_features]
        extra = [n for n in spec_features if n not in model.names]
        raise SetupError(
            f"input.features (--features) does not match the feature names {model.described_as} recorded when "
            f"it was fitted (missing: {_listing(missing) or 'none'}; not in the model: {_listing(extra) or 'none'}). "
            f"The model's recorded order: {_listing(model.names)}. "
            + (
                "A script fed JSON records finds no key for a name it is not sent (and may fill it with a default, "
                "which gives wrong numbers): make input.features that set in that order, or remove it. If the "
                "script computes the model's features itself from other columns, say so with "
                "model.derives_features: true (--derives-features)"
                if model.from_script
                else "The model's names decide the columns and their order: remove input.features, or make it "
                "the same set"
            )
        )
    if model.from_script and not by_position and tuple(spec_features) != tuple(model.names):
        # A script may pass the model an array: the columns' order is then all that says which is which.
        raise SetupError(
            f"input.features (--features) names the features {model.described_as} recorded, in another order: "
            f"input.features: {_listing(spec_features)}; the model's recorded order: {_listing(model.names)}. "
            "Put input.features in the model's order (or remove it: the model's names then choose the columns)"
        )


def choose_features(
    schema: pa.Schema,
    model: ModelInputs,
    spec_features: Sequence[str] | str | None,
    passthrough: Sequence[str],
    where: str,
    *,
    fmt: str | None = None,
) -> FeatureChoice:
    """The feature columns of a file with this schema, or an InputSchemaError naming what to change.

    ``fmt`` is the file's format: JSON lines have no column order for file_order to take."""
    present = schema.names
    for name in passthrough:
        if name not in present:
            raise InputSchemaError(
                f"passthrough column {name!r} not found in {where}; columns present: {_listing(present)}. "
                "Fix input.passthrough (--passthrough)"
            )
    file_order = spec_features == FEATURES_FILE_ORDER
    if file_order and fmt == "jsonl" and not (model.names is not None and not model.names_are_hints):
        raise InputSchemaError(
            f"input.features is file_order, but {where} is JSON lines: a JSON object has no column order, so each "
            "file's first record would decide it (and may differ from file to file). Name the features, in "
            "training order, with input.features (--features)"
        )
    listed = None if file_order or not spec_features else tuple(spec_features)
    names = model.names
    lacking: tuple[str, ...] = ()
    if names is not None and model.names_are_hints and (listed or any(n not in present for n in names)):
        lacking = tuple(n for n in names if n not in present)
        names = None
    if names is not None:
        columns, source = _recorded_columns(schema, model, names, passthrough, where), FROM_MODEL
    elif listed:
        for name in listed:
            if name not in present:
                raise InputSchemaError(
                    f"feature column {name!r} (input.features) not found in {where}; "
                    f"columns present: {_listing(present)}"
                )
        columns, source = listed, FROM_SPEC
    else:
        kind = "" if model.raw_columns else "numeric "
        candidates = tuple(
            f.name for f in schema if f.name not in passthrough and (model.raw_columns or is_numeric(f.type))
        )
        if not file_order:
            error = InputSchemaError(unnamed_model_message(model, where, candidates, lacking))
            error.candidates = candidates  # for a script, the worker tries them to name its other settings too
            raise error
        columns, source = candidates, FROM_FILE_ORDER
        _check_file_order(schema, model, columns, passthrough, where, kind)
    if not model.raw_columns:
        for name in columns:
            dtype = schema.field(name).type
            if not is_numeric(dtype):
                raise InputSchemaError(
                    f"feature column {name!r} in {where} has type {dtype}; {model.described_as} takes numbers "
                    "only (integer, float, decimal or boolean). Cast it upstream, or leave it out of the features"
                )
    used = set(columns) | set(passthrough)
    unused = tuple(name for name in present if name not in used)
    derived = model.names_are_hints and source != FROM_MODEL
    return FeatureChoice(columns=columns, source=source, unused=unused, raw_columns=model.raw_columns, derived=derived)


def _recorded_columns(
    schema: pa.Schema, model: ModelInputs, names: Sequence[str], passthrough: Sequence[str], where: str
) -> tuple[str, ...]:
    """The model's recorded names, when the file has every one of them."""
    present = schema.names
    missing = [name for name in names if name not in present]
    if missing and model.from_script:
        candidates = tuple(f.name for f in schema if f.name not in passthrough)
        error = InputSchemaError(script_lacks_message(model, where, missing, candidates))
        error.candidates = candidates  # the worker tries the first records to name the other settings too
        raise error
    if missing:
        raise InputSchemaError(
            f"{where} lacks column(s) {_listing(missing)} that {model.described_as} was fitted with; "
            f"columns present: {_listing(present)}. The model's feature names: {_listing(names)}"
        )
    return tuple(names)


def _check_file_order(
    schema: pa.Schema, model: ModelInputs, columns: Sequence[str], passthrough: Sequence[str], where: str, kind: str
) -> None:
    """file_order took ``columns``: there must be some, and as many as the model takes when it says."""
    if not columns:
        raise InputSchemaError(
            f"{where} has no {kind}columns besides the passthrough ones; columns present: {_listing(schema.names)}. "
            "Name the features with input.features (--features)"
        )
    if model.count is not None and len(columns) != model.count:
        skipped = [f.name for f in schema if f.name not in passthrough and f.name not in columns]
        raise InputSchemaError(
            f"{model.described_as} expects {model.count} features, but {where} has {len(columns)} {kind}"
            f"column(s) besides the passthrough ones: {_listing(columns)}"
            + (f" (skipped, not numeric: {_listing(skipped)})" if skipped else "")
            + f". input.features is file_order, which takes them all: name the model's {model.count} features, "
            "in training order, with input.features (--features)"
        )


def script_lacks_message(model: ModelInputs, where: str, missing: Sequence[str], candidates: Sequence[str]) -> str:
    """A custom script's model recorded feature names that a file lacks: say which, in the model's order, and
    why guessing is unsafe (a script fed JSON records looks each name up, and finds no such key)."""
    present_in_order = [name for name in model.names or () if name in candidates]
    others = [name for name in candidates if name not in present_in_order]
    return (
        f"{where} lacks column(s) {_listing(missing)}, which {model.described_as} recorded as feature names when "
        "it was fitted. "
        f"The model's recorded order: {_listing(model.names or ())}. A script fed JSON records finds no key "
        f"{missing[0]!r} in them (and one that fills a missing key with a default gives wrong numbers with no "
        "error): rename the column upstream so the file has every recorded name. If the script computes the "
        "model's features itself from other columns, name those with input.features (--features) and set "
        "model.derives_features: true (--derives-features). Columns of the file (not passthrough), the model's "
        f"names first in its order: {_listing([*present_in_order, *others])}"
    )


def trial_columns(model: ModelInputs, candidates: Sequence[str]) -> list[str]:
    """The columns the settings trial sends a script: as many as the model takes when it says (its recorded
    names first, in its order), so an extra column in the file does not hide the other settings."""
    width = model.known_width
    named = [name for name in model.names or () if name in candidates]
    ordered = [*named, *(name for name in candidates if name not in named)]
    return ordered[:width] if width else ordered


def unnamed_model_message(
    model: ModelInputs, where: str, candidates: Sequence[str], lacking: Sequence[str] = ()
) -> str:
    """Why a model that records no feature names cannot read a file until input.features names them.

    Suggests only the fix that cannot give wrong numbers: naming the features in training order.
    (Listing extra columns as passthrough would leave the rest in the file's order, which may not be
    the model's.)
    """
    if lacking:
        recorded = (
            f"{_capital(model.described_as)} recorded feature names the file lacks "
            f"({_listing(lacking)}; the script may make them itself), so they cannot choose the columns"
        )
    else:
        recorded = f"{_capital(model.described_as)} records no feature names"
    wanted = f"its {model.count} features" if model.count is not None else "its features"
    return (
        f"{recorded}, and input.features (--features) is not set: nothing says which columns of {where} it was "
        f"trained on, or in which order, and a file's own column order is no evidence of either. Name {wanted}, "
        "in training order, with input.features (a list in the spec, or --features a,b,c). "
        f"Candidate columns of the file (not passthrough): {_listing(list(candidates))}"
    )


def _listing(names: Sequence[str], limit: int = 20) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _is_sklearn_composite(model: Any) -> bool:
    """A scikit-learn Pipeline or ColumnTransformer: it takes a DataFrame's raw columns, strings included."""
    return type(model).__module__.startswith("sklearn") and type(model).__name__ in ("Pipeline", "ColumnTransformer")


def recorded_inputs(model: Any) -> ModelInputs:
    """The feature names and count a fitted model recorded, when it did.

    scikit-learn estimators and pipelines (and xgboost's sklearn wrappers) fitted on a DataFrame
    record ``feature_names_in_``; an XGBoost Booster trained on named data keeps ``feature_names``.
    """
    label = f"the model ({type(model).__name__})"
    if (
        type(model).__module__.startswith("xgboost")
        and hasattr(model, "num_features")
        and hasattr(model, "feature_names")
    ):  # a Booster
        names = model.feature_names
        types = model.feature_types or []
        if "c" in types:
            categorical = [n for n, t in zip(names or [], types, strict=False) if t == "c"]
            raise SetupError(
                f"{label} has categorical features ({', '.join(categorical) or 'unnamed'}); Shardline "
                "passes numbers only. Encode them as numbers before training"
            )
        return ModelInputs(names=tuple(names) if names else None, count=model.num_features(), described_as=label)
    names = getattr(model, "feature_names_in_", None)
    count = getattr(model, "n_features_in_", None)
    return ModelInputs(
        names=tuple(str(n) for n in names) if names is not None else None,
        count=int(count) if count is not None else None,
        raw_columns=_is_sklearn_composite(model),
        described_as=label,
    )
