"""S3 addresses: ``s3://bucket/key`` read into its parts, one way for every room (planning, the watch, on-call,
the worker's uploads, the local grant). Standard library only: the worker image imports it too.

:func:`parse_s3_uri` splits an address into its bucket and key, and raises :class:`InvalidS3Uri` for anything else
(no ``s3://`` scheme, no bucket): a permanent error, so the task that meets it fails at once. :func:`bucket_and_prefix`
reads a prefix without its trailing slash; :func:`path_of` is the address without its scheme, ``bucket/key``.
"""

from __future__ import annotations

from shardline.errors import PermanentError

SCHEME = "s3://"


class InvalidS3Uri(PermanentError, ValueError):
    """A setting or record that should name an S3 location does not."""


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    if not uri.startswith(SCHEME):
        raise InvalidS3Uri(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len(SCHEME) :].partition("/")
    if not bucket:
        raise InvalidS3Uri(f"no bucket in {uri!r}")
    return bucket, key


def bucket_and_prefix(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ("bucket", "some/prefix"): a prefix with no trailing slash."""
    bucket, key = parse_s3_uri(uri)
    return bucket, key.rstrip("/")


def path_of(uri: str) -> str:
    """``s3://bucket/key`` as ``bucket/key``."""
    parse_s3_uri(uri)
    return uri[len(SCHEME) :]
