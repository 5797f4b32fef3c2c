"""One reading of an S3 address for every room: what it gives back, and what it refuses with which words."""

from __future__ import annotations

import pytest

from shardline.errors import PermanentError
from shardline.s3uri import InvalidS3Uri, bucket_and_prefix, parse_s3_uri, path_of


def test_an_address_is_read_into_its_bucket_and_key_as_written():
    assert parse_s3_uri("s3://b/a/b/") == ("b", "a/b/")
    assert parse_s3_uri("s3://b/a/b") == ("b", "a/b")
    assert parse_s3_uri("s3://b") == ("b", "")
    assert parse_s3_uri("s3://b/ü/ä b.parquet") == ("b", "ü/ä b.parquet")  # keys are taken as they are


def test_a_prefix_has_no_trailing_slash_and_a_path_keeps_the_key_whole():
    assert bucket_and_prefix("s3://b/scores/dt=1/") == ("b", "scores/dt=1")
    assert bucket_and_prefix("s3://b") == ("b", "")
    assert path_of("s3://b/in/") == "b/in/"
    assert path_of("s3://b") == "b"


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("/local/path", "not an s3:// URI: '/local/path'"),
        ("S3://b/key", "not an s3:// URI"),  # S3 itself spells the scheme in lower case
        ("s3:/b/key", "not an s3:// URI"),
        ("s3:///key", "no bucket in 's3:///key'"),
        ("", "not an s3:// URI: ''"),
    ],
)
def test_anything_else_is_refused_naming_what_was_given(uri, said):
    for read in (parse_s3_uri, bucket_and_prefix, path_of):
        with pytest.raises(InvalidS3Uri, match=said.replace("(", r"\(")) as refused:
            read(uri)
        # Permanent (no retry spends an attempt on it), and a ValueError for callers that check values.
        assert isinstance(refused.value, PermanentError) and isinstance(refused.value, ValueError)
