"""What a reader sees of a conversation under a data policy: values of the classes whose
``read_scope`` the caller holds, tokens for the rest (``turnledger.context.tokens``).

Applied at the edge to what the read routes answer (events, export lines); without a policy
the answers are as they were.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..context.tokens import protect, readable_classes
from ..core.models import ConversationKey
from ..runtime import get_runtime
from .resolver import scope_values
from .schemas import EventsPage, EventView


def events_for_reader(page: EventsPage, key: ConversationKey, gen: str) -> EventsPage:
    """``page`` (of ``key``'s life ``gen``) as the caller may read it."""
    policy = get_runtime().data_policy(key.tenant)
    if policy is None or not policy.detectors:
        return page
    keep = readable_classes(policy, scope_values())
    secret = get_runtime().reads_for(key.tenant).token_secret(key, gen)
    events = [
        EventView.model_validate(
            {**e.model_dump(), "payload": protect(e.payload, policy, secret, keep)}
        )
        for e in page.events
    ]
    return page.model_copy(update={"events": events})


def export_reader(key: ConversationKey) -> Callable[[str], str] | None:
    """What each line of an NDJSON export becomes for the caller (``None``: as it is)."""
    policy = get_runtime().data_policy(key.tenant)
    if policy is None or not policy.detectors:
        return None
    keep = readable_classes(policy, scope_values())
    secrets: list[bytes] = []

    def line(text: str) -> str:
        if not secrets:  # on the first line: the export has read the head (it exists)
            reads = get_runtime().reads_for(key.tenant)
            secrets.append(reads.token_secret(key, reads.visible_head(key).gen))
        ending = "\n" if text.endswith("\n") else ""
        value = protect(json.loads(text), policy, secrets[0], keep)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + ending

    return line
