"""The S3 blob store lists every object under a prefix, page after page.

``S3BlobStore.list_keys`` follows ``ListObjectsV2``'s continuation token itself (not
botocore's paginator, whose model a first use loads: ``make bench``, *Cold start*): a
clear, a purge and an erasure delete what it lists, so a page it missed would be an
object left behind.
"""

from __future__ import annotations

from moto import mock_aws
from turnledger.store.blobs import S3BlobStore

from tests.support.aws import aws_clients, create_bucket


def test_every_object_under_a_prefix_is_listed_across_pages() -> None:
    with mock_aws():
        clients = aws_clients()
        bucket = create_bucket(clients.s3)
        blobs = S3BlobStore(clients.s3, bucket)
        wanted = {f"t/acme/c/{n:05d}" for n in range(1_003)}  # ListObjectsV2 pages by 1,000
        for key in wanted:
            clients.s3.put_object(Bucket=bucket, Key=key, Body=b"{}")
        clients.s3.put_object(Bucket=bucket, Key="t/other/c/00000", Body=b"{}")

        assert set(blobs.list_keys("t/acme/")) == wanted
        assert list(blobs.list_keys("t/none/")) == []
        assert blobs.delete_keys(blobs.list_keys("t/acme/")) == len(wanted)
        assert list(blobs.list_keys("t/")) == ["t/other/c/00000"]
