"""The instance's uploads, without a server: what goes up, in what order of events, and what never does."""

from __future__ import annotations

import threading

from shardline.errors import OutputUploadError
from shardline.worker.job.uploads import OutputUploader


class RecordingS3:
    """Stands in for boto3's S3 client: records each upload_file and can hold uploads until released."""

    def __init__(self, gate: threading.Event | None = None):
        self.calls: list[tuple[str, str, dict]] = []
        self.gate = gate
        self.lock = threading.Lock()

    def upload_file(self, filename, bucket, key, ExtraArgs=None, Config=None):
        if self.gate is not None:
            self.gate.wait(30)
        with self.lock:
            self.calls.append((bucket, key, dict(ExtraArgs or {})))


def test_an_output_goes_up_with_its_checksum_and_its_local_copy_is_deleted(tmp_path):
    (tmp_path / "dt=1").mkdir()
    (tmp_path / "dt=1" / "a.parquet").write_bytes(b"x" * 10)
    s3 = RecordingS3()
    uploader = OutputUploader(tmp_path, "s3://bucket/out/", client=s3, kms_key_id="alias/k")
    results = []
    uploader.submit("dt=1/a.parquet", "ab" * 32, lambda up, err: results.append((up, err)))
    uploader.close()
    [(uploaded, error)] = results
    assert error is None and (uploaded.key, uploaded.sha256) == ("s3://bucket/out/dt=1/a.parquet", "ab" * 32)
    [(bucket, key, extra)] = s3.calls
    assert (bucket, key) == ("bucket", "out/dt=1/a.parquet")
    assert extra["ChecksumAlgorithm"] == "SHA256" and extra["Metadata"] == {"sha256": "ab" * 32}
    assert extra["SSEKMSKeyId"] == "alias/k"
    assert not (tmp_path / "dt=1" / "a.parquet").exists()


def test_a_link_in_place_of_an_output_is_never_uploaded(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("credentials")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.parquet").symlink_to(secret)
    s3 = RecordingS3()
    uploader = OutputUploader(tmp_path / "out", "s3://bucket/out", client=s3)
    results = []
    uploader.submit("a.parquet", "00" * 32, lambda up, err: results.append((up, err)))
    uploader.close()
    [(uploaded, error)] = results
    assert uploaded is None and isinstance(error, OutputUploadError) and "not the regular file" in str(error)
    assert s3.calls == []


def test_at_most_max_pending_uploads_wait_so_the_scheduler_feels_backpressure(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.parquet").write_bytes(b"x")
    gate = threading.Event()
    uploader = OutputUploader(tmp_path, "s3://bucket/out", client=RecordingS3(gate), threads=1, max_pending=2)
    uploader.submit("0.parquet", "", lambda *_: None)
    uploader.submit("1.parquet", "", lambda *_: None)
    third = threading.Thread(target=uploader.submit, args=("2.parquet", "", lambda *_: None))
    third.start()
    third.join(0.5)
    assert third.is_alive()  # blocked until a slot frees: never more than max_pending outputs waiting
    gate.set()
    third.join(30)
    assert not third.is_alive()
    uploader.close()


def test_once_stopped_nothing_more_goes_up(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"x")
    s3 = RecordingS3()
    uploader = OutputUploader(tmp_path, "s3://bucket/out", client=s3)
    uploader.stopped.set()  # fenced: a newer attempt owns the step
    results = []
    uploader.submit("a.parquet", "", lambda up, err: results.append((up, err)))
    uploader.close()
    assert results[0][0] is None and s3.calls == [] and (tmp_path / "a.parquet").exists()
