"""Upload demo inputs for one run of a pipeline's first step into the stack's MinIO, and check its model is there.

Where the files go is read from the spec, not written here: the step's ``input.prefix`` and
``model.uri`` are rendered as the run triggered at ``--logical-date`` renders them (its data interval:
the hour before 11:00 for an hourly pipeline; the spec's default model version). The data are the worker's
synthetic parquet files; the model is the demo model the spec pins, which the init service uploaded.

    docker compose exec airflow-scheduler python /opt/shardline/compose/seed_demo.py \\
        --logical-date 2026-11-22T11:00:00+00:00
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
from pathlib import Path

DEFAULT_PIPELINES_DIR = Path("/opt/airflow/dags/pipelines")


def targets(spec_path: Path, logical_date: dt.datetime) -> tuple[str, str]:
    """(input prefix, model URI) of the spec's first step, rendered as a run triggered at ``logical_date``
    renders them: its data interval is the last whole period of the schedule before that date."""
    from shardline.orchestration.step.preview import render_template
    from shardline.spec import load_spec

    spec = load_spec(spec_path)
    step = spec.steps[0]
    if step.input.prefix is None:
        raise SystemExit(f"{spec_path.name}: the first step reads from_step, so there is nothing to seed")
    return (
        render_template(step.input.prefix, spec, step, logical_date),
        render_template(step.model.uri, spec, step, logical_date),
    )


def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="tabular_scoring_hourly", help="spec name in the pipelines dir")
    parser.add_argument(
        "--pipelines-dir", type=Path, default=Path(os.environ.get("SHARDLINE_PIPELINES_DIR", DEFAULT_PIPELINES_DIR))
    )
    parser.add_argument(
        "--logical-date",
        required=True,
        type=dt.datetime.fromisoformat,
        help="the run to seed, e.g. 2026-11-22T11:00:00+00:00 for the hour 10:00-11:00 (UTC when no offset is given)",
    )
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args(argv)
    logical_date = args.logical_date if args.logical_date.tzinfo else args.logical_date.replace(tzinfo=dt.UTC)

    import boto3

    from examples import synthetic

    prefix, model_uri = targets(args.pipelines_dir / f"{args.pipeline}.yaml", logical_date)
    s3 = boto3.client("s3")
    with tempfile.TemporaryDirectory(prefix="shardline-seed-") as tmp:
        work = Path(tmp)
        bucket, key_prefix = split_uri(prefix if prefix.endswith("/") else prefix + "/")
        for path in synthetic.make_dataset(work / "data", files=args.files, rows=args.rows):
            s3.upload_file(str(path), bucket, key_prefix + path.name)
        print(f"uploaded {args.files} parquet files ({args.rows:,} rows) to s3://{bucket}/{key_prefix}")
    # The model: the stack's init service uploaded the demo model the spec pins (shardline.local.provision);
    # any other artifact there would be refused by the job, since the spec pins its digest.
    model_bucket, model_key = split_uri(model_uri)
    try:
        s3.head_object(Bucket=model_bucket, Key=model_key)
        print(f"the model the spec pins is at {model_uri}")
    except s3.exceptions.ClientError:
        print(
            f"no model at {model_uri}: the init service uploads the demo model the spec pins; run it again "
            "(docker compose up shardline-init), or upload your own and pin its sha256 in the spec"
        )
        return 1
    print(
        f"now: airflow dags unpause {args.pipeline} && "
        f"airflow dags trigger {args.pipeline} --logical-date {logical_date.isoformat()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
