"""Parquet footers read from S3 without the data: a table commit's data files (their schema, rows and bounds) and a
quote's inputs (their rows, before anything runs)."""

from __future__ import annotations

import io
import struct

FOOTER_READ = 1 << 16  # one ranged GET a file: its footer, whole for most files (a few KiB)


def parquet_footer(s3, bucket: str, key: str):
    """``(pyarrow FileMetaData, size)`` of a parquet object, read with one ranged GET (a second for a footer larger
    than :data:`FOOTER_READ`); None when the object does not end as a parquet file does."""
    import pyarrow.parquet as pq

    answer = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{FOOTER_READ}")
    tail = answer["Body"].read()
    size = int(str(answer.get("ContentRange", "")).rsplit("/", 1)[-1] or len(tail))
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        return None
    length = struct.unpack("<I", tail[-8:-4])[0]
    if length + 8 > len(tail):
        start = size - length - 8
        tail = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{size - 1}")["Body"].read()
    # A footer parses alone: the magic, the metadata, its length and the magic again.
    return pq.read_metadata(io.BytesIO(b"PAR1" + tail[-(length + 8) :])), size
