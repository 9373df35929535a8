"""The SQLite backend: one database file, the same contract as DynamoDB, for the local runner.

A peer of the memory and DynamoDB backends (the store contract suite runs on
all of them): one table ``items`` keyed ``(pk, sk)`` holding each item as a
JSON object, with its index attributes (``xb``, ``tn``, ``wb``, and an inbox
entry's ``ib`` and ``is``) copied into columns of partial indexes named after the
DynamoDB ones. Text keys compare
byte-wise in UTF-8, as DynamoDB's do, so queries and cursors order alike.

Safe for several threads and several processes on one machine: every write
is one ``BEGIN IMMEDIATE`` transaction that checks its conditions and writes
under the database's write lock, so conditions hold exactly as DynamoDB's do;
the journal is in WAL mode, so readers never wait for a writer and each read
sees the last committed state. Each thread of each process has its own
connection. Writes are synchronous (``synchronous=FULL``): a commit that
returned survives a crash of the process or of the machine.

The item size limit is DynamoDB's (400 KB by :func:`.codec.item_size`), so a
turn refused in deployment is refused here too.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..core.exceptions import ConversationBusy, InternalError
from . import codec
from .backend import (
    BUSY,
    Check,
    ConditionFailed,
    Delete,
    Put,
    SlotFree,
    Update,
    Write,
    applied,
)
from .base import ConversationStore, Page
from .blobs import BlobStore, FileBlobStore
from .codec import Item
from .inbox import A_INBOX, A_INBOX_SORT, EntryKey, entry_key
from .indexes import INDEX_ATTRIBUTES

#: The layout this build writes (``PRAGMA user_version``). 2: the by-wait and by-inbox
#: columns (a layout-1 file is upgraded in place: three columns and indexes are added).
SCHEMA_VERSION = 2

#: How long a write waits for another connection's write to end.
DEFAULT_BUSY_TIMEOUT_SECONDS = 30.0

#: What a data folder (``turnledger local --data-dir``) holds.
DATABASE_FILE = "turnledger.sqlite3"
BLOBS_FOLDER = "blobs"


#: Index columns, named after the item attributes they copy.
_INDEX_COLUMNS = tuple(INDEX_ATTRIBUTES.values())
#: The by-inbox columns (``is`` is an SQL keyword, so they are named apart):
#: the attributes ``ib`` and ``is`` of an inbox entry.
_INBOX_COLUMNS = ("inbox_pk", "inbox_sk")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS items (
    pk TEXT NOT NULL,
    sk TEXT NOT NULL,
    item TEXT NOT NULL,
    {codec.A_EXPIRY_BUCKET} TEXT,
    {codec.A_TENANT} TEXT,
    {codec.A_WAIT_BUCKET} TEXT,
    {_INBOX_COLUMNS[0]} TEXT,
    {_INBOX_COLUMNS[1]} TEXT,
    PRIMARY KEY (pk, sk)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS "by-expiry" ON items ({codec.A_EXPIRY_BUCKET}, pk)
    WHERE {codec.A_EXPIRY_BUCKET} IS NOT NULL;
CREATE INDEX IF NOT EXISTS "by-tenant" ON items ({codec.A_TENANT}, pk)
    WHERE {codec.A_TENANT} IS NOT NULL;
CREATE INDEX IF NOT EXISTS "by-wait" ON items ({codec.A_WAIT_BUCKET}, pk)
    WHERE {codec.A_WAIT_BUCKET} IS NOT NULL;
CREATE INDEX IF NOT EXISTS "by-inbox" ON items ({_INBOX_COLUMNS[0]}, {_INBOX_COLUMNS[1]})
    WHERE {_INBOX_COLUMNS[0]} IS NOT NULL;
"""
#: What a layout-1 file needs to become layout 2 (before the statements above).
_UPGRADE_FROM_1 = (
    f"ALTER TABLE items ADD COLUMN {codec.A_WAIT_BUCKET} TEXT",
    f"ALTER TABLE items ADD COLUMN {_INBOX_COLUMNS[0]} TEXT",
    f"ALTER TABLE items ADD COLUMN {_INBOX_COLUMNS[1]} TEXT",
)


#: How a binary value (sealed content, store/sealed.py) is kept in an item's JSON.
_BINARY = "$b64"


def _binary(value: object) -> dict[str, str]:
    if isinstance(value, bytes):
        return {_BINARY: base64.b64encode(value).decode("ascii")}
    raise TypeError(f"no JSON for {type(value).__name__}")


def _encode(item: Item) -> str:
    return json.dumps(item, ensure_ascii=False, separators=(",", ":"), default=_binary)


def _decode(text: str) -> Item:
    item: Item = json.loads(text)
    for name, value in item.items():
        if isinstance(value, dict) and _BINARY in value:
            item[name] = base64.b64decode(value[_BINARY])
    return item


def _row(item: Item) -> tuple[Any, ...]:
    """``(pk, sk, item, xb, tn, wb, inbox_pk, inbox_sk)``: an index column holds its
    attribute when it is a string."""
    indexed = [
        item[name] if isinstance(item.get(name), str) else None
        for name in (*_INDEX_COLUMNS, A_INBOX, A_INBOX_SORT)
    ]
    return (item[codec.A_PK], item[codec.A_SK], _encode(item), *indexed)


class SQLiteConversationStore(ConversationStore):
    """Conversations in one SQLite database file (created with its tables when missing).

    Args:
        path: the database file.
        blobs: where offloaded payloads go (:class:`.blobs.FileBlobStore` next to it).
        busy_timeout_seconds: how long a write waits for the write lock.

    Raises:
        InternalError: the file holds a layout newer than this build's.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        blobs: BlobStore,
        *,
        busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(blobs, **kwargs)
        self.path = Path(path)
        self.busy_timeout_seconds = busy_timeout_seconds
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._prepare()

    @classmethod
    def in_folder(cls, folder: str | os.PathLike[str], **kwargs: Any) -> SQLiteConversationStore:
        """The store of a data folder: :data:`DATABASE_FILE`, objects under :data:`BLOBS_FOLDER`.

        Creates the folder, the database and its tables when missing.
        """
        root = Path(folder)
        return cls(root / DATABASE_FILE, FileBlobStore(root / BLOBS_FOLDER), **kwargs)

    # --- connections and transactions ---------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        # One connection per thread and process: a connection inherited through fork()
        # must never be used by the child.
        pid = os.getpid()
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != pid:
            db = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_seconds,
                isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE
                check_same_thread=False,  # only so close() may close it from another thread
            )
            db.execute("PRAGMA synchronous=FULL")
            self._local.db, self._local.pid = db, pid
            with self._connections_lock:
                self._connections.append(db)
        return db

    def _prepare(self) -> None:
        # WAL is a property of the file: set once, kept by every later connection.
        self._connection().execute("PRAGMA journal_mode=WAL")
        with self._writing() as db:
            found = db.execute("PRAGMA user_version").fetchone()[0]
            if found > SCHEMA_VERSION:
                raise InternalError(
                    f"{self.path} has storage layout {found}; this build reads {SCHEMA_VERSION}"
                )
            if found == 1:
                for statement in _UPGRADE_FROM_1:
                    db.execute(statement)
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database's write lock from its first statement."""
        db = self._connection()
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _Locked(str(exc)) from exc
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        """Close every connection this store opened (in any thread)."""
        with self._connections_lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()

    # --- reads --------------------------------------------------------------------------

    def _get_item(self, pk: str, sk: str) -> Item | None:
        self.meter.read(0)
        row = (
            self._connection()
            .execute("SELECT item FROM items WHERE pk = ? AND sk = ?", (pk, sk))
            .fetchone()
        )
        return None if row is None else _decode(row[0])

    def _query(
        self,
        pk: str,
        *,
        lower: str | None,
        upper: str | None,
        descending: bool,
        limit: int,
        cursor: Any,
        keys_only: bool = False,
        consistent: bool = True,
    ) -> Page:
        # One file, one writer at a time: every read is consistent.
        self.meter.read(0)
        clauses, values = ["pk = ?"], [pk]
        if lower is not None:
            clauses.append("sk >= ?")
            values.append(lower)
        if upper is not None:
            clauses.append("sk <= ?")
            values.append(upper)
        # The cursor is the last key returned, as DynamoDB's LastEvaluatedKey: a page
        # resumes after it even when items before it were deleted in between.
        if cursor is not None:
            clauses.append("sk < ?" if descending else "sk > ?")
            values.append(cursor)
        order = "DESC" if descending else "ASC"
        rows = (
            self._connection()
            .execute(
                f"SELECT sk, item FROM items WHERE {' AND '.join(clauses)} "
                f"ORDER BY sk {order} LIMIT ?",
                (*values, limit + 1),
            )
            .fetchall()
        )
        chosen = rows[:limit]
        return Page(
            items=[_decode(item) for _, item in chosen],
            cursor=chosen[-1][0] if len(rows) > limit else None,
        )

    def _index_page(self, index: str, value: str, *, limit: int, cursor: Any) -> Page:
        self.meter.read(0)
        column = INDEX_ATTRIBUTES[index]  # one of two fixed names, never caller text
        rows = (
            self._connection()
            .execute(
                f"SELECT DISTINCT pk FROM items WHERE {column} = ? AND pk > ? ORDER BY pk LIMIT ?",
                (value, "" if cursor is None else cursor, limit + 1),
            )
            .fetchall()
        )
        chosen = [pk for (pk,) in rows[:limit]]
        return Page(
            items=[{codec.A_PK: pk} for pk in chosen],
            cursor=chosen[-1] if len(rows) > limit else None,
        )

    def _inbox_query(self, partition: str, *, after: EntryKey | None, limit: int) -> Page:
        self.meter.read(0)
        rows = (
            self._connection()
            .execute(
                f"SELECT item FROM items WHERE {_INBOX_COLUMNS[0]} = ? AND {_INBOX_COLUMNS[1]} > ? "
                f"ORDER BY {_INBOX_COLUMNS[1]} LIMIT ?",
                (partition, "" if after is None else after.sort, limit + 1),
            )
            .fetchall()
        )
        chosen = [_decode(item) for (item,) in rows[:limit]]
        return Page(items=chosen, cursor=entry_key(chosen[-1]) if len(rows) > limit else None)

    # --- writes -------------------------------------------------------------------------

    @staticmethod
    def _stored(db: sqlite3.Connection, pk: str, sk: str) -> Item | None:
        row = db.execute("SELECT item FROM items WHERE pk = ? AND sk = ?", (pk, sk)).fetchone()
        return None if row is None else _decode(row[0])

    @staticmethod
    def _put(db: sqlite3.Connection, items: list[Item]) -> None:
        db.executemany(
            "INSERT OR REPLACE INTO items "
            f"(pk, sk, item, {', '.join((*_INDEX_COLUMNS, *_INBOX_COLUMNS))}) "
            f"VALUES ({', '.join('?' * (3 + len(_INDEX_COLUMNS) + len(_INBOX_COLUMNS)))})",
            [_row(item) for item in items],
        )

    def _apply(self, db: sqlite3.Connection, write: Put | Update | Delete) -> Item | None:
        item = applied(write, self._stored(db, *write.key))
        if item is None:
            db.execute("DELETE FROM items WHERE pk = ? AND sk = ?", write.key)
        else:
            self._put(db, [item])
        return item

    def _write(self, write: Put | Update | Delete) -> Item | None:
        # Read and write under the database's write lock: atomic across the runner's
        # processes, as DynamoDB's conditional writes are.
        try:
            with self._transaction() as db:
                stored = self._stored(db, *write.key)
                if write.when is not None and not write.when.holds(stored):
                    raise ConditionFailed(stored)
                item = self._apply(db, write)
        except _Locked as exc:
            if isinstance(write.when, SlotFree):
                # A turn's put is its commit: the same answer as a transaction's.
                raise ConversationBusy("another request on this store held it too long") from exc
            raise InternalError(f"the SQLite database stayed locked: {exc}") from exc
        self.meter.write(0)
        return item if isinstance(write, Update) and write.returning else None

    def _transact(self, writes: Sequence[Write]) -> None:
        codec.check_item_sizes([w.item for w in writes if isinstance(w, Put)])
        try:
            with self._transaction() as db:
                for write in writes:
                    if write.when is not None and not write.when.holds(
                        self._stored(db, *write.key)
                    ):
                        raise ConversationBusy(BUSY)
                for write in writes:
                    if not isinstance(write, Check):
                        self._apply(db, write)
        except _Locked as exc:
            # Nothing was written: the same answer as a conflicting DynamoDB transaction.
            raise ConversationBusy("another request on this store held it too long") from exc
        self.meter.write(0)

    def _write_batch(self, writes: Sequence[Put | Delete]) -> None:
        with self._writing() as db:
            for write in writes:
                self._apply(db, write)
        self.meter.write(0)

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """A write transaction whose lock wait, if it times out, is an internal error."""
        try:
            with self._transaction() as db:
                yield db
        except _Locked as exc:
            raise InternalError(f"the SQLite database stayed locked: {exc}") from exc


class _Locked(Exception):
    """The write lock could not be taken within the busy timeout."""
