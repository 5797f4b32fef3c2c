"""A step's model, input and output, as the spec declares them (re-exported by :mod:`shardline.spec`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from shardline.spec.base import SHA256_PATTERN, VERSION_PATTERN, VERSION_TEMPLATE, _Strict
from shardline.spec.tables import TableSpec


class ModelRef(_Strict):
    """The model of a step. The request settings apply to a custom ``code/inference.py`` only, and
    mirror SageMaker Batch Transform's: see docs/worker.md, "Bring your own inference.py"."""

    uri: str = Field(description="S3 URI of model.tar.gz (or a model file); may use Jinja templates")
    sha256: Annotated[str, Field(pattern=SHA256_PATTERN)] | None = Field(
        default=None, description="pinned digest of the artifact; the worker refuses anything else"
    )
    versions: dict[Annotated[str, Field(pattern=VERSION_PATTERN)], Annotated[str, Field(pattern=SHA256_PATTERN)]] = (
        Field(default={}, description="model_version -> pinned sha256, when model.uri uses {{ params.model_version }}")
    )
    version: Annotated[str, Field(pattern=VERSION_PATTERN)] = Field(
        default="latest", description="default of the model_version Param"
    )
    allow_unpinned: bool = Field(
        default=False,
        description="run a model with no pin (local backend only): anyone who can write the "
        "model prefix then chooses the code that runs",
    )
    content_type: Literal["text/csv", "application/json", "application/jsonlines", "application/x-npy"] = Field(
        default="text/csv", description="request body the script's input_fn gets"
    )
    accept: Literal["text/csv", "application/json", "application/jsonlines", "application/x-npy"] | None = Field(
        default=None,
        description="what output_fn is asked for, and how its response is read (default: "
        "application/json, as SageMaker's inference toolkit asks for when a request names "
        "no Accept)",
    )
    batch_strategy: Literal["multi_record", "single_record"] = Field(
        default="multi_record", description="records per call: as many as fit, or one (Batch Transform's strategy)"
    )
    json_layout: Literal["records", "instances", "inputs", "array", "lines"] = Field(
        default="records",
        description="JSON bodies: objects keyed by column name, {'instances': [[...]]}, "
        "{'inputs': [[...]]} (Hugging Face-style handlers), [[...]], or lines (application/json only: an object "
        "per line, as Batch Transform sends a JSON lines file with ContentType application/json)",
    )
    max_payload_mb: Annotated[float, Field(gt=0, le=100)] = Field(
        default=6.0, description="largest request body (Batch Transform's MaxPayloadInMB)"
    )
    csv_header: bool = Field(default=False, description="start each text/csv body with a header line")
    derives_features: bool = Field(
        default=False,
        description="a custom inference.py computes the model's features itself from the columns "
        "input.features names: send those, not the feature names the model recorded (unset, input.features "
        "must be the recorded names in their order, or unset)",
    )
    allow_nan_predictions: bool = Field(default=False, description="write NaN predictions instead of failing the file")

    @property
    def versioned(self) -> bool:
        """Whether the URI picks its version from the ``model_version`` Param."""
        return VERSION_TEMPLATE in self.uri.replace(" ", "")

    @model_validator(mode="after")
    def _pinned(self) -> ModelRef:
        if self.sha256 and self.versions:
            raise ValueError("give model.sha256 (one artifact) or model.versions (one digest per version), not both")
        if self.versioned and self.sha256:
            raise ValueError(
                "model.uri picks its version with {{ params.model_version }}, so one model.sha256 "
                "cannot pin it: list each version's digest under model.versions instead"
            )
        if self.versions and not self.versioned:
            raise ValueError("model.versions needs a model.uri that uses {{ params.model_version }}")
        if self.versions and self.version not in self.versions:
            raise ValueError(
                f"model.version {self.version!r} has no digest in model.versions "
                f"(pinned: {', '.join(sorted(self.versions))})"
            )
        if not (self.sha256 or self.versions or self.allow_unpinned):
            where = "model.versions (a sha256 per version)" if self.versioned else "model.sha256"
            raise ValueError(
                f"the model is not pinned: give {where}, e.g. from `sha256sum model.tar.gz`. "
                "Only a trial on the local backend may set model.allow_unpinned: true"
            )
        return self

    def pin_for(self, version: str | None) -> str | None:
        """The sha256 the worker must find for ``version`` (the ``model_version`` Param), or None if unpinned.

        Raises ValueError for a version that is not pinned, naming the ones that are.
        """
        if self.sha256:
            return self.sha256
        if not self.versions:
            return None
        chosen = version or self.version
        if chosen not in self.versions:
            raise ValueError(
                f"model_version {chosen!r} is not pinned in model.versions "
                f"(pinned: {', '.join(sorted(self.versions))}); add its sha256 to the spec"
            )
        return self.versions[chosen]


class InputSpec(_Strict):
    prefix: str | None = Field(default=None, description="S3 prefix to list; Jinja-templated ({{ ds }})")
    from_step: str | None = Field(default=None, description="read the output of an earlier step instead")
    format: Literal["parquet", "csv", "jsonl"] | None = Field(
        default=None,
        description="read every input as this format: a file whose name says no format (part-00000, "
        ".txt, .json) is read as it, one whose name says another fails with the reason. "
        "Unset: each file's format from its name (.parquet, .csv, .jsonl, optionally .gz)",
    )
    include: tuple[str, ...] = ("*",)
    """glob patterns of the keys (relative to the prefix) to read"""
    exclude: tuple[str, ...] = ()
    """glob patterns of the keys to leave out"""
    features: tuple[str, ...] | Literal["file_order"] | None = None
    """the feature columns, in the order the model was trained with. A model that recorded its features'
    names (fitted on a DataFrame, an XGBoost Booster with feature_names) uses those, by name; one that
    records none needs this list, or every file fails naming it. ``file_order`` takes every numeric
    non-passthrough column in each file's own order, with a WARNING: only for files whose columns are
    known to be in training order"""
    passthrough: tuple[str, ...] = ()
    """columns copied from each input row to its output row (an id, say)"""
    csv_header: bool | None = None
    """whether CSV inputs start with a header line. Unset: they do, and a first line that reads as numbers (a data
    line) is refused rather than taken as names. ``true``: they do, even one of numbers (years, say).
    ``false``: none; input.features names every column of the file by position (passthrough columns included, in
    their places), and the first line is data"""
    when_missing: Literal["wait", "fail", "skip"] | None = Field(
        default=None,
        description="no input yet: wait for it (up to wait_timeout_seconds), fail the run naming the "
        "prefix, or skip the run (recorded SKIPPED). Unset: wait for scheduled runs, fail "
        "for manual ones",
    )
    wait_timeout_seconds: Annotated[int, Field(ge=60, le=7 * 86400)] = Field(
        default=6 * 3600, description="with when_missing: wait, how long to wait for the input before failing"
    )
    ready_marker: str | None = Field(
        default=None,
        description="an object under the prefix whose presence means the partition is complete "
        "(e.g. _SUCCESS, an upstream writer's marker). Unset: a scheduled run's partition "
        "is complete settle_seconds after its data interval ends",
    )
    settle_seconds: Annotated[int, Field(ge=0, le=86400)] = Field(
        default=300,
        description="a scheduled run plans no earlier than this long after its data interval ends, so "
        "files still being written for the interval land first (not used with "
        "ready_marker, which says when the partition is complete)",
    )

    @field_validator("prefix")
    @classmethod
    def _a_folder(cls, value: str | None) -> str | None:
        # A prefix is a folder: without its "/", s3://b/events/dt=2026-11-2 would also list dt=2026-11-20/ to
        # dt=2026-11-29/. Normalised rather than refused: what the author meant is never in doubt.
        return value if value is None or value.endswith("/") else value + "/"

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        if (self.prefix is None) == (self.from_step is None):
            raise ValueError("give exactly one of input.prefix or input.from_step")
        if self.prefix is not None and not self.prefix.startswith("s3://"):
            raise ValueError(f"input.prefix must be an s3:// URI, got {self.prefix!r}")
        if self.from_step is not None and (
            self.when_missing or self.ready_marker or "settle_seconds" in self.model_fields_set
        ):
            raise ValueError(
                "input.when_missing, input.ready_marker and input.settle_seconds are for input.prefix; "
                "a from_step input is there once the earlier step has ended"
            )
        self._check_columns()
        if self.ready_marker is not None and ("/" in self.ready_marker or self.ready_marker in ("", ".", "..")):
            raise ValueError(
                f"input.ready_marker is an object name under the prefix (like _SUCCESS), got {self.ready_marker!r}"
            )
        return self

    def _check_columns(self) -> None:
        if self.features == "file_order" and self.format == "jsonl":
            raise ValueError(
                "input.features: file_order is refused for JSON lines: a JSON object has no column order, so each "
                "file's first record would decide it. Name the features, in training order, with input.features"
            )
        if self.csv_header is not False:
            return
        if self.format in ("parquet", "jsonl"):
            raise ValueError(f"input.csv_header is for CSV inputs; input.format is {self.format}")
        if not isinstance(self.features, tuple):
            raise ValueError(
                "input.csv_header: false needs input.features naming the files' columns, in order (a list; "
                "file_order has no names to take)"
            )
        strays = [name for name in self.passthrough if name not in self.features]
        if strays:
            raise ValueError(
                f"input.passthrough {strays} not in input.features, which names a headerless CSV's columns by "
                "position: list them there too, in their places"
            )

    def missing_input_action(self, run_type: str | None) -> str:
        """What a run does when its input is not there: the spec's choice, else wait for a scheduled run
        (data lands late) and fail for one a person triggered (they want to hear at once)."""
        return self.when_missing or ("wait" if run_type == "scheduled" else "fail")


class OutputSpec(_Strict):
    prefix: str
    """S3 prefix of the outputs: one per input, at the same relative path; Jinja-templated like input.prefix"""
    metadata_prefix: str | None = Field(
        default=None,
        description="where Shardline's own files (manifests) go instead of <prefix>/_shardline/, for "
        "readers that take every object under the data prefix; Jinja-templated like prefix",
    )
    table: TableSpec | None = None
    """commit each run's outputs to this Apache Iceberg table as the step ends, before _SUCCESS (docs/tables.md):
    the outputs are written as parquet, with the partition columns, and become the table's data files"""

    @field_validator("prefix")
    @classmethod
    def _s3(cls, value: str) -> str:
        if not value.startswith("s3://"):
            raise ValueError(f"must be an s3:// URI, got {value!r}")
        return value

    @model_validator(mode="after")
    def _metadata_outside(self) -> OutputSpec:
        meta = self.metadata_prefix
        if meta is None:
            return self
        if not meta.startswith("s3://"):
            raise ValueError(f"output.metadata_prefix must be an s3:// URI, got {meta!r}")
        if meta.rstrip("/").rsplit("/", 1)[-1] != "_shardline":
            # infra/'s IAM recognises Shardline's files by this folder name (jobs may not rewrite the manifests).
            raise ValueError(
                f"output.metadata_prefix must end in a folder named _shardline, e.g. "
                f"s3://bucket/meta/scores/dt={{{{ ds }}}}/_shardline/; got {meta!r}"
            )
        if meta.startswith(self.prefix.rstrip("/") + "/"):
            raise ValueError(
                "output.metadata_prefix is inside output.prefix, where the files would go anyway; "
                "leave it unset, or put it outside the data prefix"
            )
        return self
