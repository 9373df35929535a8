"""The approval inbox's store contract (``by-inbox``), on every backend.

Entries are written and deleted by the commits that request and decide calls,
listed per tenant oldest first, paged, filtered, and removed with their
conversation by clear. Runs over the ``store`` fixture's backends (memory, moto,
DynamoDB Local, SQLite); each test's docstring states the invariant it protects.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from turnledger.core.models import ConversationKey, ConversationStatus, Head, PendingCall
from turnledger.store import inbox, keys
from turnledger.store.base import ConversationStore
from turnledger.turn import lifecycle

from tests.support.factories import START, build_turn, make_key

LATER = START + timedelta(minutes=5)
DEADLINE = START + timedelta(hours=1)


def waiting(
    call_id: str, *, tool: str = "send_email", minute: int = 0, **extra: object
) -> PendingCall:
    """A call of ``tool`` awaiting approval, requested ``minute`` minutes after START."""
    fields: dict[str, object] = {
        "id": call_id,
        "name": tool,
        "arguments": {"to": f"{call_id}@example.com", "html": "<script>x</script>"},
        "requires": "approval",
        "state": "awaiting_approval",
        "idempotency_key": f"key-{call_id}",
        "arguments_sha256": "0" * 64,
        "expires_at": DEADLINE,
        "requested_at": START + timedelta(minutes=minute),
        "requested_by": "ann",
    }
    fields.update(extra)
    return PendingCall.model_validate(fields)


def ask(
    store: ConversationStore, key: ConversationKey, previous: Head | None, calls: list[PendingCall]
) -> Head:
    """Commit a turn whose head has ``calls`` pending (replacing ``previous``)."""
    turn = build_turn(
        key,
        previous,
        ["q"],
        pending=calls,
        status=ConversationStatus.AWAITING_APPROVAL if calls else ConversationStatus.COMPLETE,
    )
    # What the turn layer hands the store: the inbox entries to write and delete, and the
    # deadline of the earliest wait no new entry files (the store knows no turn rules).
    changes = lifecycle.inbox_changes(key, previous, turn.head)
    head = turn.head.model_copy(
        update={"wait_deadline": lifecycle.head_wait_deadline(calls, changes)}
    )
    store.commit(
        key,
        expected_version=turn.expected_version,
        head=head,
        events=turn.events,
        inbox_changes=changes,
    )
    return head


def listed(store: ConversationStore, tenant: str, **options: object) -> list[tuple[str, str]]:
    """Every (conversation, call) of ``tenant``'s inbox, page by page of 2."""
    found: list[tuple[str, str]] = []
    after = None
    while True:
        page = store.inbox_page(tenant, now=LATER, limit=2, after=after, **options)  # type: ignore[arg-type]
        assert len(page.entries) <= 2
        found.extend((e.conversation_id, e.call_id) for e in page.entries)
        if page.next is None:
            return found
        after = page.next


def test_requests_are_listed_per_tenant_oldest_first(store: ConversationStore) -> None:
    """Across 3 tenants and several conversations, each tenant lists exactly its own
    waiting calls, oldest request first, through pages; the entry carries what a person
    needs to decide (tool, arguments as given, who asked, when, until when)."""
    expected: dict[str, list[tuple[int, str, str]]] = {}
    for t, tenant in enumerate(["acme", "globex", "initech"]):
        for c in range(3):
            key = make_key(tenant, f"conv-{c}")
            calls = [waiting(f"call_{c}_{n}", minute=(c * 7 + n * 3 + t) % 20) for n in range(2)]
            ask(store, key, None, calls)
            expected.setdefault(tenant, []).extend(
                ((c * 7 + n * 3 + t) % 20, key.conversation_id, f"call_{c}_{n}") for n in range(2)
            )
    for tenant, rows in expected.items():
        assert listed(store, tenant) == [(conv, call) for _, conv, call in sorted(rows)]
    entry = store.inbox_page("acme", now=LATER, limit=1).entries[0]
    assert entry.kind == "approval"
    assert entry.tool == "send_email"
    assert entry.arguments["html"] == "<script>x</script>"
    assert entry.requested_by == "ann"
    assert entry.expires_at == DEADLINE
    assert store.inbox_page("nobody", now=LATER, limit=10).entries == []


def test_decided_calls_leave_the_inbox_in_their_commit(store: ConversationStore) -> None:
    """A commit that decides a call deletes its entry; one still waiting keeps it, and a
    call that starts waiting in a later commit gets one."""
    key = make_key("acme", "conv-1")
    head = ask(store, key, None, [waiting("call_1"), waiting("call_2", minute=1)])
    assert listed(store, "acme") == [("conv-1", "call_1"), ("conv-1", "call_2")]
    decided = waiting("call_1").model_copy(update={"state": "ready"})
    head = ask(store, key, head, [decided, waiting("call_2", minute=1)])
    assert listed(store, "acme") == [("conv-1", "call_2")]
    head = ask(store, key, head, [waiting("call_3", minute=2)])
    assert listed(store, "acme") == [("conv-1", "call_3")]
    ask(store, key, head, [])
    assert listed(store, "acme") == []


def test_filters_and_expired_calls(store: ConversationStore) -> None:
    """``tool`` and ``conversation_id`` narrow the listing (paging past what they skip);
    a call whose window closed is not listed."""
    ask(store, make_key("acme", "a"), None, [waiting("c1", tool="pay"), waiting("c2", minute=1)])
    ask(store, make_key("acme", "b"), None, [waiting("c3", tool="pay", minute=2)])
    ask(
        store,
        make_key("acme", "c"),
        None,
        [waiting("c4", tool="pay", minute=3, expires_at=START + timedelta(minutes=4))],
    )
    assert listed(store, "acme", tool="pay") == [("a", "c1"), ("b", "c3")]
    assert listed(store, "acme", conversation_id="a") == [("a", "c1"), ("a", "c2")]
    assert listed(store, "acme", tool="pay", conversation_id="b") == [("b", "c3")]


def test_clear_removes_the_entries(store: ConversationStore) -> None:
    """Entries live in the conversation's partition: a clear removes them, and a new life
    of the same id starts with an empty inbox."""
    key = make_key("acme", "conv-1")
    ask(store, key, None, [waiting("call_1")])
    ask(store, make_key("acme", "other"), None, [waiting("call_9")])
    store.clear(key, LATER)
    assert listed(store, "acme") == [("other", "call_9")]


def test_input_calls_are_listed_as_input(store: ConversationStore) -> None:
    """A human-input call is in the inbox with kind ``input``; an ``outcome_unknown`` call
    (a decision, whatever its requirement) with kind ``approval``."""
    ask(
        store,
        make_key("acme", "conv-1"),
        None,
        [
            waiting("ask_1", requires="input", state="awaiting_input"),
            waiting("crash_1", requires="none", state="outcome_unknown", minute=1),
        ],
    )
    kinds = [(e.call_id, e.kind) for e in store.inbox_page("acme", now=LATER, limit=5).entries]
    assert kinds == [("ask_1", "input"), ("crash_1", "approval")]


@pytest.mark.parametrize("cursor", ["", "!!", "WyJ4Il0", "WyJhI2IjYyIsICJIRUFEIl0"])
def test_foreign_cursors_are_refused(cursor: str) -> None:
    """A cursor that is not one the API handed out is refused, never trusted."""
    with pytest.raises(inbox.InvalidInboxCursor):
        inbox.decode_cursor("acme", cursor)


def test_cursors_round_trip_within_the_tenant() -> None:
    """A cursor names a position of the caller's own tenant only."""
    key = make_key("acme", "conv-1")
    head = build_turn(key, None, [], pending=[waiting("call_1")]).head
    (entry,) = lifecycle.inbox_changes(key, None, head).puts
    item = inbox.entry_item(key, head.gen, entry)
    position = inbox.entry_key(item)
    cursor = inbox.encode_cursor("acme", position)
    assert inbox.decode_cursor("acme", cursor) == position
    with pytest.raises(inbox.InvalidInboxCursor):
        inbox.decode_cursor("globex", cursor)


def test_waits_with_a_closing_window_are_on_by_wait(store: ConversationStore) -> None:
    """A conversation with decisions whose windows close is listed under the hour of each
    window (each entry files its own), once per hour; it leaves the index when nothing
    waits any more; conversations without such a call are never listed."""
    early = make_key("acme", "early")
    head = ask(
        store,
        early,
        None,
        [
            waiting("c1", expires_at=DEADLINE + timedelta(hours=3)),
            waiting("c2", expires_at=DEADLINE),
        ],
    )
    ask(store, make_key("acme", "none"), None, [])
    ask(
        store,
        make_key("globex", "input"),
        None,
        [waiting("i1", requires="input", state="awaiting_client", expires_at=None)],
    )
    bucket = keys.bucket_of(int(DEADLINE.timestamp()))

    def listed_in(hour: int) -> set[ConversationKey]:
        return {k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(hour, shard)}

    assert listed_in(bucket) == {early}
    assert listed_in(bucket + 3) == {early}
    assert [k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(bucket, shard)] == [
        early
    ]
    ask(store, early, head, [])
    assert listed_in(bucket) == set()
    assert listed_in(bucket + 3) == set()


def test_an_entry_files_its_wait_so_head_is_left_alone(store: ConversationStore) -> None:
    """The commit that starts a person's wait files it on ``by-wait`` through the wait's
    inbox entry: ``HEAD`` carries no ``wb`` and is not rewritten (it is the first commit's
    ``HEAD``, byte for byte); the decision's commit removes the filing with the entry."""
    key = make_key("acme", "filed")
    head = ask(store, key, None, [])
    stored = store.head_item(key)
    head = ask(store, key, head, [waiting("call_1")])
    assert store.head_item(key) == stored
    bucket = keys.bucket_of(int(DEADLINE.timestamp()))

    def listed_in(hour: int) -> list[ConversationKey]:
        return [k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(hour, shard)]

    assert listed_in(bucket) == [key]
    assert listed(store, "acme") == [("filed", "call_1")]
    ask(store, key, head, [waiting("call_1").model_copy(update={"state": "ready"})])
    assert listed_in(bucket) == []
    assert listed(store, "acme") == []
    assert store.head_item(key) == stored


def test_entries_of_an_older_build_list_and_go(
    store: ConversationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries written before entries filed their own waits (no ``wb``; their ``HEAD`` was
    filed) still list, keep their conversation on ``by-wait`` through ``HEAD`` while they
    wait (a partial decision keeps it there), and are removed when decided: no migration."""
    written_before = inbox.entry_item

    def older_build(key: ConversationKey, gen: str, entry: inbox.InboxEntry) -> dict[str, object]:
        item = written_before(key, gen, entry)
        item.pop("wb", None)
        return item

    key = make_key("acme", "older")
    calls = [waiting("call_1"), waiting("call_2", minute=1)]
    with monkeypatch.context() as patch:
        patch.setattr(inbox, "entry_item", older_build)
        turn = build_turn(
            key,
            None,
            ["q"],
            pending=calls,
            status=ConversationStatus.AWAITING_APPROVAL,
            wait_deadline=lifecycle.wait_deadline(calls),  # the older build's rule
        )
        store.commit(
            key,
            expected_version=None,
            head=turn.head,
            events=turn.events,
            inbox_changes=lifecycle.inbox_changes(key, None, turn.head),
        )
    bucket = keys.bucket_of(int(DEADLINE.timestamp()))

    def listed_in(hour: int) -> list[ConversationKey]:
        return [k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(hour, shard)]

    assert listed(store, "acme") == [("older", "call_1"), ("older", "call_2")]
    assert listed_in(bucket) == [key]
    head = ask(store, key, turn.head, [waiting("call_1", state="ready"), calls[1]])
    assert listed(store, "acme") == [("older", "call_2")]
    assert listed_in(bucket) == [key]
    ask(store, key, head, [])
    assert listed(store, "acme") == []
    assert listed_in(bucket) == []


def test_a_very_long_call_id_still_gets_an_entry(store: ConversationStore) -> None:
    """An index sort key holds at most 1,024 bytes: a call id too long for it is keyed by
    its hash, and the entry still lists (and leaves) with the call's own id."""
    key = make_key("acme", "conv-1")
    long_id = "call_" + "x" * 900
    head = ask(store, key, None, [waiting(long_id), waiting("call_2", minute=1)])
    listed_ids = [e.call_id for e in store.inbox_page("acme", now=LATER, limit=5).entries]
    assert listed_ids == [long_id, "call_2"]
    ask(store, key, head, [waiting("call_2")])
    assert [e.call_id for e in store.inbox_page("acme", now=LATER, limit=5).entries] == ["call_2"]


def test_a_page_reads_a_bounded_number_of_index_queries(store: ConversationStore) -> None:
    """Entries a listing skips (expired here) cost at most ``inbox_rounds`` queries per
    page: a page may then come back short, or empty, with a cursor that goes on."""
    closed = START + timedelta(minutes=4)
    calls = [waiting(f"old_{n}", minute=n, expires_at=closed) for n in range(3)]
    calls += [waiting(f"new_{n}", minute=10 + n) for n in range(2)]
    ask(store, make_key("acme", "conv-1"), None, calls)
    store.inbox_rounds = 1
    first = store.inbox_page("acme", now=LATER, limit=2)
    assert first.entries == [] and first.next is not None
    assert listed(store, "acme") == [("conv-1", "new_0"), ("conv-1", "new_1")]


def test_the_store_files_the_wait_deadline_it_is_given(store: ConversationStore) -> None:
    """The store applies no turn rule to ``by-wait``: a head is filed under the hour of the
    ``wait_deadline`` the turn layer computed, whatever its pending calls say (none here),
    and leaves the index when a later head carries none."""
    key = make_key("acme", "given")
    turn = build_turn(key, None, ["q"], wait_deadline=DEADLINE)
    store.commit(key, expected_version=None, head=turn.head, events=turn.events)
    bucket = keys.bucket_of(int(DEADLINE.timestamp()))

    def listed_in(hour: int) -> set[ConversationKey]:
        return {k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(hour, shard)}

    assert listed_in(bucket) == {key}
    later = build_turn(key, turn.head, ["again"])
    store.commit(key, expected_version=later.expected_version, head=later.head, events=later.events)
    assert listed_in(bucket) == set()


def test_the_store_writes_the_inbox_entries_it_is_given(store: ConversationStore) -> None:
    """The store decides nothing about who waits: it writes exactly the entries a commit
    hands it (here with no pending call at all) and deletes the call ids it names."""
    key = make_key("acme", "given")
    entry = inbox.InboxEntry(
        kind="input",
        conversation_id=key.conversation_id,
        call_id="call_x",
        tool="ask_human",
        arguments={"question": "ok?"},
        requested_by=None,
        requested_at=START,
        expires_at=None,
        reason="because",
    )
    turn = build_turn(key, None, ["q"])
    store.commit(
        key,
        expected_version=None,
        head=turn.head,
        events=turn.events,
        inbox_changes=inbox.InboxChanges(puts=[entry]),
    )
    assert store.inbox_page("acme", now=LATER, limit=5).entries == [entry]
    later = build_turn(key, turn.head, ["again"])
    store.commit(
        key,
        expected_version=later.expected_version,
        head=later.head,
        events=later.events,
        inbox_changes=inbox.InboxChanges(deletes=["call_x"]),
    )
    assert store.inbox_page("acme", now=LATER, limit=5).entries == []
