"""The idempotency records' store contract, on every backend.

``get_record``, ``put_record``, ``update_record`` and ``delete_record`` are what
Powertools' persistence layer needs (:mod:`turnledger.api.idempotency_records`):
a put that refuses while a live record holds the key (and says which), expiry of
a record and of an in-progress run, an update that keeps the in-progress expiry,
and records that go with their conversation. Runs over the ``store`` fixture's
backends (memory, moto, DynamoDB Local, SQLite); each test's docstring states the
invariant it protects.
"""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import InternalError
from turnledger.store.base import ContextBudget, ConversationStore
from turnledger.store.records import IN_PROGRESS, Record

from tests.support.concurrency import all_at_once
from tests.support.factories import START, build_turn, make_key

NOW = 1_800_000_000.0
KEY = make_key("acme", "conv-1")
RECORD_KEY = "I#0123456789abcdef"


def running(*, expires_at: float = NOW + 3600, run_ends_at: float | None = NOW + 30) -> Record:
    """A record of a request still running (Powertools' ``INPROGRESS``)."""
    return Record(
        key=RECORD_KEY,
        status=IN_PROGRESS,
        expires_at=int(expires_at),
        in_progress_expires_at=None if run_ends_at is None else int(run_ends_at * 1000),
        validation="hash-of-body",
    )


def test_a_record_round_trips(store: ConversationStore) -> None:
    """What a put writes, a get reads back, every field; an absent record is ``None``."""
    assert store.get_record(KEY, RECORD_KEY) is None
    record = Record(
        key=RECORD_KEY,
        status="COMPLETED",
        expires_at=int(NOW) + 60,
        in_progress_expires_at=int(NOW * 1000) + 5,
        data='{"answer": "é", "n": 1}',
        validation="abc",
    )
    assert store.put_record(KEY, record, now=NOW) is None
    assert store.get_record(KEY, RECORD_KEY) == record
    bare = Record(key="I#bare", status=IN_PROGRESS, expires_at=int(NOW) + 60)
    assert store.put_record(KEY, bare, now=NOW) is None
    assert store.get_record(KEY, "I#bare") == bare


def test_a_live_record_refuses_a_put_and_says_which(store: ConversationStore) -> None:
    """A put over a live record (not expired, its run not timed out) writes nothing and
    returns the stored record, whatever the new one holds."""
    first = running()
    assert store.put_record(KEY, first, now=NOW) is None
    second = running(expires_at=NOW + 7200)
    assert store.put_record(KEY, second, now=NOW + 10) == first
    done = Record(key=RECORD_KEY, status="COMPLETED", expires_at=int(NOW) + 3600, data="x")
    store.update_record(KEY, done)
    # A completed record is live until it expires, even after its run's in-progress expiry.
    assert store.put_record(KEY, second, now=NOW + 60) == store.get_record(KEY, RECORD_KEY)
    assert store.get_record(KEY, RECORD_KEY) != second


def test_an_expired_record_is_replaced(store: ConversationStore) -> None:
    """Once ``now`` is past a record's expiry, a put replaces it (Powertools' TTL may not
    have removed it yet); at its expiry second it still counts."""
    store.put_record(KEY, running(expires_at=NOW, run_ends_at=None), now=NOW - 10)
    assert store.put_record(KEY, running(expires_at=NOW + 60), now=NOW) is not None
    fresh = running(expires_at=NOW + 3600)
    assert store.put_record(KEY, fresh, now=NOW + 1) is None
    assert store.get_record(KEY, RECORD_KEY) == fresh


def test_a_run_that_timed_out_is_taken_over(store: ConversationStore) -> None:
    """An in-progress record whose in-progress expiry (the Lambda's deadline, in
    milliseconds) has passed is replaced; one without an in-progress expiry is not."""
    store.put_record(KEY, running(run_ends_at=NOW + 30), now=NOW)
    assert store.put_record(KEY, running(), now=NOW + 29) is not None
    retry = running(expires_at=NOW + 7200, run_ends_at=NOW + 90)
    assert store.put_record(KEY, retry, now=NOW + 31) is None
    assert store.get_record(KEY, RECORD_KEY) == retry
    other = Record(key="I#other", status=IN_PROGRESS, expires_at=int(NOW) + 3600)
    store.put_record(KEY, other, now=NOW)
    takeover = Record(key="I#other", status=IN_PROGRESS, expires_at=int(NOW) + 7200)
    assert store.put_record(KEY, takeover, now=NOW + 3000) == other


def test_an_update_sets_the_outcome_and_keeps_the_run_deadline(store: ConversationStore) -> None:
    """An update sets status, expiry, answer and validation hash and leaves the stored
    in-progress expiry; on an absent record it creates one; without a validation hash it
    keeps the stored one."""
    store.put_record(KEY, running(), now=NOW)
    done = Record(key=RECORD_KEY, status="COMPLETED", expires_at=int(NOW) + 99, data='{"a":1}')
    store.update_record(KEY, done)
    assert store.get_record(KEY, RECORD_KEY) == Record(
        key=RECORD_KEY,
        status="COMPLETED",
        expires_at=int(NOW) + 99,
        in_progress_expires_at=int((NOW + 30) * 1000),
        data='{"a":1}',
        validation="hash-of-body",
    )
    created = Record(
        key="I#new", status="COMPLETED", expires_at=int(NOW) + 5, data="d", validation="v"
    )
    store.update_record(KEY, created)
    assert store.get_record(KEY, "I#new") == created


def test_delete_and_isolation(store: ConversationStore) -> None:
    """A delete removes only that record (absent is fine); records of another conversation
    or tenant under the same record key are other records."""
    elsewhere = [make_key("acme", "conv-2"), make_key("globex", "conv-1")]
    for key in [KEY, *elsewhere]:
        assert store.put_record(key, running(), now=NOW) is None
    store.delete_record(KEY, RECORD_KEY)
    store.delete_record(KEY, RECORD_KEY)
    assert store.get_record(KEY, RECORD_KEY) is None
    assert all(store.get_record(key, RECORD_KEY) == running() for key in elsewhere)
    assert store.put_record(KEY, running(), now=NOW) is None


def test_exactly_one_of_racing_puts_wins(store: ConversationStore) -> None:
    """Puts racing for one key (threads, released together): exactly one is written, and
    every other one is refused with the winner's record (never a half-written one)."""
    contenders = [
        Record(key=RECORD_KEY, status=IN_PROGRESS, expires_at=int(NOW) + 60 + n) for n in range(6)
    ]
    answers = all_at_once(
        len(contenders), lambda index: store.put_record(KEY, contenders[index], now=NOW)
    )
    winners = [c for c, answer in zip(contenders, answers, strict=True) if answer is None]
    assert len(winners) == 1
    assert store.get_record(KEY, RECORD_KEY) == winners[0]
    assert all(answer == winners[0] for answer in answers if answer is not None)


def test_records_go_with_their_conversation(store: ConversationStore) -> None:
    """A clear removes the conversation's records (its partition), so the same request
    key runs anew; the records never show in the conversation's reads."""
    turn = build_turn(KEY, None, ["q"])
    store.commit(KEY, expected_version=None, head=turn.head, events=turn.events)
    store.put_record(KEY, running(), now=NOW)
    snapshot = store.load(KEY, ContextBudget())
    assert snapshot.head == turn.head and len(snapshot.events) == len(turn.events)
    store.clear(KEY, START)
    assert store.get_record(KEY, RECORD_KEY) is None
    assert store.put_record(KEY, running(), now=NOW) is None


@pytest.mark.parametrize("record_key", ["HEAD", "E#000000000001", "W#abc", ""])
def test_only_record_keys_are_touched(store: ConversationStore, record_key: str) -> None:
    """The record primitives refuse any sort key outside ``I#``: they can never
    overwrite or delete a head, an event or an inbox entry."""
    record = Record(key=record_key, status=IN_PROGRESS, expires_at=int(NOW) + 60)
    with pytest.raises(InternalError):
        store.put_record(KEY, record, now=NOW)
    with pytest.raises(InternalError):
        store.update_record(KEY, record)
    with pytest.raises(InternalError):
        store.delete_record(KEY, record_key)
    with pytest.raises(InternalError):
        store.get_record(KEY, record_key)
