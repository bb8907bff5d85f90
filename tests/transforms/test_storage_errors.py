"""storage's one error boundary: whatever Beam's file systems raise (each store its own error
type) is an OSError, as a local file system's error is, for every caller."""

from __future__ import annotations

import pytest

from kvtrace.transforms import storage

pytestmark = pytest.mark.beam


def test_a_refused_upload_is_an_os_error(s3, monkeypatch):
    from apache_beam.io.aws.clients.s3 import boto3_client, messages

    def refused(client: object, request: object) -> object:
        raise messages.S3ClientError("Access Denied", 403)

    s3.create_bucket(Bucket="kvtrace-bucket")
    monkeypatch.setattr(boto3_client.Client, "create_multipart_upload", refused)
    with pytest.raises(OSError, match="S3ClientError.*Access Denied"):
        with storage.create("s3://kvtrace-bucket/file") as handle:
            handle.write(b"x")


def test_a_files_own_errors_are_os_errors_and_its_bytes_go_through(s3, monkeypatch):
    from apache_beam.io.aws.clients.s3 import boto3_client, messages

    s3.create_bucket(Bucket="kvtrace-bucket")
    with storage.create("s3://kvtrace-bucket/file") as handle:
        handle.write(b"line\n")
    with storage.open_read("s3://kvtrace-bucket/file") as handle:
        assert handle.readline() == b"line\n"
    assert storage.files_in("s3://kvtrace-bucket") == ["file"]

    def refused(client: object, request: object) -> object:
        raise messages.S3ClientError("Access Denied", 403)

    monkeypatch.setattr(boto3_client.Client, "complete_multipart_upload", refused)
    with pytest.raises(OSError, match="S3ClientError"):
        with storage.create("s3://kvtrace-bucket/other") as handle:
            handle.write(b"x")
