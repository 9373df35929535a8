"""The sweep, orphan reclaim after TTL deletions, tenant erasure and clear, on memory, moto and
SQLite (DynamoDB Local runs its own in ``tests/integration``).

Every test moves an injected clock instead of waiting, and checks the physical
items and S3 objects that remain, not only what the report says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from turnledger.core.config import Settings
from turnledger.core.exceptions import InvalidRequest
from turnledger.core.models import ConversationKey, ConversationStatus, Head, PendingCall
from turnledger.handlers import sweep_handler as lambda_handler
from turnledger.ops.sweep import SWEEP_LOOKBACK_BUCKETS, TIME_MARGIN_MS, Deadline, Sweeper
from turnledger.providers.demo import DemoProvider
from turnledger.runtime import Runtime, set_runtime
from turnledger.store import codec, keys
from turnledger.store.base import ContextBudget, ConversationStore, new_generation
from turnledger.store.codec import SideItem
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.turn.pipeline import Conversations
from turnledger_local.gateway import LambdaContext

from tests.support import edge
from tests.support.concurrency import all_at_once
from tests.support.edge import Caller
from tests.support.factories import (
    START,
    FakeClock,
    Turn,
    blob_keys,
    commit_turn,
    corrupt,
    data_sort_keys,
    delete_raw_item,
    interleave,
    make_key,
    put_raw_item,
    raw_item,
    raw_sort_keys,
)

EPOCH = int(START.timestamp())
HOUR = keys.EXPIRY_BUCKET_SECONDS
TTL = 600
#: Over the 64 KiB offload threshold: this message's payload goes to S3.
BIG = "x" * 70_000


@pytest.fixture(params=["memory", "moto", "sqlite"])
def store(request: pytest.FixtureRequest) -> ConversationStore:
    """The store on the in-process backend, on DynamoDB (moto) and on SQLite."""
    backend: ConversationStore = request.getfixturevalue(f"{request.param}_store")
    return backend


@dataclass
class BudgetContext:
    """A Lambda context whose remaining time the test sets by hand."""

    remaining_ms: int = 60_000

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def seed(
    store: ConversationStore,
    key: ConversationKey,
    *,
    expires_at: int | None,
    turns: int = 2,
    big: bool = True,
) -> list[Turn]:
    """``turns`` turns of two events each; the last assistant message is offloaded to S3."""
    committed: list[Turn] = []
    previous: Head | None = None
    for number in range(turns):
        last = number == turns - 1
        turn = commit_turn(
            store,
            key,
            previous,
            [f"question {number}", BIG if big and last else f"answer {number}"],
            ttl_seconds=TTL if expires_at is not None else 0,
            expires_at=expires_at,
        )
        committed.append(turn)
        previous = turn.head
    return committed


def assert_gone(store: ConversationStore, key: ConversationKey) -> None:
    """Nothing of the conversation remains: no head, no event item, no S3 object."""
    assert data_sort_keys(store, key) == []
    assert blob_keys(store, key) == []


def assert_intact(store: ConversationStore, key: ConversationKey, turns: list[Turn]) -> None:
    """The conversation reads back whole: the last head and every committed event."""
    snapshot = store.load(key, ContextBudget())
    assert snapshot.head == turns[-1].head
    assert snapshot.events == [event for turn in turns for event in turn.events]


def sweeper(store: ConversationStore, clock: FakeClock, context: Any = None) -> Sweeper:
    return Sweeper(store, clock=clock.now, deadline=Deadline.of(context))


def key_of(number: int, tenant: str = "tenant-a") -> ConversationKey:
    return make_key(tenant=tenant, conversation_id=f"conv-{number:03d}")


# --- the scheduled sweep -------------------------------------------------------------------


def test_expiry_boundary_is_exact(store: ConversationStore, clock: FakeClock) -> None:
    """A head is swept at ``expires_at`` and not one second before; no-TTL heads never are."""
    expiring, forever = key_of(1), key_of(2)
    expires_at = EPOCH + 1800
    turns = seed(store, expiring, expires_at=expires_at)
    kept = seed(store, forever, expires_at=None)

    clock.advance(expires_at - 1 - EPOCH)
    report = sweeper(store, clock).expired()
    assert (report.conversations_removed, report.events_removed) == (0, 0)
    assert report.complete
    assert_intact(store, expiring, turns)

    clock.advance(1)
    report = sweeper(store, clock).expired()
    assert report.conversations_removed == 1
    assert report.events_removed == 4
    assert report.objects_removed == 1
    assert report.complete
    assert_gone(store, expiring)
    assert_intact(store, forever, kept)


def test_sweep_removes_every_expired_conversation_and_only_those(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Expired heads in past buckets and in the current one go; live ones stay whole."""
    expired = {key_of(n): EPOCH - n * 1000 for n in range(1, 6)}  # spread over 2 hours back
    live = {key_of(n): EPOCH + 3 * HOUR for n in range(6, 9)}
    seeded = {k: seed(store, k, expires_at=at) for k, at in {**expired, **live}.items()}

    report = sweeper(store, clock).expired()

    assert report.conversations_removed == len(expired)
    assert report.events_removed == 4 * len(expired)
    assert report.objects_removed == len(expired)
    for key in expired:
        assert_gone(store, key)
    for key in live:
        assert_intact(store, key, seeded[key])


def test_cursor_moves_only_past_settled_buckets(store: ConversationStore, clock: FakeClock) -> None:
    """First run starts a week back; the cursor ends at the current bucket, never past it."""
    clock.advance(HOUR // 2)
    current = int(clock.now().timestamp()) // HOUR
    assert store.read_sweep_cursor() is None
    oldest = key_of(1)
    seed(store, oldest, expires_at=(current - SWEEP_LOOKBACK_BUCKETS) * HOUR + 5)

    report = sweeper(store, clock).expired()

    assert report.conversations_removed == 1
    assert_gone(store, oldest)
    assert store.read_sweep_cursor() == current
    assert not store.advance_sweep_cursor(current - 1), "the cursor never moves back"
    assert store.read_sweep_cursor() == current


def test_the_current_bucket_is_swept_again_next_run(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A head of the current hour that expires after one run is swept by the next."""
    clock.advance(60)
    key = key_of(1)
    turns = seed(store, key, expires_at=EPOCH + 1200)
    sweeper(store, clock).expired()
    assert_intact(store, key, turns)

    clock.advance(1200)
    report = sweeper(store, clock).expired()
    assert report.conversations_removed == 1
    assert_gone(store, key)
    assert store.read_sweep_cursor() == EPOCH // HOUR


def test_sweep_stops_at_its_deadline_and_resumes_from_the_cursor(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Out of time: ``complete: false``, the cursor stays at the unfinished bucket.

    The next run resumes there and finishes.
    """
    expired = [key_of(n) for n in range(1, 9)]
    for n, key in enumerate(expired):
        seed(store, key, expires_at=EPOCH - (4 - n // 2) * HOUR + 10, turns=1)  # 2 per bucket
    context = BudgetContext()
    purges = 0
    original = store.purge_if_unchanged

    def purge_then_run_out(*args: Any) -> Any:
        nonlocal purges
        purges += 1
        if purges == 3:
            context.remaining_ms = TIME_MARGIN_MS - 1
        return original(*args)

    with mock.patch.object(store, "purge_if_unchanged", side_effect=purge_then_run_out):
        first = sweeper(store, clock, context).expired()
    assert not first.complete
    assert first.conversations_removed == 3
    # Buckets -4 and -3 hold two each: the first is done, the second half done.
    assert store.read_sweep_cursor() == EPOCH // HOUR - 3

    second = sweeper(store, clock, BudgetContext()).expired()
    assert second.complete
    assert first.conversations_removed + second.conversations_removed == len(expired)
    for key in expired:
        assert_gone(store, key)
    assert store.read_sweep_cursor() == EPOCH // HOUR - 1


def test_a_failing_conversation_keeps_the_cursor_and_is_retried(
    store: ConversationStore, clock: FakeClock
) -> None:
    """One error is logged, the rest is swept, and the bucket is walked again next run."""
    bad, good = key_of(1), key_of(2)
    seed(store, bad, expires_at=EPOCH - 2 * HOUR)
    seed(store, good, expires_at=EPOCH - 2 * HOUR + 1)
    original = store.purge_if_unchanged

    def fail_for_bad(key: ConversationKey, *args: Any) -> Any:
        if key == bad:
            raise RuntimeError("throttled")
        return original(key, *args)

    with mock.patch.object(store, "purge_if_unchanged", side_effect=fail_for_bad):
        first = sweeper(store, clock).expired()
    assert not first.complete
    assert first.conversations_removed == 1
    assert_gone(store, good)
    assert store.read_sweep_cursor() == EPOCH // HOUR - 2

    second = sweeper(store, clock).expired()
    assert second.complete
    assert second.conversations_removed == 1
    assert_gone(store, bad)


def test_a_turn_racing_the_sweep_survives_whole(store: ConversationStore, clock: FakeClock) -> None:
    """A commit that lands after the sweep read the expired head wins; nothing is deleted."""
    key = key_of(1)
    turns = seed(store, key, expires_at=EPOCH - 10)
    newer: list[Turn] = []

    def turn() -> None:
        newer.append(
            commit_turn(
                store,
                key,
                turns[-1].head,
                ["again", "answer"],
                ttl_seconds=TTL,
                expires_at=EPOCH + TTL,
            )
        )

    # The sweep's purge: its tombstone and its claim of the next slot, in one write.
    with interleave(store, "_transact", turn) as race:
        report = sweeper(store, clock).expired()
    assert race.ran == 1
    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        0,
        0,
        0,
    )
    assert_intact(store, key, [*turns, *newer])
    assert len(blob_keys(store, key)) == 1


def test_a_turn_before_the_head_is_read_makes_it_live(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Selected from the index as expired, but the head read says otherwise: kept."""
    key = key_of(1)
    turns = seed(store, key, expires_at=EPOCH - 10)
    later = commit_turn(
        store, key, turns[-1].head, ["again"], ttl_seconds=TTL, expires_at=EPOCH + TTL
    )
    stale = mock.patch.object(store, "expiring_in", side_effect=lambda b, s: iter([key]))
    with stale:
        report = Sweeper(store, clock=clock.now).expired()
    assert report.conversations_removed == 0
    assert_intact(store, key, [*turns, later])


def test_concurrent_sweeps_count_each_conversation_once(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Two sweeps at once: no errors, every expired conversation counted exactly once."""
    if isinstance(store, DynamoDBConversationStore):
        pytest.skip("moto's in-process mock is not thread-safe (DynamoDB Local runs this)")
    expired = [key_of(n) for n in range(1, 21)]
    for n, key in enumerate(expired):
        seed(store, key, expires_at=EPOCH - (n % 3) * HOUR - 1)
    reports = all_at_once(2, lambda _: sweeper(store, clock).expired())

    assert all(r.complete for r in reports)
    assert sum(r.conversations_removed for r in reports) == len(expired)
    assert sum(r.events_removed for r in reports) == 4 * len(expired)
    assert sum(r.objects_removed for r in reports) == len(expired)
    for key in expired:
        assert_gone(store, key)


def test_a_sweep_that_loses_the_race_counts_nothing(
    store: ConversationStore, clock: FakeClock
) -> None:
    """The second sweep purges first, between the first's head read and its tombstone."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10)
    other: list[Any] = []
    with interleave(
        store, "_transact", lambda: other.append(sweeper(store, clock).conversations([key]))
    ) as race:
        report = sweeper(store, clock).expired()
    assert race.ran == 1
    assert other[0].conversations_removed == 1
    assert other[0].events_removed == 4
    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        0,
        0,
        0,
    )
    assert report.complete
    assert_gone(store, key)


def test_tombstones_are_left_to_their_purge_by_the_schedule(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A purge in flight is not finished (and counted) a second time by the scheduled sweep."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10)
    tomb = tombstone_over(store, key)
    with mock.patch.object(store, "expiring_in", side_effect=lambda b, s: iter([key])):
        report = Sweeper(store, clock=clock.now).expired()
    assert report.events_removed == 0
    assert store.get_head(key) == tomb


def tombstone_over(store: ConversationStore, key: ConversationKey) -> Head:
    """Stage a purge that wrote its tombstone and crashed before deleting anything."""
    head = store.get_head(key)
    assert head is not None
    tomb = Head(
        gen=new_generation(),
        version=head.version + 1,
        base=head.seq,
        seq=head.seq,
        turn=0,
        status=ConversationStatus.CLEARED,
        created_at=START,
        updated_at=START,
        ttl_seconds=0,
    )
    put_raw_item(store, codec.encode_head(key, tomb))
    return tomb


def test_an_unreadable_expired_head_is_cleared(store: ConversationStore, clock: FakeClock) -> None:
    """Corrupted or unknown-version heads whose raw ``expires_at`` passed are removed too."""
    unknown, damaged, live = key_of(1), key_of(2), key_of(3)
    for key in (unknown, damaged):
        seed(store, key, expires_at=EPOCH - 10)
    seed(store, live, expires_at=EPOCH + HOUR)
    corrupt(store, unknown, keys.HEAD_SK, v=99)
    corrupt(store, damaged, keys.HEAD_SK, d="{not json")
    corrupt(store, live, keys.HEAD_SK, d="{not json")

    report = sweeper(store, clock).expired()

    assert report.conversations_removed == 2
    assert_gone(store, unknown)
    assert_gone(store, damaged)
    assert raw_item(store, live, keys.HEAD_SK) is not None


def fence_and_die(store: ConversationStore, key: ConversationKey) -> None:
    """Stage a clear that fenced the head and died before writing its tombstone."""
    with (
        mock.patch.object(store, "_replace_head", side_effect=RuntimeError("died")),
        pytest.raises(RuntimeError),
    ):
        store.clear(key, START)
    item = raw_item(store, key, keys.HEAD_SK)
    assert item is not None and codec.A_FENCE in item


def test_an_expired_head_left_fenced_by_a_dead_clear_is_cleared(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A clear that died after fencing leaves a head no turn can commit on: once it has
    expired the sweep finishes that clear; a fenced head not yet expired is left alone."""
    expired, live = key_of(1), key_of(2)
    seed(store, expired, expires_at=EPOCH - 10)
    alive = seed(store, live, expires_at=EPOCH + HOUR)
    fence_and_die(store, expired)
    fence_and_die(store, live)

    report = sweeper(store, clock).expired()
    listed = sweeper(store, clock).conversations([live])

    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        1,
        4,
        1,
    )
    assert_gone(store, expired)
    assert listed.conversations_removed == 0
    assert_intact(store, live, alive)


# --- on demand -----------------------------------------------------------------------------


def test_sweep_of_a_given_list_touches_only_those(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Expired listed ones go; an expired unlisted one and a live listed one stay."""
    listed, unlisted, live = key_of(1), key_of(2), key_of(3)
    seed(store, listed, expires_at=EPOCH - 10)
    kept = seed(store, unlisted, expires_at=EPOCH - 10)
    alive = seed(store, live, expires_at=EPOCH + TTL)

    report = sweeper(store, clock).conversations([listed, live, key_of(4)])

    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        1,
        4,
        1,
    )
    assert report.complete
    assert_gone(store, listed)
    assert_intact(store, unlisted, kept)
    assert_intact(store, live, alive)


def test_sweep_of_a_list_finishes_tombstones(store: ConversationStore, clock: FakeClock) -> None:
    """A crashed purge named on demand is finished: events and objects of the old life go."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH + TTL)
    tombstone_over(store, key)
    report = sweeper(store, clock).conversations([key])
    assert report.events_removed == 4
    assert report.objects_removed == 1
    assert_gone(store, key)


def test_finishing_a_tombstone_never_purges_the_life_that_replaced_it(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A turn starts a new life over the tombstone just after the sweep read it: it survives."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH + TTL)
    tomb = tombstone_over(store, key)
    new_life: list[Turn] = []

    def first_turn() -> None:
        new_life.append(commit_turn(store, key, tomb, ["fresh", BIG], ttl_seconds=TTL))

    with interleave(store, "head_item", first_turn, after=True) as race:
        report = Sweeper(store, clock=clock.now).conversations([key])

    assert race.ran == 1
    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        0,
        4,
        1,
    )
    assert_intact(store, key, new_life)
    assert len(blob_keys(store, key)) == 1


# --- TTL deletions -------------------------------------------------------------------------


def test_a_ttl_deleted_head_leaves_no_orphans(store: ConversationStore, clock: FakeClock) -> None:
    """DynamoDB removed the head on its own: its events and S3 objects are reclaimed."""
    key, other = key_of(1), key_of(2)
    seed(store, key, expires_at=EPOCH - 10, turns=3)
    kept = seed(store, other, expires_at=EPOCH - 10)
    delete_raw_item(store, key, keys.HEAD_SK)

    report = sweeper(store, clock).reclaim([key])

    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        1,
        6,
        1,
    )
    assert_gone(store, key)
    assert_intact(store, other, kept)
    again = sweeper(store, clock).reclaim([key])
    assert (again.conversations_removed, again.events_removed, again.objects_removed) == (0, 0, 0)


def test_reclaim_keeps_a_new_life_started_after_the_ttl_deletion(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Only other lives' items and objects go; the new life reads back whole."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10, turns=3)  # storage sequences 1..6
    delete_raw_item(store, key, keys.HEAD_SK)
    new_life = [
        commit_turn(store, key, None, ["fresh start", BIG], ttl_seconds=TTL, expires_at=EPOCH + TTL)
    ]  # overwrites the turn item of sequences 1..2

    report = sweeper(store, clock).reclaim([key])

    assert report.conversations_removed == 0
    assert report.events_removed == 4
    assert report.objects_removed == 1
    assert_intact(store, key, new_life)
    assert raw_sort_keys(store, key) == [keys.event_sort_key(1), "HEAD"]  # one turn item
    gen = new_life[0].head.gen
    assert [k.startswith(keys.blob_prefix(key, gen)) for k in blob_keys(store, key)] == [True]


def test_reclaim_retries_when_a_new_life_commits_under_it(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A first turn lands between the stamps read and the head re-read: nothing of it is lost."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10, turns=3)
    delete_raw_item(store, key, keys.HEAD_SK)
    new_life: list[Turn] = []

    def first_turn() -> None:
        new_life.append(
            commit_turn(store, key, None, ["fresh", BIG], ttl_seconds=TTL, expires_at=EPOCH + TTL)
        )

    with interleave(store, "event_stamps", first_turn, after=True) as race:
        report = Sweeper(store, clock=clock.now).reclaim([key])

    assert race.ran == 1
    assert report.complete
    assert report.events_removed == 4
    assert_intact(store, key, new_life)
    assert len(blob_keys(store, key)) == 1


def test_reclaim_deletes_are_conditional_on_the_life_read(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A first turn overwrites old items after they were judged dead: its items survive."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10, turns=3)
    delete_raw_item(store, key, keys.HEAD_SK)
    new_life: list[Turn] = []

    def first_turn() -> None:
        new_life.append(
            commit_turn(store, key, None, ["fresh", BIG], ttl_seconds=TTL, expires_at=EPOCH + TTL)
        )

    with interleave(store, "delete_event", first_turn) as race:
        report = Sweeper(store, clock=clock.now).reclaim([key])

    assert race.ran == 1
    assert report.events_removed == 4, "the two overwritten items were not deleted"
    assert_intact(store, key, new_life)
    assert len(blob_keys(store, key)) == 1


def test_reclaim_finishes_a_tombstone(store: ConversationStore, clock: FakeClock) -> None:
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10)
    tombstone_over(store, key)
    report = sweeper(store, clock).reclaim([key])
    assert (report.events_removed, report.objects_removed) == (4, 1)
    assert_gone(store, key)


# --- tenant erasure and clear --------------------------------------------------------------


def test_erasure_removes_every_conversation_of_the_tenant_only(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Live, expiring, never-expiring, tombstoned and damaged: all of one tenant go."""
    mine = [key_of(n, "acme") for n in range(1, 6)]
    seed(store, mine[0], expires_at=EPOCH + TTL)
    seed(store, mine[1], expires_at=None)
    seed(store, mine[2], expires_at=EPOCH - 10)
    seed(store, mine[3], expires_at=None)
    tombstone_over(store, mine[3])
    seed(store, mine[4], expires_at=None)
    corrupt(store, mine[4], keys.HEAD_SK, v=99)
    theirs = key_of(1, "globex")
    kept = seed(store, theirs, expires_at=None)

    report = sweeper(store, clock).erase("acme")

    assert report.complete
    assert report.conversations_removed == 4  # the tombstone was already not a conversation
    assert report.events_removed == 4 * 5
    assert report.objects_removed == 5
    for key in mine:
        assert_gone(store, key)
    assert_intact(store, theirs, kept)


def test_erasure_lists_on_its_store_and_clears_through_the_tenants(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Issue 22: the API's erasure lists on its own role and clears on the tenant's
    credentials (``clear_with``), so its function holds no table-wide item access."""
    mine = [key_of(n, "acme") for n in range(1, 4)]
    for key in mine:
        seed(store, key, expires_at=None, turns=1)
    tenants = mock.Mock(wraps=store)

    report = sweeper(store, clock).erase("acme", tenants)

    assert report.complete and report.conversations_removed == 3
    # Then the tenant's own side items (the OpenAI face's index), through the same store.
    cleared = {c.args[0] for c in tenants.clear.call_args_list}
    assert cleared == {*mine, keys.tenant_items("acme")}
    for key in mine:
        assert_gone(store, key)


def test_erasure_removes_the_tenant_s_own_side_items(
    store: ConversationStore, clock: FakeClock
) -> None:
    """The tenant's partition of its own (the OpenAI face's transcript index) goes too;
    another tenant's stays."""
    mine, theirs = keys.tenant_items("acme"), keys.tenant_items("globex")
    for key in (mine, theirs):
        store.put_side_item(key, SideItem("S#oai#t#abc", {"c": "conv-1"}, expires_at=EPOCH + TTL))
    seed(store, key_of(1, "acme"), expires_at=None)

    report = sweeper(store, clock).erase("acme")

    assert report.complete and report.conversations_removed == 1
    assert data_sort_keys(store, mine) == []
    assert raw_sort_keys(store, theirs) == ["S#oai#t#abc"]


def test_erasure_in_pages_resumes_where_it_stopped(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Out of time after some conversations: ``complete: false``; calling again finishes."""
    mine = [key_of(n, "acme") for n in range(1, 8)]
    for key in mine:
        seed(store, key, expires_at=None, turns=1)
    context = BudgetContext()
    clears = 0
    original = store.clear

    def clear_then_run_out(*args: Any, **kwargs: Any) -> Any:
        nonlocal clears
        clears += 1
        if clears == 3:
            context.remaining_ms = 0
        return original(*args, **kwargs)

    with mock.patch.object(store, "clear", side_effect=clear_then_run_out):
        first = sweeper(store, clock, context).erase("acme")
    assert not first.complete
    assert first.conversations_removed == 3
    assert sum(1 for key in mine if data_sort_keys(store, key)) == 4

    second = sweeper(store, clock, BudgetContext()).erase("acme")
    assert second.complete
    assert second.conversations_removed == 4
    for key in mine:
        assert_gone(store, key)


def test_clear_removes_s3_artifacts_at_once(store: ConversationStore, clock: FakeClock) -> None:
    """``DELETE /v1/conversations/{id}`` (the service's clear) leaves no object behind."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH + TTL, turns=3)
    assert len(blob_keys(store, key)) == 1
    service = Conversations(
        store=store, provider=DemoProvider(), settings=Settings(), clock=clock.now
    )
    edge.clear(service, Caller(tenant=key.tenant, actor="ada"), key.conversation_id)
    assert_gone(store, key)


# --- deadline ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left_ms", "margin_ms"), [(300_000, TIME_MARGIN_MS), (29_000, 7_250), (1_000, 250)]
)
def test_deadline_margin(left_ms: int, margin_ms: int) -> None:
    """10 s, or a quarter of the time left for short timeouts."""
    context = BudgetContext(left_ms)
    deadline = Deadline.of(context)
    assert deadline.margin_ms == margin_ms
    assert not deadline.reached()
    context.remaining_ms = margin_ms - 1
    assert deadline.reached()
    assert not Deadline.of(None).reached()


# --- the Lambda handler and the API route (DynamoDB on moto) -------------------------------


@pytest.fixture
def runtime(moto_store: DynamoDBConversationStore, clock: FakeClock) -> Iterator[Runtime]:
    """The process runtime the handlers use, over the moto store and the fake clock."""
    settings = Settings(table_name=moto_store.table_name)
    conversations = Conversations(
        store=moto_store, provider=DemoProvider(), settings=settings, clock=clock.now
    )
    installed = Runtime(
        settings=settings, conversations=conversations, store=moto_store, dynamodb=moto_store.client
    )
    set_runtime(installed)
    yield installed
    set_runtime(None)


@pytest.fixture
def context() -> LambdaContext:
    return LambdaContext(function_name="sweep", memory_limit_in_mb=512, timeout_seconds=300)


def test_handler_runs_the_scheduled_sweep(
    runtime: Runtime,
    context: LambdaContext,
    load_event: Callable[[str], dict[str, Any]],
) -> None:
    """The sample EventBridge event sweeps expired conversations and answers the report."""
    store = runtime.store
    expired, live = key_of(1), key_of(2)
    seed(store, expired, expires_at=EPOCH - HOUR)
    kept = seed(store, live, expires_at=EPOCH + HOUR)

    answer = lambda_handler(load_event("sweep-schedule"), context)

    assert answer["conversations_removed"] == 1
    assert answer["events_removed"] == 4
    assert answer["objects_removed"] == 1
    assert answer["complete"] is True
    assert answer["read_units"] >= 0
    assert answer["provider_state_deleted"] == 0
    assert set(answer) == {
        "conversations_removed",
        "events_removed",
        "objects_removed",
        "provider_state_deleted",
        "read_units",
        "complete",
        "waits_expired",
        "fork_lives_reclaimed",
        "contents_removed",
    }
    assert answer["waits_expired"] == 0
    assert_gone(store, expired)
    assert_intact(store, live, kept)


def test_handler_reclaims_ttl_stream_records(
    runtime: Runtime,
    context: LambdaContext,
    load_event: Callable[[str], dict[str, Any]],
) -> None:
    """The sample stream record (``T#acme#C#user-123``) reclaims that conversation's orphans."""
    store = runtime.store
    key = make_key(tenant="acme", conversation_id="user-123")
    seed(store, key, expires_at=EPOCH - 10)
    delete_raw_item(store, key, keys.HEAD_SK)
    event = load_event("sweep-ttl-stream")
    ignored = json.loads(json.dumps(event["Records"][0]))
    ignored["eventName"] = "MODIFY"
    event["Records"].append(ignored)

    answer = lambda_handler(event, context)

    assert (answer["events_removed"], answer["objects_removed"]) == (4, 1)
    assert_gone(store, key)


def test_handler_sweeps_a_list_of_ids(runtime: Runtime, context: LambdaContext) -> None:
    store = runtime.store
    listed, other = key_of(1), key_of(2)
    seed(store, listed, expires_at=EPOCH - 10)
    kept = seed(store, other, expires_at=EPOCH - 10)
    event = {"conversation_ids": [listed.conversation_id, "not a valid id!"], "tenant": "tenant-a"}

    answer = lambda_handler(event, context)

    assert answer["conversations_removed"] == 1
    assert_gone(store, listed)
    assert_intact(store, other, kept)


@pytest.mark.parametrize(
    "event",
    [
        {"detail-type": "Object Created", "source": "aws.s3"},
        {"conversation_ids": "conv-1", "tenant": "acme"},
        {"conversation_ids": ["conv-1"]},
    ],
)
@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_handler_refuses_other_events(
    runtime: Runtime, context: LambdaContext, event: dict[str, Any]
) -> None:
    with pytest.raises(InvalidRequest):
        lambda_handler(event, context)


def test_erase_tenant_route_answers_the_report(
    runtime: Runtime, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """``DELETE /v1/conversations`` erases the caller's tenant (``acme``) only."""
    from turnledger.api import lambda_handler as api_handler

    store = runtime.store
    mine = [key_of(n, "acme") for n in range(1, 4)]
    for key in mine:
        seed(store, key, expires_at=EPOCH + TTL)
    theirs = key_of(1, "globex")
    kept = seed(store, theirs, expires_at=EPOCH + TTL)
    api_context = LambdaContext(function_name="clear", memory_limit_in_mb=512, timeout_seconds=29)

    response = api_handler(load_event("erase-tenant"), api_context)

    assert response["statusCode"] == 200
    body = json.loads(response["body"])
    assert body == {
        "conversations_removed": 3,
        "events_removed": 12,
        "objects_removed": 3,
        "provider_state_deleted": 0,
        "read_units": body["read_units"],
        "complete": True,
        "waits_expired": 0,
        "fork_lives_reclaimed": 0,
    }
    for key in mine:
        assert_gone(store, key)
    assert_intact(store, theirs, kept)
    again = runtime.sweeper(api_context).erase("acme")
    assert (again.conversations_removed, again.complete) == (0, True)


def test_clear_route_removes_s3_artifacts(
    runtime: Runtime, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """``DELETE /v1/conversations/user-123`` as ``acme``: head, events and objects gone."""
    from turnledger.api import lambda_handler as api_handler

    store = runtime.store
    key = make_key(tenant="acme", conversation_id="user-123")
    seed(store, key, expires_at=EPOCH + TTL, turns=3)
    api_context = LambdaContext(function_name="clear", memory_limit_in_mb=512, timeout_seconds=29)

    response = api_handler(load_event("clear"), api_context)

    assert response["statusCode"] == 204
    assert_gone(store, key)


def test_refiling_a_head_stored_without_its_wait_deadline_files_its_wait(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A head stored before heads carried their wait deadline (no ``wait_deadline``, so no
    by-wait entry) that the sweep re-files gets the deadline its pending calls call for:
    the expiry pass then finds its decision window."""
    key = key_of(1)
    window = START + timedelta(hours=3)
    call = PendingCall.model_validate(
        {
            "id": "call_1",
            "name": "send_email",
            "arguments": {},
            "requires": "approval",
            "state": "awaiting_approval",
            "idempotency_key": "k1",
            "arguments_sha256": "0" * 64,
            "expires_at": window,
            "requested_at": START,
        }
    )
    commit_turn(
        store,
        key,
        None,
        ["q"],
        status=ConversationStatus.AWAITING_APPROVAL,
        pending=[call],
        ttl_seconds=5 * HOUR,
        expires_at=EPOCH + 5 * HOUR,
        expiry_bucket=EPOCH // HOUR - 1,  # filed under an hour that is due: re-filed
    )
    # As such a build stored it: its event item carries no head state (docs/STORAGE.md).
    (item,) = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key) if sk != "HEAD"]
    assert item is not None
    put_raw_item(store, {k: v for k, v in item.items() if k not in (codec.A_STATE, "ver")})
    bucket = keys.bucket_of(int(window.timestamp()))

    def waiting() -> set[ConversationKey]:
        return {k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(bucket, shard)}

    assert waiting() == set()
    sweeper(store, clock).expired()
    head = store.get_head(key)
    assert head is not None and head.filed_bucket == keys.bucket_of(EPOCH + 5 * HOUR)
    assert head.wait_deadline == window
    assert waiting() == {key}
