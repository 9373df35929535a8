"""Envelope encryption of conversation content, under keys that erasure can destroy.

Three levels of keys, each wrapped by the one above it::

    KMS key (one shared by default; a tenant may name its own customer-managed key)
      └── tenant key         one per tenant: KMS GenerateDataKey, kept wrapped
            └── data key     one per conversation life (tenant, conversation, gen)

Content is sealed with AES-256-GCM (``cryptography``'s AESGCM: no home-made
crypto) under its conversation's data key, with the item's own key as associated
data, so a ciphertext copied into another item, another conversation or another
life does not open. Wrapped keys live in their own store (:class:`KeyItems`): in
deployment a table without point-in-time recovery, so that deleting a key makes
every backup copy of what it protected unreadable: crypto-shredding.

Unwrapped keys are cached in the execution environment for a bounded time
(:data:`DEFAULT_CACHE_SECONDS`): a warm environment calls KMS once per tenant
per that time, not once per turn. :meth:`Keyring.forget` drops every cached key
(a restored SnapStart snapshot must not reuse what another environment holds).

Item layout of :class:`KeyItems` (``name`` is the key's whole identity)::

    "T#<tenant>"                           the tenant key, wrapped by KMS (or a key file)
    "T#<tenant>#C#<conversation>#<gen>"    a data key, wrapped by its tenant key
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..core.exceptions import ContentUnreadable, CorruptedState, ServiceUnavailable

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_kms.client import KMSClient

#: How long an unwrapped data key stays in an execution environment's memory.
DEFAULT_CACHE_SECONDS = 300.0
#: How long an unwrapped tenant key does. Longer: it is what costs a KMS call, and it adds
#: no exposure after an erasure, which deletes the data keys it wraps with it (a data key
#: made under it is checked against the stored tenant key first: :meth:`Keyring.data_key`).
DEFAULT_TENANT_CACHE_SECONDS = 3600.0
#: How many unwrapped keys an execution environment keeps at most (least recently used go).
DEFAULT_MAX_CACHED = 4096
#: The days KMS waits before deleting a tenant's own key (its minimum is 7).
KMS_PENDING_DAYS = 7

#: The first byte of a sealed value: the format (nonce, then AES-GCM's ciphertext and tag).
FORMAT = b"\x01"
_NONCE_BYTES = 12
#: How long a key store's write waits for another process's (SQLiteKeyItems).
_KEYS_BUSY_TIMEOUT_SECONDS = 30.0
_KEY_BYTES = 32


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """``plaintext`` sealed under ``key``, bound to ``aad`` (the item it belongs in)."""
    nonce = secrets.token_bytes(_NONCE_BYTES)
    return FORMAT + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, sealed: bytes, aad: bytes, *, where: str) -> bytes:
    """What :func:`seal` sealed under ``key`` for ``aad``.

    Raises:
        CorruptedState: ``sealed`` is not of this format, or was sealed for another
            item or under another key (AES-GCM's tag does not verify).
    """
    if sealed[:1] != FORMAT or len(sealed) < 1 + _NONCE_BYTES + 16:
        raise CorruptedState("a sealed value is not in a known format", details={"item": where})
    nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
    try:
        return AESGCM(key).decrypt(nonce, body, aad)
    except InvalidTag as exc:
        raise CorruptedState(
            "a sealed value does not belong to this item", details={"item": where}
        ) from exc


@dataclass(frozen=True)
class DataKey:
    """One conversation life's data key, unwrapped."""

    tenant: str
    conversation_id: str
    gen: str
    material: bytes

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        """``plaintext`` sealed under this key for the item ``aad`` names."""
        return seal(self.material, plaintext, aad)

    def unseal(self, sealed: bytes, aad: bytes, *, where: str) -> bytes:
        """What :meth:`seal` sealed for ``aad`` (:func:`unseal`)."""
        return unseal(self.material, sealed, aad, where=where)


# --- where wrapped keys live -----------------------------------------------------------


class KeyItems(ABC):
    """Wrapped keys by name: the primitives :class:`Keyring` needs, on every backend."""

    @abstractmethod
    def get(self, name: str) -> bytes | None:
        """The wrapped key stored as ``name`` (``None``: none, or destroyed)."""

    @abstractmethod
    def put_new(self, name: str, wrapped: bytes, owner: str) -> bytes:
        """Store ``wrapped`` as ``name`` unless a key is there; answers the stored one.

        Two environments that create a key at once both end with the first one
        written. ``owner`` is the tenant: :meth:`names_of` lists by it.
        """

    @abstractmethod
    def delete(self, names: list[str]) -> None:
        """Delete the keys named; absent ones are fine."""

    @abstractmethod
    def names_of(self, owner: str) -> Iterator[str]:
        """Every key name ``owner`` (a tenant) holds."""


class MemoryKeyItems(KeyItems):
    """Wrapped keys in a dict (tests, the memory store)."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, bytes]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> bytes | None:
        found = self._items.get(name)
        return None if found is None else found[1]

    def put_new(self, name: str, wrapped: bytes, owner: str) -> bytes:
        with self._lock:
            return self._items.setdefault(name, (owner, wrapped))[1]

    def delete(self, names: list[str]) -> None:
        with self._lock:
            for name in names:
                self._items.pop(name, None)

    def names_of(self, owner: str) -> Iterator[str]:
        with self._lock:
            found = [name for name, (who, _) in self._items.items() if who == owner]
        yield from found


class DynamoDBKeyItems(KeyItems):
    """Wrapped keys in their own DynamoDB table (``name`` the hash key, ``owner`` indexed).

    The table has no point-in-time recovery on purpose: a deleted key must not come
    back from a backup (template.yaml, ``KeysTable``).
    """

    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self.client = client
        self.table_name = table_name

    def get(self, name: str) -> bytes | None:
        answer = self.client.get_item(
            TableName=self.table_name, Key={"name": {"S": name}}, ConsistentRead=True
        )
        item = answer.get("Item")
        return None if item is None else item["key"]["B"]

    def put_new(self, name: str, wrapped: bytes, owner: str) -> bytes:
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={"name": {"S": name}, "owner": {"S": owner}, "key": {"B": wrapped}},
                ConditionExpression="attribute_not_exists(#n)",
                ExpressionAttributeNames={"#n": "name"},
            )
        except self.client.exceptions.ConditionalCheckFailedException:
            stored = self.get(name)
            if stored is None:  # written and destroyed in between: ours is as good
                return self.put_new(name, wrapped, owner)
            return stored
        return wrapped

    def delete(self, names: list[str]) -> None:
        for name in names:
            self.client.delete_item(TableName=self.table_name, Key={"name": {"S": name}})

    def names_of(self, owner: str) -> Iterator[str]:
        paginator = self.client.get_paginator("query")
        for page in paginator.paginate(
            TableName=self.table_name,
            IndexName="by-owner",
            KeyConditionExpression="#o = :o",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={":o": {"S": owner}},
        ):
            for item in page.get("Items", []):
                yield item["name"]["S"]


class SQLiteKeyItems(KeyItems):
    """Wrapped keys in their own SQLite file, beside (never inside) the data file.

    A copy of the data file (a backup) then holds no key: deleting a key here
    makes what it protected unreadable in every copy of the data file, as the keys
    table does.

    A deleted key leaves no copy in the key files (``keys.sqlite3`` and its journal):
    the file has ``secure_delete`` on (SQLite overwrites what a delete frees with
    zeros) and a rollback journal (``journal_mode=DELETE``), whose copy of the pages
    a delete changes is removed with the transaction. A WAL would keep the page that
    held a deleted key until a checkpoint overwrote it, which a reader can hold off.
    A file an older build left in WAL mode is moved to this mode and vacuumed (what its
    earlier deletes left in free pages is overwritten) by the first process to open it
    while no other has it open (:meth:`__init__`; the local runner opens it before it
    starts its functions).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        db = self._connection()
        if db.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            # Leaving WAL needs the file to itself; another process holding it (an older
            # runner) keeps it in WAL until a later open finds it free.
            with contextlib.suppress(sqlite3.OperationalError):
                db.execute("PRAGMA busy_timeout=0")
                if db.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete":
                    db.execute("VACUUM")
            db.execute(f"PRAGMA busy_timeout={int(_KEYS_BUSY_TIMEOUT_SECONDS * 1000)}")
        with db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS keys (name TEXT PRIMARY KEY, owner TEXT NOT NULL,"
                " key BLOB NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS keys_owner ON keys (owner)")

    def _connection(self) -> sqlite3.Connection:
        # One connection per thread and process: one inherited through fork() is never used.
        pid = os.getpid()
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != pid:
            db = sqlite3.connect(self.path, timeout=_KEYS_BUSY_TIMEOUT_SECONDS)
            # Per connection: every one that deletes must zero what it frees.
            db.execute("PRAGMA secure_delete=ON")
            db.execute("PRAGMA synchronous=FULL")
            self._local.db, self._local.pid = db, pid
        return db

    def get(self, name: str) -> bytes | None:
        row = self._connection().execute("SELECT key FROM keys WHERE name = ?", (name,)).fetchone()
        return None if row is None else bytes(row[0])

    def put_new(self, name: str, wrapped: bytes, owner: str) -> bytes:
        with self._connection() as db:
            db.execute(
                "INSERT OR IGNORE INTO keys (name, owner, key) VALUES (?, ?, ?)",
                (name, owner, wrapped),
            )
        stored = self.get(name)
        return wrapped if stored is None else stored

    def delete(self, names: list[str]) -> None:
        with self._connection() as db:
            db.executemany("DELETE FROM keys WHERE name = ?", [(name,) for name in names])

    def names_of(self, owner: str) -> Iterator[str]:
        rows = self._connection().execute("SELECT name FROM keys WHERE owner = ?", (owner,))
        yield from (str(row[0]) for row in rows.fetchall())


# --- what wraps tenant keys -------------------------------------------------------------


class MasterKey(ABC):
    """Creates and unwraps tenant keys (KMS in deployment, a key file locally)."""

    #: Calls made to the service that holds the master key (the bench counts them).
    calls: int = 0

    @abstractmethod
    def new_tenant_key(self, tenant: str) -> tuple[bytes, bytes]:
        """A new tenant key: ``(plaintext, wrapped)``."""

    @abstractmethod
    def unwrap(self, tenant: str, wrapped: bytes) -> bytes:
        """The plaintext of a tenant key :meth:`new_tenant_key` wrapped.

        Raises:
            ContentUnreadable: the master key that wrapped it is gone or disabled.
        """

    def destroy_tenant(self, tenant: str) -> str | None:
        """Schedule deletion of the tenant's own master key, if it named one.

        Returns:
            The key scheduled for deletion (``None``: the tenant used the shared one).
        """
        return None


class KmsMasterKey(MasterKey):
    """Tenant keys as KMS data keys, bound to their tenant by the encryption context.

    Args:
        default_key_id: the shared KMS key (id, ARN or alias).
        tenant_key_ids: tenants that name their own customer-managed key.
    """

    def __init__(
        self,
        client: KMSClient,
        default_key_id: str,
        tenant_key_ids: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.default_key_id = default_key_id
        self.tenant_key_ids = dict(tenant_key_ids or {})
        self.calls = 0

    def _key_id(self, tenant: str) -> str:
        return self.tenant_key_ids.get(tenant, self.default_key_id)

    @staticmethod
    def _context(tenant: str) -> dict[str, str]:
        return {"turnledger:tenant": tenant}

    def new_tenant_key(self, tenant: str) -> tuple[bytes, bytes]:
        self.calls += 1
        answer = self.client.generate_data_key(
            KeyId=self._key_id(tenant), KeySpec="AES_256", EncryptionContext=self._context(tenant)
        )
        return answer["Plaintext"], answer["CiphertextBlob"]

    def unwrap(self, tenant: str, wrapped: bytes) -> bytes:
        self.calls += 1
        try:
            answer = self.client.decrypt(
                CiphertextBlob=wrapped,
                KeyId=self._key_id(tenant),
                EncryptionContext=self._context(tenant),
            )
        except (
            self.client.exceptions.NotFoundException,
            self.client.exceptions.DisabledException,
            self.client.exceptions.KMSInvalidStateException,
        ) as exc:
            raise ContentUnreadable(
                "the tenant's master key is gone", details={"tenant": tenant}
            ) from exc
        except self.client.exceptions.InvalidCiphertextException as exc:
            raise CorruptedState(
                "a tenant key does not open under its master key", details={"tenant": tenant}
            ) from exc
        except self.client.exceptions.KMSInternalException as exc:
            raise ServiceUnavailable("KMS is unavailable; try again") from exc
        return answer["Plaintext"]

    def destroy_tenant(self, tenant: str) -> str | None:
        own = self.tenant_key_ids.get(tenant)
        if own is None:
            return None
        self.calls += 1
        # Already pending deletion: an erasure resumed after its deadline.
        with contextlib.suppress(self.client.exceptions.KMSInvalidStateException):
            self.client.schedule_key_deletion(KeyId=own, PendingWindowInDays=KMS_PENDING_DAYS)
        return own


class LocalMasterKey(MasterKey):
    """A master key this process holds: where there is no KMS.

    :meth:`from_file` keeps it in a file readable by its owner only, outside the local
    runner's data folder by default (:func:`.local_folder.local_master_key_file`):
    a copy of the folder then holds wrapped keys that nothing in it opens. Without a
    file (tests) it lives in memory.
    """

    def __init__(self, material: bytes | None = None) -> None:
        self.calls = 0
        self._material = material if material is not None else secrets.token_bytes(_KEY_BYTES)
        if len(self._material) != _KEY_BYTES:
            raise CorruptedState("a master key is not a 256-bit key")

    @classmethod
    def from_file(cls, path: Path) -> LocalMasterKey:
        """The key in ``path``, created there (mode 0600, its folder 0700 when created too)
        when the file does not exist."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(path.read_bytes())
        material = secrets.token_bytes(_KEY_BYTES)
        with os.fdopen(fd, "wb") as out:
            out.write(material)
        return cls(material)

    def new_tenant_key(self, tenant: str) -> tuple[bytes, bytes]:
        self.calls += 1
        plaintext = secrets.token_bytes(_KEY_BYTES)
        return plaintext, seal(self._material, plaintext, _tenant_aad(tenant))

    def unwrap(self, tenant: str, wrapped: bytes) -> bytes:
        self.calls += 1
        return unseal(self._material, wrapped, _tenant_aad(tenant), where=f"tenant key {tenant}")


def _tenant_aad(tenant: str) -> bytes:
    return json.dumps(["tenant-key", tenant]).encode()


def _data_aad(tenant: str, conversation_id: str, gen: str) -> bytes:
    return json.dumps(["data-key", tenant, conversation_id, gen]).encode()


def tenant_key_name(tenant: str) -> str:
    """The :class:`KeyItems` name of ``tenant``'s key."""
    return f"T#{tenant}"


def data_key_name(tenant: str, conversation_id: str, gen: str) -> str:
    """The :class:`KeyItems` name of one conversation life's data key."""
    return f"T#{tenant}#C#{conversation_id}#{gen}"


# --- the keyring ------------------------------------------------------------------------


class Keyring:
    """Data keys of conversation lives: created on first write, cached, destroyed on erasure.

    Args:
        master: what wraps tenant keys.
        items: where wrapped keys live.
        cache_seconds: how long an unwrapped data key is reused without reading it again.
        tenant_cache_seconds: the same for tenant keys (each read of one is a KMS call).
        max_cached: how many unwrapped keys are kept at most.
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        master: MasterKey,
        items: KeyItems,
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        tenant_cache_seconds: float = DEFAULT_TENANT_CACHE_SECONDS,
        max_cached: int = DEFAULT_MAX_CACHED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.master = master
        self.items = items
        self.cache_seconds = cache_seconds
        self.tenant_cache_seconds = tenant_cache_seconds
        #: The wrapped form of each cached tenant key (a recheck compares it to the stored one).
        self._wrapped: dict[str, bytes] = {}
        self.max_cached = max_cached
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def data_key(
        self, tenant: str, conversation_id: str, gen: str, *, create: bool, recheck: bool = False
    ) -> DataKey:
        """The data key of one conversation life.

        Args:
            create: make the key when there is none (a write); a read never does.
            recheck: read the key's item even when it is cached (one read of the key store):
                a write that must not seal under a key another environment destroyed.

        Raises:
            ContentUnreadable: no key (``create`` false): it was destroyed by erasure,
                or the content was restored from a copy taken before it.
        """
        name = data_key_name(tenant, conversation_id, gen)
        material = None if recheck else self._cached(name)
        if material is None:
            aad = _data_aad(tenant, conversation_id, gen)
            wrapped = self.items.get(name)
            if wrapped is None and create:
                # Against the stored tenant key, not a cached one another environment may
                # have destroyed since (tenant erasure): one read, no KMS call.
                tenant_key = self._tenant_key(tenant, create=True, recheck=True)
                fresh = secrets.token_bytes(_KEY_BYTES)
                wrapped = self.items.put_new(name, seal(tenant_key, fresh, aad), tenant)
            if wrapped is None:
                raise ContentUnreadable(
                    "this conversation's content was erased: its key is destroyed",
                    details={"conversation_id": conversation_id},
                )
            tenant_key = self._tenant_key(tenant, create=False)
            material = unseal(tenant_key, wrapped, aad, where=f"data key {name}")
            self._remember(name, material)
        return DataKey(tenant, conversation_id, gen, material)

    def _tenant_key(self, tenant: str, *, create: bool, recheck: bool = False) -> bytes:
        name = tenant_key_name(tenant)
        material = self._cached(name)
        if material is not None and not recheck:
            return material
        wrapped = self.items.get(name)
        if material is not None and wrapped is not None and wrapped == self._wrapped.get(name):
            return material
        if wrapped is None and create:
            plaintext, fresh = self.master.new_tenant_key(tenant)
            wrapped = self.items.put_new(name, fresh, tenant)
            if wrapped == fresh:
                self._remember(name, plaintext, wrapped)
                return plaintext
        if wrapped is None:
            raise ContentUnreadable(
                "this tenant's content was erased: its key is destroyed",
                details={"tenant": tenant},
            )
        material = self.master.unwrap(tenant, wrapped)
        self._remember(name, material, wrapped)
        return material

    def destroy_conversation(self, tenant: str, conversation_id: str, gens: list[str]) -> None:
        """Destroy the data keys of ``conversation_id``'s lives ``gens``: their content,
        wherever a copy of it is, no longer opens."""
        names = [data_key_name(tenant, conversation_id, gen) for gen in gens]
        self.items.delete(names)
        self._drop(names)

    def destroy_tenant(self, tenant: str) -> str | None:
        """Destroy ``tenant``'s key first, then its data keys' items (already useless).

        Returns:
            The tenant's own KMS key scheduled for deletion, if it named one.
        """
        first = tenant_key_name(tenant)
        self.items.delete([first])
        self._drop([first])
        scheduled = self.master.destroy_tenant(tenant)
        rest = [name for name in self.items.names_of(tenant) if name != first]
        self.items.delete(rest)
        self._drop(rest)
        return scheduled

    def forget(self) -> None:
        """Drop every cached key (after a SnapStart restore, or to bound exposure)."""
        with self._lock:
            self._cache.clear()
            self._wrapped.clear()

    def _cached(self, name: str) -> bytes | None:
        with self._lock:
            found = self._cache.get(name)
            if found is None:
                return None
            until, material = found
            if self.clock() >= until:
                del self._cache[name]
                return None
            self._cache.move_to_end(name)
            return material

    def _remember(self, name: str, material: bytes, wrapped: bytes | None = None) -> None:
        """Cache ``material``; ``wrapped``: it is a tenant key, stored wrapped as that."""
        seconds = self.cache_seconds if wrapped is None else self.tenant_cache_seconds
        with self._lock:
            if wrapped is not None:
                self._wrapped[name] = wrapped
            self._cache[name] = (self.clock() + seconds, material)
            self._cache.move_to_end(name)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)

    def _drop(self, names: list[str]) -> None:
        with self._lock:
            for name in names:
                self._cache.pop(name, None)
                self._wrapped.pop(name, None)


def item_aad(pk: str, sk: str, attribute: str, *, deflated: bool = False) -> bytes:
    """The associated data of a value sealed into attribute ``attribute`` of item (pk, sk);
    ``deflated``: of its clear text deflated (:data:`.sealed.DEFLATED`), so that a reader
    never takes one encoding for the other."""
    named = ["item", pk, sk, attribute, *(["deflate"] if deflated else [])]
    return json.dumps(named).encode()
