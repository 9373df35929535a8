"""One benchmark conversation: deterministic messages and replies, a controlled clock,
and the storage side of every turn measured through :class:`bench.metered.MeteredStore`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from turnledger.api import views
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationBusy
from turnledger.core.models import ConversationKey, Usage
from turnledger.core.observability import metrics
from turnledger.providers.base import ModelReply, ModelRequest, Provider
from turnledger.store.blobs import BlobStore
from turnledger.store.codec import A_BODY, Item
from turnledger.turn import longturns
from turnledger.turn.pipeline import Conversations

from bench.metered import LAYOUTS, Commit, MeteredStore
from bench.pricing import IndexSpec, item_size
from tests.support import edge
from tests.support.edge import Caller

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

USER_CHARS = 300
REPLY_CHARS = 700
TENANT = "bench"
#: The tenant of each layout's conversations: the same length, so the same conversation id
#: gives items of the same size on both (a byte can cross a unit's boundary).
LAYOUT_TENANTS = {"current": TENANT, "legacy": "basis"}
#: A conflict on a conversation nobody else writes would be a bug; it is counted and retried.
_ATTEMPTS = 3


#: The words of the bench's texts (:func:`text_of`).
WORDS = (
    "ledger", "turn", "state", "head", "event", "commit", "durable", "context", "window",
    "model", "reply", "user", "conversation", "storage", "partition", "query", "capacity",
    "append", "record", "offload", "payload", "tenant", "lambda", "table", "bucket",
    "version", "optimistic", "lock", "transaction", "sequence", "budget",
)  # fmt: skip


def text_of(seed: str, chars: int) -> str:
    """``chars`` characters of word-like text, the same for the same ``seed``."""
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[: chars - 1].rstrip().ljust(chars - 1, "x") + "."


class BenchProvider(Provider):
    """A model that answers every request with ``REPLY_CHARS`` characters, offline."""

    def complete(self, request: ModelRequest) -> ModelReply:
        last = request.messages[-1].content or ""
        reply = text_of(f"reply:{last}", REPLY_CHARS)
        words = sum(len((m.content or "").split()) for m in request.messages)
        return ModelReply(
            text=reply,
            usage=Usage(input_tokens=words, output_tokens=len(reply.split())),
            model=request.model,
        )


class BenchClock:
    """A clock that moves only when told.

    It starts half a second past the current hour, and a turn advances it one
    second, so a 1000-turn run stays within one hour: the expiry-index key (the
    hour the conversation expires in) moves only where a run asks for it.
    """

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(minute=0, second=0, microsecond=500_000)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead."""
        self.now += timedelta(seconds=seconds)


@dataclass(frozen=True)
class TurnSample:
    """The storage side of one turn."""

    turn: int
    reported_wcu: float
    reported_rcu: float
    read_calls: int
    write_calls: int
    priced_wcu: float
    #: The part of ``priced_wcu`` spent on index entries.
    priced_index_wcu: float
    priced_rcu: float
    items_read: int
    #: The largest ``Limit`` the turn's queries asked for.
    page_limit: int
    #: Stored events the model was sent (the messages minus this turn's user message).
    context_events: int
    storage_ms: float
    user_bytes: int
    assistant_bytes: int
    head_bytes: int
    #: The turn summarized older turns (it read them, and wrote a ``context_compacted``).
    compacted: bool = False
    #: Bytes of every transcript item (``E#...``) the turn put, and whether it put the head.
    transcript_bytes: int = 0
    head_written: bool = True


@dataclass
class Conversation:
    """One conversation driven by the benchmark, with its own store, clock and service."""

    conversation_id: str
    store: MeteredStore
    clock: BenchClock
    service: Conversations
    commits: list[Commit] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    conflicts: int = 0
    #: The newest summary's range end the last turn reported (a change: it compacted).
    summary_through: int | None = None
    tenant: str = TENANT

    @classmethod
    def open(
        cls,
        conversation_id: str,
        client: DynamoDBClient,
        blobs: BlobStore,
        settings: Settings,
        indexes: Sequence[IndexSpec],
        *,
        layout: str = "current",
    ) -> Conversation:
        """A fresh conversation in ``settings.table_name``, stored by ``layout`` (a key of
        :data:`bench.metered.LAYOUTS`: ``legacy`` is the layout before issue 21)."""
        store = LAYOUTS[layout](client, settings.table_name, blobs, indexes)
        clock = BenchClock()
        service = Conversations(
            store=store, provider=BenchProvider(), settings=settings, clock=clock
        )
        return cls(conversation_id, store, clock, service, tenant=LAYOUT_TENANTS[layout])

    def turn(
        self, number: int, *, gap_seconds: float = 1.0, through_drafts: bool = False
    ) -> TurnSample:
        """Run turn ``number``, ``gap_seconds`` after the previous one; measure its storage.

        ``through_drafts``: run it as ``POST .../turns`` does (without an idempotency key):
        :func:`turnledger.turn.longturns.run_synchronously`, which writes the turn's draft
        when ``SYNC_TURN_DRAFTS`` is on (the default); otherwise ``Conversations.turn``.
        A ``conversation_busy`` is counted and the turn retried.

        Raises:
            ConversationBusy: every attempt conflicted.
        """
        self.clock.advance(gap_seconds)
        text = text_of(f"user:{self.conversation_id}:{number}", USER_CHARS)
        for attempt in range(_ATTEMPTS):
            before = self.store.meter.snapshot()
            work = self.store.begin()
            caller = Caller(tenant=self.tenant, actor="bench-user")
            try:
                if through_drafts:
                    command = views.turn_command(TurnRequest(input=text), None)
                    key = caller.key(self.conversation_id)
                    result = longturns.run_synchronously(self.service, key, caller.actor, command)
                    response = views.turn_response(result)
                else:
                    response = edge.turn(
                        self.service, caller, self.conversation_id, TurnRequest(input=text)
                    )
                break
            except ConversationBusy:
                self.conflicts += 1
                if attempt == _ATTEMPTS - 1:
                    raise
        # A Lambda invocation flushes its metrics; here they would pile up and print.
        metrics.clear_metrics()
        used = self.store.meter.since(before)
        self.sent.append(text)
        self.commits.extend(work.commits)
        events = [item for commit in work.commits for item in commit.events]
        heads = [commit.head for commit in work.commits if commit.head is not None]
        sizes = {_kind(item): item_size(item) for item in events}
        summary = response.context.summary_through
        compacted = summary is not None and summary != self.summary_through
        self.summary_through = summary
        return TurnSample(
            turn=response.turn,
            reported_wcu=used.write_units,
            reported_rcu=used.read_units,
            # Round trips as sent on the wire (every request, whichever store method sent it).
            read_calls=work.read_requests,
            write_calls=work.write_requests,
            priced_wcu=work.priced_wcu,
            priced_index_wcu=work.priced_index_wcu,
            priced_rcu=work.priced_rcu,
            items_read=work.items_read,
            page_limit=max(work.query_limits, default=0),
            context_events=response.context.messages_sent - 1,
            storage_ms=work.seconds * 1000,
            user_bytes=sizes.get("user_message", 0),
            assistant_bytes=sizes.get("assistant_message", 0),
            head_bytes=item_size(heads[-1]) if heads else 0,
            compacted=compacted,
            transcript_bytes=sum(item_size(item) for item in events),
            head_written=bool(heads),
        )

    def is_intact(self) -> bool:
        """True when the stored transcript is exactly this conversation's turns, in order."""
        key = ConversationKey(tenant=self.tenant, conversation_id=self.conversation_id)
        head = self.store.get_head(key)
        turns = len(self.sent)
        if head is None or head.turn != turns:
            return False
        events = self.store.read_events(key, head, after=0, limit=head.event_count)
        # Summaries (context_compacted) come on top of the turns' two events each.
        turn_events = [e for e in events if e.kind in ("user_message", "assistant_message")]
        users = [e.payload["content"] for e in events if e.kind == "user_message"]
        return (
            len(turn_events) == 2 * turns
            and users == self.sent
            and all(e.conversation_id == self.conversation_id for e in events)
        )


def _kind(item: Item) -> str:
    """The event kind of a legacy event item; ``turn`` for an item holding several events,
    ``sealed`` for one whose body is sealed (bench/crypto.py)."""
    if isinstance(item[A_BODY], bytes):
        return "sealed"
    body = json.loads(item[A_BODY])
    return str(body["kind"]) if isinstance(body, dict) and "kind" in body else "turn"
