"""A pipeline's clients are built once and shared, Hook-style, and never outlive the AWS settings they used."""

from __future__ import annotations

from pathlib import Path

from shardline.orchestration import services
from shardline.spec import load_spec

SPEC = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "tabular_scoring_hourly.yaml"


def test_the_clients_of_a_spec_are_built_once_and_shared_by_equal_specs(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    first, again = load_spec(SPEC), load_spec(SPEC)  # a task and a trigger each parse the spec
    assert services.s3_client(first) is services.s3_client(first) is services.s3_client(again)
    assert services.ledger_model(first) is services.ledger_model(again)
    assert services.backend_for(first) is services.backend_for(again)


def test_another_endpoint_or_local_root_gets_clients_of_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    spec = load_spec(SPEC)
    before = services.s3_client(spec)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")
    after = services.s3_client(spec)
    assert after is not before and after.meta.endpoint_url == "http://127.0.0.1:10"
    monkeypatch.setenv(services.ENV_LOCAL_ROOT, str(tmp_path))
    assert services.backend_for(spec).root == tmp_path


def test_the_listing_client_leaves_timestamps_as_text_and_lists_the_same_inputs(aws_env):
    """The planner's listing client skips botocore's datetime parsing (most of a page's parse time); the
    shared client keeps it, and both plan the same inputs."""
    import datetime
    import uuid

    from shardline.planning.inputs import list_inputs_and_refusals

    spec = load_spec(SPEC)
    s3, listing = services.s3_client(spec), services.s3_listing_client(spec)
    assert listing is not s3 and listing is services.s3_listing_client(spec)
    bucket = f"listing-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"in/part-{i}.parquet", Body=b"x" * i)
    text = listing.list_objects_v2(Bucket=bucket)["Contents"][0]["LastModified"]
    parsed = s3.list_objects_v2(Bucket=bucket)["Contents"][0]["LastModified"]
    assert isinstance(text, str) and isinstance(parsed, datetime.datetime)
    assert datetime.datetime.fromisoformat(text.replace("Z", "+00:00")) == parsed
    uri = f"s3://{bucket}/in/"
    assert list_inputs_and_refusals(listing, uri) == list_inputs_and_refusals(s3, uri)
