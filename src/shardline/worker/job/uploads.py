"""Each output durable as its file finishes: the instance uploads it to the step's output prefix itself.

SageMaker's ``EndOfJob`` upload made the job the unit of durability: one lost instance and nothing the job had
finished was safe. Here a file's output goes to S3 as soon as it is renamed into place, with S3's own SHA-256
checksum of the body (``ChecksumAlgorithm=SHA256``: S3 checks the bytes it received against it and keeps it),
and only then is its FILE item marked SUCCEEDED, with the sha256 the pool process computed as it wrote the file.
The check before ``_SUCCESS`` compares the two, so an object another run put at that key never passes for this
run's.

Uploads run on a few threads beside the pool, at most ``max_pending`` at once: when S3 is slower than the model,
the scheduler waits for a slot (backpressure), so the local copies waiting to go up stay bounded. An uploaded
output's local copy is deleted: a job's disk holds only the outputs in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from shardline import contract
from shardline.errors import OutputUploadError
from shardline.s3uri import bucket_and_prefix

log = logging.getLogger("shardline.worker")

UPLOAD_THREADS = 4
MAX_PENDING_UPLOADS = 16  # outputs written and not yet uploaded, at most, before the scheduler waits
# Below this an output goes up in one PUT, so S3's checksum is of the whole object (a multipart upload's is a
# checksum of its parts' checksums, and the check falls back to the sha256 the object's metadata carries).
SINGLE_PART_LIMIT = 4 << 30


@dataclasses.dataclass(frozen=True)
class Uploaded:
    """Where an output went, and the sha256 recorded for it."""

    key: str  # s3://bucket/key
    sha256: str


def s3_client():
    """An S3 client for the job's role (the container's credentials, ``AWS_ENDPOINT_URL`` where one is set), with
    the standard retry mode: throttles and 5xx are retried with backoff before a file's upload fails."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": 8, "mode": "standard"}))


class OutputUploader:
    """Uploads outputs from ``output_dir`` to ``output_uri`` on a few threads, at most ``max_pending`` at once."""

    def __init__(
        self,
        output_dir: Path,
        output_uri: str,
        *,
        client=None,
        kms_key_id: str | None = None,
        threads: int = UPLOAD_THREADS,
        max_pending: int = MAX_PENDING_UPLOADS,
    ):
        self.output_dir = Path(output_dir)
        self.bucket, self.prefix = bucket_and_prefix(output_uri)
        self.client = client if client is not None else s3_client()
        self.kms_key_id = kms_key_id
        self._slots = threading.BoundedSemaphore(max_pending)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="upload")
        self.stopped = threading.Event()  # fenced: nothing more goes up
        self._count_lock = threading.Lock()
        self.uploaded = 0
        self.bytes = 0

    def key_for(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def submit(
        self,
        relative: str,
        sha256: str,
        then: Callable[[Uploaded | None, Exception | None], None],
        first: Callable[[], None] | None = None,
    ) -> Future:
        """Upload ``output_dir/relative``; then call ``then(uploaded, None)``, or ``then(None, error)`` when it
        could not go up (or ``first``, run on the upload thread before it, raised). Waits for a slot while
        ``max_pending`` uploads are in flight."""
        self._slots.acquire()
        try:
            return self._pool.submit(self._run, relative, sha256, then, first)
        except BaseException:
            self._slots.release()
            raise

    def _run(self, relative: str, sha256: str, then, first) -> None:
        try:
            if self.stopped.is_set():
                answer = (None, OutputUploadError("not uploaded: a newer attempt owns this step"))
            else:
                try:
                    if first is not None:
                        first()
                    answer = (self.upload(relative, sha256), None)
                except Exception as err:  # noqa: BLE001 - the callback records it: the file fails, nothing is lost
                    answer = (None, err)
            try:
                then(*answer)
            except Exception:  # a Future nobody reads would swallow it: the file would never be recorded
                log.exception("recording the upload of %s failed; the file stays unfinished in the ledger", relative)
        finally:
            self._slots.release()

    def upload(self, relative: str, sha256: str) -> Uploaded:
        """One output, now, on this thread. Its local copy is deleted once S3 has it."""
        from boto3.exceptions import Boto3Error
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        path = self.output_dir / relative
        key = self.key_for(relative)
        extra: dict = {"ChecksumAlgorithm": "SHA256", "Metadata": {contract.OUTPUT_SHA256_METADATA: sha256}}
        if self.kms_key_id:
            extra.update(ServerSideEncryption="aws:kms", SSEKMSKeyId=self.kms_key_id)
        if path.is_symlink() or not path.is_file():
            # The worker renamed a regular file into place: anything else was put there by other code in the job
            # (a model's), and a link would upload whatever it points at.
            raise OutputUploadError(f"the output {relative} is not the regular file the worker wrote; not uploaded")
        try:
            size = path.stat().st_size
            self.client.upload_file(
                str(path),
                self.bucket,
                key,
                ExtraArgs=extra,
                Config=TransferConfig(multipart_threshold=SINGLE_PART_LIMIT, use_threads=False),
            )
        except (Boto3Error, BotoCoreError, ClientError, OSError) as err:
            raise OutputUploadError(
                f"the output {relative} could not be uploaded to s3://{self.bucket}/{key}: {type(err).__name__}: "
                f"{err}. Check that the job's role may s3:PutObject under the step's output.uri (and use its "
                "KMS key, sagemaker.kms_key_id), and that the instance reaches S3 (a VPC endpoint for S3 with "
                "sagemaker.vpc); a next attempt scores the file again"
            ) from err
        with contextlib.suppress(OSError):
            path.unlink()
        with self._count_lock:
            self.uploaded += 1
            self.bytes += size
        return Uploaded(f"s3://{self.bucket}/{key}", sha256)

    def put_bytes(self, uri: str, body: bytes, content_type: str = "application/json") -> None:
        """A small file of the instance's own (its manifest), in one PUT, with the lifecycle rule's tag that every
        file under ``_shardline/`` carries. A role that may not tag it (a stack deployed before the job role could)
        still writes it, untagged, and a WARNING says the bucket's rule will not expire it."""
        from botocore.exceptions import ClientError

        bucket, key = bucket_and_prefix(uri)
        extra = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key_id} if self.kms_key_id else {}
        try:
            self.client.put_object(
                Bucket=bucket, Key=key, Body=body, ContentType=content_type, Tagging=contract.METADATA_TAGGING, **extra
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "AccessDenied":
                raise
            self.client.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type, **extra)
            log.warning(
                "wrote %s without its lifecycle tag (%s): the job's role may not s3:PutObjectTagging there (update "
                "the stack's template), so the bucket's expire-shardline-metadata rule will not remove it",
                uri,
                contract.METADATA_TAGGING,
            )

    def close(self) -> None:
        """Wait for every upload in flight (each ends with its callback)."""
        self._pool.shutdown(wait=True)
