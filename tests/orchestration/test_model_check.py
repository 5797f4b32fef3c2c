"""Whether a step's model is where its spec says (orchestration/model_check.py), asked of moto_server's S3: a model
object or a folder of model files is there; a missing one is named with what lies one level up."""

from __future__ import annotations

import boto3
import pytest

from shardline.orchestration.model_check import model_problem
from shardline.spec import parse_spec


@pytest.fixture
def models(two_steps):
    """The staged pipeline, with model versions v1 and v2 beside each other and a folder-of-files model."""
    spec, bucket = two_steps
    s3 = boto3.client("s3")
    for version in ("v1", "v2"):
        s3.put_object(Bucket=bucket, Key=f"models/churn/{version}/model.tar.gz", Body=b"a packed model")
    s3.put_object(Bucket=bucket, Key="models/folder/model.json", Body=b"{}")
    return spec, bucket


def test_a_model_object_that_is_there_is_no_problem(models):
    spec, bucket = models
    assert model_problem(spec, "score", f"s3://{bucket}/model/model.tar.gz") is None
    assert model_problem(spec, "score", f"s3://{bucket}/models/churn/v2/model.tar.gz") is None


def test_a_folder_of_model_files_is_no_problem(models):
    spec, bucket = models
    assert model_problem(spec, "score", f"s3://{bucket}/models/folder") is None
    assert model_problem(spec, "score", f"s3://{bucket}/models/folder/") is None


def test_a_missing_version_is_named_with_the_versions_that_are_there(models):
    spec, bucket = models
    uri = f"s3://{bucket}/models/churn/v3/model.tar.gz"
    problem = model_problem(spec, "score", uri)
    assert problem == f"no model at {uri} (check model.uri); under s3://{bucket}/models/churn/ there are: v1, v2"


def test_a_versioned_spec_points_at_the_model_version_param(models):
    spec, bucket = models
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["steps"][0]["model"] = {
        "uri": f"s3://{bucket}/models/churn/{{{{ params.model_version }}}}/model.tar.gz",
        "version": "v1",
        "allow_unpinned": True,
    }
    versioned = parse_spec(data, "two_steps.yaml")
    uri = f"s3://{bucket}/models/churn/v9/model.tar.gz"
    problem = model_problem(versioned, "score", uri)
    assert problem.startswith(f"no model at {uri} (check the Param model_version or model.uri)"), problem
    assert problem.endswith("there are: v1, v2"), problem


def test_a_model_in_a_bucket_that_is_not_there_is_named_without_a_listing(models):
    spec, _bucket = models
    uri = "s3://no-such-bucket-shardline/models/churn/v1/model.tar.gz"
    assert model_problem(spec, "score", uri) == f"no model at {uri} (check model.uri)"


def test_a_missing_model_near_the_top_of_a_bucket_names_the_buckets_folders(models):
    spec, bucket = models
    uri = f"s3://{bucket}/model/other.tar.gz"
    # Fewer than two folders deep: the bucket's top folders are named.
    assert model_problem(spec, "score", uri) == (
        f"no model at {uri} (check model.uri); under s3://{bucket}/ there are: in, model, models"
    )
