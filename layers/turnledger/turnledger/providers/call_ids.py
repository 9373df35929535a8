"""Tool call ids as one provider accepts them, mapped deterministically from canonical ids.

The canonical log keeps the ids the model that made each call gave it
(``call_...`` from OpenAI, ``tooluse_...`` from Bedrock, ``call_1`` from the
demo model). When a conversation moves to another provider its history holds
ids that provider may refuse: Bedrock wants ``[a-zA-Z0-9_-]{1,64}`` and, for
Anthropic models, ids unique in the conversation; OpenAI wants at most 40
characters. :class:`CallIdMap` gives each call of a history the id it keeps
when acceptable, else a derived one (``tl_`` and 24 hex digits of a sha256 of
the id and its occurrence), and each tool result the id of the call it
answers. The mapping depends only on the history before each call, so the
same history always maps the same way (what a provider stored from an
earlier request still matches), and it maps back: an id the provider echoes
is returned as the canonical one.
"""

from __future__ import annotations

import hashlib
import re

#: What Bedrock Converse (and the Anthropic models behind it) accepts as a ``toolUseId``.
BEDROCK_CALL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
#: What OpenAI's Chat Completions accepts as a tool call id (at most 40 characters).
OPENAI_CHAT_CALL_ID = re.compile(r"[a-zA-Z0-9_.:-]{1,40}")
#: What is sent as a Responses API ``call_id``.
OPENAI_RESPONSES_CALL_ID = re.compile(r"[a-zA-Z0-9_.:-]{1,64}")


class CallIdMap:
    """Canonical call ids to one provider's ids and back, over one history, in order.

    Feed it the history oldest first: :meth:`call` for each tool call of each
    assistant message, :meth:`result` for each tool result.
    """

    def __init__(self, accepted: re.Pattern[str], *, unique: bool = False) -> None:
        """Args:
        accepted: the ids the provider takes as they are (matched whole).
        unique: the provider refuses an id used by two calls of one history.
        """
        self._accepted = accepted
        self._unique = unique
        self._used: set[str] = set()
        self._seen: dict[str, int] = {}
        #: canonical id -> the wire id of its latest call.
        self._latest: dict[str, str] = {}
        #: wire id -> canonical id, for the ids that differ.
        self._back: dict[str, str] = {}

    def call(self, canonical: str) -> str:
        """The wire id of the next call with id ``canonical``."""
        occurrence = self._seen.get(canonical, 0)
        self._seen[canonical] = occurrence + 1
        wire = canonical
        if not self._accepted.fullmatch(canonical) or (self._unique and canonical in self._used):
            wire = self._derive(canonical, occurrence)
        self._used.add(wire)
        self._latest[canonical] = wire
        if wire != canonical:
            self._back[wire] = canonical
        return wire

    def result(self, canonical: str) -> str:
        """The wire id of the call a result with id ``canonical`` answers (its latest call)."""
        wire = self._latest.get(canonical)
        if wire is not None:
            return wire
        # A result without a call in sight: map it the same way, so it stays recognisable.
        return canonical if self._accepted.fullmatch(canonical) else self._derive(canonical, 0)

    def canonical(self, wire: str) -> str:
        """The canonical id of ``wire`` (itself, unless this map derived it)."""
        return self._back.get(wire, wire)

    def _derive(self, canonical: str, occurrence: int) -> str:
        salt = occurrence
        while True:
            digest = hashlib.sha256(f"{canonical}\x00{salt}".encode()).hexdigest()
            wire = f"tl_{digest[:24]}"
            if wire not in self._used:
                return wire
            salt += 1  # a second result for a derived id: practically never, but stay unique
