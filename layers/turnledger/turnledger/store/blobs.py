"""Large-payload storage: S3 in deployment, a dict in tests.

A :class:`BlobStore` knows four things: put an object, get it, list keys under
a prefix, delete keys. Offloading decisions, hashing and naming live in
:class:`turnledger.store.base.ConversationStore`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..exceptions import CorruptedState, InternalError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class BlobStore(ABC):
    """Objects by key."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (overwriting)."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object under ``key``.

        Raises:
            CorruptedState: there is no such object (an item points at nothing).
        """

    @abstractmethod
    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix``, paging as needed."""

    @abstractmethod
    def delete_keys(self, keys: Iterable[str]) -> int:
        """Delete ``keys`` (absent ones are fine); return how many were requested."""


class MemoryBlobStore(BlobStore):
    """A thread-safe in-process blob store for tests."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[key] = data

    def get(self, key: str) -> bytes:
        with self._lock:
            try:
                return self.objects[key]
            except KeyError:
                raise CorruptedState(
                    "an event points at a missing object", details={"object": key}
                ) from None

    def list_keys(self, prefix: str) -> Iterator[str]:
        with self._lock:
            found = sorted(k for k in self.objects if k.startswith(prefix))
        yield from found

    def delete_keys(self, keys: Iterable[str]) -> int:
        # Drain ``keys`` before locking: it may be :meth:`list_keys`, which takes the lock too.
        doomed = list(keys)
        with self._lock:
            for key in doomed:
                self.objects.pop(key, None)
        return len(doomed)


class S3BlobStore(BlobStore):
    """Objects in one S3 bucket (server-side encrypted by the bucket's default)."""

    _DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys a call

    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(
            Bucket=self._bucket, Key=key, Body=data, ContentType="application/json"
        )

    def get(self, key: str) -> bytes:
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=key)
        except self._client.exceptions.NoSuchKey:
            raise CorruptedState(
                "an event points at a missing object", details={"object": key}
            ) from None
        return response["Body"].read()

    def list_keys(self, prefix: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self._bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def delete_keys(self, keys: Iterable[str]) -> int:
        batch: list[str] = []
        count = 0
        for key in keys:
            batch.append(key)
            if len(batch) == self._DELETE_BATCH:
                count += self._delete_batch(batch)
                batch = []
        if batch:
            count += self._delete_batch(batch)
        return count

    def _delete_batch(self, batch: list[str]) -> int:
        response = self._client.delete_objects(
            Bucket=self._bucket,
            Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
        )
        # DeleteObjects answers 200 even when some keys failed; a quiet reply lists only those.
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            raise InternalError(
                f"S3 did not delete {len(errors)} of {len(batch)} objects "
                f"(first: {first.get('Key')}: {first.get('Code')})"
            )
        return len(batch)
