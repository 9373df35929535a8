"""Replays: a conversation's recorded model calls sent to another model, with no side effects.

``POST .../replays`` names a provider and model, a mode and optionally a turn range and a
system prompt. :func:`start` checks them and stores a ``running`` record; the replay then
runs (:func:`run`) in the turn worker (:func:`run_event`), or within the request when the
deployment has no worker. The record is kept as side items of the conversation's
partition (:data:`RECORD_PREFIX`), so it expires with the conversation's TTL and is
deleted by its clear and erasure with everything else::

    S#rp#<replay id>                 the record: request, status, summary
    S#rp#<replay id>#c#<call:05d>    one replayed call each, written as it is done

Modes:

* ``pointwise``: each recorded call's exact context (:func:`.contexts.call_contexts`:
  rebuilt from the log, hash checked) is sent to the candidate, and its answer set beside
  the recorded one.
* ``rollout``: the candidate continues from the first replayed turn with its own answers:
  its context starts as the recorded first call's, then grows with its own answers, the
  log's user messages of the next turns, and tool results. A tool call whose name and
  arguments equal a recorded call's gets that call's recorded output; any other gets an
  error result saying no recorded output exists. The calls it made are the rollout.

**Judged** when the request has an ``expect`` (:mod:`.judging`): each replayed turn gets
``passed`` and its ``failures`` (tool-call trajectory, constraints), the record ``passed``
and the summary ``turns_judged`` / ``turns_passed``. Wording is never compared by it.

No side effects: no tool runs, nothing is committed to the conversation (its head,
version, events, budgets and provider cursor stay as they were, so no notification is
sent either), and providers are asked not to keep the responses (``store=False``).
"""

from __future__ import annotations

import difflib
import json
import secrets
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..core import telemetry
from ..core.exceptions import InvalidRequest, ProviderError, TurnledgerError
from ..core.models import (
    AssistantMessage,
    ConversationKey,
    Head,
    Pin,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..core.observability import logger
from ..providers.base import Message, ModelReply, ModelRequest, Provider, ToolSpec
from ..store.codec import SideItem
from ..store.user_pins import UserPin, UserPinBook
from . import policy_gate
from .contexts import (
    CallContext,
    ConversationLog,
    call_contexts,
    read_log,
    tool_specs,
    visible_head,
)
from .judging import PIN_CHECKS, JudgedTurn, TurnVerdict, judge
from .replay_records import (
    Answer,
    CallError,
    GivenResult,
    InvalidTurnRange,
    ReplayCall,
    ReplayNotFound,
    ReplayRecord,
    ReplaySpec,
    ReplaySummary,
    ToolCallMatch,
    Totals,
)
from .turn_reads import STALE_AFTER_SECONDS

if TYPE_CHECKING:
    from .pipeline import Conversations
    from .reads import Reads

#: Sort keys of replay records start with this (a side item of the conversation).
RECORD_PREFIX = "S#rp#"
#: The turn worker's event for a replay (the worker runs turns and replays).
REPLAY_EVENT = "turnledger.replay"
#: A replay id: ``rp_`` and 24 hex digits.
REPLAY_ID_PATTERN = r"^rp_[0-9a-f]{24}$"
#: Between two reads of a running replay while a reader waits.
POLL_SECONDS = 0.2
#: Texts longer than this are cut in the record (one call is one item, at most 400 KB).
MAX_TEXT_CHARS = 20_000
#: What a rollout's tool call gets when no recorded call has its name and arguments.
NO_RECORDED_OUTPUT = "replay: no recorded output exists for this tool call (name and arguments)"


def _record_key(replay_id: str) -> str:
    return f"{RECORD_PREFIX}{replay_id}"


def _call_key(replay_id: str, number: int) -> str:
    return f"{RECORD_PREFIX}{replay_id}#c#{number:05d}"


class _Writer:
    """Writes one replay's items (each call as it is done, the record at its moves)."""

    def __init__(self, service: Conversations, key: ConversationKey, head: Head) -> None:
        self.service = service
        self.key = key
        self.expires_at = head.expires_at
        self.gen = head.gen
        self.written = 0

    def record(self, record: ReplayRecord) -> None:
        body = record.model_dump(mode="json", exclude={"calls"})
        self._put(_record_key(record.id), body)

    def call(self, replay_id: str, call: ReplayCall) -> None:
        self.written += 1
        self._put(_call_key(replay_id, self.written), call.model_dump(mode="json"))

    def _put(self, sort_key: str, body: dict[str, Any]) -> None:
        self.service.store.put_side_item(
            self.key,
            SideItem(
                sort_key,
                {"body": json.dumps(body, ensure_ascii=False, separators=(",", ":"))},
                expires_at=self.expires_at,
                gen=self.gen,
            ),
        )


def read(service: Reads, key: ConversationKey, replay_id: str) -> ReplayRecord:
    """The replay ``replay_id`` of ``key``, with every call written so far.

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
        ReplayNotFound: no such replay in the conversation's current life.
    """
    head = visible_head(service, key)
    items = service.store.query_side_items(
        key, lower=_record_key(replay_id), upper=f"{_record_key(replay_id)}#c#~"
    )
    if not items or items[0].sort_key != _record_key(replay_id) or items[0].gen != head.gen:
        raise ReplayNotFound(f"replay {replay_id!r} not found", details={"replay_id": replay_id})
    record = ReplayRecord.model_validate_json(str(items[0].attributes["body"]))
    calls = [ReplayCall.model_validate_json(str(item.attributes["body"])) for item in items[1:]]
    if (
        record.status == "running"
        and (service.clock() - record.created_at).total_seconds() > STALE_AFTER_SECONDS
    ):
        # Its worker stopped without finishing (a worker runs 15 minutes at most).
        lost = CallError(code="worker_lost", message="the replay's worker stopped before its end")
        record = record.model_copy(update={"status": "failed", "error": lost})
    return record.model_copy(update={"calls": calls})


def read_waiting(
    service: Reads, key: ConversationKey, replay_id: str, *, wait: float
) -> ReplayRecord:
    """:func:`read`, waiting up to ``wait`` seconds (polling) while the replay runs.

    Raises:
        ConversationNotFound, ReplayNotFound: as :func:`read`.
    """
    deadline = time.monotonic() + wait
    record = read(service, key, replay_id)
    while record.status == "running" and time.monotonic() < deadline:
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        record = read(service, key, replay_id)
    return record


# --- starting ----------------------------------------------------------------------------


def start(service: Conversations, key: ConversationKey, spec: ReplaySpec) -> ReplayRecord:
    """Check ``spec`` against the conversation and store the replay's ``running`` record.

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
        UnknownProvider, UnknownModel: the deployment does not allow the candidate.
        DataPolicyUnsatisfied: the conversation's data class does not allow it (a replay
            compares the model it names: never another).
        InvalidTurnRange: the turn range is empty or past the conversation's turns.
    """
    head = visible_head(service, key)
    service.provider_for(spec.provider)
    service.check_model(spec.model)
    policy_gate.check_exact(
        service.data_policy(key.tenant),
        head.data_class,
        model=spec.model,
        provider=spec.provider,
        settings=service.settings,
    )
    first = spec.from_turn or 1
    last = spec.to_turn or head.turn
    if head.turn == 0 or first > last or last > head.turn:
        raise InvalidTurnRange(
            "the turn range must lie within the conversation's turns",
            details={"from_turn": first, "to_turn": last, "turns": head.turn},
        )
    if spec.expect is not None:
        active = {pin.id for pin in head.pins}
        user = head.options.memory_user
        named = {c.pin_id for c in spec.expect.constraints if isinstance(c, PIN_CHECKS)}
        if user is not None and named - active:
            # A pin of the conversation's user (its last turn's) is in force there too.
            active |= {pin.id for pin in UserPinBook(service.store, key.tenant, user).active()}
        for constraint in spec.expect.constraints:
            if isinstance(constraint, PIN_CHECKS) and constraint.pin_id not in active:
                raise InvalidRequest(
                    f"pin_respected names {constraint.pin_id!r}, no active pin of the conversation",
                    details={"pin_id": constraint.pin_id},
                )
    now = service.clock()
    record = ReplayRecord(
        id=f"rp_{secrets.token_hex(12)}",
        conversation_id=key.conversation_id,
        status="running",
        provider=spec.provider,
        model=spec.model,
        mode=spec.mode,
        from_turn=first,
        to_turn=last,
        system_prompt=spec.system_prompt,
        created_at=now,
        updated_at=now,
        expect=spec.expect,
    )
    _Writer(service, key, head).record(record)
    return record


def abandon(service: Conversations, key: ConversationKey, record: ReplayRecord, code: str) -> None:
    """Mark ``record`` failed before it ran (its worker could not be started)."""
    head = visible_head(service, key)
    failed = record.model_copy(
        update={
            "status": "failed",
            "updated_at": service.clock(),
            "error": CallError(code=code, message="the replay could not be started"),
        }
    )
    _Writer(service, key, head).record(failed)


def worker_event(key: ConversationKey, replay_id: str) -> dict[str, Any]:
    """The turn worker's event that runs the replay ``replay_id`` of ``key``."""
    return {
        "kind": REPLAY_EVENT,
        "tenant": key.tenant,
        "conversation_id": key.conversation_id,
        "replay_id": replay_id,
    }


def run_event(service: Conversations, event: dict[str, Any]) -> dict[str, Any]:
    """Run the replay a turn worker event names; returns a summary for the logs.

    Raises:
        ValueError: the event is not a replay event.
    """
    if event.get("kind") != REPLAY_EVENT:
        raise ValueError("not a replay event")
    key = ConversationKey(
        tenant=str(event["tenant"]), conversation_id=str(event["conversation_id"])
    )
    record = run(service, key, str(event["replay_id"]))
    return {"replay_id": record.id, "status": record.status, "calls": len(record.calls)}


# --- running -----------------------------------------------------------------------------


def run(service: Conversations, key: ConversationKey, replay_id: str) -> ReplayRecord:
    """Run the stored ``running`` replay ``replay_id`` to its end; a record already over is
    answered as it is (a retried worker event runs nothing twice).

    Never raises for the replay's own failures: a failed candidate call is recorded on
    its call; anything else ends the record ``failed`` with the error.

    Raises:
        ConversationNotFound, ReplayNotFound: the conversation or the replay is gone.
    """
    record = read(service, key, replay_id)
    if record.status != "running" or record.calls:
        return record
    log = read_log(service, key)
    writer = _Writer(service, key, log.head)
    calls: list[ReplayCall] = []

    def keep(call: ReplayCall) -> None:
        calls.append(call)
        writer.call(replay_id, call)

    contexts: list[CallContext] = []
    try:
        provider = service.provider_for(record.provider)
        contexts = call_contexts(service, log, from_turn=record.from_turn, to_turn=record.to_turn)
        replayer = _Replayer(service, provider, record, tool_specs(service))
        if record.mode == "pointwise":
            for context in contexts:
                keep(replayer.pointwise(context))
        else:
            replayer.rollout(log, contexts, keep)
    except TurnledgerError as exc:
        logger.warning("replay failed", extra={"replay_id": replay_id, "code": exc.code})
        return _finish(writer, record, calls, error=CallError(code=exc.code, message=str(exc)))
    except Exception as exc:
        logger.exception("replay failed", extra={"replay_id": replay_id})
        failure = CallError(code="internal_error", message=type(exc).__name__)
        return _finish(writer, record, calls, error=failure)
    return _finish(writer, record, calls, verdicts=_judged(service, record, calls, contexts))


def _judged(
    service: Conversations,
    record: ReplayRecord,
    calls: list[ReplayCall],
    contexts: list[CallContext],
) -> list[TurnVerdict] | None:
    """The replayed turns judged by the record's ``expect`` (``None``: it has none)."""
    if record.expect is None:
        return None
    pins: dict[int, list[Pin]] = {}
    user_pins: dict[int, list[UserPin]] = {}
    for context in contexts:
        pins.setdefault(context.turn, context.pins)
        user_pins.setdefault(context.turn, context.user_pins)
    turns: list[JudgedTurn] = []
    for number in sorted({call.turn for call in calls}):
        mine = [call for call in calls if call.turn == number]
        answers = [c.candidate.text for c in mine if c.candidate is not None and c.candidate.text]
        turns.append(
            JudgedTurn(
                turn=number,
                recorded=[t for c in mine if c.recorded for t in c.recorded.tool_calls],
                candidate=[t for c in mine if c.candidate for t in c.candidate.tool_calls],
                answer=answers[-1] if answers else None,
                pins=pins.get(number, []),
                user_pins=user_pins.get(number, []),
            )
        )
    return judge(record.expect, turns, service.tools)


def _finish(
    writer: _Writer,
    record: ReplayRecord,
    calls: list[ReplayCall],
    *,
    error: CallError | None = None,
    verdicts: list[TurnVerdict] | None = None,
) -> ReplayRecord:
    summary = summarize(calls)
    judged: dict[str, Any] = {}
    if verdicts is not None:
        passed = sum(1 for verdict in verdicts if verdict.passed)
        summary = summary.model_copy(update={"turns_judged": len(verdicts), "turns_passed": passed})
        judged = {"turns": verdicts, "passed": passed == len(verdicts)}
    done = record.model_copy(
        update={
            "status": "failed" if error is not None else "complete",
            "updated_at": writer.service.clock(),
            "summary": summary,
            "error": error,
            **judged,
        }
    )
    writer.record(done)
    return done.model_copy(update={"calls": calls})


class _Replayer:
    """Sends contexts to the candidate and sets its answers beside the recorded ones."""

    def __init__(
        self,
        service: Conversations,
        provider: Provider,
        record: ReplayRecord,
        tools: list[ToolSpec],
    ) -> None:
        self.service = service
        self.provider = provider
        self.record = record
        self.tools = tools

    def pointwise(self, context: CallContext) -> ReplayCall:
        """Send the call's rebuilt context to the candidate; compare the answers."""
        candidate = self.ask(context.messages)
        return _compared(
            context.turn,
            context.index,
            recorded_answer(context),
            candidate,
            context_matches=context.matches,
        )

    def rollout(
        self,
        log: ConversationLog,
        contexts: list[CallContext],
        keep: Callable[[ReplayCall], None],
    ) -> None:
        """Let the candidate continue the conversation from the first replayed turn."""
        if not contexts:
            return
        redactor = self.service.redactor
        outputs = recorded_outputs(contexts)
        by_turn: dict[int, list[CallContext]] = {}
        for context in contexts:
            by_turn.setdefault(context.turn, []).append(context)
        first = contexts[0]
        messages = list(first.messages)
        steps = self.service.settings.max_tool_steps + 1
        for turn in range(first.turn, self.record.to_turn + 1):
            recorded = by_turn.get(turn, [])
            said: str | None = None
            if turn != first.turn:
                inputs = [
                    body.content
                    for event in log.turn_events(turn)
                    if isinstance(body := event.body(), UserMessage)
                ]
                if not inputs and not recorded:
                    continue
                sent = [redactor.text(t) if redactor is not None else t for t in inputs]
                messages.extend(Message(role="user", content=text) for text in sent)
                said = "\n".join(sent) or None
            else:
                said = _last_user_text(messages)
            for step in range(1, steps + 1):
                candidate = self.ask(messages)
                original = recorded[step - 1] if step <= len(recorded) else None
                call = _compared(
                    turn,
                    step,
                    recorded_answer(original) if original is not None else None,
                    candidate,
                    context_matches=None,
                )
                call.input = _cut(said) if step == 1 else None
                if candidate.error is not None:
                    keep(call)
                    return  # the rollout cannot go on without the candidate's answer
                messages.append(
                    Message(
                        role="assistant", content=candidate.text, tool_calls=candidate.tool_calls
                    )
                )
                for tool_call in candidate.tool_calls:
                    found = outputs.get(_call_signature(tool_call))
                    output = found.output if found is not None else NO_RECORDED_OUTPUT
                    if found is not None and redactor is not None:
                        output = redactor.text(output)
                    messages.append(
                        Message(
                            role="tool",
                            tool_call_id=tool_call.id,
                            name=tool_call.name,
                            content=output,
                            is_error=found.is_error if found is not None else True,
                        )
                    )
                    call.tool_results.append(
                        GivenResult(
                            call_id=tool_call.id,
                            name=tool_call.name,
                            output=_cut(output) or "",
                            recorded=found is not None,
                        )
                    )
                keep(call)
                if not candidate.tool_calls:
                    break
            for extra, original in enumerate(recorded[step:], start=step + 1):
                keep(_compared(turn, extra, recorded_answer(original), None, context_matches=None))

    def ask(self, messages: list[Message]) -> Answer:
        """The candidate's answer to ``messages`` (the system prompt swapped if asked);
        a provider failure is the answer's ``error``."""
        request = ModelRequest(
            model=self.record.model,
            messages=_with_system_prompt(
                messages, self.service.settings.system_prompt, self.record.system_prompt
            ),
            tools=self.tools,
            store=False,
        )
        started = time.perf_counter()
        try:
            with telemetry.model_call(
                self.provider.name, self.record.model, telemetry.PURPOSE_REPLAY
            ) as traced:
                reply = self.provider.complete(request)
                traced.answered(reply)
        except ProviderError as exc:
            return Answer(
                model=self.record.model,
                latency_ms=int((time.perf_counter() - started) * 1000),
                error=CallError(code=exc.code, message=str(exc)),
            )
        return _answer(self.service, reply, self.record.model, started)


def _answer(service: Conversations, reply: ModelReply, model: str, started: float) -> Answer:
    used = reply.model or model
    return Answer(
        text=reply.text,
        tool_calls=reply.tool_calls,
        model=used,
        usage=reply.usage,
        cost_usd=service.settings.model_spec(used).cost(reply.usage),
        latency_ms=int((time.perf_counter() - started) * 1000),
    )


def recorded_answer(context: CallContext) -> Answer:
    """The recorded answer of a call, with its run record's cost and latency."""
    body: AssistantMessage = context.answer
    text = body.content
    if body.content_json is not None:
        text = json.dumps(body.content_json, ensure_ascii=False)
    return Answer(
        text=text,
        tool_calls=body.tool_calls,
        model=context.run.model,
        usage=context.run.usage,
        cost_usd=context.run.cost_usd,
        latency_ms=context.run.latency_ms,
    )


def recorded_outputs(contexts: Iterable[CallContext]) -> dict[str, ToolResult]:
    """The recorded result of each tool call of ``contexts`` by its name and arguments
    (the first one, when the same call was made twice)."""
    found: dict[str, ToolResult] = {}
    for context in contexts:
        for call in context.answer.tool_calls:
            result = context.results.get(call.id)
            if result is not None:
                found.setdefault(_call_signature(call), result)
    return found


def _call_signature(call: ToolCall) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, ensure_ascii=False)


def _with_system_prompt(messages: list[Message], current: str, wanted: str | None) -> list[Message]:
    """``messages`` with ``wanted`` as their system prompt instead of ``current``."""
    if wanted is None:
        return messages
    rest = messages
    if current and messages and messages[0].role == "system" and messages[0].content == current:
        rest = messages[1:]
    return [Message(role="system", content=wanted), *rest] if wanted else list(rest)


def _last_user_text(messages: list[Message]) -> str | None:
    for message in reversed(messages):
        if message.role == "user":
            return message.content
    return None


def _cut(text: str | None) -> str | None:
    return text[:MAX_TEXT_CHARS] if text is not None else None


def _compared(
    turn: int,
    number: int,
    recorded: Answer | None,
    candidate: Answer | None,
    *,
    context_matches: bool | None,
) -> ReplayCall:
    """One call's entry: both answers (texts cut), their tool calls compared."""
    similarity: float | None = None
    if (
        recorded is not None
        and candidate is not None
        and candidate.error is None
        and (recorded.text or candidate.text)
    ):
        matcher = difflib.SequenceMatcher(None, recorded.text or "", candidate.text or "")
        similarity = round(matcher.ratio(), 4)
    return ReplayCall(
        turn=turn,
        call=number,
        recorded=recorded.model_copy(update={"text": _cut(recorded.text)}) if recorded else None,
        candidate=candidate.model_copy(update={"text": _cut(candidate.text)})
        if candidate
        else None,
        tool_calls=compare_tool_calls(
            recorded.tool_calls if recorded is not None else [],
            candidate.tool_calls if candidate is not None else [],
        ),
        similarity=similarity,
        context_matches=context_matches,
    )


def compare_tool_calls(recorded: list[ToolCall], candidate: list[ToolCall]) -> list[ToolCallMatch]:
    """Each recorded call beside the candidate's: the same name and arguments (``same``),
    the same name with other arguments (``different``), or none (``missing``); then the
    candidate's calls left over (``extra``)."""
    left = list(candidate)
    same: dict[int, ToolCall] = {}
    for index, call in enumerate(recorded):
        twin = next((c for c in left if _call_signature(c) == _call_signature(call)), None)
        if twin is not None:
            left.remove(twin)
            same[index] = twin
    found: list[ToolCallMatch] = []
    for index, call in enumerate(recorded):
        if index in same:
            found.append(ToolCallMatch(name=call.name, match="same", arguments=call.arguments))
            continue
        other = next((c for c in left if c.name == call.name), None)
        if other is not None:
            left.remove(other)
        found.append(
            ToolCallMatch(
                name=call.name,
                match="different" if other is not None else "missing",
                arguments=call.arguments,
                candidate_arguments=other.arguments if other is not None else None,
            )
        )
    found.extend(
        ToolCallMatch(name=c.name, match="extra", candidate_arguments=c.arguments) for c in left
    )
    return found


def summarize(calls: list[ReplayCall]) -> ReplaySummary:
    """The aggregate of ``calls``."""
    original, candidate = Totals(), Totals()
    similarities: list[float] = []
    tool_calls = identical = failed = mismatches = 0
    for call in calls:
        if call.recorded is not None:
            original.add(call.recorded)
        if call.candidate is not None:
            candidate.add(call.candidate)
            failed += call.candidate.error is not None
        if call.similarity is not None:
            similarities.append(call.similarity)
        tool_calls += len(call.tool_calls)
        identical += sum(1 for match in call.tool_calls if match.match == "same")
        mismatches += call.context_matches is False
    return ReplaySummary(
        calls=len(calls),
        tool_calls=tool_calls,
        identical_tool_calls=identical,
        identical_tool_call_share=round(identical / tool_calls, 4) if tool_calls else None,
        text_similarity=round(sum(similarities) / len(similarities), 4) if similarities else None,
        failed_calls=failed,
        context_mismatches=mismatches,
        original=original,
        candidate=candidate,
    )
