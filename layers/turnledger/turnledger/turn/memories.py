"""Control of a user's long-term memory (``/v1/memories``): list, add, edit, delete, erase.

The user is always the request's (the caller's ``sub``, or the user a trusted caller
named: :func:`turnledger.api.resolver.memory_user`); records of other users and tenants
are never found. Write-back and recall are the turn pipeline's
(:mod:`turnledger.turn.pipeline`, :mod:`turnledger.context.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.exceptions import MemoryFull, MemoryNotFound
from ..store.base import ConversationStore
from ..store.memories import MemoryBook, MemoryRecord, new_memory_id
from .session import Clock


@dataclass(frozen=True)
class MemoryPage:
    """A page of records, oldest first, and the cursor of the next (``None``: last page)."""

    items: list[MemoryRecord]
    next_cursor: str | None


class MemoryControl:
    """One tenant's users' records, as the API changes them."""

    def __init__(self, store: ConversationStore, clock: Clock, cap: int) -> None:
        self.store = store
        self.clock = clock
        self.cap = max(cap, 1)

    def _book(self, tenant: str, user: str) -> MemoryBook:
        return MemoryBook(self.store, tenant, user)

    def page(self, tenant: str, user: str, *, after: str | None, limit: int) -> MemoryPage:
        """The user's records with ids after ``after``, oldest first, at most ``limit``."""
        records = [r for r in self._book(tenant, user).records() if after is None or r.id > after]
        items = records[:limit]
        more = len(records) > limit
        return MemoryPage(items=items, next_cursor=items[-1].id if more and items else None)

    def add(self, tenant: str, user: str, text: str, key: str | None) -> tuple[MemoryRecord, bool]:
        """Add a record, or supersede the user's record of ``key``; returns it and whether
        it is new.

        Raises:
            MemoryFull: a new record would take the user past the cap.
        """
        book = self._book(tenant, user)
        records = book.records()
        now = self.clock()
        same = [r for r in records if key is not None and r.key == key]
        if same:
            newest = max(same, key=lambda r: r.updated_at)
            record = newest.model_copy(
                update={
                    "text": text,
                    "source": "manual",
                    "updated_at": now,
                    "conversation_id": None,
                    "from_sequence": None,
                    "to_sequence": None,
                    "embedding": None,
                }
            )
            book.put(record)
            book.delete([r.id for r in same if r.id != record.id])
            return record, False
        if len(records) >= self.cap:
            raise MemoryFull(
                f"the user keeps at most {self.cap} memory records; delete some first",
                details={"limit": self.cap},
            )
        record = MemoryRecord(
            id=new_memory_id(), text=text, key=key, created_at=now, updated_at=now
        )
        book.put(record, first=not records)
        return record, True

    def edit(
        self, tenant: str, user: str, record_id: str, changes: dict[str, str | None]
    ) -> MemoryRecord:
        """Change the text and/or key of the record ``record_id`` (a ``None`` key: none).

        Raises:
            MemoryNotFound: the user has no such record.
        """
        book = self._book(tenant, user)
        record = book.get(record_id)
        if record is None:
            raise MemoryNotFound("no memory record with this id", details={"id": record_id})
        update: dict[str, object] = {"source": "manual", "updated_at": self.clock()}
        if changes.get("text") is not None:
            update["text"] = changes["text"]
            update["embedding"] = None
        if "key" in changes:
            update["key"] = changes["key"]
        edited = record.model_copy(update=update)
        book.put(edited)
        return edited

    def delete(self, tenant: str, user: str, record_id: str) -> None:
        """Delete the record ``record_id``.

        Raises:
            MemoryNotFound: the user has no such record.
        """
        book = self._book(tenant, user)
        if book.get(record_id) is None:
            raise MemoryNotFound("no memory record with this id", details={"id": record_id})
        book.delete([record_id])

    def delete_all(self, tenant: str, user: str, conversation_id: str | None = None) -> int:
        """Delete every record of the user (only those extracted from ``conversation_id``,
        when given); returns how many."""
        book = self._book(tenant, user)
        if conversation_id is None:
            return book.clear()
        doomed = [r.id for r in book.records() if r.conversation_id == conversation_id]
        book.delete(doomed)
        return len(doomed)
