"""Compaction: the summaries that cover what a working context leaves out, with manifests.

Three things call for a summary, and each ``context_compacted`` event records which
(its ``trigger``):

* ``budget``: older turns no longer fit the token budget
  (:func:`~turnledger.context.assembly.turns_to_compact`);
* ``read_window``: the history a turn reads (the store's cap in events and characters,
  :class:`~turnledger.store.base.ContextBudget`) stopped short of the newest summary's
  range, so the assembly never saw the turns in between. They are read here
  (:func:`unread`, paged, whatever their size) and summarized before the model is called:
  nothing leaves the context unsummarised;
* ``manual``: ``POST .../compact`` writes the newest summary again over the same range,
  from the log, with the summarizer it names.

A large range is summarized in batches of at most half the summarizer's budget, each
call folding in the text the previous one returned (:func:`summarize`).

A summary that fails, comes back empty, or would cut a tool call from its result never
replaces history: nothing is written, the caller goes on with the previous summary, and
the skip is logged and counted (metric :data:`SKIPPED_METRIC`).

**Checked by code.** A deployment names must-keep patterns (``SUMMARY_MUST_KEEP``: order
numbers, amounts, a confirmed language): every value one of them matches in what a
summary replaces (the summarized turns and the previous summary) must be in its text, or
the summary is refused as a failed one is (:func:`lost_values`, reason ``lost_values``).
Pins are never the summarizer's: every context carries them beside the summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from aws_lambda_powertools.metrics import MetricUnit

from ..context.assembly import (
    SUMMARY_PROMPT_VERSION,
    Estimator,
    Summary,
    Turn,
    counts,
    splits_tool_call,
    summary_batches,
    summary_request,
    text_sha256,
)
from ..core import telemetry
from ..core.exceptions import ProviderError
from ..core.models import ContextCompacted, Event, Usage
from ..core.observability import logger, metrics, timed
from ..providers.base import Message, Provider
from ..store.base import ConversationStore
from .session import Session

#: Counted once each time a summary was due and none was written.
SKIPPED_METRIC = "CompactionSkipped"

Trigger = Literal["budget", "read_window", "manual"]


@dataclass(frozen=True)
class Summarizer:
    """Who writes a summary: a provider and the model it is asked for."""

    provider: Provider
    model: str


@dataclass(frozen=True)
class Compaction:
    """What a new summary covers: the turns it summarizes now (oldest first), the range's
    first sequence and turn, its last sequence, and the summary it folds in (if any)."""

    turns: list[Turn]
    from_sequence: int
    from_turn: int | None
    through: int
    previous: Summary | None
    trigger: Trigger
    #: A manual compaction: the sequence of the summary event it writes again.
    replaces: int | None = None


@dataclass(frozen=True)
class Written:
    """A summary ready to stage: its payload and what the summarizer calls used."""

    payload: ContextCompacted
    usage: Usage
    model: str


def unread(store: ConversationStore, session: Session) -> list[Event]:
    """The committed events between the newest summary's range and the first event
    ``session`` read (what the read window left out), oldest first; ``[]`` when the read
    reached the range."""
    known = session.events
    if not known or session.head is None:
        return []
    floor = session.summary.through if session.summary is not None else 0
    first = min(event.sequence for event in known)
    if first <= floor + 1:
        return []
    return store.read_events(session.key, session.head, after=floor, limit=first - 1 - floor)


def skipped(reason: str, **extra: object) -> None:
    """Log and count a summary that was due and not written."""
    logger.warning(
        "context summary not written; the turn goes on with the previous summary",
        extra={"reason": reason, **extra},
    )
    metrics.add_metric(SKIPPED_METRIC, MetricUnit.Count, 1)


def summarize(
    summarizer: Summarizer,
    compaction: Compaction,
    *,
    estimator: Estimator,
    limit: int,
    later: Iterable[Event] = (),
    pending: Iterable[str] = (),
    pins: list[str] | None = None,
    must_keep: Mapping[str, str] | None = None,
) -> Written | None:
    """Summarize ``compaction``'s turns in batches of at most ``limit`` tokens, folding in
    its previous summary, and describe the result in a ``context_compacted`` payload with
    its manifest.

    ``None`` (logged and counted) when there is nothing to summarize, the summary would
    cut a tool call from its result (``later``: the events after the range; ``pending``:
    ids of calls still waiting), a summarizer call fails, or one answers nothing.
    ``pins``: the ids of the pins in effect, for the manifest (none is sent to the
    summarizer: every context carries them beside the summary). ``must_keep``: the
    deployment's must-keep patterns; a summary that loses a value is refused too.
    """
    turns = compaction.turns
    if not turns:
        return None
    name = summarizer.provider.name
    if splits_tool_call(turns, later, pending):
        skipped("splits_tool_call", summarizer=name)
        return None
    previous = compaction.previous
    text = previous.message().content if previous is not None else None
    usage = Usage()
    model = summarizer.model
    for batch in summary_batches(turns, limit):
        try:
            with (
                telemetry.model_call(name, summarizer.model, telemetry.PURPOSE_SUMMARY) as traced,
                timed("SummaryLatency"),
            ):
                reply = summarizer.provider.complete(summary_request(summarizer.model, text, batch))
                traced.answered(reply)
        except ProviderError as exc:
            skipped("summarizer_failed", code=exc.code, summarizer=name)
            return None
        usage = usage + reply.usage
        model = reply.model or model
        text = (reply.text or "").strip()
        if not text:
            skipped("empty_summary", summarizer=name)
            return None
    assert text is not None  # at least one batch ran
    replaced = [previous.message().content or ""] if previous is not None else []
    replaced += [m.content or "" for turn in turns for m in turn.messages]
    lost = lost_values(must_keep or {}, replaced, text)
    if lost:
        skipped("lost_values", summarizer=name, patterns=sorted(lost))
        return None
    messages, calls = counts(turns)
    covered_messages: int | None = messages
    covered_calls: int | None = calls
    before = sum(turn.tokens for turn in turns)
    if previous is not None:
        body = previous.body
        covered_messages = None if body.messages is None else body.messages + messages
        covered_calls = None if body.tool_calls is None else body.tool_calls + calls
        before += estimator.tokens([previous.message()])
    after = estimator.tokens([Message(role="system", content=text)])
    payload = ContextCompacted(
        from_sequence=compaction.from_sequence,
        to_sequence=compaction.through,
        previous_through=previous.body.to_sequence if previous is not None else None,
        summarizer_provider=name,
        summarizer_model=model,
        prompt_version=SUMMARY_PROMPT_VERSION,
        text=text,
        content_sha256=text_sha256(text),
        tokens_estimated=after,
        from_turn=compaction.from_turn,
        to_turn=turns[-1].number,
        messages=covered_messages,
        tool_calls=covered_calls,
        tokens_before=before,
        tokens_after=after,
        trigger=compaction.trigger,
        replaces=compaction.replaces,
        pins=pins,
    )
    return Written(payload=payload, usage=usage, model=model)


def lost_values(
    must_keep: Mapping[str, str], replaced: Iterable[str], text: str
) -> dict[str, list[str]]:
    """The values each must-keep pattern matches in the texts a summary ``replaced`` that
    its ``text`` does not hold, by pattern name (``{}``: it keeps them all). A match is
    its first group when the pattern has one, else the whole match."""
    lost: dict[str, list[str]] = {}
    sources = list(replaced)
    for name, pattern in must_keep.items():
        compiled = re.compile(pattern)
        values = {
            match.group(1) if compiled.groups else match.group(0)
            for source in sources
            for match in compiled.finditer(source)
        }
        missing = sorted(value for value in values if value and value not in text)
        if missing:
            lost[name] = missing
    return lost


def covering(
    turns: Sequence[Turn], previous: Summary | None, through: int, trigger: Trigger
) -> Compaction:
    """The compaction of ``turns`` through sequence ``through``, folding in ``previous``:
    the range starts where ``previous``'s did, else at the first turn."""
    if previous is not None:
        first, first_turn = previous.body.from_sequence, previous.body.from_turn
    else:
        first, first_turn = turns[0].first_sequence, turns[0].number
    return Compaction(
        turns=list(turns),
        from_sequence=first,
        from_turn=first_turn,
        through=through,
        previous=previous,
        trigger=trigger,
    )
