"""The model call of a turn: the context built to its budget (compacting first when older
turns no longer fit), the provider's stored state used when it is still faithful, the
call itself (streamed into the turn's draft sink when there is one), and the run record
that explains it.

Mixed into the service; the runner (:mod:`.runner`) records a failed call.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from ..context.assembly import (
    MESSAGE_OVERHEAD_TOKENS,
    Assembly,
    Estimator,
    assemble,
    latest_summary,
    messages_through,
    split_turns,
    turns_to_compact,
    turns_to_compact_now,
)
from ..context.pins import corrected, pin_message
from ..context.redaction import Redactor
from ..core import telemetry
from ..core.config import Settings
from ..core.exceptions import ContextLengthExceeded, NothingToCompact, ProviderError
from ..core.models import Event, EventKind, Pin, ProviderCursor, RunRecord, SummaryRef
from ..core.observability import timed
from ..core.strict_json import BodyError, parse
from ..providers.base import (
    Continuation,
    Message,
    ModelReply,
    ModelRequest,
    Provider,
    ResponseFormat,
    ToolSpec,
)
from ..store.user_pins import UserPin
from . import compaction, policy_gate
from .commands import TurnCommand
from .drafts import DraftSink, model_reply
from .execution import TurnWork
from .memory_step import MemoryStep
from .session import Session


class ModelCall(MemoryStep):
    """One model call of a turn and what it needs: context, compaction, cursor, calibration."""

    def check_input_fits(
        self, command: TurnCommand, token_scale: float | None, pins: list[Pin] | None = None
    ) -> None:
        """Refuse, before anything is stored, new messages that cannot fit the context
        budget even alone (with the system prompt and the ``pins``), counted with the conversation's
        estimate scale: the current turn is always sent whole, so no summary could make
        room for them.

        Raises:
            ContextLengthExceeded: with the budget (``limit``) and the input's estimate.
        """
        if not command.messages:
            return
        model = command.model or self.settings.model
        estimator = self._estimator(self.provider_for(command.provider), token_scale)
        redactor = self.redactor
        sent = [
            Message(role="user", content=redactor.text(m) if redactor is not None else m)
            for m in command.messages
        ]
        block = pin_message(pins or [])
        if block is not None:
            sent.insert(0, block)
        if self.settings.system_prompt:
            sent.insert(0, Message(role="system", content=self.settings.system_prompt))
        tokens = estimator.tokens(sent)
        limit = self.settings.context_budget(model)
        if tokens > limit:
            raise ContextLengthExceeded(
                f"the input is about {tokens} tokens; the context of {model} holds {limit}",
                details={"limit": limit, "tokens": tokens, "model": model},
            )

    def call_model(
        self, work: TurnWork, sink: DraftSink | None = None
    ) -> tuple[ModelReply, RunRecord]:
        """Build the context to its budget (compacting first when older turns no longer
        fit), call the model (its answer streamed into ``sink``, the turn's draft), and
        describe the call in a run record.

        Raises:
            ProviderError, ProviderTimeout: the model failed (the runner records it).
        """
        session = work.session
        state_allowed = self.route_call(work)
        provider = work.provider
        redactor = self.redactor_for(session.key, session.data_class, session.gen)
        estimator = self._estimator(provider, session.token_scale)
        budget = self.settings.context_budget(work.model)

        recall = self._recall(work, budget, estimator)
        # What the history read left out; its newest summary, if the read missed that
        # too, stays in the context until a new one covers the rest.
        left_out = compaction.unread(self.store, session)
        missed = [e for e in left_out if e.kind is EventKind.CONTEXT_COMPACTED][-1:]

        def build() -> Assembly:
            return assemble(
                [*missed, *session.events],
                budget=budget,
                estimator=estimator,
                system_prompt=self.settings.system_prompt,
                redactor=redactor,
                memory=recall.message if recall is not None else None,
                pins=session.pins,
                user_pins=recall.pins if recall is not None else (),
            )

        assembly = build()
        if self._compact(work, assembly, estimator, left_out):
            assembly = build()  # with the summary just staged
        specs = [tool.spec() for tool in work.tools]
        continuation = (
            self._continuation(work, assembly, specs, redactor) if state_allowed else None
        )
        work.budget_tokens = budget
        work.summary_through = assembly.summary_through
        work.model_calls += 1
        started = time.perf_counter()
        with (
            telemetry.model_call(provider.name, work.model) as traced,
            timed("ModelLatency"),
        ):
            reply = model_reply(
                provider,
                ModelRequest(
                    model=work.model,
                    messages=assembly.messages,
                    tools=specs,
                    response_format=ResponseFormat.model_validate(
                        work.response_format.model_dump(by_alias=True)
                    )
                    if work.response_format
                    else None,
                    continuation=continuation,
                    store=provider.stateful and state_allowed,
                ),
                sink,
            )
            traced.answered(reply)
        if work.response_format and not reply.tool_calls:
            json_answer(reply)  # an answer that is not JSON is the provider's failure
        latency_ms = int((time.perf_counter() - started) * 1000)
        work.provider_state = reply.provider_state
        # What was sent: only the new messages when the stored state was used.
        sent = assembly.messages
        if reply.provider_state == "continued" and continuation is not None:
            sent = assembly.messages[continuation.new_from :]
        work.messages_sent = len(sent)
        work.tokens_estimated = estimator.tokens(sent)
        self._calibrate(provider, session, assembly, estimator, reply)
        model = reply.model or work.model
        # The recalled block, when it fitted in the context (the run record names it).
        carried = recall if recall is not None and recall.message in assembly.messages else None
        user_pins = self.user_pins(work)
        return reply, RunRecord(
            model=model,
            provider=provider.name,
            provider_state=reply.provider_state,
            latency_ms=latency_ms,
            usage=reply.usage,
            tokens_estimated=work.tokens_estimated,
            budget_tokens=budget,
            messages_sent=work.messages_sent,
            redaction_version=redactor.version if redactor is not None else None,
            summary_through=assembly.summary_through,
            context_from=assembly.context_from,
            context_sha256=assembly.sha256,
            token_scale=estimator.scale,
            response_id=reply.response_id,
            made_with=_cursor_sha256(self.settings, specs, redactor, session.pins, user_pins)
            if reply.response_id is not None
            else None,
            cost_usd=self.settings.model_spec(model).cost(reply.usage),
            memory_ids=carried.ids if carried is not None else [],
            memory_user=carried.user
            if carried is not None
            else (recall.user if recall is not None and user_pins else None),
            user_pins=[pin.id for pin in user_pins],
        )

    def route_call(self, work: TurnWork, purpose: str = "turn") -> bool:
        """Route the call ``work`` is about to make by the conversation's data class: the
        model (and provider) the class allows takes the requested one's place, and the
        choice is staged as a ``policy_decision`` event. A conversation with no class is
        not routed. Returns whether the class lets the provider keep state.

        Raises:
            DataPolicyUnsatisfied: no model the class allows may answer; nothing was sent.
        """
        session = work.session
        policy = self.data_policy(session.key.tenant)
        if policy is None or session.data_class is None:
            return True
        routing = policy_gate.decide(
            policy,
            session.data_class,
            model=work.model,
            provider=work.provider.name,
            settings=self.settings,
        )
        assert routing.chosen is not None
        if routing.chosen.provider is not None:
            work.provider = self.provider_for(routing.chosen.provider)
        work.model = routing.chosen.model
        session.add(
            policy_gate.decision_event(
                policy, routing, provider=work.provider.name, purpose=purpose
            ),
            actor="system",
        )
        return self.provider_state_allowed(session)

    def provider_state_allowed(self, session: Session) -> bool:
        """Whether the conversation's data class lets a provider keep its state."""
        policy = self.data_policy(session.key.tenant)
        data_class = policy.effective(session.data_class) if policy is not None else None
        return data_class is None or data_class.provider_state

    def _continuation(
        self,
        work: TurnWork,
        assembly: Assembly,
        specs: list[ToolSpec],
        redactor: Redactor | None,
    ) -> Continuation | None:
        """Use the provider's stored response when it is still a faithful cache of the log.

        The cursor must have been made by this tenant, provider and model, with the same
        system prompt, tools, redaction rules and pins, and no summary may have been added since
        (a summary changes what the model should see). Otherwise the call is ``fresh``.
        """
        cursor = work.session.provider_cursor
        provider = work.provider
        if cursor is None or not provider.stateful:
            return None
        summary = work.session.summary
        age = (self.clock() - cursor.created_at).total_seconds()
        if (
            cursor.provider != provider.name
            or cursor.model != work.model
            or cursor.tenant != work.session.key.tenant
            or cursor.context_sha256
            != _cursor_sha256(
                self.settings, specs, redactor, work.session.pins, self.user_pins(work)
            )
            or (summary is not None and summary.sequence > cursor.sequence)
            or age > self.settings.provider_state_retention_seconds
        ):
            return None
        new_from = messages_through(
            assembly, cursor.sequence, redactor, corrected(work.session.pins)
        )
        if new_from is None or new_from >= len(assembly.messages):
            return None
        return Continuation(previous_response_id=cursor.response_id, new_from=new_from)

    def keep_cursor(self, work: TurnWork, reply: ModelReply, sequence: int) -> None:
        """Point the conversation's provider cursor at this answer (or drop it).

        Only a successful answer moves it, and it is saved in the turn's own commit.
        """
        session = work.session
        if not work.provider.stateful:
            return
        if reply.response_id is None or not self.provider_state_allowed(session):
            session.provider_cursor = None
            return
        session.provider_cursor = ProviderCursor(
            provider=work.provider.name,
            api="responses",
            model=work.model,
            response_id=reply.response_id,
            created_at=self.clock(),
            tenant=session.key.tenant,
            context_sha256=_cursor_sha256(
                self.settings,
                [tool.spec() for tool in work.tools],
                self.redactor_for(session.key, session.data_class, session.gen),
                session.pins,
                self.user_pins(work),
            ),
            sequence=sequence,
            conversation_id=session.key.conversation_id,
        )

    @staticmethod
    def _estimator(provider: Provider, scale: float | None) -> Estimator:
        """How tokens are counted for ``provider``, scaled by the conversation's ``scale``."""
        if provider.estimate_is_exact:
            return Estimator(count=provider.estimate_tokens)
        return Estimator(
            count=provider.estimate_tokens,
            scale=scale or 1.0,
            per_message=MESSAGE_OVERHEAD_TOKENS,
        )

    @staticmethod
    def _calibrate(
        provider: Provider,
        session: Session,
        assembly: Assembly,
        estimator: Estimator,
        reply: ModelReply,
    ) -> None:
        """Scale later estimates by what the provider reported for this whole context.

        Only a ``fresh`` call reports usage for exactly what was sent. The scale is
        rounded up and kept within 0.5-3x, so one odd report cannot make the
        estimate reckless.
        """
        if provider.estimate_is_exact or reply.provider_state != "fresh":
            return
        raw = estimator.raw(assembly.messages)
        if raw <= 0 or reply.usage.input_tokens <= 0:
            return
        scale = min(max(reply.usage.input_tokens / raw * _CALIBRATION_MARGIN, 0.5), 3.0)
        session.token_scale = round(scale + 0.0005, 3)

    def _compact(
        self, work: TurnWork, assembly: Assembly, estimator: Estimator, left_out: list[Event]
    ) -> bool:
        """Summarize what the context leaves out into a ``context_compacted`` event: the
        turns the read window did not reach (``left_out``, :func:`.compaction.unread`),
        then the older turns that no longer fit the budget.

        Returns whether a summary was staged. A summarizer failure is not the turn's:
        the turn goes on with the previous summary, and the next turn tries again.
        """
        session = work.session
        turns = turns_to_compact(assembly)
        trigger: compaction.Trigger = "budget"
        previous = assembly.summary
        through = turns[-1].last_sequence if turns else 0
        if left_out:
            trigger = "read_window"
            after = previous.body.to_sequence if previous is not None else 0
            missed = split_turns(
                left_out,
                after=after,
                estimator=estimator,
                redactor=self.redactor_for(session.key, session.data_class, session.gen),
            )
            turns = [*missed, *turns]
            through = max(through, left_out[-1].sequence)
        if not turns:
            return False
        routed = self.route_side_call(
            session, self.settings.summarizer_model or work.model, self._summarizer(work), "summary"
        )
        if routed is None:
            return False
        summarizer = compaction.Summarizer(routed[1], routed[0])
        written = compaction.summarize(
            summarizer,
            compaction.covering(turns, previous, through, trigger),
            estimator=estimator,
            limit=self._summary_limit(summarizer.model),
            later=[e for e in session.events if e.sequence > through],
            pending=[p.id for p in session.machine.pending],
            pins=[pin.id for pin in session.pins],
            must_keep=self.settings.summary_must_keep,
        )
        if written is None:
            return False
        self._stage_summary(session, written, actor=f"summarizer:{written.model}")
        return True

    def compact_now(self, work: TurnWork, summarizer: compaction.Summarizer, actor: str) -> Event:
        """Summarize now (``POST .../compact`` on a conversation with no summary yet) every
        turn but the newest (:func:`~turnledger.context.assembly.turns_to_compact_now`), by
        the budget trigger's rules; the summary is staged as ``actor``'s, ``trigger``
        ``manual``.

        Raises:
            NothingToCompact: fewer than two turns make messages.
            ProviderError: the summarizer failed, answered nothing or lost a must-keep
                value; nothing was staged.
        """
        session = work.session
        estimator = self._estimator(work.provider, session.token_scale)
        assembly = assemble(
            [*compaction.unread(self.store, session), *session.events],
            budget=self.settings.context_budget(work.model),
            estimator=estimator,
            system_prompt=self.settings.system_prompt,
            redactor=self.redactor_for(session.key, session.data_class, session.gen),
            pins=session.pins,
        )
        turns = turns_to_compact_now(assembly)
        if not turns:
            raise NothingToCompact("the conversation has no turn to summarize but its newest")
        through = turns[-1].last_sequence
        written = compaction.summarize(
            summarizer,
            compaction.covering(turns, None, through, "manual"),
            estimator=estimator,
            limit=self._summary_limit(summarizer.model),
            later=[e for e in session.events if e.sequence > through],
            pins=[pin.id for pin in session.pins],
            must_keep=self.settings.summary_must_keep,
        )
        if written is None:
            raise ProviderError(
                "the summarizer wrote no summary; nothing was stored",
                details={"provider": summarizer.provider.name, "model": summarizer.model},
            )
        return self._stage_summary(session, written, actor=actor)

    def compact_again(self, work: TurnWork, summarizer: compaction.Summarizer, actor: str) -> Event:
        """Write the newest summary again over the same range, from the log (``POST
        .../compact`` on a conversation with a summary), staged as ``actor``'s.

        Raises:
            CorruptedState: the newest summary fails its content hash.
            ProviderError: the summarizer failed, answered nothing or lost a must-keep
                value; nothing was staged.
        """
        session = work.session
        head = session.head
        assert head is not None and session.summary is not None  # checked by the caller
        key = session.key
        newest = latest_summary(
            self.store.read_events(key, head, after=session.summary.sequence - 1, limit=1)
        )
        assert newest is not None  # the head names that event
        old = newest.body
        covered = self.store.read_events(
            key, head, after=old.from_sequence - 1, limit=old.to_sequence - old.from_sequence + 1
        )
        estimator = self._estimator(work.provider, session.token_scale)
        turns = split_turns(
            covered,
            after=old.from_sequence - 1,
            estimator=estimator,
            redactor=self.redactor_for(key, session.data_class, session.gen),
        )
        written = compaction.summarize(
            summarizer,
            compaction.Compaction(
                turns=turns,
                from_sequence=old.from_sequence,
                from_turn=old.from_turn or (turns[0].number if turns else None),
                through=old.to_sequence,
                previous=None,
                trigger="manual",
                replaces=newest.sequence,
            ),
            estimator=estimator,
            limit=self._summary_limit(summarizer.model),
            pins=[pin.id for pin in session.pins],
            must_keep=self.settings.summary_must_keep,
        )
        if written is None:
            raise ProviderError(
                "the summarizer wrote no summary; nothing was stored",
                details={"provider": summarizer.provider.name, "model": summarizer.model},
            )
        return self._stage_summary(session, written, actor=actor)

    def _summary_limit(self, model: str) -> int:
        """Tokens of turns one summarizer call is sent: half the summarizer model's room
        (window less answer reserve), leaving the rest to its prompt and previous summary."""
        spec = self.settings.model_spec(model)
        return (spec.context_window - spec.answer_reserve) // 2

    def _stage_summary(self, session: Session, written: compaction.Written, actor: str) -> Event:
        """Stage a summary; later contexts (and loads) start from it."""
        event = session.add(written.payload, actor=actor)
        session.summary = SummaryRef(sequence=event.sequence, through=written.payload.to_sequence)
        session.usage = session.usage + written.usage
        session.cost_usd += self.settings.model_spec(written.model).cost(written.usage)
        return event


#: Estimates are scaled to the reported usage and then 5 % over it: conservative.
_CALIBRATION_MARGIN = 1.05


def _cursor_sha256(
    settings: Settings,
    specs: list[ToolSpec],
    redactor: Redactor | None,
    pins: list[Pin],
    user_pins: Sequence[UserPin] = (),
) -> str:
    """What a stored provider response was made with: system prompt, tools, redaction, and
    the pins, the user's too (a pin added or removed since changes what every context
    starts with)."""
    made_with: dict[str, object] = {
        "system": settings.system_prompt,
        "tools": [spec.model_dump(mode="json") for spec in specs],
        "redaction": redactor.version if redactor is not None else None,
    }
    if pins:
        # Left out while there is none: cursors made before pins existed stay usable.
        made_with["pins"] = [pin.id for pin in pins]
    if user_pins:
        made_with["user_pins"] = [pin.id for pin in user_pins]
    return hashlib.sha256(json.dumps(made_with, sort_keys=True).encode()).hexdigest()


def json_answer(reply: ModelReply) -> Any:
    """A JSON-mode answer as a JSON value.

    Raises:
        ProviderError: the answer is not JSON the ledger keeps (the strict parser's: no
            lone surrogate, no nesting past its limit, no key twice).
    """
    try:
        return parse(reply.text or "", "the answer")
    except BodyError:
        raise ProviderError(
            "the model's answer in JSON mode is not JSON",
            details={"reason": "invalid_json"},
        ) from None
