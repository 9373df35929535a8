"""Objects sealed under their conversation's data key (:mod:`.keyring`) on their way to S3.

:class:`SealedBlobStore` wraps any :class:`.blobs.BlobStore`: every object a
conversation life writes with :meth:`~SealedBlobStore.put` (offloaded payloads,
draft chunks) is stored as ciphertext bound to its own object key, under the data
key of the life its key names (``t/<tenant>/c/<conversation>/g/<gen>/...``). So an
object restored from a bucket's old version after erasure, or copied to another
key, does not open.

Objects written before encryption was turned on carry no :data:`MAGIC` and are read
as they are, so existing conversations keep working; they are sealed when next
written. Streamed objects (:meth:`~SealedBlobStore.put_stream`: a large export, which
its owner downloads by URL) are stored as given: the export is the one place content
leaves in clear, by its owner's request, and it lives only until the conversation's
next purge.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from urllib.parse import unquote

from ..core.exceptions import InternalError
from .blobs import BlobStore
from .keyring import DataKey, Keyring

#: What a sealed object starts with (then :func:`.keyring.seal`'s format).
MAGIC = b"TLSEAL1\n"


def object_life(object_key: str) -> tuple[str, str, str] | None:
    """The ``(tenant, conversation_id, gen)`` an object key of a conversation life names."""
    parts = object_key.split("/")
    if len(parts) < 7 or parts[0] != "t" or parts[2] != "c" or parts[4] != "g":
        return None
    return unquote(parts[1]), parts[3], parts[5]


class SealedBlobStore(BlobStore):
    """A :class:`BlobStore` that seals what conversation lives put into ``inner``."""

    def __init__(self, inner: BlobStore, keyring: Keyring) -> None:
        self.inner = inner
        self.keyring = keyring
        self.makes_urls = inner.makes_urls

    def _key(self, object_key: str, *, create: bool) -> DataKey:
        life = object_life(object_key)
        if life is None:
            raise InternalError(f"object {object_key!r} belongs to no conversation life")
        return self.keyring.data_key(*life, create=create)

    def put(self, key: str, data: bytes) -> None:
        sealed = self._key(key, create=True).seal(data, key.encode())
        self.inner.put(key, MAGIC + sealed)

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        if not data.startswith(MAGIC):
            return data  # written before encryption was on
        return self._key(key, create=False).unseal(data[len(MAGIC) :], key.encode(), where=key)

    def list_keys(self, prefix: str) -> Iterator[str]:
        return self.inner.list_keys(prefix)

    def delete_keys(self, keys: Iterable[str]) -> int:
        return self.inner.delete_keys(keys)

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> int:
        return self.inner.put_stream(key, chunks, content_type)

    def download_url(self, key: str, expires_in: int) -> str | None:
        return self.inner.download_url(key, expires_in)
