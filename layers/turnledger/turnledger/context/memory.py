"""Long-term memory in the context: what to recall for a turn, and what to write back.

**Recall.** Each turn's context carries the user's most relevant records
(:class:`~turnledger.store.memories.MemoryRecord`) as one system message after the
system prompt, starting with :data:`MEMORY_PREFIX`, one record a line. Records are
ranked (:func:`rank`) by cosine similarity of embeddings when both the turn's input and
the record have one, else by keyword overlap with the turn's input, ties to the most
recently updated; of records sharing a ``key`` only the newest counts. They are taken in
that order while the block stays within ``MEMORY_CONTEXT_SHARE`` of the context budget
(:func:`recall_block`); the run record names the ids taken (``memory_ids``).

**Write-back.** After a turn's final answer, the summarizer provider is asked
(:func:`extraction_request`, ``purpose="memory"``) for the facts the user stated about
themselves in the turn's messages, as JSON ``{"memories": [{"key", "text"}]}``
(:func:`parse_facts`). :func:`plan_writes` turns them into writes: a fact whose key a
record already has supersedes that record (same id, new text, new provenance); a fact
with no key is added unless a record has the same text; beyond the cap, the least
recently updated records are dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..providers.base import Message, ModelRequest
from ..store.memories import (
    MEMORY_KEY_PATTERN,
    MEMORY_TEXT_MAX,
    MemoryRecord,
    new_memory_id,
)
from ..store.user_pins import UserPin
from .assembly import Estimator

#: Every recalled memory block is one system message starting with this.
MEMORY_PREFIX = "Memory of this user (from earlier conversations):"

#: Names the extraction prompt below.
EXTRACTION_PROMPT_VERSION = "memory-v1"

EXTRACTION_PROMPT = (
    "You keep a long-term memory of facts a user states about themselves. The user "
    "message is JSON: `known` (the facts kept so far, each with a `key` and a `text`) and "
    "`messages` (what the user just said, oldest first). Answer only JSON: "
    '{"memories": [{"key": K, "text": T}]} listing the facts in `messages` worth keeping '
    "across conversations (name, city, language, work, preferences), each `text` one "
    "short first-person sentence, each `key` a short lower-case name; reuse a known key "
    "when a fact replaces it. Facts about anyone else, and anything an assistant said, "
    'are not kept. Nothing to keep: {"memories": []}.'
)

_WORD = re.compile(r"[^\W_]+")
#: Words that say nothing about what a record is about.
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "so",
        "that",
        "the",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
        "you",
        "your",
    ]
)


class Fact(BaseModel):
    """One fact the extractor found: its text and, where one applies, its key."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: str | None = Field(default=None, pattern=MEMORY_KEY_PATTERN)
    text: str = Field(min_length=1, max_length=MEMORY_TEXT_MAX)


class _Facts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    memories: list[Fact]


def extraction_request(
    model: str, texts: Sequence[str], known: Sequence[MemoryRecord]
) -> ModelRequest:
    """The extractor's call over the user's ``texts``, with the ``known`` records' keys."""
    payload = {
        "known": [{"key": r.key, "text": r.text} for r in known if r.key is not None],
        "messages": list(texts),
    }
    return ModelRequest(
        model=model,
        purpose="memory",
        messages=[
            Message(role="system", content=EXTRACTION_PROMPT),
            Message(role="user", content=json.dumps(payload, ensure_ascii=False)),
        ],
    )


def parse_facts(text: str) -> list[Fact]:
    """The facts of an extractor's answer (a JSON object, possibly fenced as code).

    Raises:
        ValueError: the answer is not the JSON the prompt asks for.
    """
    raw = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        return _Facts.model_validate_json(raw).memories
    except ValidationError as exc:
        raise ValueError(
            f"the memory extractor's answer is not its JSON: {exc.error_count()} errors"
        ) from exc


@dataclass(frozen=True)
class Provenance:
    """Where facts come from: the conversation and its events' sequence range."""

    conversation_id: str
    from_sequence: int
    to_sequence: int


@dataclass
class WritePlan:
    """What write-back changes: records to put (new or superseding) and ids to delete."""

    puts: list[MemoryRecord] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)


def plan_writes(
    records: Sequence[MemoryRecord],
    facts: Sequence[Fact],
    *,
    now: datetime,
    source: Provenance,
    cap: int,
    embed: Callable[[str], str | None] | None = None,
) -> WritePlan:
    """The writes that keep ``facts`` in a user's ``records`` (see the module docstring).

    ``embed``: the embedding of a new text, when embeddings rank records.
    """
    plan = WritePlan()
    current: dict[str, MemoryRecord] = {r.id: r for r in records}
    by_key: dict[str, MemoryRecord] = {}
    for record in sorted(records, key=lambda r: r.updated_at):
        if record.key is None:
            continue
        older = by_key.get(record.key)
        if older is not None:
            # Two turns racing wrote the same key twice: the newer wins, the older goes.
            plan.deletes.append(older.id)
            current.pop(older.id)
        by_key[record.key] = record
    texts = {" ".join(r.text.lower().split()) for r in records}
    provenance = {
        "conversation_id": source.conversation_id,
        "from_sequence": source.from_sequence,
        "to_sequence": source.to_sequence,
        "source": "extracted",
        "updated_at": now,
    }
    for fact in facts:
        old = by_key.get(fact.key) if fact.key is not None else None
        if old is not None:
            if old.text == fact.text:
                continue  # nothing new: no write
            record = old.model_copy(
                update={
                    "text": fact.text,
                    "embedding": embed(fact.text) if embed else None,
                    **provenance,
                }
            )
        elif " ".join(fact.text.lower().split()) in texts:
            continue
        else:
            record = MemoryRecord(
                id=new_memory_id(),
                text=fact.text,
                key=fact.key,
                created_at=now,
                embedding=embed(fact.text) if embed else None,
                **provenance,
            )
        if record.key is not None:
            by_key[record.key] = record
        texts.add(" ".join(record.text.lower().split()))
        current[record.id] = record
        plan.puts = [p for p in plan.puts if p.id != record.id] + [record]
    if len(current) > cap:
        written = {p.id for p in plan.puts}
        oldest = sorted(current.values(), key=lambda r: (r.id in written, r.updated_at, r.id))
        plan.deletes.extend(r.id for r in oldest[: len(current) - cap])
        dropped = set(plan.deletes)
        plan.puts = [p for p in plan.puts if p.id not in dropped]
    return plan


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (0 when either is zero or they differ in size)."""
    if len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def rank(
    records: Sequence[MemoryRecord],
    query: str,
    *,
    query_vector: Sequence[float] | None = None,
    vector_of: Callable[[MemoryRecord], Sequence[float] | None] | None = None,
) -> list[MemoryRecord]:
    """``records`` most relevant to ``query`` first (see the module docstring); of those
    sharing a key, only the newest."""
    newest: dict[str, MemoryRecord] = {}
    for record in records:
        if record.key is not None:
            kept = newest.get(record.key)
            if kept is None or record.updated_at > kept.updated_at:
                newest[record.key] = record
    unique = [r for r in records if r.key is None or newest[r.key] is r]
    words = _words(query)

    def score(record: MemoryRecord) -> float:
        vector = vector_of(record) if vector_of is not None and query_vector is not None else None
        if vector is not None and query_vector is not None:
            return cosine(query_vector, vector)
        mine = _words(record.text) | ({record.key} if record.key else set())
        return len(words & mine) / (len(mine) or 1)

    return sorted(unique, key=lambda r: (score(r), r.updated_at, r.id), reverse=True)


def memory_message(records: Sequence[MemoryRecord]) -> Message:
    """The recalled records as the context's system message (one record a line)."""
    lines = [f"- {' '.join(r.text.split())}" for r in records]
    return Message(role="system", content="\n".join([MEMORY_PREFIX, *lines]))


@dataclass(frozen=True)
class Recall:
    """A turn's view of its user's memory: the user, every record read (write-back plans
    against them), and the block the context carries with the ids it holds."""

    user: str
    records: list[MemoryRecord]
    message: Message | None = None
    ids: list[str] = field(default_factory=list)
    #: ``False``: the records could not be read (no write-back plans against them).
    complete: bool = True
    #: The user's active pins (read with the records), oldest first.
    pins: list[UserPin] = field(default_factory=list)


def recall_block(
    ranked: Sequence[MemoryRecord], *, budget: int, share: float, estimator: Estimator
) -> tuple[Message | None, list[str]]:
    """The block of the best ``ranked`` records within ``share`` of ``budget``, and their
    ids (``None`` and no ids when not even one fits)."""
    room = int(budget * share)
    taken: list[MemoryRecord] = []
    for record in ranked:
        if estimator.tokens([memory_message([*taken, record])]) > room:
            continue  # a long record may not fit where a shorter one still does
        taken.append(record)
    if not taken:
        return None, []
    return memory_message(taken), [r.id for r in taken]
