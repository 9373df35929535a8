"""Expiry and erasure: nothing of an expired, TTL-removed or erased conversation remains.

The sweep function's three events (a schedule, a list of ids, TTL deletions; its entry
point is :mod:`turnledger.handlers`) and tenant erasure share one :class:`Sweeper`, which
the composition root builds (:meth:`~turnledger.runtime.Runtime.sweeper`); each answers a
:class:`~turnledger.turn.results.SweepReport` (what it removed and the read units it spent).

**The scheduled sweep** (EventBridge, hourly by default) first does the due work of
conversations nobody touches: the heads the ``by-wait`` index files under the hours from
its own cursor up to now (the hour of a head's next due work: its earliest wait's
deadline or its retained content's due time) get the approvals whose window closed
recorded by the service (``Conversations.expire_waits``, which the composition root hands
the sweeper), so they leave the approval inbox, and the content their class's retention
no longer keeps removed (:func:`turnledger.ops.retention.retain_due`), the head then filed
under its next due time. It then finds expired heads
through the sparse ``by-expiry`` index, never a scan: a head that can expire
carries ``xb = "<bucket>#<shard>"`` (:func:`turnledger.store.keys.expiry_bucket`), the hour
it is filed under, so one hour's expiries are :data:`~turnledger.store.keys.EXPIRY_SHARDS`
small queries. A turn keeps a head's bucket while it is ahead of the sweep, so
a live head may sit in a bucket before its expiry: the sweep passing it re-files
it under the hour it is now due (:meth:`~turnledger.store.base.ConversationStore.refile`). The
sweep walks buckets from its cursor up to the current one (inclusive) and, for
each candidate, reads the head consistently (the index lags) and purges it only
if it is expired at the sweep's ``now``, conditionally on the version it read
(:meth:`~turnledger.store.base.ConversationStore.purge_if_unchanged`): a conversation that
got a turn after it was selected survives whole, and of two sweeps racing on
one conversation exactly one counts it. The cost grows with the number of
buckets walked and of heads in them, not with the table.

* Cursors (:meth:`~turnledger.store.base.ConversationStore.read_sweep_cursor`), one per
  pass: the first bucket not yet fully swept. A cursor
  moves past a bucket only once every candidate in it was handled and the
  bucket ended :data:`INDEX_SETTLE_SECONDS` ago (so the index has caught up
  with heads written just before it ended), and only forward: concurrent
  sweeps are fine. Without a cursor (first run) the expiry pass starts
  :data:`SWEEP_LOOKBACK_BUCKETS` (7 days) back, anything older left to DynamoDB's TTL
  and the stream below; the pass over due work reads :data:`WAIT_LOOKBACK_BUCKETS` (48 hours)
  back at most.
* Time budget: the sweep stops when the Lambda has less than its margin left
  (:class:`Deadline`) and reports ``complete: false``; the next run resumes at
  the cursor. A conversation that fails is logged, keeps the cursor at its
  bucket and is retried by the next run.
* Tombstones (a purge in flight) found by the scheduled sweep are left to the
  purge that wrote them: finishing them too would count their events twice. A
  tombstone's expiry is due at once, so if its purge died, DynamoDB's TTL removes
  it and the stream below reclaims the rest.
  Heads too damaged to decode whose raw ``expires_at`` has passed are cleared
  (``clear`` recovers them) and logged, and so are expired heads left fenced by
  a clear that died (``clear`` adopts the fence and finishes).

**On demand** (``{"conversation_ids": [...], "tenant": "..."}``, and
``POST /_local/sweep`` with a body) does the same for only these conversations:
their expired waits recorded, their content past its retention removed, expired ones
purged, live ones otherwise untouched, tombstones finished.

**TTL deletions** (``{"Records": [...]}`` from the table's stream). DynamoDB's
native TTL stays on as the backstop, and it deletes heads on its own. The
stream was chosen over the sweep for those because once TTL removes a head,
its index entries (``xb``, ``tn``) vanish with it: only a table scan could
find the events and S3 objects left behind, and scans are what the design
rules out. The stream hands over the key of exactly each removed head, at a
cost that grows with what TTL removed; template.yaml filters it to TTL
removals of heads (``userIdentity`` ``dynamodb.amazonaws.com``, ``sk = HEAD``)
and makes it ``KEYS_ONLY``, so no content leaves the table. A failing batch is
retried and bisected, then named in the SQS dead-letter queue.

Reclaiming must stay safe against a turn that starts a new life of the same
conversation meanwhile (over no head, with a fresh ``gen``), so it deletes by
life, never by range (:meth:`Sweeper.reclaim`):

1. read the head (``before``), the event items' stamps (sort key and ``g``)
   and the conversation's S3 keys, then the head again (``after``); if the
   head changed, start over;
2. no head: the dead lives are the ``g`` values of the event items found; their
   objects are deleted by prefix, then each event item with a condition on the
   ``g`` it was read with, so an item a new life overwrote meanwhile survives;
3. a live head of life ``G``: every object outside ``G``'s prefix and every
   event item whose ``g`` is not ``G`` is dead (a life's ``gen`` is never
   reused, and no other life can start while ``G``'s head stands); event items
   are deleted on the same ``g`` condition;
4. a tombstone: that purge is finished (the tombstone read, never a new life
   that replaced it meanwhile).

Objects go before event items, so an interrupted reclaim leaves the items that
name the dead life for the next attempt.

**Forks** (:mod:`turnledger.store.forks`): every purge and reclaim keeps the events (and
their objects) that forks of a deleted life still read, and releases the references of the
forks it deletes; a parent's life that no fork reads any more is then deleted too, up the
lineage. Reports count such lives in ``fork_lives_reclaimed``.

**Tenant erasure** (``DELETE /v1/conversations``) pages through the
``by-tenant`` index and clears each conversation (head, events, every other
item of its partition, objects; a clear wins against turns committing
meanwhile, see the fence in :mod:`turnledger.store.base`) until the time budget runs
out, answering ``complete: false`` then; the caller calls again. What was
erased is gone from the index, so the next call resumes naturally (a lagging
index only makes it re-read a few absent heads). A turn that starts a
conversation while erasure runs may survive it: erasure removes what existed
when it reached each conversation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ..core.exceptions import ConversationBusy, InvalidConversationId, StateError
from ..core.models import ConversationKey, ConversationStatus, validate_conversation_id
from ..core.observability import logger
from ..store import codec, forks, keys, purge
from ..store.base import CapacityMeter, ConversationStore, PurgeReport
from ..store.codec import Item
from ..store.indexes import EventStamp, SweepPass
from ..store.memories import memory_users
from ..turn import lifecycle
from ..turn.results import SweepReport
from ..turn.session import Clock

if TYPE_CHECKING:
    from ..context.policy import DataPolicy

#: Where the first run (no cursor yet) starts: one week of expiry buckets back.
SWEEP_LOOKBACK_BUCKETS = 7 * 24 * 3600 // keys.EXPIRY_BUCKET_SECONDS
#: How long after a bucket ends before the cursor may move past it (index lag).
INDEX_SETTLE_SECONDS = 60
#: Stop with this much of the invocation left (at most; see :class:`Deadline`).
TIME_MARGIN_MS = 10_000
#: ...or with this fraction of it left, whichever is less, for short timeouts.
TIME_MARGIN_FRACTION = 0.25
#: Times a reclaim re-reads a conversation whose head keeps changing under it.
RECLAIM_ATTEMPTS = 5
#: Hours of ``by-wait`` buckets the pass over due work reads back from the current one at
#: most (from its cursor when that is later: the first run, or one whose cursor a failing
#: conversation held for this long). A head leaves a bucket once its expired calls are
#: recorded and its due content removed (it is filed under its next due time, or nowhere),
#: so only the failures of earlier passes sit further back; past this, the conversation's
#: own TTL (never shorter than its approval windows) ends it, and the next request on it
#: records the expiry; the sweep run for it by name removes its due content.
WAIT_LOOKBACK_BUCKETS = 48


class RemainingTime(Protocol):
    """What the sweep needs of a Lambda context."""

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds before the invocation is stopped."""
        ...


@dataclass(frozen=True)
class Deadline:
    """When to stop: the context's remaining time falls below ``margin_ms``."""

    context: RemainingTime | None
    margin_ms: int = 0

    @classmethod
    def of(cls, context: RemainingTime | None) -> Deadline:
        """The deadline of an invocation (``None``: no limit, for local calls and tests).

        The margin is :data:`TIME_MARGIN_MS`, or :data:`TIME_MARGIN_FRACTION` of the
        time left now when that is less (an API function has 29 s, not 300).
        """
        if context is None:
            return cls(None)
        left = context.get_remaining_time_in_millis()
        return cls(context, min(TIME_MARGIN_MS, math.ceil(left * TIME_MARGIN_FRACTION)))

    def reached(self) -> bool:
        """True when the work must stop now."""
        return (
            self.context is not None
            and self.context.get_remaining_time_in_millis() < self.margin_ms
        )


@dataclass
class _Run:
    """What one run removed, whether it finished, and where its reads started."""

    sweeper: Sweeper
    removed: PurgeReport = field(default_factory=PurgeReport)
    complete: bool = True
    #: Calls whose approval window closed, recorded by the pass over due work.
    waits_expired: int = 0
    #: Events whose content the class's retention removed.
    contents_removed: int = 0
    start: CapacityMeter = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.sweeper.store.meter.snapshot()

    def report(self) -> SweepReport:
        """The report: counts removed, read units spent since the run began."""
        spent = self.sweeper.store.meter.since(self.start)
        forget = self.sweeper.forget
        deleted = forget(self.removed.provider_responses) if forget is not None else 0
        return SweepReport(
            conversations_removed=self.removed.conversations,
            events_removed=self.removed.events,
            objects_removed=self.removed.objects,
            provider_state_deleted=deleted,
            read_units=spent.read_units,
            complete=self.complete,
            waits_expired=self.waits_expired,
            contents_removed=self.contents_removed,
            fork_lives_reclaimed=self.removed.reclaimed_lives,
        )


class _Action(Protocol):
    def __call__(self, key: ConversationKey, /) -> PurgeReport: ...


def _identity(item: Item | None) -> tuple[Any, Any] | None:
    # Every head write changes its version, and a new life's body names another gen.
    return None if item is None else (item.get(codec.A_VERSION), item.get(codec.A_BODY))


class Sweeper:
    """Sweeps, reclaims and erases conversations of one store, through its public interface.

    Args:
        store: the conversations (any backend: the index and cursor operations are
            the store's own).
        clock: the current time (injected in tests).
        deadline: when to stop (:meth:`Deadline.of` the Lambda context).
        forget: deletes provider-side state the purged heads knew of (best effort);
            returns how many responses were deleted.
    """

    def __init__(
        self,
        store: ConversationStore,
        *,
        clock: Clock,
        deadline: Deadline | None = None,
        forget: Callable[[list[tuple[str, str]]], int] | None = None,
        expire_waits: Callable[[ConversationKey], list[str]] | None = None,
        policy_of: Callable[[str], DataPolicy | None] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.deadline = deadline or Deadline(None)
        self.forget = forget
        #: Records the expired waits of one conversation (``Conversations.expire_waits``).
        self.expire_waits = expire_waits
        #: A tenant's data policy: its classes' retention (:mod:`turnledger.ops.retention`).
        self.policy_of = policy_of

    # --- the scheduled sweep ------------------------------------------------------------

    def expired(self) -> SweepReport:
        """Do the due work ``by-wait`` lists (record the approvals whose window closed,
        remove the content whose class's retention is due), then purge every expired
        conversation the expiry index lists, each pass from its own cursor on."""
        run = _Run(self)
        now = self.clock()
        if self.expire_waits is not None or self.policy_of is not None:
            self._walk(
                "waits",
                now,
                WAIT_LOOKBACK_BUCKETS,
                lambda b: self._sweep_due(b, now, run),
                bounded=True,
            )
        self._walk("expiry", now, SWEEP_LOOKBACK_BUCKETS, lambda b: self._sweep_bucket(b, now, run))
        return run.report()

    def _walk(
        self,
        of: SweepPass,
        now: datetime,
        lookback: int,
        sweep: Callable[[int], bool],
        *,
        bounded: bool = False,
    ) -> None:
        """Run ``sweep`` on each bucket of the pass ``of``, from its cursor to the current
        bucket, and move the cursor past a bucket once ``sweep`` handled every candidate in
        it and it ended :data:`INDEX_SETTLE_SECONDS` ago. Without a cursor the walk starts
        ``lookback`` buckets back; ``bounded``: never further back, even from a cursor a
        failing conversation held there (the pass over due work), else from wherever the
        cursor is (the expiry pass). Stops at the deadline."""
        epoch = int(now.timestamp())
        current = epoch // keys.EXPIRY_BUCKET_SECONDS
        settled = (epoch - INDEX_SETTLE_SECONDS) // keys.EXPIRY_BUCKET_SECONDS
        oldest = current - lookback
        cursor = self.store.read_sweep_cursor(of)
        first = oldest if cursor is None else cursor
        if bounded:
            first = max(first, oldest)
        may_advance = True
        for bucket in range(first, current + 1):
            handled = sweep(bucket)
            may_advance = may_advance and handled and bucket < settled
            if may_advance:
                self.store.advance_sweep_cursor(bucket + 1, of)
            if not handled and self.deadline.reached():
                return

    def _sweep_bucket(self, bucket: int, now: datetime, run: _Run) -> bool:
        """Sweep one bucket's shards; True when every candidate in it was handled."""
        handled = True
        for shard in range(keys.EXPIRY_SHARDS):
            if self.deadline.reached():
                run.complete = False
                return False
            candidates = self.store.expiring_in(bucket, shard)
            if not self._each(candidates, run, lambda k: self._sweep_one(k, now, False)):
                handled = False
        return handled

    def _sweep_due(self, bucket: int, now: datetime, run: _Run) -> bool:
        """The pass over due work on one ``by-wait`` bucket: every conversation filed there
        (its earliest decision window closes, or its retained content falls due, in that
        hour) gets ``approval_expired``, its rejections and the model's error results
        recorded (and leaves the approval inbox), and the content its class's retention
        no longer keeps removed (:func:`turnledger.ops.retention.retain_due`), though nobody
        touches it; True when every one was handled.

        :meth:`_walk` runs it from the pass's own cursor. Due work is filed under its hour,
        never before the current one, so it is never behind the cursor; a run at steady
        state reads the current bucket or two, not the whole look-back.
        """
        handled = True
        for shard in range(keys.EXPIRY_SHARDS):
            if self.deadline.reached():
                run.complete = False
                return False
            for key in self.store.due_in(bucket, shard):
                handled = self._expire_waits_of(key, run) and handled
                handled = self._retain_due(key, now, run) and handled
        return handled

    def _retain_due(self, key: ConversationKey, now: datetime, run: _Run) -> bool:
        """Remove ``key``'s content whose class's retention is due (nothing when none is);
        whether it was handled (``False``: it failed: a later run retries)."""
        if self.policy_of is None:
            return True
        # Imported here: only a sweep of a deployment with a policy needs it.
        from .retention import retain_due

        try:
            removal = retain_due(self.store, key, self.policy_of, now)
        except Exception:
            # One conversation must not stop the pass; the next run retries it.
            logger.exception(
                "could not remove content whose retention is due",
                extra={"tenant": key.tenant, "conversation_id": key.conversation_id},
            )
            return False
        run.contents_removed += len(removal.sequences)
        return not removal.skipped

    def _expire_waits_of(self, key: ConversationKey, run: _Run) -> bool:
        """The waits' work of the pass over due work on one conversation (nothing when
        none is due); whether it was handled (``False``: a request held it, or it failed:
        a later run retries)."""
        if self.expire_waits is None:
            return True
        try:
            run.waits_expired += len(self.expire_waits(key))
        except ConversationBusy:
            return False  # a request got there first: it records the expiry itself
        except Exception:
            # One conversation must not stop the pass; the next run retries it.
            logger.exception(
                "could not record expired approvals",
                extra={"tenant": key.tenant, "conversation_id": key.conversation_id},
            )
            return False
        return True

    # --- on demand ----------------------------------------------------------------------

    def conversations(self, wanted: Iterable[ConversationKey]) -> SweepReport:
        """Sweep only ``wanted``, doing for each what the scheduled sweep does: record
        the waits whose window closed, then purge it if expired (tombstones are
        finished, live conversations kept)."""
        run = _Run(self)
        now = self.clock()

        def sweep(key: ConversationKey) -> PurgeReport:
            self._expire_waits_of(key, run)
            if self.policy_of is not None:
                # Imported here: only a sweep on demand of a deployment with a policy needs it.
                from .retention import retain

                run.contents_removed += len(retain(self.store, key, self.policy_of, now).sequences)
            return self._sweep_one(key, now, True)

        self._each(iter(wanted), run, sweep)
        return run.report()

    def _sweep_one(
        self, key: ConversationKey, now: datetime, finish_tombstones: bool
    ) -> PurgeReport:
        item = self.store.head_item(key)
        if item is None:
            return PurgeReport()  # purged already, removed by TTL, or never there
        expires = item.get(codec.A_EXPIRES)
        expired = isinstance(expires, int) and now.timestamp() >= expires
        if codec.A_FENCE in item:
            # A clear is in flight, or died after fencing: it wins; once expired, finish it.
            return self.store.clear(key, now) if expired else PurgeReport()
        try:
            # No content is read here (the head state's is left sealed): the sweep works
            # on heads whose keys an erasure destroyed too (restored from a backup).
            head = codec.decode_head(codec.without_content(item))
        except StateError as exc:
            if expired:
                logger.warning(
                    "clearing an expired head that cannot be read",
                    extra={
                        "tenant": key.tenant,
                        "conversation_id": key.conversation_id,
                        "code": exc.code,
                    },
                )
                return self.store.clear(key, now)
            return PurgeReport()
        if head.status is ConversationStatus.CLEARED:
            # Finish this tombstone, not whatever clear() would read next: a new life
            # may replace it at any moment and must not be purged.
            finished = self.store.purge_if_unchanged(key, head, now) if finish_tombstones else None
            return finished or PurgeReport()
        # The effective head (HEAD and the newest turn item: docs/STORAGE.md): its expiry is
        # exact, where HEAD's TTL is the end of its hour bucket.
        effective = self.store.get_head(key, content=False)
        if effective is None or effective.gen != head.gen:
            return PurgeReport()  # gone, or another life began since
        head = effective
        if not head.is_expired(now):
            if head.expires_at is not None and head.filed_bucket < keys.bucket_of(head.expires_at):
                # In use since it was filed: move it to the bucket it is now due in, or
                # the cursor would pass it by.
                # With its wait deadline as the turn rules compute it: a head stored
                # before heads carried one keeps its place on the by-wait index.
                deadline = lifecycle.wait_deadline(head.pending)
                self.store.refile(key, head.model_copy(update={"wait_deadline": deadline}))
            return PurgeReport()
        # None: a turn (or another sweep) changed the head since it was read.
        return self.store.purge_if_unchanged(key, head, now) or PurgeReport()

    # --- TTL deletions ------------------------------------------------------------------

    def reclaim(self, removed: Iterable[ConversationKey]) -> SweepReport:
        """Delete what TTL left behind of ``removed`` conversations (see the module doc).

        Counts a conversation when its head is gone and this call deleted some of it.
        """
        run = _Run(self)
        now = self.clock()
        self._each(iter(removed), run, lambda k: self._reclaim_one(k, now))
        return run.report()

    def _reclaim_one(self, key: ConversationKey, now: datetime) -> PurgeReport:
        for _ in range(RECLAIM_ATTEMPTS):
            before = self.store.head_item(key)
            live_gen: str | None = None
            if before is not None:
                try:
                    head = codec.decode_head(codec.without_content(before))
                except StateError as exc:
                    # Its life is unknown, so nothing can be told dead; DELETE recovers it.
                    logger.warning(
                        "orphans left: the conversation's head cannot be read",
                        extra={
                            "tenant": key.tenant,
                            "conversation_id": key.conversation_id,
                            "code": exc.code,
                        },
                    )
                    return PurgeReport()
                if head.status is ConversationStatus.CLEARED:
                    return self.store.purge_if_unchanged(key, head, now) or PurgeReport()
                live_gen = head.gen
            # What forks still read stays (store/forks.py), whichever life wrote it.
            kept = purge.retention(self.store, key)
            if before is None and kept:
                # With no head, a new life would start below what forks read: a clear keeps
                # a tombstone above it and deletes the rest, as a purge does.
                return self.store.clear(key, now)
            stamps = [
                s
                for s in self.store.event_stamps(key)
                if (s.gen is None or s.gen != live_gen)
                and not forks.reads(kept, s.gen, keys.sequence_of(s.sort_key))
            ]
            if live_gen is not None:
                listed = keys.blob_prefix(key)
                dead = [
                    k
                    for k in self.store.blobs.list_keys(listed)
                    if not k.startswith(keys.blob_prefix(key, live_gen))
                ]
            else:
                # Only lives whose event items were seen are known dead: a brand-new life
                # writes its objects before its first commit, under a gen nobody has seen.
                gens = sorted({s.gen for s in stamps if s.gen is not None} | kept.keys())
                dead = [
                    k
                    for gen in gens
                    for k in self.store.blobs.list_keys(keys.blob_prefix(key, gen))
                ]
            objects = [k for k in dead if not forks.object_read(key, k, kept)]
            if _identity(self.store.head_item(key)) != _identity(before):
                continue
            report = self._delete_dead(key, stamps, objects, head_gone=before is None)
            report += purge.release_forks(self.store, key, live_gen=live_gen, kept=kept)
            return report
        raise ConversationBusy("the conversation kept changing while its orphans were reclaimed")

    def _delete_dead(
        self, key: ConversationKey, stamps: list[EventStamp], objects: list[str], head_gone: bool
    ) -> PurgeReport:
        report = PurgeReport()
        report.objects += self.store.blobs.delete_keys(objects)
        report.events = sum(s.events for s in stamps if self.store.delete_event(key, s))
        report.conversations = 1 if head_gone and report.events else 0
        return report

    # --- tenant erasure -----------------------------------------------------------------

    def erase(self, tenant: str, clear_with: ConversationStore | None = None) -> SweepReport:
        """Destroy ``tenant``'s key (with a keyring), then clear every conversation of
        ``tenant``, in index order, until the deadline; once
        all are, every user's memory partition (:mod:`turnledger.store.memories`, found
        through the users filed in the tenant's own partition), then the tenant's own side
        items (:func:`~turnledger.store.keys.tenant_items`).

        The conversations are listed on this store (the ``by-tenant`` index) and cleared
        through ``clear_with`` (default: this store): the API passes the tenant's own
        store, so its function needs no item access beyond the tenant's partitions.
        """
        run = _Run(self)
        now = self.clock()
        target = self.store if clear_with is None else clear_with
        start = target.meter.snapshot()
        # Keys first (issue 24): with the tenant key gone (and the tenant's own KMS key
        # scheduled for deletion), every copy of its content, backups included, is
        # ciphertext before the first item is deleted.
        scheduled = target.sealer.destroy_tenant(tenant)
        if scheduled is not None:
            logger.info(
                "tenant KMS key scheduled for deletion", extra={"tenant": tenant, "key": scheduled}
            )
        if self._each(self.store.of_tenant(tenant), run, lambda k: target.clear(k, now)):
            for user in memory_users(target, tenant):
                if self.deadline.reached():
                    run.complete = False
                    break
                target.clear(keys.memory_items(tenant, user), now)
            else:
                # Last: the users filed here are how a later call finds what is left.
                target.clear(keys.tenant_items(tenant), now)
        report = run.report()
        if target is self.store:
            return report
        # The clears read through the tenant's store: its units count too.
        spent = target.meter.since(start).read_units
        return replace(report, read_units=report.read_units + spent)

    # --- shared -------------------------------------------------------------------------

    def _each(
        self,
        candidates: Iterator[ConversationKey],
        run: _Run,
        action: _Action,
    ) -> bool:
        """Apply ``action`` to each candidate until the deadline; True when all were handled.

        A failing conversation is logged and skipped: one bad item must not stop
        the rest. It makes the run incomplete, so it is tried again.
        """
        handled = True
        for key in candidates:
            if self.deadline.reached():
                run.complete = False
                return False
            try:
                run.removed += action(key)
            except Exception:
                logger.exception(
                    "could not purge a conversation",
                    extra={"tenant": key.tenant, "conversation_id": key.conversation_id},
                )
                run.complete = False
                handled = False
        return handled


class SweepRequest(BaseModel):
    """The on-demand event: sweep only these conversations of one tenant."""

    model_config = ConfigDict(extra="forbid")

    conversation_ids: list[str] = Field(max_length=10_000)
    tenant: str = Field(min_length=1)

    def conversation_keys(self) -> list[ConversationKey]:
        """The keys of the valid ids (an invalid id cannot name a stored conversation)."""
        found: list[ConversationKey] = []
        for conversation_id in dict.fromkeys(self.conversation_ids):
            try:
                validate_conversation_id(conversation_id)
            except InvalidConversationId as exc:
                logger.warning("skipping an invalid conversation id", extra={"code": exc.code})
                continue
            found.append(ConversationKey(tenant=self.tenant, conversation_id=conversation_id))
        return found


class _StreamChange(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Keys: dict[str, dict[str, Any]]


class _StreamRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    eventName: str
    dynamodb: _StreamChange

    def removed_conversation(self) -> ConversationKey | None:
        """The conversation whose head this record removed, if it is such a record."""
        pk = self.dynamodb.Keys.get(codec.A_PK, {}).get("S")
        sk = self.dynamodb.Keys.get(codec.A_SK, {}).get("S")
        if self.eventName != "REMOVE" or sk != keys.HEAD_SK or not isinstance(pk, str):
            return None
        try:
            return keys.parse_partition_key(pk)
        except ValueError:
            return None


class StreamBatch(BaseModel):
    """A batch of DynamoDB stream records (template.yaml passes TTL removals of heads)."""

    model_config = ConfigDict(extra="ignore")

    Records: list[_StreamRecord]

    def removed_conversations(self) -> list[ConversationKey]:
        """The conversations whose heads the batch removed, each once, in order."""
        found = (record.removed_conversation() for record in self.Records)
        return list(dict.fromkeys(k for k in found if k is not None))


class SweepIncomplete(Exception):
    """A stream batch was not fully reclaimed; raising makes Lambda retry it (idempotent)."""
