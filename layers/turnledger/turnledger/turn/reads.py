"""The read side of the service: a conversation's head, transcript and forks, and its clear.

:class:`Reads` answers the read routes (and the clear) from the store alone: it imports
no provider, tool or turn pipeline, so the functions that only read or clear
(``functions/read``, ``functions/clear``) load none at init
(``tests/unit/test_cold_import.py``). :class:`~turnledger.turn.pipeline.Conversations`,
the whole service, extends it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ..core.config import Settings
from ..core.exceptions import ConversationNotFound
from ..core.models import ConversationKey, Head
from ..store.base import ConversationStore, PurgeReport
from ..store.forks import fork_refs
from .lifecycle import awaiting as open_waits
from .lifecycle import lapsed, public_status, waiting
from .results import ConversationState, EventPage, ForkEntry, ForkPage, ForkParent
from .session import Clock, utc_now

#: Deletes stored provider responses (``(provider, response id)`` pairs), best effort;
#: returns how many were deleted.
Forget = Callable[[list[tuple[str, str]]], int]


class Reads:
    """Reads (and the clear) of one store; domain results out."""

    def __init__(
        self,
        *,
        store: ConversationStore,
        settings: Settings,
        clock: Clock = utc_now,
        forget: Forget | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self._forget = forget

    def forget_provider_state(self, responses: list[tuple[str, str]]) -> int:
        """Delete stored provider responses, best effort, with the ``forget`` this was built
        with (none: nothing is deleted); returns how many were deleted."""
        return self._forget(responses) if self._forget is not None and responses else 0

    def get(self, key: ConversationKey) -> ConversationState:
        """The head (``GET /v1/conversations/{id}``).

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
        """
        head = self._visible_head(key)
        now = self.clock()
        # A read writes nothing: what is due shows as expired at once, and the next
        # request (or the sweep's pass, ``Conversations.expire_waits``) records it.
        open_calls = [p for p in head.pending if not lapsed(p, now)]
        return ConversationState(
            conversation_id=key.conversation_id,
            # The head shows a turn whose tools are running as such; a turn's answer
            # reports it complete (the request that ran them is over).
            status=public_status(head, now),
            turns=head.turn,
            events=head.event_count,
            created_at=head.created_at,
            updated_at=head.updated_at,
            expires_at=datetime.fromtimestamp(head.expires_at, tz=head.created_at.tzinfo)
            if head.expires_at is not None
            else None,
            ttl_seconds=head.ttl_seconds,
            waiting=waiting(open_calls),
            usage=head.usage,
            cost_usd=round(head.cost_usd, 6),
            failed_turns=head.failed_turns,
            summary_through=head.summary.through if head.summary else None,
            awaiting=open_waits(open_calls),
            expired=waiting([p for p in head.pending if lapsed(p, now)]),
            parent=ForkParent(
                conversation_id=head.fork.conversation_id, turn=head.fork.turn, seq=head.fork.seq
            )
            if head.fork is not None
            else None,
            forks=self.store.fork_count(key, head),
            data_class=head.data_class,
        )

    def forks(self, key: ConversationKey, *, after: str | None, limit: int) -> ForkPage:
        """A page of the live forks of ``key``, by fork id (``GET .../forks``).

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
        """
        head = self._visible_head(key)
        refs, more = fork_refs(self.store, key, head, after=after, limit=limit)
        return ForkPage(
            conversation_id=key.conversation_id,
            forks=[
                ForkEntry(
                    conversation_id=ref.fork_id,
                    turn=ref.turn,
                    seq=ref.seq,
                    created_at=ref.created_at,
                )
                for ref in refs
            ],
            next_after=refs[-1].fork_id if more and refs else None,
        )

    def events(self, key: ConversationKey, *, after: int, limit: int) -> EventPage:
        """A page of the transcript (``GET .../events``).

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
        """
        head = self._visible_head(key)
        events = self.store.read_events(key, head, after=after, limit=limit)
        last = events[-1].sequence if events else after
        return EventPage(
            conversation_id=key.conversation_id,
            events=events,
            next_after=last if last < head.event_count else None,
            gen=head.gen,
        )

    def clear(self, key: ConversationKey) -> PurgeReport:
        """Delete the conversation, its events and its objects (``DELETE``); absent is fine.

        Provider-side state the conversation knew of is deleted too, best effort
        (:meth:`forget_provider_state`).
        """
        report = self.store.clear(key, self.clock())
        self.forget_provider_state(report.provider_responses)
        return report

    def token_secret(self, key: ConversationKey, gen: str, *, create: bool = False) -> bytes:
        """The key the tokens of ``key``'s life ``gen`` are made with
        (:func:`turnledger.context.tokens.token_secret`; ``create``: a write's, which makes
        the life's data key when there is none yet).

        Raises:
            ContentUnreadable: the life's data key is gone (erased), ``create`` false.
        """
        # Imported here: only a conversation under a data policy's detectors needs them.
        from ..context.tokens import token_secret
        from .callbacks import signing_key

        return token_secret(
            self.store.sealer.keyring, key, gen, create=create, deployment=signing_key
        )

    def visible_head(self, key: ConversationKey) -> Head:
        """The head a reader may see (:meth:`_visible_head`)."""
        return self._visible_head(key)

    def _visible_head(self, key: ConversationKey) -> Head:
        head = self.store.get_head(key)
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        return head
