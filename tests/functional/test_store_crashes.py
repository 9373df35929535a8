"""Crash safety of the storage writes themselves: a process killed just before or just after
each write a plain turn or a clear sends (docs/STORAGE.md: a plain turn is one conditional
put; a clear fences ``HEAD`` and claims the next slot in one transaction, writes its
tombstone, then deletes).

Each case runs on a conversation of its own over one store: the operation is started in a
"process" that dies (:class:`SimulatedCrash`, which no ``except Exception`` catches) at
the chosen write, then a new process does what a client does next. Whatever the write:

* a turn is stored whole or not at all, and the next turn goes on from what is stored;
* a clear that died is finished by the client's retry: nothing of the conversation is
  left (no head, no data item, no object), a turn that read before the clear can never
  land, and a new conversation under the same id starts from turn 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Literal
from unittest import mock

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationBusy, ConversationNotFound
from turnledger.core.models import ConversationKey
from turnledger.providers.demo import DemoProvider
from turnledger.store.base import ConversationStore
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import (
    FakeClock,
    Turn,
    another_environment,
    blob_keys,
    build_turn,
    data_sort_keys,
)

ANN = Caller(tenant="tenant-crash", actor="ann")
#: Over the 64 KiB offload threshold: the turn's payload goes to the object store too.
BIG = "x" * 70_000

#: Every backend primitive that writes, and the named writes over them (store/backend.py):
#: a write is counted once, by the outermost name it went through.
WRITES = (
    "_write",
    "_transact",
    "_write_batch",
    "_put_turn",
    "_replace_head",
    "_delete_head",
    "_delete_items",
    "_put_items",
    "_fence_head",
)

Phase = Literal["before", "after"]


class SimulatedCrash(BaseException):
    """The process died here: nothing after this point of the request happens."""


@dataclass
class Writes:
    """The write primitives one operation called, in order; crashes at ``crash_at``."""

    crash_at: tuple[int, Phase] | None = None
    called: list[str] = field(default_factory=list)
    #: Primitives running now: one a backend builds on another (SQLite's put) is one write.
    depth: int = 0


@contextmanager
def counted(store: ConversationStore, writes: Writes) -> Iterator[None]:
    """Count (and maybe crash at) every write primitive ``store`` calls while inside."""

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def write(*args: Any, **kwargs: Any) -> Any:
            if writes.depth:
                return original(*args, **kwargs)
            index = len(writes.called)
            writes.called.append(name)
            if writes.crash_at == (index, "before"):
                raise SimulatedCrash(f"before write {index} ({name})")
            writes.depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                writes.depth -= 1
            if writes.crash_at == (index, "after"):
                raise SimulatedCrash(f"after write {index} ({name})")
            return result

        return write

    with ExitStack() as stack:
        for name in WRITES:
            original = getattr(store, name)
            stack.enter_context(mock.patch.object(store, name, wrap(name, original)))
        yield


def process(store: ConversationStore, clock: FakeClock) -> Conversations:
    """A new process over the same storage (its own service, so nothing it remembers)."""
    return Conversations(store=store, provider=DemoProvider(), settings=Settings(), clock=clock.now)


def turns_of(svc: Conversations, conversation: str) -> list[str]:
    """The user messages stored, in order."""
    page = edge.events(svc, ANN, conversation, after=0, limit=1000)
    return [e.payload["content"] for e in page.events if e.kind == "user_message"]


def crash_points(run: Callable[[Writes], None]) -> tuple[list[str], list[tuple[int, Phase]]]:
    """The writes ``run`` sends (run once without a crash to count them), and every
    (write, phase) it can die at."""
    writes = Writes()
    run(writes)
    phases: tuple[Phase, Phase] = ("before", "after")
    return writes.called, [(i, phase) for i in range(len(writes.called)) for phase in phases]


def test_a_plain_turn_dies_at_its_write_and_is_stored_whole_or_not_at_all(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A plain turn is one conditional put: a death before it stores nothing, after it the
    whole turn (message, answer, head state); the next turn continues either way."""
    conversations = iter(range(1000))

    def setup() -> str:
        conversation = f"plain-{next(conversations)}"
        svc = process(store, clock)
        for text in ("one", BIG):
            edge.turn(svc, ANN, conversation, TurnRequest(input=text))
        return conversation

    def third_turn(writes: Writes, conversation: str) -> None:
        svc = process(store, clock)
        with counted(store, writes):
            edge.turn(svc, ANN, conversation, TurnRequest(input="three"))

    called, points = crash_points(lambda writes: third_turn(writes, setup()))
    assert called == ["_put_turn"]  # the whole turn: one conditional put
    for point in points:
        conversation = setup()
        writes = Writes(crash_at=point)
        with pytest.raises(SimulatedCrash):
            third_turn(writes, conversation)
        survivor = process(store, clock)
        stored = turns_of(survivor, conversation)
        landed = point[1] == "after"
        assert stored == ["one", BIG, *(["three"] if landed else [])], point
        view = edge.get(survivor, ANN, conversation)
        assert (view.status, view.turns) == ("complete", len(stored)), point
        edge.turn(survivor, ANN, conversation, TurnRequest(input="four"))
        assert turns_of(survivor, conversation) == [*stored, "four"], point


def test_a_clear_that_dies_at_any_write_is_finished_by_its_retry(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A clear killed before or after each of its writes (the fence and claim, the
    tombstone, the deletes, the gravestones, the head's delete): a turn meanwhile never
    lands, the client's retry of the clear leaves nothing of the conversation, a turn
    that read before the clear is refused, and the id then starts a new conversation."""
    conversations = iter(range(1000))

    def setup() -> tuple[str, tuple[ConversationStore, Turn]]:
        conversation = f"clear-{next(conversations)}"
        svc = process(store, clock)
        edge.turn(svc, ANN, conversation, TurnRequest(input="one"))
        edge.turn(svc, ANN, conversation, TurnRequest(input=BIG))
        key = ConversationKey(tenant=ANN.tenant, conversation_id=conversation)
        # A turn that read now, in another execution environment, and commits after the
        # clear (a slow model call).
        slow = another_environment(store)
        read = slow.get_head(key)
        assert read is not None
        # Its head keeps what HEAD holds: a plain turn, one conditional put.
        slow_state = {
            "ttl_seconds": read.ttl_seconds,
            "expires_at": read.expires_at,
            "expiry_bucket": read.expiry_bucket,
        }
        late = build_turn(key, read, ["late", BIG], now=clock.now(), **slow_state)
        edge.turn(svc, ANN, conversation, TurnRequest(input="three"))
        return conversation, (slow, late)

    def clear(writes: Writes, conversation: str) -> None:
        with counted(store, writes):
            edge.clear(process(store, clock), ANN, conversation)

    called, points = crash_points(lambda writes: clear(writes, setup()[0]))
    # The fence and the claim first, in one write; then the tombstone, deletes and the rest.
    assert called[:2] == ["_transact", "_replace_head"], called
    for point in points:
        conversation, (slow, late) = setup()
        key = ConversationKey(tenant=ANN.tenant, conversation_id=conversation)
        with pytest.raises(SimulatedCrash):
            clear(Writes(crash_at=point), conversation)
        survivor = process(store, clock)
        # Whatever a turn does now, nothing half-cleared is continued or half-deleted.
        with suppress(ConversationBusy):  # the clear's fence stands: turns wait for its retry
            edge.turn(survivor, ANN, conversation, TurnRequest(input="meanwhile"))
        edge.clear(survivor, ANN, conversation)
        with pytest.raises(ConversationNotFound):
            edge.get(survivor, ANN, conversation)
        assert data_sort_keys(store, key) == [], point
        assert blob_keys(store, key) == [], point
        with pytest.raises(ConversationBusy):
            slow.commit(
                key, expected_version=late.expected_version, head=late.head, events=late.events
            )
        assert data_sort_keys(store, key) == [], point
        edge.turn(survivor, ANN, conversation, TurnRequest(input="again"))
        assert turns_of(survivor, conversation) == ["again"], point
