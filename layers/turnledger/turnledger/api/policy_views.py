"""What a reader sees of a conversation under a data policy: values of the classes whose
``read_scope`` the caller holds, tokens for the rest (``turnledger.context.tokens``).

Applied at the edge to what the read routes answer (events, export lines, a turn's
response, as the turn route answers it and as ``GET .../turns/{n}`` does); without a
policy the answers are as they were. Both ways: a value of a class the reader may not see
becomes its token, and a token the model wrote (it only ever sees tokens) of a class the
reader may see becomes its value, read back from the conversation's events
(:func:`~turnledger.context.tokens.mapping`: the transcript is the only mapping). An
answer that holds neither a value nor a token is answered as it is, with nothing read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ..context.policy import DataPolicy, Finding, detectors_of
from ..context.tokens import TOKEN, mapping, protect, readable_classes, reveal
from ..core.models import ConversationKey
from ..runtime import get_runtime
from .resolver import scope_values
from .schemas import EventsPage, EventView, TurnResponse

#: Events a page of the read that maps tokens back to values holds.
_MAPPING_PAGE = 1000


class ReaderView:
    """What the current caller sees of one life of a conversation (``gen``; ``None``: the
    visible head's, read when first needed). The token key and the mapping are read once,
    and only when an answer needs them."""

    def __init__(self, key: ConversationKey, policy: DataPolicy, gen: str | None = None) -> None:
        self.key = key
        self.policy = policy
        self.keep = readable_classes(policy, scope_values())
        self._gen = gen
        self._secret: bytes | None = None
        self._known: dict[str, Finding] | None = None

    def __call__(self, value: Any) -> Any:
        """``value`` (JSON) as the caller may read it."""
        texts = list(_strings(value))
        detectors = detectors_of(self.policy)
        revealing = any(m.group(1) in self.keep for text in texts for m in TOKEN.finditer(text))
        if not revealing and not any(detectors.find(text) for text in texts):
            return value
        shown = protect(value, self.policy, self.secret(), self.keep)
        return reveal(shown, self.known(), self.keep) if revealing else shown

    def secret(self) -> bytes:
        """The life's token key."""
        if self._secret is None:
            reads = get_runtime().reads_for(self.key.tenant)
            if self._gen is None:
                self._gen = reads.visible_head(self.key).gen
            self._secret = reads.token_secret(self.key, self._gen)
        return self._secret

    def known(self) -> dict[str, Finding]:
        """Token -> value, over every event of the conversation (paged)."""
        if self._known is None:
            reads = get_runtime().reads_for(self.key.tenant)
            texts: list[str] = []
            after: int | None = 0
            while after is not None:
                page = reads.events(self.key, after=after, limit=_MAPPING_PAGE)
                texts.extend(_strings([e.payload for e in page.events]))
                after = page.next_after
            self._known = mapping(texts, self.policy, self.secret())
        return self._known


def reader_view(key: ConversationKey, gen: str | None = None) -> ReaderView | None:
    """The caller's view of ``key`` (``None``: no policy with detectors: as it is)."""
    policy = get_runtime().data_policy(key.tenant)
    if policy is None or not policy.detectors:
        return None
    return ReaderView(key, policy, gen)


def events_for_reader(page: EventsPage, key: ConversationKey, gen: str) -> EventsPage:
    """``page`` (of ``key``'s life ``gen``) as the caller may read it."""
    view = reader_view(key, gen)
    if view is None:
        return page
    events = [
        EventView.model_validate({**e.model_dump(), "payload": view(e.payload)})
        for e in page.events
    ]
    return page.model_copy(update={"events": events})


def export_reader(key: ConversationKey) -> Callable[[str], str] | None:
    """What each line of an NDJSON export becomes for the caller (``None``: as it is)."""
    view = reader_view(key)
    if view is None:
        return None

    def line(text: str) -> str:
        ending = "\n" if text.endswith("\n") else ""
        value = view(json.loads(text))
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + ending

    return line


def answer_for_reader(answer: TurnResponse, key: ConversationKey) -> TurnResponse:
    """A turn's response (as recorded for an idempotent retry: the same for every
    caller) as the caller may read it."""
    view = reader_view(key)
    if view is None:
        return answer
    value = answer.model_dump(mode="json")
    shown = view(value)
    return answer if shown is value else TurnResponse.model_validate(shown)


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value`` (JSON), keys excepted."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
