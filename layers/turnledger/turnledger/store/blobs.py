"""Large-payload storage: S3 in deployment, files for the local runner, a dict in tests.

A :class:`BlobStore` knows four things: put an object, get it, list keys under
a prefix, delete keys; and, for large exports, two more with defaults: put a stream
(S3: in parts) and a URL that fetches an object without credentials (S3: presigned).
Offloading decisions, hashing and naming live in
:class:`turnledger.store.base.ConversationStore`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from ..core.exceptions import CorruptedState, InternalError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class BlobStore(ABC):
    """Objects by key."""

    #: Whether :meth:`download_url` makes URLs (S3 does; files and memory do not).
    makes_urls: bool = False

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

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> int:
        """Store the concatenation of ``chunks`` under ``key`` (overwriting); return its size.

        This base joins them in memory; :class:`S3BlobStore` streams them in parts.
        """
        data = b"".join(chunks)
        self.put(key, data)
        return len(data)

    def download_url(self, key: str, expires_in: int) -> str | None:
        """A URL that fetches ``key`` without other credentials for ``expires_in`` seconds,
        or ``None`` where the store has no such URLs (files, memory)."""
        return None


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
    makes_urls = True

    def __init__(self, client: S3Client | Callable[[], S3Client], bucket: str) -> None:
        """Store in ``bucket`` through ``client``, or through the client that ``client()``
        returns, asked on each call (most requests read no blob: the caller may build
        the client on the first that does, and cache it)."""
        self._source = client
        self._bucket = bucket

    @property
    def _client(self) -> S3Client:
        source = self._source
        # A boto3 client is not callable; a factory is.
        return source() if callable(source) else source

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(
            Bucket=self._bucket, Key=key, Body=data, ContentType="application/json"
        )

    #: Parts of a multipart upload (S3 takes 5 MiB at least, but for the last).
    PART_BYTES = 8 * 1024 * 1024

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> int:
        """Store ``chunks`` under ``key``: one ``PutObject`` when they fit one part, else a
        multipart upload (one part in memory at a time; aborted on failure, so nothing
        half-written is ever visible under ``key``)."""
        buffer = bytearray()
        size = 0
        upload_id: str | None = None
        parts: list[dict[str, Any]] = []
        try:
            for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                if len(buffer) >= self.PART_BYTES:
                    if upload_id is None:
                        upload_id = self._client.create_multipart_upload(
                            Bucket=self._bucket, Key=key, ContentType=content_type
                        )["UploadId"]
                    parts.append(self._upload_part(key, upload_id, len(parts) + 1, buffer))
                    buffer = bytearray()
            if upload_id is None:
                self._client.put_object(
                    Bucket=self._bucket, Key=key, Body=bytes(buffer), ContentType=content_type
                )
                return size
            if buffer:
                parts.append(self._upload_part(key, upload_id, len(parts) + 1, buffer))
            self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )
        except BaseException:
            if upload_id is not None:
                with contextlib.suppress(Exception):
                    self._client.abort_multipart_upload(
                        Bucket=self._bucket, Key=key, UploadId=upload_id
                    )
            raise
        return size

    def _upload_part(
        self, key: str, upload_id: str, number: int, data: bytearray
    ) -> dict[str, Any]:
        answer = self._client.upload_part(
            Bucket=self._bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=bytes(data)
        )
        return {"ETag": answer["ETag"], "PartNumber": number}

    def download_url(self, key: str, expires_in: int) -> str | None:
        """A presigned ``GetObject`` URL (SigV4; it also ends when the signing credentials do)."""
        return self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self._bucket, "Key": key}, ExpiresIn=expires_in
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
        # The continuation token by hand, not botocore's paginator: its first use in a
        # process loads the paginators' model (about 9 ms of a clear's first request).
        client = self._client
        page = client.list_objects_v2(Bucket=self._bucket, Prefix=prefix)
        while True:
            for obj in page.get("Contents", []):
                yield obj["Key"]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            page = client.list_objects_v2(
                Bucket=self._bucket, Prefix=prefix, ContinuationToken=token
            )

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


#: Longest encoded path segment written as one file or directory name (filesystems
#: allow 255 bytes); longer ones continue in nested directories.
_SEGMENT_BYTES = 200
#: Ends a name that continues in the next path level (a percent-encoded string never
#: ends with a bare ``%``).
_CONTINUES = "%"
_ATTEMPTS = 5


def _encode_segment(segment: str) -> list[str]:
    if not segment:
        raise InternalError("an object key has an empty path segment")
    # Percent-encoding leaves only letters, digits and -_~; "." is encoded too, so no
    # name is "." or "..", and the temporary files (".tmp-...") never look like objects.
    encoded = quote(segment, safe="-_~").replace(".", "%2E")
    pieces = [encoded[i : i + _SEGMENT_BYTES] for i in range(0, len(encoded), _SEGMENT_BYTES)]
    return [piece + _CONTINUES for piece in pieces[:-1]] + pieces[-1:]


def _decode_parts(parts: Iterable[str]) -> str:
    segments: list[str] = []
    pending = ""
    for part in parts:
        if part.endswith(_CONTINUES):
            pending += part[: -len(_CONTINUES)]
        else:
            segments.append(unquote(pending + part))
            pending = ""
    return "/".join(segments)


class FileBlobStore(BlobStore):
    """Objects as files under one directory, one file per key; safe for several processes.

    Each ``/``-separated part of a key is one directory level (percent-encoded), so
    listing a conversation's prefix reads only its directory. Writes go to a
    temporary file that is synced and renamed into place: a reader sees a whole
    object or none. Directories left empty by deletes are removed.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*(p for s in key.split("/") for p in _encode_segment(s)))

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        for attempt in range(_ATTEMPTS):
            # A concurrent delete may remove the (empty) directory between the two steps.
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                temporary = path.parent / f".tmp-{secrets.token_hex(8)}"
                with open(temporary, "wb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, path)
                return
            except FileNotFoundError:
                if attempt == _ATTEMPTS - 1:
                    raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise CorruptedState(
                "an event points at a missing object", details={"object": key}
            ) from None

    def list_keys(self, prefix: str) -> Iterator[str]:
        *folders, _ = prefix.split("/")
        start = self.root.joinpath(*(p for s in folders for p in _encode_segment(s)))
        found: list[str] = []
        for directory, subdirectories, files in os.walk(start):
            subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
            relative = Path(directory).relative_to(self.root).parts
            for name in files:
                if name.startswith("."):
                    continue  # a write in progress
                key = _decode_parts([*relative, name])
                if key.startswith(prefix):
                    found.append(key)
        yield from sorted(found)

    def delete_keys(self, keys: Iterable[str]) -> int:
        count = 0
        for key in keys:
            count += 1
            path = self._path(key)
            path.unlink(missing_ok=True)
            self._prune(path.parent)
        return count

    def _prune(self, directory: Path) -> None:
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return  # not empty (or gone): stop there
            directory = directory.parent
