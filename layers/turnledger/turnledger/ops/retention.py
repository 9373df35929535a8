"""Retention per data class: the sweep removes content older than its class keeps it.

A data policy's class may say ``retention_seconds`` (``turnledger.context.policy``). For a
conversation of such a class, :func:`retain` replaces the content of every event older
than the retention (at the sweep's ``now``) by a marker saying what removed it, the class
and when (:func:`turnledger.store.retention.remove_content`); the events stay, so the
transcript still shows what happened and a later turn continues it. The sweep runs it for
each conversation it is asked to sweep (:meth:`turnledger.ops.sweep.Sweeper.conversations`).

Under a policy none of whose classes has a retention (or no policy) it reads nothing; a
conversation with no class, or of a class without a retention, costs one head read.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from ..context.policy import DataPolicy
from ..core.models import ConversationKey
from ..core.observability import logger
from ..store.base import ConversationStore
from ..store.retention import Removal, removal_marker, remove_content


def retain(
    store: ConversationStore,
    key: ConversationKey,
    policy_of: Callable[[str], DataPolicy | None],
    now: datetime,
) -> Removal:
    """Remove the content of ``key``'s events older than its class's retention at ``now``.

    Raises:
        CorruptedState, UnsupportedStateVersion: an event item cannot be read.
    """
    policy = policy_of(key.tenant)
    if policy is None or all(c.retention_seconds is None for c in policy.classes):
        return Removal()  # nothing can be due: not even the head is read
    head = store.get_head(key, content=False)
    if head is None or head.data_class is None or not head.is_visible(now):
        return Removal()
    held = policy.effective(head.data_class)
    if held is None or held.retention_seconds is None:
        return Removal()
    before = now - timedelta(seconds=held.retention_seconds)
    removal = remove_content(store, key, head, before=before, marker=removal_marker(held.name, now))
    if removal.sequences:
        logger.info(
            "content removed by its class's retention",
            extra={
                "tenant": key.tenant,
                "conversation_id": key.conversation_id,
                "data_class": held.name,
                "sequences": removal.sequences,
            },
        )
    return removal
