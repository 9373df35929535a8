"""The memory step of a turn: recall the user's records (and read the user's pins with
them, :mod:`turnledger.store.user_pins`) into its context, extract the
facts the user stated once the model answered, write them after the commit
(:mod:`turnledger.context.memory`, :mod:`turnledger.store.memories`).

Mixed into the service; a failure here never fails a turn.
"""

from __future__ import annotations

from ..context.assembly import Estimator
from ..context.memory import (
    Provenance,
    Recall,
    extraction_request,
    parse_facts,
    plan_writes,
    rank,
    recall_block,
)
from ..core import deadline, telemetry
from ..core.exceptions import ProviderError
from ..core.models import RunRecord, UserMessage
from ..core.observability import logger, timed
from ..providers.base import Message
from ..providers.embeddings import decode_vector, encode_vector
from ..store.memories import MemoryBook, MemoryRecord
from ..store.user_pins import UserPin, user_memory
from .commands import TurnCommand
from .execution import TurnWork
from .selection import ProviderSelection
from .session import Session


class MemoryStep(ProviderSelection):
    """Recall, extraction and write-back of a user's memory records for a turn."""

    def _memory_user(self, actor: str, command: TurnCommand, session: Session) -> str | None:
        """Whose memory a turn uses: the user a trusted caller named, else the actor;
        ``None`` when memory is off for the deployment or the conversation (a turn's
        ``memory`` opts the conversation out, or in again, from that turn on), or nobody
        is named."""
        if command.memory is not None:
            session.memory_off = not command.memory
        if not self.settings.memory_enabled or session.memory_off:
            return None
        user = command.memory_user or actor
        return None if user in ANONYMOUS_ACTORS else user

    def _recall(self, work: TurnWork, budget: int, estimator: Estimator) -> Recall | None:
        """Read the turn's user's records once per request and pick the block its context
        carries. A failure to read is logged: the turn goes on without memory."""
        user = work.session.options.memory_user
        if user is None:
            return None
        if work.recall is not None and work.recall.user == user:
            return work.recall
        session = work.session
        query = " ".join(
            body.content
            for event in session.events
            if event.turn == session.turn and isinstance(body := event.body(), UserMessage)
        )
        complete = True
        try:
            # Eventually consistent: half the price, and a record written a moment ago
            # by another conversation may wait for the next turn. The user's pins come
            # with the records, in the same query.
            records, pins = user_memory(self.store, session.key.tenant, user, consistent=False)
        except Exception:
            logger.exception("could not read the user's memory; the turn goes on without it")
            records, pins, complete = [], [], False
        query_vector = self._embed(query) if records and self.embedder is not None else None
        ranked = rank(records, query, query_vector=query_vector, vector_of=_vector_of)
        message, ids = recall_block(
            ranked,
            budget=budget,
            share=self.settings.memory_context_share,
            estimator=estimator,
        )
        redactor = self.redactor
        if message is not None and redactor is not None:
            # Everything a model sees is redacted; records added by hand never were.
            message = Message(role="system", content=redactor.text(message.content or ""))
        work.recall = Recall(
            user=user, records=records, message=message, ids=ids, complete=complete, pins=pins
        )
        return work.recall

    @staticmethod
    def user_pins(work: TurnWork) -> list[UserPin]:
        """The pins of the turn's user its recall read (none without a memory user)."""
        return work.recall.pins if work.recall is not None else []

    def extract_memory(self, work: TurnWork, run: RunRecord) -> RunRecord:
        """Ask the summarizer for the facts the user stated in this turn and plan their
        writes (done after the commit); the call's usage is the head's and the run
        record's (``memory_usage``). A failure is logged and never fails the turn."""
        session = work.session
        user = session.options.memory_user
        if user is None or work.recall is None or not work.recall.complete:
            return run
        said = [
            (event.sequence, body.content)
            for event in session.events
            if event.turn == session.turn and isinstance(body := event.body(), UserMessage)
        ]
        if not said:
            return run
        left = deadline.remaining()
        if left is not None and left < _MEMORY_MIN_SECONDS:
            # The answer must still be committed: no extraction in the request's last seconds.
            logger.warning("no time left for memory extraction", extra={"seconds_left": left})
            return run
        redactor = self.redactor_for(session.key, session.data_class, session.gen)
        texts = [redactor.text(text) if redactor is not None else text for _, text in said]
        try:
            routed = self.route_side_call(
                session,
                self.settings.summarizer_model or work.model,
                self._summarizer(work),
                "memory",
            )
        except Exception as exc:  # a summarizer that cannot be built: as a failed call
            logger.warning("memory extraction failed", extra={"error": type(exc).__name__})
            return run
        if routed is None:
            return run
        model, summarizer = routed
        try:
            with (
                telemetry.model_call(summarizer.name, model, telemetry.PURPOSE_MEMORY) as traced,
                timed("MemoryExtractionLatency"),
            ):
                reply = summarizer.complete(extraction_request(model, texts, work.recall.records))
                traced.answered(reply)
            session.usage = session.usage + reply.usage
            session.cost_usd += self.settings.model_spec(reply.model or model).cost(reply.usage)
            run = run.model_copy(update={"memory_usage": reply.usage})
            facts = parse_facts(reply.text or "")
            work.memory_plan = plan_writes(
                work.recall.records,
                facts,
                now=self.clock(),
                source=Provenance(
                    conversation_id=session.key.conversation_id,
                    from_sequence=said[0][0],
                    to_sequence=said[-1][0],
                ),
                cap=max(self.settings.memory_max_records, 1),
                embed=self._embedded if self.embedder is not None else None,
            )
        except Exception as exc:
            logger.warning(
                "memory extraction failed; the turn is answered without it",
                extra={
                    "error": type(exc).__name__,
                    "summarizer": summarizer.name if summarizer else None,
                },
            )
        return run

    def _embed(self, text: str) -> list[float] | None:
        """The embedding of ``text``, or ``None`` (logged) when the embedder fails."""
        embedder = self.embedder
        if embedder is None or not text.strip():
            return None
        try:
            with timed("EmbeddingLatency"):
                return embedder.embed([text])[0]
        except ProviderError as exc:
            logger.warning(
                "embedding failed; memory is ranked by keywords",
                extra={"code": exc.code, "embedder": embedder.name},
            )
            return None

    def _embedded(self, text: str) -> str | None:
        vector = self._embed(text)
        return None if vector is None else encode_vector(vector)

    def write_memory(self, work: TurnWork) -> None:
        """Write what extraction planned, once the turn is committed (a cancelled turn
        writes nothing). A failure is logged: the turn's answer stands."""
        plan, recall = work.memory_plan, work.recall
        work.memory_plan = None
        if plan is None or recall is None or work.status_reason == "cancelled":
            return
        book = MemoryBook(self.store, work.session.key.tenant, recall.user)
        try:
            for index, record in enumerate(plan.puts):
                book.put(record, first=index == 0 and not recall.records)
            book.delete(plan.deletes)
        except Exception:
            logger.exception("could not write the user's memory; the turn's answer stands")


def _vector_of(record: MemoryRecord) -> list[float] | None:
    """A record's stored embedding (``None``: none, or unreadable)."""
    if record.embedding is None:
        return None
    try:
        return decode_vector(record.embedding)
    except ValueError:
        return None


#: Seconds a request must have left for model calls to run the memory extraction.
_MEMORY_MIN_SECONDS = 3.0

#: Actors that name nobody in particular (no ``sub`` claim): they have no memory.
ANONYMOUS_ACTORS = frozenset({"anonymous"})
