"""The storage contract: every backend of :class:`ConversationStore` behaves the same.

Runs over the ``store`` fixture's three backends (memory, moto, DynamoDB Local).
Each test's docstring states the invariant it protects. Races are staged
either with real threads or, where the interleaving must be exact, with
:func:`interleave`, which runs a concurrent writer at a chosen point of a
store operation.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from datetime import timedelta
from unittest import mock

import pytest
from turnledger.core.exceptions import (
    ConversationBusy,
    CorruptedState,
    InternalError,
    PayloadTooLarge,
    UnsupportedStateVersion,
)
from turnledger.core.models import (
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    ConversationKey,
    ConversationStatus,
    Event,
    Head,
    SummaryRef,
)
from turnledger.store import codec, keys, slots
from turnledger.store import purge as purge_protocol
from turnledger.store.backend import ConditionFailed, Unchanged, Update
from turnledger.store.base import (
    DEFAULT_OFFLOAD_THRESHOLD,
    MAX_EVENTS_PER_COMMIT,
    ContextBudget,
    ConversationStore,
    PurgeReport,
    Snapshot,
)
from turnledger.store.codec import Item

from tests.support.concurrency import all_at_once
from tests.support.factories import (
    REMOVE,
    START,
    FakeClock,
    Turn,
    another_environment,
    blob_keys,
    build_turn,
    commit_turn,
    corrupt,
    corrupt_event_body,
    data_sort_keys,
    delete_raw_item,
    holding,
    incompressible,
    interleave,
    make_head,
    make_key,
    opened_item,
    put_raw_item,
    raw_item,
    raw_sort_keys,
    small_pages,
    stored_body,
    stored_ref,
)

#: A message whose payload is offloaded (over the default 64 KiB threshold).
BIG = "b" * (DEFAULT_OFFLOAD_THRESHOLD + 1000)
EVERYTHING = ContextBudget(max_events=10_000, max_chars=100_000_000)
KEY = make_key()


def events_of(*turns: Turn) -> list[Event]:
    """Every event the turns committed, in order."""
    return [event for turn in turns for event in turn.events]


def all_events(store: ConversationStore, key: ConversationKey = KEY) -> list[Event]:
    """The whole transcript of the current life, through ``read_events``."""
    head = store.get_head(key)
    assert head is not None
    return store.read_events(key, head, after=0, limit=100_000)


def refs_of(store: ConversationStore, turn: Turn, key: ConversationKey = KEY) -> list[str]:
    """The object keys the turn's offloaded events point at."""
    found = []
    for event in turn.events:
        ref = stored_ref(store, key, turn.head.base + event.sequence)
        if ref is not None:
            found.append(ref.key)
    return found


def assert_absent(store: ConversationStore, key: ConversationKey = KEY) -> None:
    """Nothing of the conversation is left: no head, no event item, no object."""
    assert store.get_head(key) is None
    assert store.load(key, EVERYTHING) == Snapshot(head=None, events=[], from_start=True)
    assert data_sort_keys(store, key) == []
    assert blob_keys(store, key) == []


# --- commit -------------------------------------------------------------------------------


def test_first_commit_creates_the_conversation(store: ConversationStore) -> None:
    """A commit expecting no head stores the head and its events exactly, in the documented
    physical layout (one partition, ``E#<seq:012>`` events under a ``HEAD`` item)."""
    turn = commit_turn(store, KEY, None, ["hello", "hi there"])

    assert store.get_head(KEY) == turn.head
    assert store.load(KEY, EVERYTHING) == Snapshot(
        head=turn.head, events=turn.events, from_start=True
    )
    # One turn item holds the commit's two events (docs/STORAGE.md).
    assert raw_sort_keys(store, KEY) == ["E#000000000001", "HEAD"]
    head_item = raw_item(store, KEY, keys.HEAD_SK)
    assert head_item is not None
    assert head_item[codec.A_PK] == "T#tenant-a#C#conv-1"
    assert head_item[codec.A_SCHEMA] == SCHEMA_VERSION
    assert head_item[codec.A_VERSION] == 1
    assert head_item[codec.A_GEN] == turn.head.gen
    assert head_item[codec.A_TENANT] == "tenant-a"
    event_item = opened_item(store, KEY, "E#000000000001")
    assert event_item is not None
    assert event_item[codec.A_GEN] == turn.head.gen
    assert event_item[codec.A_COUNT] == 2
    assert [body["payload"] for body in json.loads(event_item[codec.A_BODY])] == [
        {"content": "hello"},
        {"content": "hi there"},
    ]


def test_later_turns_append_after_the_log(store: ConversationStore) -> None:
    """Each commit expects the version it read, writes the next one, and appends its events
    after the previous ones: the transcript is every turn's events, in order."""
    first = commit_turn(store, KEY, None, ["q1", "a1"])
    second = commit_turn(store, KEY, first.head, ["q2", "a2", "a3"])
    third = commit_turn(store, KEY, second.head, ["q3"])

    head = store.get_head(KEY)
    assert head == third.head
    assert head.version == 3
    snapshot = store.load(KEY, EVERYTHING)
    assert snapshot.events == events_of(first, second, third)
    assert [e.sequence for e in snapshot.events] == [1, 2, 3, 4, 5, 6]
    assert [e.turn for e in snapshot.events] == [1, 1, 2, 2, 2, 3]
    assert snapshot.from_start


def test_a_commit_without_events_replaces_the_head(store: ConversationStore) -> None:
    """A decision that changes only the head (no events) is still a versioned commit."""
    first = commit_turn(store, KEY, None, ["q1"])
    decided = first.head.model_copy(
        update={"version": 2, "status": ConversationStatus.AWAITING_APPROVAL}
    )

    store.commit(KEY, expected_version=1, head=decided, events=[])

    assert store.get_head(KEY) == decided
    assert all_events(store) == first.events
    with pytest.raises(ConversationBusy):
        store.commit(KEY, expected_version=1, head=decided, events=[])


@pytest.mark.parametrize("claims", ["new", "stale-version"])
def test_a_stale_commit_is_busy_and_stores_nothing(store: ConversationStore, claims: str) -> None:
    """A commit whose expected version is not the stored one raises ConversationBusy and
    leaves no trace: no event item, the head unchanged, no object of its own in S3."""
    first = commit_turn(store, KEY, None, ["q1", "a1"])
    second = commit_turn(store, KEY, first.head, ["q2", BIG])
    items_before, objects_before = raw_sort_keys(store, KEY), blob_keys(store, KEY)
    assert len(objects_before) == 1

    stale = build_turn(KEY, None if claims == "new" else first.head, ["late", BIG, "x"])
    with pytest.raises(ConversationBusy):
        store.commit(
            KEY, expected_version=stale.expected_version, head=stale.head, events=stale.events
        )

    assert store.get_head(KEY) == second.head
    assert raw_sort_keys(store, KEY) == items_before
    assert blob_keys(store, KEY) == objects_before
    assert store.load(KEY, EVERYTHING).events == events_of(first, second)


def test_a_commit_expecting_a_head_that_is_gone_is_busy(store: ConversationStore) -> None:
    """A turn that read a head which no longer exists (it was cleared) cannot recreate the
    conversation by committing on the version it read; nothing of it is stored."""
    stale = build_turn(KEY, make_head(version=3), ["late", BIG])

    with pytest.raises(ConversationBusy):
        store.commit(
            KEY, expected_version=stale.expected_version, head=stale.head, events=stale.events
        )

    assert_absent(store)


def test_a_commit_of_another_life_at_the_same_version_is_busy(store: ConversationStore) -> None:
    """The head condition covers the life too: a turn that read version N of an earlier life
    cannot land on a new life that has reached version N since."""
    old = commit_turn(store, KEY, None, ["old q1"])
    old_reader = old.head  # a slow turn read this, then the conversation was cleared
    store.clear(KEY, START)
    new = commit_turn(store, KEY, None, ["new q1"])
    assert new.head.version == old_reader.version

    late = build_turn(KEY, old_reader, ["late"])
    with pytest.raises(ConversationBusy):
        store.commit(
            KEY, expected_version=late.expected_version, head=late.head, events=late.events
        )

    assert store.get_head(KEY) == new.head
    assert all_events(store) == new.events


def test_a_commit_checks_its_own_shape(store: ConversationStore) -> None:
    """A commit over the transaction limit, or whose head does not cover its events, is a
    bug of the caller: InternalError, and nothing stored."""
    too_many = build_turn(KEY, None, ["m"] * (MAX_EVENTS_PER_COMMIT + 1))
    with pytest.raises(InternalError):
        store.commit(KEY, expected_version=None, head=too_many.head, events=too_many.events)
    short = build_turn(KEY, None, ["a", "b"], seq=1)
    with pytest.raises(InternalError):
        store.commit(KEY, expected_version=None, head=short.head, events=short.events)

    assert_absent(store)


def test_an_item_over_the_size_limit_is_payload_too_large(store: ConversationStore) -> None:
    """A head over DynamoDB's 400 KB item limit is refused as PayloadTooLarge (never an
    internal error), and nothing of the commit is stored, not even its objects."""
    first = commit_turn(store, KEY, None, ["q1"])
    huge = build_turn(
        KEY,
        first.head,
        ["q2", BIG],
        pending=[_pending_call(arguments={"blob": incompressible(700_000)})],
    )

    with pytest.raises(PayloadTooLarge):
        store.commit(
            KEY, expected_version=huge.expected_version, head=huge.head, events=huge.events
        )

    assert store.get_head(KEY) == first.head
    assert all_events(store) == first.events
    assert blob_keys(store, KEY) == []


def _pending_call(**overrides: object) -> dict[str, object]:
    call: dict[str, object] = {
        "id": "call-1",
        "name": "lookup",
        "arguments": {},
        "requires": "approval",
        "state": "awaiting_approval",
        "idempotency_key": "idem-1",
        "arguments_sha256": "0" * 64,
    }
    call.update(overrides)
    return call


def test_a_commit_is_one_write_and_a_load_one_read(store: ConversationStore) -> None:
    """A turn's state costs one round trip each way when it fits one page: the commit is a
    single transaction and load reads head and history in one query."""
    first = commit_turn(store, KEY, None, ["q1", "a1"])
    before = store.meter.snapshot()

    commit_turn(store, KEY, first.head, ["q2", "a2"])
    after_commit = store.meter.since(before)
    store.load(KEY, ContextBudget())
    after_load = store.meter.since(before)

    assert (after_commit.write_calls, after_commit.read_calls) == (1, 0)
    assert after_load.read_calls == 1


@pytest.mark.parametrize("identical", [False, True], ids=["different-payloads", "same-payload"])
def test_racing_commits_on_one_version_exactly_one_wins(
    store: ConversationStore, identical: bool
) -> None:
    """Of several commits that read the same version, exactly one lands whole; every other
    raises ConversationBusy and leaves nothing, and no loser removes the winner's objects
    (a retried request sends the very same payload, so their content hashes are equal)."""
    first = commit_turn(store, KEY, None, ["q1"])
    contenders = [
        build_turn(KEY, first.head, [f"q2 from {n}", BIG if identical else f"{BIG}{n}"])
        for n in range(6)
    ]

    def race(index: int) -> str:
        turn = contenders[index]
        try:
            store.commit(
                KEY, expected_version=turn.expected_version, head=turn.head, events=turn.events
            )
        except ConversationBusy:
            return "busy"
        return "won"

    outcomes = all_at_once(len(contenders), race)

    assert sorted(outcomes) == ["busy"] * (len(contenders) - 1) + ["won"]
    winner = contenders[outcomes.index("won")]
    assert store.get_head(KEY) == winner.head
    assert store.load(KEY, EVERYTHING).events == events_of(first, winner)
    assert blob_keys(store, KEY) == refs_of(store, winner)


# --- load ---------------------------------------------------------------------------------


def test_load_of_an_absent_conversation_is_empty(store: ConversationStore) -> None:
    """An absent conversation loads as no head and no events."""
    assert store.load(KEY, ContextBudget()) == Snapshot(head=None, events=[], from_start=True)
    assert store.get_head(KEY) is None


def _turns_of_three(store: ConversationStore, count: int) -> list[Turn]:
    turns: list[Turn] = []
    head: Head | None = None
    for n in range(1, count + 1):
        turn = commit_turn(store, KEY, head, [f"q{n}", f"a{n}", f"b{n}"])
        turns.append(turn)
        head = turn.head
    return turns


@pytest.mark.parametrize("page", [None, 2], ids=["pages-as-needed", "pages-of-2"])
@pytest.mark.parametrize(
    ("max_events", "newest_turns"),
    [(12, 4), (11, 3), (9, 3), (7, 2), (6, 2), (5, 1), (3, 1), (1, 1)],
)
def test_load_takes_the_newest_whole_turns_within_max_events(
    store: ConversationStore, max_events: int, newest_turns: int, page: int | None
) -> None:
    """load returns the newest turns that fit max_events entirely: a turn is never cut, one
    that fits exactly is kept, the newest is always there, and from_start says whether the
    transcript is complete; the backend's page size does not change the answer."""
    turns = _turns_of_three(store, 4)

    if page is None:
        snapshot = store.load(KEY, ContextBudget(max_events=max_events))
    else:
        with small_pages(store, page):
            snapshot = store.load(KEY, ContextBudget(max_events=max_events))

    assert snapshot.head == turns[-1].head
    assert snapshot.events == events_of(*turns[-newest_turns:])
    assert snapshot.from_start == (newest_turns == 4)


def test_load_takes_the_newest_whole_turns_within_max_chars(store: ConversationStore) -> None:
    """max_chars bounds what load returns, even when what fits reaches back to the first event:
    whole turns only, newest first, never over the budget."""
    first = commit_turn(store, KEY, None, ["q" * 1000])
    second = commit_turn(store, KEY, first.head, ["q" * 1000, "a" * 1000])
    third = commit_turn(store, KEY, second.head, ["q" * 1000, "a" * 1000])

    # Four 1 KB events fit 5000 characters, five do not.
    snapshot = store.load(KEY, ContextBudget(max_chars=5000))
    assert snapshot.events == events_of(second, third)
    assert not snapshot.from_start

    snapshot = store.load(KEY, ContextBudget(max_chars=8000))
    assert snapshot.events == events_of(first, second, third)
    assert snapshot.from_start


def test_offloaded_payloads_weigh_their_real_size(store: ConversationStore) -> None:
    """An offloaded payload counts for its size in max_chars, not for its reference's: a turn
    holding a 100 KB message does not fit a 50 000-character budget wherever it is stored."""
    first = commit_turn(store, KEY, None, ["q1", "a" * 100_000])
    second = commit_turn(store, KEY, first.head, ["q2", "a2"])
    assert stored_ref(store, KEY, 2) is not None

    snapshot = store.load(KEY, ContextBudget(max_chars=50_000))

    assert snapshot.events == second.events
    assert not snapshot.from_start


@pytest.mark.parametrize("earlier_turns", [0, 2], ids=["only-turn", "after-others"])
def test_load_reads_the_current_turn_whole_over_any_budget(
    store: ConversationStore, earlier_turns: int
) -> None:
    """The newest turn is always read whole, however far over the budget (its pending tool
    calls and results live in it), even when it spans several commits, and nothing older is
    read with it."""
    head: Head | None = None
    for n in range(earlier_turns):
        head = commit_turn(store, KEY, head, [f"q{n}", f"a{n}"]).head
    opening = commit_turn(store, KEY, head, ["long task", *(f"step {n}" for n in range(7))])
    rest = commit_turn(
        store, KEY, opening.head, [f"tool {n}" for n in range(6)], continue_turn=True
    )
    current = events_of(opening, rest)

    for budget in (ContextBudget(max_events=3), ContextBudget(max_chars=10)):
        with small_pages(store, 4):
            snapshot = store.load(KEY, budget)
        assert snapshot.events == current
        assert snapshot.from_start == (earlier_turns == 0)


def test_load_reports_a_gap_in_the_log(store: ConversationStore) -> None:
    """An event missing from the middle of the log is CorruptedState, never a silently
    shorter transcript."""
    first = commit_turn(store, KEY, None, ["q1"])
    second = commit_turn(store, KEY, first.head, ["a1"])
    third = commit_turn(store, KEY, second.head, ["b1"])
    delete_raw_item(store, KEY, keys.event_sort_key(2))

    # Read where the items were not read before (the store keeps what it last read).
    with pytest.raises(CorruptedState):
        another_environment(store).load(KEY, EVERYTHING)
    with pytest.raises(CorruptedState):
        store.read_events(KEY, third.head, after=0, limit=10)


# --- read_events --------------------------------------------------------------------------


def test_read_events_pages_by_after_and_limit(store: ConversationStore) -> None:
    """read_events returns up to ``limit`` events after public sequence ``after``, and nothing
    past the end."""
    turns = _turns_of_three(store, 4)
    every = events_of(*turns)
    head = turns[-1].head

    assert store.read_events(KEY, head, after=0, limit=5) == every[:5]
    assert store.read_events(KEY, head, after=5, limit=5) == every[5:10]
    assert store.read_events(KEY, head, after=10, limit=5) == every[10:]
    assert store.read_events(KEY, head, after=12, limit=5) == []
    assert store.read_events(KEY, head, after=40, limit=5) == []
    assert store.read_events(KEY, head, after=3, limit=0) == []


def test_read_events_never_stops_at_a_backend_page(store: ConversationStore) -> None:
    """A limit spanning many backend pages is filled whole: paging goes on until the limit or
    the end, whatever the backend's page size."""
    turns = _turns_of_three(store, 10)
    every = events_of(*turns)

    with small_pages(store, 3):
        assert store.read_events(KEY, turns[-1].head, after=1, limit=25) == every[1:26]
        assert store.read_events(KEY, turns[-1].head, after=20, limit=100) == every[20:]


def test_read_events_sees_only_the_life_of_the_head_it_is_given(
    store: ConversationStore,
) -> None:
    """After a clear, a new life numbers its events from 1 again and reading it never returns
    an event of the earlier life."""
    old = commit_turn(store, KEY, None, ["old q", "old a", "old b"])
    store.clear(KEY, START)
    new = commit_turn(store, KEY, None, ["new q"])

    assert store.read_events(KEY, new.head, after=0, limit=10) == new.events
    assert [e.sequence for e in new.events] == [1]
    assert store.load(KEY, EVERYTHING).events == new.events
    assert not set(e.event_id for e in old.events) & set(e.event_id for e in all_events(store))


# --- offloading ---------------------------------------------------------------------------


def test_a_payload_at_the_threshold_is_offloaded_with_its_hash(store: ConversationStore) -> None:
    """A payload of offload_threshold bytes or more goes to the blob store, under the life's
    prefix and named by its sha256; the item keeps only the reference. One byte less stays
    inline. Both read back whole."""
    envelope = len(json.dumps({"content": ""}, separators=(",", ":")))
    below = "u" * (store.offload_threshold - envelope - 1)
    at = "o" * (store.offload_threshold - envelope)
    turn = commit_turn(store, KEY, None, [below, at])

    assert stored_ref(store, KEY, 1) is None
    assert stored_body(store, KEY, 1)["payload"] == {"content": below}

    data = json.dumps({"content": at}, separators=(",", ":")).encode()
    assert len(data) == store.offload_threshold
    digest = hashlib.sha256(data).hexdigest()
    ref = stored_ref(store, KEY, 2)
    assert ref is not None
    assert (ref.sha256, ref.size) == (digest, len(data))
    assert ref.key.startswith(f"{keys.blob_prefix(KEY, turn.head.gen)}e/000000000002-{digest[:16]}")
    assert blob_keys(store, KEY) == [ref.key]
    assert store.blobs.get(ref.key) == data
    offloaded = stored_body(store, KEY, 2)
    assert "payload" not in offloaded
    assert len(json.dumps(offloaded)) < 1000

    assert store.load(KEY, EVERYTHING).events == turn.events


def test_a_600_kb_message_round_trips(store: ConversationStore) -> None:
    """A message far over DynamoDB's item limit is stored and read back byte for byte,
    multi-byte characters included."""
    content = ("grüße, 世界 — " * 60_000)[:600_000]
    turn = commit_turn(store, KEY, None, [content, "ok"])

    assert store.load(KEY, EVERYTHING).events == turn.events
    assert all_events(store) == turn.events
    assert all_events(store)[0].payload["content"] == content


@pytest.mark.parametrize("damage", ["tampered", "truncated", "missing", "not-json"])
def test_a_damaged_object_is_corrupted_state(store: ConversationStore, damage: str) -> None:
    """An offloaded payload is trusted only if it is there and matches the sha256 and size its
    item recorded (and is a JSON object); anything else is CorruptedState on every read."""
    turn = commit_turn(store, KEY, None, ["q1", BIG])
    ref = stored_ref(store, KEY, 2)
    assert ref is not None
    data = store.blobs.get(ref.key)
    if damage == "tampered":
        store.blobs.put(ref.key, data.replace(b"b", b"c", 1))
    elif damage == "truncated":
        store.blobs.put(ref.key, data[:-10])
    elif damage == "missing":
        store.blobs.delete_keys([ref.key])
    else:
        garbage = b"{not json" + b" " * 100
        store.blobs.put(ref.key, garbage)

        def point_at_garbage(body: dict[str, object]) -> None:
            body["ref"] = {
                "key": ref.key,
                "sha256": hashlib.sha256(garbage).hexdigest(),
                "size": len(garbage),
            }

        corrupt_event_body(store, KEY, 2, point_at_garbage)

    with pytest.raises(CorruptedState):
        store.load(KEY, EVERYTHING)
    with pytest.raises(CorruptedState):
        store.read_events(KEY, turn.head, after=1, limit=1)
    assert store.read_events(KEY, turn.head, after=0, limit=1) == turn.events[:1]


# --- damaged and unknown items ------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        {codec.A_BODY: "{not json"},
        {codec.A_BODY: json.dumps({"gen": "x"})},
        {codec.A_VERSION: 7},
        {codec.A_GEN: "another-life"},
        {codec.A_SCHEMA: REMOVE},
        {codec.A_SCHEMA: "1"},
    ],
    ids=[
        "body-not-json",
        "body-incomplete",
        "version-mismatch",
        "gen-mismatch",
        "no-schema",
        "schema-not-int",
    ],
)
def test_a_damaged_head_is_corrupted_state(
    store: ConversationStore, damage: dict[str, object]
) -> None:
    """A head that does not parse, or whose attributes disagree with its body, is
    CorruptedState on every read; nothing is guessed or repaired."""
    commit_turn(store, KEY, None, ["q1"])
    corrupt(store, KEY, keys.HEAD_SK, **damage)

    with pytest.raises(CorruptedState):
        store.get_head(KEY)
    with pytest.raises(CorruptedState):
        store.load(KEY, EVERYTHING)


def test_a_head_of_an_unknown_schema_version_is_unsupported(store: ConversationStore) -> None:
    """A head written by a newer build is UnsupportedStateVersion naming the version found and
    the versions this build reads."""
    commit_turn(store, KEY, None, ["q1"])
    corrupt(store, KEY, keys.HEAD_SK, **{codec.A_SCHEMA: 99})

    for read in (lambda: store.get_head(KEY), lambda: store.load(KEY, EVERYTHING)):
        with pytest.raises(UnsupportedStateVersion) as caught:
            read()
        assert caught.value.details["found"] == 99
        assert caught.value.details["supported"] == SUPPORTED_SCHEMA_VERSIONS


def test_an_event_of_an_unknown_schema_version_is_unsupported(store: ConversationStore) -> None:
    """An event written by a newer build is UnsupportedStateVersion on every read of it."""
    turn = commit_turn(store, KEY, None, ["q1", "a1"])
    corrupt(store, KEY, holding(store, KEY, 2), **{codec.A_SCHEMA: 99})

    # Read where the items were not read before (the store keeps what it last read).
    with pytest.raises(UnsupportedStateVersion) as caught:
        another_environment(store).load(KEY, EVERYTHING)
    assert caught.value.details["found"] == 99
    assert caught.value.details["supported"] == SUPPORTED_SCHEMA_VERSIONS
    with pytest.raises(UnsupportedStateVersion):
        store.read_events(KEY, turn.head, after=0, limit=10)


@pytest.mark.parametrize(
    "damage",
    [
        {codec.A_GEN: "another-life"},
        {codec.A_BODY: "{not json"},
        {codec.A_BODY: json.dumps({"id": "e", "turn": 1})},
    ],
    ids=["other-generation", "body-not-json", "body-incomplete"],
)
def test_a_damaged_event_is_corrupted_state(
    store: ConversationStore, damage: dict[str, object]
) -> None:
    """An event inside the head's range that belongs to another life of the conversation, or
    does not parse, is CorruptedState: never read as part of this transcript."""
    turn = commit_turn(store, KEY, None, ["q1", "a1", "b1"])
    corrupt(store, KEY, holding(store, KEY, 2), **damage)

    # Read where the items were not read before (the store keeps what it last read).
    with pytest.raises(CorruptedState):
        another_environment(store).load(KEY, EVERYTHING)
    with pytest.raises(CorruptedState):
        store.read_events(KEY, turn.head, after=0, limit=10)


# --- clear --------------------------------------------------------------------------------


def test_clear_removes_head_events_and_objects(store: ConversationStore, clock: FakeClock) -> None:
    """clear deletes the head, every event item and every object, and says how many; the
    next turn starts a new conversation numbered from 1."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    commit_turn(store, KEY, first.head, ["q2", "a2", BIG])
    assert len(blob_keys(store, KEY)) == 2

    report = store.clear(KEY, clock.now())

    assert report == PurgeReport(conversations=1, events=5, objects=2)
    assert_absent(store)
    fresh = commit_turn(store, KEY, None, ["hello again"])
    assert store.load(KEY, EVERYTHING).events == fresh.events
    assert fresh.events[0].sequence == 1


def test_clear_of_an_absent_conversation_returns_zeros(store: ConversationStore) -> None:
    """Clearing what does not exist is fine: zeros, and nothing written."""
    assert store.clear(KEY, START) == PurgeReport()
    assert_absent(store)


@pytest.mark.parametrize(
    "damage",
    [
        {codec.A_BODY: "{not json"},
        {codec.A_SCHEMA: 99},
        {codec.A_VERSION: REMOVE},
        {codec.A_VERSION: "seven", codec.A_GEN: REMOVE},
    ],
    ids=["corrupted-body", "unknown-schema", "no-version", "version-not-a-number"],
)
def test_clear_recovers_an_unreadable_head(
    store: ConversationStore, damage: dict[str, object]
) -> None:
    """clear works on a head that cannot be read (corrupted, or from a newer build): that is
    how DELETE recovers a conversation. Everything goes and a new conversation can start."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    commit_turn(store, KEY, first.head, ["q2", "a2"])
    corrupt(store, KEY, keys.HEAD_SK, **damage)

    report = store.clear(KEY, START)

    assert report == PurgeReport(conversations=1, events=4, objects=1)
    assert_absent(store)
    fresh = commit_turn(store, KEY, None, ["hello again"])
    assert store.load(KEY, EVERYTHING).events == fresh.events


def test_clear_removes_what_a_vanished_head_left(store: ConversationStore) -> None:
    """When the head is gone but events and objects remain (DynamoDB's TTL removed the head,
    or a clear crashed), clear removes the leftovers."""
    commit_turn(store, KEY, None, ["q1", BIG, "a1"])
    delete_raw_item(store, KEY, keys.HEAD_SK)

    report = store.clear(KEY, START)

    assert report == PurgeReport(conversations=0, events=3, objects=1)
    assert_absent(store)


def test_clear_pages_through_a_long_log(store: ConversationStore) -> None:
    """clear deletes every event however many backend pages the log spans: deleting a page
    never makes the next one skip events."""
    _turns_of_three(store, 8)

    with small_pages(store, 5):
        report = store.clear(KEY, START)

    assert report.events == 24
    assert_absent(store)


def test_clear_finishes_an_interrupted_purge(store: ConversationStore) -> None:
    """A tombstone left by a purge that stopped half way is finished by the next clear."""
    commit_turn(store, KEY, None, ["q1", BIG])

    def crash() -> None:
        raise RuntimeError("the purge stopped here")

    # The purge's first deleting write: every item here was written just now, so a
    # gravestone replaces each (docs/STORAGE.md, "clear wins").
    with interleave(store, "_put_items", crash) as staged, pytest.raises(RuntimeError):
        store.clear(KEY, START)
    assert staged.ran
    tomb = store.get_head(KEY)
    assert tomb is not None
    assert tomb.status is ConversationStatus.CLEARED
    assert store.load(KEY, EVERYTHING) == Snapshot(head=tomb, events=[], from_start=True)

    report = store.clear(KEY, START)

    assert (report.events, report.objects) == (2, 1)
    assert_absent(store)


def test_clear_wins_against_turns_that_keep_committing(store: ConversationStore) -> None:
    """A turn lands just before clear fences the head, and another one tries just before the
    tombstone: the first is cleared with the rest, the second is busy and stores nothing, and
    clear never raises. Nothing of any of them remains."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    outcomes: list[str] = []

    def a_turn() -> None:
        try:
            commit_turn(store, KEY, store.get_head(KEY), ["again", BIG])
        except ConversationBusy:
            outcomes.append("busy")
        else:
            outcomes.append("landed")

    with (
        interleave(purge_protocol, "_fence", a_turn) as before_fence,
        interleave(store, "_replace_head", a_turn) as before_tombstone,
    ):
        report = store.clear(KEY, START)

    assert (before_fence.ran, before_tombstone.ran) == (1, 1)
    assert outcomes == ["landed", "busy"]
    assert report == PurgeReport(conversations=1, events=4, objects=2)
    assert_absent(store)
    assert first.head.version == 1


def test_a_fenced_head_refuses_every_commit_but_stays_readable(store: ConversationStore) -> None:
    """Between a clear's fence and its tombstone (here: the clear died there), the conversation
    reads as it was, but no turn can commit on it, whatever head it read, and no conversation
    can be created over it."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    second = commit_turn(store, KEY, first.head, ["q2"])
    with (
        mock.patch.object(store, "_replace_head", side_effect=RuntimeError("died")),
        pytest.raises(RuntimeError),
    ):
        store.clear(KEY, START)
    fenced = raw_item(store, KEY, keys.HEAD_SK)
    assert fenced is not None and codec.A_FENCE in fenced

    assert store.get_head(KEY) == second.head
    assert store.load(KEY, EVERYTHING).events == events_of(first, second)
    for previous in (second.head, first.head, None):
        late = build_turn(KEY, previous, ["late", BIG])
        with pytest.raises(ConversationBusy):
            store.commit(
                KEY, expected_version=late.expected_version, head=late.head, events=late.events
            )
    assert raw_item(store, KEY, keys.HEAD_SK) == fenced
    assert all_events(store) == events_of(first, second)
    assert blob_keys(store, KEY) == refs_of(store, first)


def test_the_next_clear_finishes_a_clear_that_died_after_its_fence(
    store: ConversationStore,
) -> None:
    """A clear that died between fence and tombstone is finished by the next one, which adopts
    the fence (it writes none of its own); then the conversation starts anew."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    commit_turn(store, KEY, first.head, ["q2", "a2"])
    with (
        mock.patch.object(store, "_replace_head", side_effect=RuntimeError("died")),
        pytest.raises(RuntimeError),
    ):
        store.clear(KEY, START)

    with mock.patch.object(store, "_fence_head", wraps=store._fence_head) as fences:
        report = store.clear(KEY, START)

    assert fences.call_count == 0
    assert report == PurgeReport(conversations=1, events=4, objects=1)
    assert_absent(store)
    fresh = commit_turn(store, KEY, None, ["hello again"])
    assert store.load(KEY, EVERYTHING).events == fresh.events


def test_two_clears_racing_on_one_fence_both_succeed(store: ConversationStore) -> None:
    """A second clear runs whole between the first one's fence and its tombstone: it adopts the
    fence and wins; the first finds the conversation gone and reports nothing. Neither raises,
    and what they report together is the conversation, once."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    commit_turn(store, KEY, first.head, ["q2"])
    other: list[PurgeReport] = []

    with interleave(store, "_replace_head", lambda: other.append(store.clear(KEY, START))) as race:
        report = store.clear(KEY, START)

    assert race.ran == 1
    assert other == [PurgeReport(conversations=1, events=3, objects=1)]
    assert report == PurgeReport()
    assert_absent(store)


def test_the_sweep_and_refiling_leave_a_fenced_head_to_its_clear(
    store: ConversationStore,
) -> None:
    """The sweep's conditional purge and re-filing expect an unfenced head: on a fenced one
    they do nothing, and the clear that fenced it is not undone."""
    first = commit_turn(store, KEY, None, ["q1", BIG], expires_at=int(START.timestamp()) + 60)
    with (
        mock.patch.object(store, "_replace_head", side_effect=RuntimeError("died")),
        pytest.raises(RuntimeError),
    ):
        store.clear(KEY, START)
    fenced = raw_item(store, KEY, keys.HEAD_SK)

    assert store.purge_if_unchanged(KEY, first.head, START) is None
    assert store.refile(KEY, first.head) is False

    assert raw_item(store, KEY, keys.HEAD_SK) == fenced
    assert all_events(store) == first.events


def test_clear_finishes_a_tombstone_written_before_its_fence(store: ConversationStore) -> None:
    """Another purge writes its tombstone just before clear fences the head it read: the
    fence (conditional on the head as read, with its claim of the next slot) does not land,
    and the clear finishes that purge instead, removing everything."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    second = commit_turn(store, KEY, first.head, ["q2"])
    tomb = make_head(
        version=second.head.version + 1,
        base=second.head.seq,
        seq=second.head.seq,
        status=ConversationStatus.CLEARED,
    )
    blocked: list[str] = []

    def another_purge_writes_its_tombstone() -> None:
        put_raw_item(store, codec.encode_head(KEY, tomb))

    def a_new_life_on_the_tombstone() -> None:
        fresh = build_turn(KEY, tomb, ["fresh"])
        try:
            store.commit(
                KEY, expected_version=fresh.expected_version, head=fresh.head, events=fresh.events
            )
        except ConversationBusy:
            blocked.append("busy")

    with (
        interleave(purge_protocol, "_fence", another_purge_writes_its_tombstone) as staged,
        interleave(store, "_replace_head", a_new_life_on_the_tombstone) as racing,
    ):
        report = store.clear(KEY, START)

    assert (staged.ran, racing.ran) == (1, 0)
    assert blocked == []
    assert (report.events, report.objects) == (3, 1)
    assert_absent(store)


# --- every item of the partition ------------------------------------------------------------


def _raw(key: ConversationKey, sk: str, **attributes: object) -> dict[str, object]:
    return {codec.A_PK: keys.partition_key(key), codec.A_SK: sk, codec.A_SCHEMA: 1, **attributes}


@pytest.mark.parametrize("purge", ["clear", "sweep"])
def test_a_purge_removes_every_item_of_the_partition(store: ConversationStore, purge: str) -> None:
    """Besides the head and the events, a purge removes items of any other kind the
    partition holds (idempotency records under ``I#``, with or without a life ``g``, and
    keys before the events), and nothing of another conversation."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    other = make_key("tenant-a", "conv-2")
    theirs = commit_turn(store, other, None, ["theirs"])
    extra = ["A#first", "I#key-1", "I#key-2", "Z#last"]
    put_raw_item(store, _raw(KEY, extra[0]))
    put_raw_item(store, _raw(KEY, extra[1], status="COMPLETED", data="{}"))
    put_raw_item(store, _raw(KEY, extra[2], g=first.head.gen))
    put_raw_item(store, _raw(KEY, extra[3], g="another-life"))
    put_raw_item(store, _raw(other, "I#theirs"))

    if purge == "clear":
        report = store.clear(KEY, START)
    else:
        purged = store.purge_if_unchanged(KEY, first.head, START)
        assert purged is not None
        report = purged

    assert report == PurgeReport(conversations=1, events=2, objects=1)
    assert_absent(store)
    assert raw_sort_keys(store, other) == ["E#000000000001", "HEAD", "I#theirs"]
    assert store.load(other, EVERYTHING).events == theirs.events


def test_clear_removes_the_items_a_vanished_head_left(store: ConversationStore) -> None:
    """With no head and no events, items of other kinds alone are still removed."""
    put_raw_item(store, _raw(KEY, "I#orphan"))

    report = store.clear(KEY, START)

    assert report == PurgeReport()
    assert_absent(store)


def test_a_purge_keeps_what_the_next_life_wrote(store: ConversationStore) -> None:
    """A turn starts the next life on the tombstone before the purge deletes anything, and an
    item of another kind is written for it with its ``g``: the purge keeps both (and the
    life's events), while the old life's items go, an unmarked one included."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    put_raw_item(store, _raw(KEY, "I#old", g=first.head.gen))
    put_raw_item(store, _raw(KEY, "I#unmarked"))
    new: list[Turn] = []

    def next_life() -> None:
        tomb = store.get_head(KEY)
        assert tomb is not None and tomb.status is ConversationStatus.CLEARED
        new.append(commit_turn(store, KEY, tomb, ["fresh", BIG]))
        put_raw_item(store, _raw(KEY, "I#new", g=tomb.gen))

    with interleave(store, "_replace_head", next_life, after=True) as staged:
        report = store.clear(KEY, START)

    assert staged.ran
    (turn,) = new
    assert store.get_head(KEY) == turn.head
    assert all_events(store) == turn.events
    # The new life starts above the clear's claim on slot 3 (a gravestone, no data).
    assert data_sort_keys(store, KEY) == ["E#000000000004", "HEAD", "I#new"]
    assert blob_keys(store, KEY) == refs_of(store, turn)
    assert (report.events, report.objects) == (2, 1)


# --- clear racing turns -------------------------------------------------------------------


def test_a_turn_that_read_before_a_clear_cannot_commit_after_it(store: ConversationStore) -> None:
    """After clear returns, a commit expecting the pre-clear version fails with
    ConversationBusy and stores nothing: a cleared conversation stays cleared."""
    first = commit_turn(store, KEY, None, ["q1"])
    second = commit_turn(store, KEY, first.head, ["q2", BIG])

    store.clear(KEY, START)
    late = build_turn(KEY, second.head, ["late", BIG])
    with pytest.raises(ConversationBusy):
        store.commit(
            KEY, expected_version=late.expected_version, head=late.head, events=late.events
        )

    assert_absent(store)


def test_a_turn_racing_a_purge_starts_a_new_life_above_the_old_one(
    store: ConversationStore,
) -> None:
    """A turn that reads the tombstone while clear is deleting starts a new life over it: its
    sequences start at 1, it never sees an old event, and the clear keeps it (events and
    objects) while removing everything older."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    commit_turn(store, KEY, first.head, ["q2", "a2"])
    new: list[Turn] = []

    def concurrent_turn() -> None:
        snapshot = store.load(KEY, ContextBudget())
        assert snapshot.head is not None
        assert snapshot.head.status is ConversationStatus.CLEARED
        assert snapshot.events == []
        new.append(commit_turn(store, KEY, snapshot.head, ["fresh start", BIG]))

    # At the purge's first deleting write (gravestones over the items written just now).
    with interleave(store, "_put_items", concurrent_turn) as staged:
        report = store.clear(KEY, START)

    assert staged.ran
    (turn,) = new
    assert [e.sequence for e in turn.events] == [1, 2]
    assert store.get_head(KEY) == turn.head
    assert store.load(KEY, EVERYTHING) == Snapshot(
        head=turn.head, events=turn.events, from_start=True
    )
    assert all_events(store) == turn.events
    assert blob_keys(store, KEY) == refs_of(store, turn)
    assert (report.conversations, report.events, report.objects) == (1, 4, 1)


def test_a_new_conversation_racing_a_clear_of_leftovers_is_never_half_deleted(
    store: ConversationStore,
) -> None:
    """While clear removes the leftovers of a vanished head, a turn creates the conversation
    anew. Afterwards the conversation is either absent or exactly that turn: never a head
    whose events or objects were deleted under it."""
    commit_turn(store, KEY, None, ["old q", BIG])
    delete_raw_item(store, KEY, keys.HEAD_SK)
    new: list[Turn] = []

    def concurrent_new_conversation() -> None:
        # A new life never overwrites another life's items (docs/STORAGE.md): over the
        # leftovers it may be refused busy (retryable) until they are gone.
        with suppress(ConversationBusy):
            new.append(commit_turn(store, KEY, None, ["new q", BIG, "new a"]))

    # Right after clear looked for leftover events, before it deletes anything.
    with interleave(store, "_query", concurrent_new_conversation, after=True) as staged:
        store.clear(KEY, START)

    assert staged.ran
    head = store.get_head(KEY)
    if head is None:
        assert_absent(store)
    else:
        (turn,) = new
        assert head == turn.head
        assert all_events(store) == turn.events
        assert store.load(KEY, EVERYTHING).events == turn.events
        assert blob_keys(store, KEY) == refs_of(store, turn)


def test_clear_racing_commits_in_threads_leaves_a_consistent_conversation(
    store: ConversationStore,
) -> None:
    """Whatever the interleaving of a clear and a stream of turns, afterwards the conversation
    is readable: absent, or a life whose every event and object is there."""
    head = commit_turn(store, KEY, None, ["q0", BIG]).head
    start = threading.Barrier(2)

    def turns() -> None:
        nonlocal head
        start.wait()
        for n in range(8):
            current = store.get_head(KEY)
            try:
                head = commit_turn(store, KEY, current, [f"q{n}", BIG]).head
            except ConversationBusy:
                continue

    def clear() -> None:
        start.wait()
        store.clear(KEY, START)

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(turns), pool.submit(clear)]:
            future.result()

    final = store.get_head(KEY)
    if final is None:
        assert_absent(store)
    else:
        assert final.status is not ConversationStatus.CLEARED  # the clear finished
        events = all_events(store)
        assert [e.sequence for e in events] == list(range(1, final.event_count + 1))
        assert store.load(KEY, EVERYTHING).events == events


# --- purge_if_unchanged -------------------------------------------------------------------


def test_purge_if_unchanged_spares_a_conversation_that_moved(store: ConversationStore) -> None:
    """The sweep's purge deletes nothing and returns None when a turn committed after the
    head it decided on was read."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    second = commit_turn(store, KEY, first.head, ["q2", BIG])
    objects = blob_keys(store, KEY)

    assert store.purge_if_unchanged(KEY, first.head, START) is None

    assert store.get_head(KEY) == second.head
    assert all_events(store) == events_of(first, second)
    assert blob_keys(store, KEY) == objects


def test_purge_if_unchanged_purges_an_unchanged_conversation(store: ConversationStore) -> None:
    """The sweep's purge of a head that did not move removes everything and says so."""
    first = commit_turn(store, KEY, None, ["q1", BIG])
    second = commit_turn(store, KEY, first.head, ["q2"])

    report = store.purge_if_unchanged(KEY, second.head, START)

    assert report == PurgeReport(conversations=1, events=3, objects=1)
    assert_absent(store)


def test_purge_if_unchanged_spares_a_new_life_at_the_same_version(
    store: ConversationStore,
) -> None:
    """A head the sweep read before a clear does not match a new life that reached the same
    version since: the new conversation survives."""
    old = commit_turn(store, KEY, None, ["old"])
    store.clear(KEY, START)
    new = commit_turn(store, KEY, None, ["new", BIG])
    assert new.head.version == old.head.version

    assert store.purge_if_unchanged(KEY, old.head, START) is None

    assert store.get_head(KEY) == new.head
    assert all_events(store) == new.events
    assert blob_keys(store, KEY) == refs_of(store, new)


# --- tenants ------------------------------------------------------------------------------


def test_tenants_are_isolated(store: ConversationStore) -> None:
    """The same conversation id under two tenants names two independent conversations:
    committing to or clearing one never touches the other."""
    mine, theirs = make_key("tenant-a", "shared"), make_key("tenant-b", "shared")
    my_first = commit_turn(store, mine, None, ["mine", BIG])
    their_first = commit_turn(store, theirs, None, ["theirs", BIG])

    commit_turn(store, mine, my_first.head, ["mine again"])
    assert store.get_head(theirs) == their_first.head
    report = store.clear(mine, START)

    assert report == PurgeReport(conversations=1, events=3, objects=1)
    assert_absent(store, mine)
    assert store.get_head(theirs) == their_first.head
    assert store.load(theirs, EVERYTHING).events == their_first.events
    assert blob_keys(store, theirs) == refs_of(store, their_first, theirs)


#: Tenants and ids that would collide if tenants were not encoded (or prefixes not closed).
AWKWARD_KEYS = [
    make_key("a", "b"),
    make_key("a", "b2"),
    make_key("a#C#b", "c"),
    make_key("a%23C%23b", "c"),
    make_key("a/c/b", "x"),
    make_key("a%2Fc%2Fb", "x"),
    make_key("urn:tenant:42", "c"),
    make_key("100%", "c"),
    make_key("#", "c"),
    make_key("/", "c"),
]


def test_tenants_with_separator_characters_are_safe(store: ConversationStore) -> None:
    """Tenants holding '#', '/', ':' or '%' (and ids that prefix one another) never share a
    partition or an object prefix: each conversation reads only its own events, and clearing
    one leaves every other intact."""
    committed = {
        key: commit_turn(store, key, None, [f"{key.tenant}|{key.conversation_id}", f"{BIG}{n}"])
        for n, key in enumerate(AWKWARD_KEYS)
    }
    assert len({keys.partition_key(k) for k in AWKWARD_KEYS}) == len(AWKWARD_KEYS)

    for key, turn in committed.items():
        item = raw_item(store, key, keys.HEAD_SK)
        assert item is not None
        assert item[codec.A_TENANT] == key.tenant
        assert store.load(key, EVERYTHING).events == turn.events

    remaining = dict(committed)
    for key in AWKWARD_KEYS[:4]:
        assert store.clear(key, START) == PurgeReport(conversations=1, events=2, objects=1)
        del remaining[key]
        assert_absent(store, key)
        for other, turn in remaining.items():
            assert store.load(other, EVERYTHING).events == turn.events, other
            assert blob_keys(store, other) == refs_of(store, turn, other), other


def test_get_head_returns_the_head_in_any_state(store: ConversationStore) -> None:
    """get_head returns the stored head as committed, whatever its status and pending calls."""
    first = commit_turn(
        store,
        KEY,
        None,
        ["q1"],
        status=ConversationStatus.AWAITING_APPROVAL,
        pending=[_pending_call(arguments={"city": "Paris"})],
        expires_at=int(START.timestamp()) + 60,
        ttl_seconds=60,
    )

    head = store.get_head(KEY)

    assert head == first.head
    assert head is not None
    assert head.pending[0].arguments == {"city": "Paris"}
    item = raw_item(store, KEY, keys.HEAD_SK)
    assert item is not None
    # HEAD's TTL: the end of the expiry's hour bucket, never earlier (docs/STORAGE.md).
    assert item[codec.A_EXPIRES] == codec.bucket_end(int(START.timestamp()) + 60)


def test_commit_reports_the_bytes_it_wrote(store: ConversationStore) -> None:
    """``commit`` returns the size of every item it wrote (DynamoDB's rule) plus the
    bytes it offloaded: what the BytesWritten metric records."""
    key = make_key()
    turn = build_turn(key, None, ["hello", "x" * (store.offload_threshold + 10)])
    written = store.commit(
        key, expected_version=turn.expected_version, head=turn.head, events=turn.events
    )
    stored = [raw_item(store, key, keys.event_sort_key(1))]  # the turn item of both events
    head = raw_item(store, key, keys.HEAD_SK)
    assert all(item is not None for item in [*stored, head])
    ref = stored_ref(store, key, 2)
    assert ref is not None
    items = sum(codec.item_size(item) for item in [*stored, head] if item is not None)
    assert written == items + ref.size


# --- turn items (docs/STORAGE.md) ---------------------------------------------------------


def test_reads_find_events_inside_turn_items(store: ConversationStore) -> None:
    """A commit's events are one item under the key of the first; every read finds an event
    wherever it sits in such an item: a summary that ends inside one (the load reads from the
    middle of it), a page of read_events that starts inside one, a point read of one event."""
    first = commit_turn(store, KEY, None, ["q1", "a1", "b1", "c1"])
    second = commit_turn(
        store, KEY, first.head, ["q2", "a2", "b2"], summary=SummaryRef(sequence=6, through=2)
    )
    assert [k for k in raw_sort_keys(store, KEY) if k.startswith("E#")] == [
        keys.event_sort_key(1),
        keys.event_sort_key(5),
    ]
    everything = [*first.events, *second.events]

    with small_pages(store, 1):
        snapshot = store.load(KEY, EVERYTHING)
    assert snapshot.events == everything[2:] and not snapshot.from_start
    for after in range(7):
        assert store.read_events(KEY, second.head, after=after, limit=2) == everything[after:][:2]
    assert [store.event_at(KEY, second.head, n) for n in range(1, 8)] == everything


def test_a_commit_too_large_for_one_item_writes_several_turn_items(
    store: ConversationStore,
) -> None:
    """Events that fit the item size limit one by one but not together go in as few turn
    items as fit, each under the key of its first event, in one atomic write."""
    inline = "i" * (store.offload_threshold - 200)  # just under the offload threshold
    turn = commit_turn(store, KEY, None, [inline] * 8)

    event_keys = [k for k in raw_sort_keys(store, KEY) if k.startswith(keys.EVENT_PREFIX)]
    assert 1 < len(event_keys) < 8 and event_keys[0] == keys.event_sort_key(1)
    assert all(stored_ref(store, KEY, n) is None for n in range(1, 9)), "all inline"
    assert store.load(KEY, EVERYTHING).events == turn.events
    assert store.read_events(KEY, turn.head, after=0, limit=8) == turn.events


# --- the slot as the lock: late turns, leftovers ------------------------------------------


def test_a_turn_that_read_before_an_earlier_commit_and_a_clear_never_lands_after_them(
    store: ConversationStore,
) -> None:
    """A turn that read version 1 lost its slot to turn 2, and then a clear purged turn 2:
    the purge leaves that slot taken (a gravestone holding no data, for DynamoDB's TTL),
    so the late turn is refused and nothing of the deleted life is stored again; a new
    conversation under the same id then writes over the gravestones."""
    first = commit_turn(store, KEY, None, ["q1"])
    slow = another_environment(store)  # where the late turn runs: it read version 1
    assert slow.load(KEY, EVERYTHING).head == first.head
    commit_turn(store, KEY, first.head, ["q2", BIG])
    store.clear(KEY, START)

    late = build_turn(KEY, first.head, ["late", BIG])
    with pytest.raises(ConversationBusy):
        slow.commit(KEY, expected_version=late.expected_version, head=late.head, events=late.events)
    assert_absent(store)
    again = commit_turn(store, KEY, None, ["again", "a"])
    more = commit_turn(store, KEY, again.head, ["more", "b"])
    assert all_events(store) == [*again.events, *more.events]


def test_a_purge_deletes_what_no_late_turn_can_target(store: ConversationStore) -> None:
    """Items written longer ago than any request runs are deleted outright; the purge
    leaves one gravestone: its own claim on the next slot, bare of any state."""
    first = commit_turn(store, KEY, None, ["q1", "a1"])
    second = commit_turn(store, KEY, first.head, ["q2", "a2"])

    store.clear(KEY, START + timedelta(seconds=slots.LATE_TURN_SECONDS + 1))

    (grave,) = raw_sort_keys(store, KEY)
    assert grave == keys.event_sort_key(second.head.seq + 1)
    item = raw_item(store, KEY, grave)
    assert item is not None and codec.A_STATE not in item and codec.A_BODY not in item


def test_a_new_life_after_ttl_removed_the_head_continues_over_the_leftovers(
    store: ConversationStore,
) -> None:
    """DynamoDB's TTL removed the head of a long conversation and the stream's reclaim has
    not run yet: a new conversation under the same id commits turn after turn over the
    old life's items (never told busy) and reads back only its own events."""
    previous: Head | None = None
    for n in range(12):
        previous = commit_turn(store, KEY, previous, [f"old q{n}", f"old a{n}"]).head
    delete_raw_item(store, KEY, keys.HEAD_SK)

    turns: list[Turn] = []
    head: Head | None = None
    for n in range(5):
        turns.append(commit_turn(store, KEY, head, [f"new q{n}", f"new a{n}"]))
        head = turns[-1].head

    assert store.get_head(KEY) == head
    events = [e for t in turns for e in t.events]
    assert store.load(KEY, EVERYTHING) == Snapshot(head=head, events=events, from_start=True)
    assert all_events(store) == events


def test_a_load_after_its_own_commit_is_one_read_and_never_stale(store: ConversationStore) -> None:
    """An execution environment keeps the newest items it read or wrote: its next load reads
    only ``HEAD`` and what lies above them, in one round trip, when nothing else was
    written; after another environment's commit it reads that commit too (never a stale
    view), and either way it reads what a fresh environment reads."""
    previous: Head | None = None
    for n in range(12):
        previous = commit_turn(store, KEY, previous, [f"q{n}", f"a{n}" * 50]).head
    store.load(KEY, EVERYTHING)
    turn = commit_turn(store, KEY, previous, ["q12", "a12"])

    before = store.meter.snapshot()
    snapshot = store.load(KEY, EVERYTHING)
    assert store.meter.since(before).read_calls == 1
    assert snapshot == another_environment(store).load(KEY, EVERYTHING)
    assert snapshot.head == turn.head and snapshot.events[-2:] == turn.events

    theirs = commit_turn(another_environment(store), KEY, turn.head, ["q13", "a13"])
    seen = store.load(KEY, EVERYTHING)
    assert seen.head == theirs.head and seen.events[-2:] == theirs.events
    assert seen == another_environment(store).load(KEY, EVERYTHING)
    assert len(seen.events) == 28


def test_set_if_unchanged_writes_only_over_what_it_read(store: ConversationStore) -> None:
    """An update on :class:`~turnledger.store.backend.Unchanged` (the migration's sealing
    write) sets its attributes when the item still holds the values named (absent ones
    absent), keeps the item's other attributes, and never writes over a change or creates
    an item."""
    key = make_key("t1", "set-if-unchanged-1")
    pk = keys.partition_key(key)
    put_raw_item(store, {codec.A_PK: pk, codec.A_SK: "S#x", "a": "one", "other": 7})

    def set_if_unchanged(sk: str, attributes: Item, expected: Item) -> bool:
        try:
            store._write(Update(pk, sk, attributes, Unchanged(expected)))
        except ConditionFailed:
            return False
        return True

    assert not set_if_unchanged("S#x", {"a": "two"}, {"a": "changed"})
    assert not set_if_unchanged("S#x", {"b": "new"}, {"other": None})
    assert not set_if_unchanged("S#absent", {"a": "two"}, {"a": None})
    assert raw_item(store, key, "S#absent") is None
    assert set_if_unchanged("S#x", {"a": b"two", "b": "x"}, {"a": "one", "b": None})
    assert raw_item(store, key, "S#x") == {
        codec.A_PK: pk,
        codec.A_SK: "S#x",
        "a": b"two",
        "b": "x",
        "other": 7,
    }
