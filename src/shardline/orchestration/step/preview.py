"""Preview a step before launch: its model, with the job's own settings, on the first rows of one input.

``shardline preview PIPELINE`` and a DAG run with the ``dry_run`` Param both come here. It
fetches the model artifact and a sample of one input file (only the first rows: a parquet
footer and its first row group through ranged reads, the first lines of a CSV or JSON lines
file), then runs ``python -m shardline.worker --preview ROWS`` with exactly the arguments the
processing job would get, in a subprocess with a minimal environment, and returns its report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from shardline import contract
from shardline.errors import PermanentError, ShardlineError
from shardline.planning.inputs import S3Object, list_inputs
from shardline.planning.request import pin_arguments, worker_arguments
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec, StepSpec, data_interval
from shardline.spec.templates import default_params, render_uri

DEFAULT_ROWS = 20
# What the preview's worker process may see of the caller's environment: enough to run Python,
# nothing of Airflow's or AWS's secrets (the preview needs no AWS: its files are local).
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


class PreviewError(ShardlineError):
    """The preview could not run: no input, no model, a template it cannot render."""


class PreviewDenied(PreviewError):
    """The caller's role may not read the model or the sample: on AWS the job role reads them, Airflow's does not."""


def _denied(err: Exception) -> bool:
    code = str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("AccessDenied", "403", "Forbidden")


@dataclasses.dataclass(frozen=True)
class PreviewResult:
    step: str
    model_uri: str
    sample_uri: str
    exit_code: int  # the worker's: 0 ran, 3 the sample file fails as the job would, 4 setup error
    text: str  # the worker's report
    report: dict | None  # the same as JSON (None after a setup error)
    log: str  # the worker's log (why a setup error happened)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def warnings(self) -> list[str]:
        return list((self.report or {}).get("warnings", []))

    def render(self) -> str:
        head = f"preview of step {self.step}: model {self.model_uri}, sample {self.sample_uri}\n"
        if self.exit_code == 4 or not self.text:
            return head + "the model could not be set up:\n" + _setup_error(self.log)
        return head + self.text


WRITTEN_JSON_LIMIT = 16 << 20  # a preview's report or tune's figures: kilobytes; anything larger is not ours


def read_written_file(path: Path, limit: int = WRITTEN_JSON_LIMIT) -> bytes | None:
    """The bytes of a file the worker (in its image, or as a process) wrote for the caller, or None.

    The folder is one the model's code could write too: a link there (to a credentials file, the Airflow
    config, a FIFO) is not followed, and only a regular file of at most ``limit`` bytes is read."""
    import stat

    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # absent, or a link (ELOOP)
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = file.read(limit + 1)
    return data if len(data) <= limit else None  # it grew past the limit while being read


def read_written_json(path: Path) -> dict | None:
    """A JSON object the worker wrote for the caller (read as ``read_written_file`` reads), or None."""
    data = read_written_file(path)
    try:
        found = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _setup_error(log: str) -> str:
    lines = [line for line in log.splitlines() if " ERROR " in line or "setup failed" in line]
    return "\n".join(lines[-5:]) or log[-2000:]


def render_template(
    template: str, spec: PipelineSpec, step: StepSpec, logical_date: dt.datetime, params: dict | None = None
) -> str:
    """Render a spec URI as a manual DAG run would, for a logical date and the Params' defaults: the data
    interval is the last whole period of the spec's schedule before the logical date, as in Airflow."""
    import jinja2

    values = {**default_params(spec.steps[0].model.version), "dry_run": True, **(params or {})}
    start, end = data_interval(spec.schedule, logical_date)
    try:
        return render_uri(template, logical_date=logical_date, start=start, end=end, params=values)
    except jinja2.TemplateError as err:
        raise PreviewError(
            f"cannot render {template!r} of step {step.name} for a preview ({err}); pass the "
            "URIs with --input and --model-uri"
        ) from err


def step_uris(
    spec: PipelineSpec, step: StepSpec, logical_date: dt.datetime, params: dict | None = None
) -> tuple[str, str]:
    """(model URI, input prefix) of a step, rendered. A step that reads an earlier step's output gets that
    step's output prefix."""
    source = spec.step(step.input.from_step).output.prefix if step.input.from_step else step.input.prefix
    return (
        render_template(step.model.uri, spec, step, logical_date, params),
        render_template(source, spec, step, logical_date, params),
    )


def preview_step(
    spec: PipelineSpec,
    step_name: str,
    s3,
    *,
    model_uri: str,
    input_uri: str,
    rows: int = DEFAULT_ROWS,
    objects: list[S3Object] | None = None,
    model_version: str | None = None,
) -> PreviewResult:
    """Run the step's model on the first ``rows`` rows of the first input under ``input_uri`` (a prefix,
    or one object's URI). ``objects``: the prefix's listing, when the caller has it already.
    ``model_version``: the run's ``model_version`` Param, which picks the pinned digest."""
    step = spec.step(step_name)
    try:
        step.model.pin_for(model_version)  # an unpinned version is refused before anything is fetched
    except ValueError as err:
        raise PreviewError(str(err)) from err
    image = sandbox_image(spec, step, model_version, "shardline preview")
    sample = _first_input(s3, step, input_uri, objects)
    with tempfile.TemporaryDirectory(prefix="shardline-preview-") as tmp:
        # The sample's folder sits in a 0700 one of the caller's: when the image's user needs it writable (0777,
        # as root), no other user of this machine can reach it.
        root = Path(tmp) / "sample"
        root.mkdir()
        model_dir, data_dir = root / "model", root / "data"
        _fetch(s3, model_uri, sample, rows, model_dir, data_dir)
        report_path = root / "preview.json"
        command = [
            sys.executable,
            "-m",
            "shardline.worker",
            "--input-dir",
            str(data_dir),
            "--output-dir",
            str(root / "out"),
            "--model-dir",
            str(model_dir),
            "--scratch-dir",
            str(root / "scratch"),
            "--host",
            "preview",
            *worker_arguments(step),
            *pin_arguments(step, model_version),
            "--preview",
            str(rows),
            "--preview-json",
            str(report_path),
        ]
        command = in_sandbox(command, image, {root: contract.SAMPLE_DIR})
        env = worker_environment(root, sandboxed=image is not None)
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            cwd=root,
            stdin=subprocess.DEVNULL,
        )
        report = read_written_json(report_path)
    return PreviewResult(
        step=step_name,
        model_uri=model_uri,
        sample_uri=f"s3://{sample[0]}/{sample[1]}",
        exit_code=done.returncode,
        text=done.stdout,
        report=report,
        log=done.stderr,
    )


def sandbox_image(spec: PipelineSpec, step: StepSpec, model_version: str | None, what: str) -> str | None:
    """The worker image to run the model's code in, where Docker can (local_container); None: a process here.
    An unpinned model is refused as a process, before anything is fetched."""
    from shardline.backends import local_container
    from shardline.orchestration.services import image_and_role

    image = image_and_role(spec)[0]
    try:
        return image if local_container.sandbox_for(image, bool(step.model.pin_for(model_version)), what) else None
    except local_container.ContainerRuntimeError as err:
        raise PreviewError(str(err)) from err


def worker_environment(root: Path, *, sandboxed: bool) -> dict[str, str]:
    """The environment of the worker a preview or tune runs: the caller's PATH, locale and Python. In the image
    it is the docker CLI's (HOME holds its config); as a process the model's code gets a HOME of its own under
    ``root``, so it finds no ``~/.aws``, no ``shardline login`` token and no other file of the caller's home."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    env["PYTHONUNBUFFERED"] = "1"
    if not sandboxed:
        home = root / "home"
        home.mkdir(mode=0o700, exist_ok=True)
        env["HOME"] = str(home)
    return env


def in_sandbox(command: list[str], image: str | None, folders: dict[Path, str]) -> list[str]:
    from shardline.backends import local_container

    return local_container.worker_in_image(command, image, folders) if image else command


def _first_input(s3, step: StepSpec, input_uri: str, objects: list[S3Object] | None) -> tuple[str, str]:
    bucket, key = parse_s3_uri(input_uri)
    if objects is None:
        if key and not key.endswith("/") and _exists(s3, bucket, key):
            return bucket, key  # one object, named
        objects = list_inputs(s3, input_uri, step.input.include, step.input.exclude)
    if not objects:
        raise PreviewError(
            f"no input files under {input_uri} to preview (step {step.name}); pass --input with a "
            "file or prefix that has data, or --logical-date for another partition"
        )
    return bucket, objects[0].key


def _exists(s3, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


def _fetch(s3, model_uri: str, sample: tuple[str, str], rows: int, model_dir: Path, data_dir: Path) -> None:
    """The model and the sample's first ``rows`` rows, here; PreviewDenied when this role may not read them."""
    bucket, key = sample
    try:
        fetch_model(s3, model_uri, model_dir)
        fetch_sample(s3, bucket, key, rows, data_dir)
    except SampleTooLarge as err:
        raise PreviewError(str(err)) from err
    except Exception as err:
        if not _denied(err):
            raise
        raise PreviewDenied(
            f"this role may not read {model_uri} or s3://{bucket}/{key} ({type(err).__name__}: {err})"
        ) from err


def fetch_model(s3, model_uri: str, model_dir: Path) -> None:
    """Download the model as SageMaker's S3Prefix input would: one object, or every object under a prefix."""
    from shardline.backends.local_supervisor import list_prefix

    found = list_prefix(s3, model_uri)
    if not found:
        raise PreviewError(f"no model at {model_uri}; check model.uri and the model_version")
    for bucket, key, relative in found:
        dest = model_dir / relative
        if not dest.resolve().is_relative_to(model_dir.resolve()):
            raise PreviewError(f"model object key {key!r} would be written outside the model directory")
        dest.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(dest))


# The most a preview reads of an input, compressed or not: a sample is a few rows, and an input is anyone's
# bytes (a line with no end, a gzip bomb, a parquet file whose first row group is huge).
MAX_SAMPLE_BYTES = 64 << 20  # of a text file (CSV, JSON lines), compressed and inflated alike
MAX_PARQUET_SAMPLE_BYTES = 512 << 20  # of a parquet file: its footer and first row group (Spark's are 128 MiB)
MAX_SAMPLE_LINE_BYTES = 8 << 20


class SampleTooLarge(PermanentError, ValueError):
    """The sample would need more of an input than a preview reads."""


def fetch_sample(s3, bucket: str, key: str, rows: int, data_dir: Path, max_bytes: int | None = None) -> Path:
    """The first ``rows`` rows of one object, as a local file of the same format, reading at most ``max_bytes``
    of it (compressed and uncompressed alike), or SampleTooLarge naming the object."""
    data_dir.mkdir(parents=True, exist_ok=True)
    name = key.rsplit("/", 1)[-1]
    lower = name.lower()
    gzipped = lower.endswith(".gz")
    base = name[:-3] if gzipped else name
    where = f"s3://{bucket}/{key}"
    if base.lower().endswith(".parquet"):
        max_bytes = max_bytes or MAX_PARQUET_SAMPLE_BYTES
        dest = data_dir / name
        if gzipped:  # not seekable: the whole object, if it is small enough
            size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
            if size > max_bytes:
                raise SampleTooLarge(
                    f"{where} is a gzipped parquet file of {size / 2**20:.0f} MiB: a preview reads it "
                    f"whole, and reads at most {max_bytes / 2**20:.0f} MiB; preview another file "
                    "(--input)"
                )
            s3.download_file(bucket, key, str(dest))
            return dest
        _parquet_head(s3, bucket, key, rows, dest, max_bytes)
        return dest
    max_bytes = max_bytes or MAX_SAMPLE_BYTES
    dest = data_dir / base  # text formats are written back uncompressed
    header = 1 if base.lower().endswith(".csv") else 0
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        raw = io.BufferedReader(_Capped(body, max_bytes, where), 1 << 16)
        stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
        with open(dest, "wb") as out:
            read = 0
            for count in range(rows + header):
                line = stream.readline(MAX_SAMPLE_LINE_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_SAMPLE_LINE_BYTES:
                    raise SampleTooLarge(
                        f"line {count + 1} of {where} is longer than {MAX_SAMPLE_LINE_BYTES >> 20} "
                        "MiB: not a CSV or JSON lines file a preview can sample"
                    )
                read += len(line)
                if read > max_bytes:
                    raise SampleTooLarge(f"the first {rows} rows of {where} are over {max_bytes >> 20} MiB")
                out.write(line)
    finally:
        body.close()
    return dest


class _Capped(io.RawIOBase):
    """A stream that refuses to give more than ``limit`` bytes of the object."""

    def __init__(self, body, limit: int, where: str):
        self.body, self.limit, self.where, self.given = body, limit, where, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.body.read(min(len(buffer), self.limit + 1 - self.given))
        self.given += len(data)
        if self.given > self.limit:
            raise SampleTooLarge(f"a preview reads at most {self.limit >> 20} MiB of {self.where}")
        buffer[: len(data)] = data
        return len(data)


def _parquet_head(s3, bucket: str, key: str, rows: int, dest: Path, max_bytes: int = MAX_SAMPLE_BYTES) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    source = io.BufferedReader(_RangedObject(s3, bucket, key, size, max_bytes), buffer_size=1 << 20)
    parquet = pq.ParquetFile(source)
    batch = next(parquet.iter_batches(batch_size=rows), None)
    table = pa.Table.from_batches([batch]) if batch is not None else parquet.schema_arrow.empty_table()
    pq.write_table(table, dest)


class _RangedObject(io.RawIOBase):
    """A read-only, seekable view of one S3 object, read with ranged GETs."""

    def __init__(self, s3, bucket: str, key: str, size: int, max_bytes: int = MAX_SAMPLE_BYTES):
        self.s3, self.bucket, self.key, self.size, self.position = s3, bucket, key, size, 0
        self.max_bytes, self.fetched = max_bytes, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        if self.position >= self.size:
            return 0
        end = min(self.size, self.position + len(buffer)) - 1
        self.fetched += end - self.position + 1
        if self.fetched > self.max_bytes:
            raise SampleTooLarge(
                f"the sample of s3://{self.bucket}/{self.key} needs more than "
                f"{self.max_bytes >> 20} MiB of it (its footer and first row group): a preview "
                "reads no more; preview another file (--input)"
            )
        data = self.s3.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={self.position}-{end}")["Body"].read()
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)
