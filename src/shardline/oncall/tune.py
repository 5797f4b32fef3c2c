"""Auto-tune a step: ``shardline tune PIPELINE [--step S] [--input-prefix URI] [--rows N]``.

It fetches what the step's job would get -- the model artifact (the worker then verifies it against
the spec's pinned sha256, exactly as the job does, and refuses a mismatch) and the first input files
up to ``rows`` rows (the latest run's input prefix from the ledger, or ``--input-prefix``) -- and runs
``python -m shardline.worker --tune`` on them here, with the step's own worker arguments, in a
subprocess with a minimal environment, as ``shardline preview`` does. The worker sweeps workers x
threads and rows per batch on this machine, prints the table and the spec snippet, and writes the
plot and the figures under ``out_dir``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import posixpath
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from shardline import contract
from shardline.ledger.keys import StepRef
from shardline.ledger.step_reads import list_runs
from shardline.oncall.errors import BadRequest, NotFound
from shardline.orchestration import services
from shardline.orchestration.step.files import latest_attempt
from shardline.orchestration.step.preview import (
    PreviewError,
    fetch_model,
    fetch_sample,
    in_sandbox,
    read_written_file,
    read_written_json,
    sandbox_image,
    step_uris,
    worker_environment,
)
from shardline.planning.attempt import Attempt
from shardline.planning.inputs import list_inputs
from shardline.planning.request import pin_arguments, worker_arguments
from shardline.s3uri import parse_s3_uri
from shardline.spec import PipelineSpec, StepSpec

DEFAULT_ROWS = 200_000
TUNE_MAX_SAMPLE_BYTES = 1 << 30  # a tuning sample is larger than a preview's, and still bounded
RUNS_SEARCHED = 20  # the newest runs looked at for one that planned the step


@dataclasses.dataclass(frozen=True)
class TuneResult:
    step: str
    model_uri: str
    input_uri: str
    source: str  # where the input prefix came from: a run, or --input-prefix
    sample: list[str]  # the objects the sample was taken from
    exit_code: int  # the worker's: 0 tuned, 4 setup error (the model, its pin, the sample)
    text: str  # the worker's table and snippet
    figures: dict | None  # tune.json
    plot: str | None  # tune.png, when drawn
    log: str  # the worker's log

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def render(self) -> str:
        head = (
            f"tune of step {self.step}: model {self.model_uri}\n"
            f"sample: the first {len(self.sample)} file(s) under {self.input_uri} ({self.source})\n"
        )
        if not self.ok:
            lines = [line for line in self.log.splitlines() if " ERROR " in line or "setup failed" in line]
            return (
                head
                + f"the tune could not run (worker exit {self.exit_code}):\n"
                + ("\n".join(lines[-5:]) or self.log[-2000:])
                + "\n"
            )
        return head + self.text


def newest_planned_attempt(spec: PipelineSpec, step: str) -> Attempt | None:
    """The newest attempt of ``step`` in the newest run that planned it (from the ledger), or None."""
    model = services.ledger_model(spec)
    for entry in list_runs(model, spec.pipeline, RUNS_SEARCHED):
        attempt = latest_attempt(spec, StepRef(spec.pipeline, entry.run_id, step))
        if attempt is not None:
            return attempt
    return None


def tune_step(
    spec: PipelineSpec,
    step_name: str,
    s3,
    *,
    out_dir: Path,
    input_prefix: str | None = None,
    rows: int = DEFAULT_ROWS,
    extra_args: tuple[str, ...] = (),
    echo: Callable[[str], None] | None = None,
    now: dt.datetime | None = None,
) -> TuneResult:
    """Tune ``step_name`` on this machine. ``input_prefix``: sample it instead of the latest run's input.
    ``extra_args``: more worker flags (``--tune-repeat 1``). ``echo`` gets each line of the worker's log as it
    comes (the sweep takes minutes)."""
    step = spec.step(step_name)
    model_uri, model_version, input_uri, source = _what_to_sample(spec, step, input_prefix, now)
    try:
        step.model.pin_for(model_version)  # an unpinned version is refused before anything is fetched
    except ValueError as err:
        raise PreviewError(str(err)) from err
    objects = list_inputs(s3, input_uri, step.input.include, step.input.exclude)
    if not objects:
        raise NotFound(
            f"no input files under {input_uri} (step {step.name}, {source}); pass --input-prefix with a "
            "prefix that has data"
        )
    image = sandbox_image(spec, step, model_version, "shardline tune")
    out_dir = out_dir.resolve()  # mapped into the worker image by its absolute path
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shardline-tune-") as tmp:
        # The sample's folder sits in a 0700 one of the caller's: when the image's user needs it writable (0777,
        # as root), no other user of this machine can reach it.
        root = Path(tmp) / "sample"
        root.mkdir()
        model_dir, data_dir = root / "model", root / "data"
        fetch_model(s3, model_uri, model_dir)
        keys = fetch_inputs(s3, input_uri, [o.key for o in objects], rows, data_dir)
        # The worker writes its figures into the sample's folder, never into --out: that folder is yours, and the
        # model's code runs beside the worker. Only the two files it is to write, regular files, come out.
        written = root / "tune"
        command = _worker_command(root, step, model_version, rows, written, extra_args)
        command = in_sandbox(command, image, {root: contract.SAMPLE_DIR})
        code, text, log = _run(command, root, echo, worker_environment(root, sandboxed=image is not None))
        # The worker names where it wrote (this folder, or the image's view of it): say where the files are now.
        text = text.replace(str(written), str(out_dir)).replace(f"{contract.SAMPLE_DIR}/tune", str(out_dir))
        figures = read_written_json(written / "tune.json") if code == 0 else None
        plot_path = out_dir / "tune.png"
        plotted = code == 0 and _copy_regular(written / "tune.png", plot_path)
    if figures is not None:
        (out_dir / "tune.json").write_text(json.dumps(figures, indent=2))
    return TuneResult(
        step=step.name,
        model_uri=model_uri,
        input_uri=input_uri,
        source=source,
        sample=[f"s3://{parse_s3_uri(input_uri)[0]}/{k}" for k in keys],
        exit_code=code,
        text=text,
        figures=figures,
        plot=str(plot_path) if plotted else None,
        log=log,
    )


def _what_to_sample(
    spec: PipelineSpec, step: StepSpec, input_prefix: str | None, now: dt.datetime | None
) -> tuple[str, str | None, str, str]:
    """(model URI, model version, input URI, where that input came from): the latest run's, or ``input_prefix``."""
    if input_prefix is not None and not input_prefix.startswith("s3://"):
        raise BadRequest(f"--input-prefix must be an s3:// URI, got {input_prefix!r}")
    attempt = newest_planned_attempt(spec, step.name)
    if attempt is not None:
        model_uri, model_version = attempt.model_uri, attempt.model_version
        source = f"run {attempt.run_id}"
        input_uri = attempt.input_prefix
    else:
        model_uri, input_uri = step_uris(spec, step, now or dt.datetime.now(dt.UTC))
        model_version, source = None, "the spec"
    if input_prefix:
        input_uri, source = input_prefix, "--input-prefix"
    elif attempt is None:
        raise NotFound(
            f"no run of pipeline {spec.pipeline} has planned step {step.name} yet, so there is no input "
            "to sample; pass --input-prefix s3://... with a prefix of real inputs of this step"
        )
    return model_uri, model_version, input_uri, source


def _worker_command(
    root: Path, step: StepSpec, model_version: str | None, rows: int, out_dir: Path, extra_args: tuple[str, ...]
) -> list[str]:
    """``python -m shardline.worker --tune`` over the model and the sample fetched under ``root``."""
    return [
        sys.executable,
        "-m",
        "shardline.worker",
        "--input-dir",
        str(root / "data"),
        "--output-dir",
        str(root / "out"),
        "--model-dir",
        str(root / "model"),
        "--scratch-dir",
        str(root / "scratch"),
        "--host",
        "tune",
        *worker_arguments(step),
        *pin_arguments(step, model_version),
        "--tune",
        "--tune-rows",
        str(rows),
        "--tune-out",
        str(out_dir),
        "--tune-step",
        step.name,
        *extra_args,
    ]


def fetch_inputs(s3, input_uri: str, keys: list[str], rows: int, data_dir: Path) -> list[str]:
    """The first objects under ``input_uri``, up to ``rows`` rows (the last one cut), under their paths relative
    to the prefix; returns the keys taken. Parquet files are read by ranged GETs, text files by their first
    lines (preview's sampling)."""
    bucket, prefix = parse_s3_uri(input_uri)
    base = prefix if prefix.endswith("/") or not prefix else prefix + "/"
    taken, total = [], 0
    for key in keys:
        if total >= rows:
            break
        relative = key[len(base) :] if key.startswith(base) else key.rsplit("/", 1)[-1]
        # list_inputs has refused every key that could leave the folder, so the relative path stays inside it.
        folder = data_dir / posixpath.dirname(relative)
        sample = fetch_sample(s3, bucket, key, rows - total, folder, max_bytes=TUNE_MAX_SAMPLE_BYTES)
        total += _rows_of(sample)
        taken.append(key)
    return taken


def _rows_of(path: Path) -> int:
    import gzip

    name = path.name.lower()
    if name.endswith(".parquet") or name.endswith(".parquet.gz"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if name.endswith(".gz"):
            with pa.input_stream(str(path), compression="gzip") as stream:
                return pq.read_table(stream).num_rows
        return pq.read_metadata(path).num_rows
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rb") as stream:
        lines = sum(1 for line in stream if line.strip())
    return max(0, lines - (1 if ".csv" in name else 0))


def _copy_regular(source: Path, dest: Path, limit: int = 64 << 20) -> bool:
    """Copy ``source`` to ``dest`` when it is a regular file of at most ``limit`` bytes (a link is not followed);
    whether it was copied."""
    data = read_written_file(source, limit)
    if data is None:
        return False
    dest.write_bytes(data)
    return True


def _run(
    command: list[str], cwd: Path, echo: Callable[[str], None] | None, env: dict[str, str]
) -> tuple[int, str, str]:
    """Run the worker; hand each line of its log to ``echo`` as it comes; (exit code, stdout, log)."""
    with (
        tempfile.TemporaryFile("w+") as out,
        subprocess.Popen(
            command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, text=True
        ) as proc,
    ):
        log = []
        try:
            for line in proc.stderr:
                log.append(line)
                if echo is not None:
                    echo(line.rstrip("\n"))
            code = proc.wait()
        except BaseException:
            proc.kill()  # never leave the sweep running after we stop (Ctrl-C)
            raise
        out.seek(0)
        return code, out.read(), "".join(log)


# A job's instance asks the ledger five things a file, one after another (its claim, the run's status and its prefix's
# holder before the upload, the check that it still owns the file, its finish); the sample runs without a ledger, so
# each of its files is charged that many round trips, at the endpoint's latency as measured here.
LEDGER_REQUESTS_A_FILE = 5
LATENCY_PROBES = 5
SAMPLE_RUNS = 3  # runs of each sample a quote times: their median, as a job's run is a typical one, not the fastest
QUOTE_SAMPLE_ROWS = (50_000, 500_000)  # the two samples: a small and a large one, to part start-up from rows


def sample_rates(spec: PipelineSpec, step_name: str, model_uri: str, model_version: str | None, input_uri: str):
    """A quote's rates when the step has no history: the step's own worker, with its own settings, run here as its
    instances run it (``python -m shardline.worker`` over a folder of inputs, no ledger, sandboxed as ``tune`` is)
    on two samples of the first inputs, a small and a large one, each process timed from its start to its exit:
    the two give the time an instance takes whatever its share, and its time per row. Raises QuoteError when it
    cannot run. The :data:`~shardline.orchestration.quote.Sampler` the CLI gives the quote."""
    from shardline.orchestration.quote import QuoteError
    from shardline.report.quote import PastRun, rates_from

    step = spec.step(step_name)
    s3 = services.s3_client(spec)
    objects = list_inputs(s3, input_uri, step.input.include, step.input.exclude)
    if not objects:
        raise QuoteError(f"step {step.name}: no input under {input_uri} to sample")
    image = sandbox_image(spec, step, model_version, "shardline quote")
    bucket, first = parse_s3_uri(input_uri)[0], objects[0].key
    latency = statistics.median(_timed(lambda: s3.head_object(Bucket=bucket, Key=first)) for _ in range(LATENCY_PROBES))
    points = []
    with tempfile.TemporaryDirectory(prefix="shardline-quote-") as tmp:
        root = Path(tmp) / "sample"
        root.mkdir()
        fetch_model(s3, model_uri, root / "model")
        for n, rows in enumerate(QUOTE_SAMPLE_ROWS):
            data = root / f"data{n}"
            try:
                fetch_inputs(s3, input_uri, [o.key for o in objects], rows, data)
            except (ValueError, OSError) as err:  # pyarrow's ArrowInvalid is a ValueError: not the format it says
                raise QuoteError(
                    f"step {step.name}: the sample run could not run: its first inputs under {input_uri} could not "
                    f"be read ({type(err).__name__}: {err}); see why with "
                    f"`shardline preview {spec.pipeline} --step {step.name}`"
                ) from err
            files = [p for p in data.rglob("*") if p.is_file()]
            rows_in, bytes_in = sum(_rows_of(p) for p in files), sum(p.stat().st_size for p in files)
            seconds = statistics.median(
                _timed_job(spec, step, root, data.name, model_version, image) for _ in range(SAMPLE_RUNS)
            )
            seconds += len(files) * LEDGER_REQUESTS_A_FILE * latency  # what the sample's files did not ask
            points.append(
                PastRun(f"{rows_in:,} rows", 1, rows_in, seconds, seconds, bytes_in=bytes_in, rows_in=rows_in)
            )
    if points[0].rows >= points[-1].rows:  # the inputs hold no more than the small sample: one point
        points = points[-1:]
    return rates_from(points, "sample")


def _timed_job(spec: PipelineSpec, step: StepSpec, root: Path, data: str, model_version: str | None, image) -> float:
    """Seconds of one worker process over ``root/data``, from its start to its exit; QuoteError when it fails."""
    import time

    from shardline.orchestration.quote import QuoteError

    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "shardline.worker",
        "--input-dir",
        str(root / data),
        "--output-dir",
        str(out),
        "--model-dir",
        str(root / "model"),
        "--scratch-dir",
        str(root / "scratch"),
        "--host",
        "quote",
        *worker_arguments(step),
        *pin_arguments(step, model_version),
    ]
    command = in_sandbox(command, image, {root: contract.SAMPLE_DIR})
    started = time.monotonic()
    code, _, log = _run(command, root, None, worker_environment(root, sandboxed=image is not None))
    seconds = time.monotonic() - started
    if code != 0:
        lines = [line for line in log.splitlines() if " ERROR " in line or "setup failed" in line]
        raise QuoteError(
            f"step {step.name}: the sample run could not run (worker exit {code}): "
            + ("; ".join(lines[-3:]) or log[-500:])
            + f"; see why with `shardline preview {spec.pipeline} --step {step.name}`"
        )
    return seconds


def _timed(call) -> float:
    import time

    started = time.monotonic()
    call()
    return time.monotonic() - started
