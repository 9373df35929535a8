"""Retention per data class: the sweep removes content older than its class keeps it.

A data policy's class may say ``retention_seconds`` (``turnledger.context.policy``). For a
conversation of such a class, the sweep replaces the content of every event older than
the retention (at the sweep's ``now``) by a marker saying what removed it, the class and
when (:func:`turnledger.store.retention.remove_content`); the events stay, so the
transcript still shows what happened and a later turn continues it.

Two ways in, one removal:

* **Scheduled** (:func:`retain_due`): the head says when its oldest retained content
  falls due (:attr:`~turnledger.core.models.Head.retention_due`, set by the first commit of
  a class with a retention: :class:`turnledger.turn.session.Session`), and the store files
  it on ``by-wait`` under that hour; the sweep's pass over due work
  (:meth:`turnledger.ops.sweep.Sweeper.expired`) calls this for each conversation it lists
  there. The cost grows with the conversations due, never with the table.
* **On demand** (:func:`retain`), for each conversation the sweep is asked to sweep
  (:meth:`turnledger.ops.sweep.Sweeper.conversations`), due or not.

Either way the head is then filed under the time the oldest content kept falls due (its
time plus the retention), or under nothing when none is kept
(:meth:`~turnledger.store.base.ConversationStore.refile_retention`). Under a policy none
of whose classes has a retention (or no policy) neither reads anything; a conversation
with no class, or of a class without a retention, costs one head read.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from ..context.policy import DataPolicy
from ..core.models import ConversationKey, Head
from ..core.observability import logger
from ..store.base import ConversationStore
from ..store.retention import Removal, removal_marker, remove_content

PolicyOf = Callable[[str], DataPolicy | None]


def retain(
    store: ConversationStore, key: ConversationKey, policy_of: PolicyOf, now: datetime
) -> Removal:
    """Remove the content of ``key``'s events older than its class's retention at ``now``.

    Raises:
        CorruptedState, UnsupportedStateVersion: an event item cannot be read.
    """
    policy = _retaining(policy_of, key)
    if policy is None:
        return Removal()  # nothing can be due: not even the head is read
    return _retain(store, key, store.get_head(key, content=False), policy, now)


def retain_due(
    store: ConversationStore, key: ConversationKey, policy_of: PolicyOf, now: datetime
) -> Removal:
    """:func:`retain` for a conversation the ``by-wait`` index lists: only when its head's
    retained content is due at ``now`` (it may be listed for a wait, or for later in the
    hour: the pass reads that hour again until it ended).

    Raises:
        CorruptedState, UnsupportedStateVersion: an event item cannot be read.
    """
    policy = _retaining(policy_of, key)
    if policy is None:
        return Removal()
    head = store.get_head(key, content=False)
    if head is None or head.retention_due is None or head.retention_due > now:
        return Removal()
    return _retain(store, key, head, policy, now)


def _retaining(policy_of: PolicyOf, key: ConversationKey) -> DataPolicy | None:
    """The tenant's policy, if one of its classes has a retention."""
    policy = policy_of(key.tenant)
    if policy is None or all(c.retention_seconds is None for c in policy.classes):
        return None
    return policy


def _retain(
    store: ConversationStore,
    key: ConversationKey,
    head: Head | None,
    policy: DataPolicy,
    now: datetime,
) -> Removal:
    if head is None or head.data_class is None or not head.is_visible(now):
        return Removal()  # an expired head is the expiry pass's
    held = policy.effective(head.data_class)
    if held is None or held.retention_seconds is None:
        if head.retention_due is not None:
            # The policy no longer retains this class: nothing will fall due.
            store.refile_retention(key, head, None)
        return Removal()
    retention = timedelta(seconds=held.retention_seconds)
    removal = remove_content(
        store, key, head, before=now - retention, marker=removal_marker(held.name, now)
    )
    # What was kept is due after its retention; never filed behind the sweep's cursor.
    due = max(removal.kept_since + retention, now) if removal.kept_since is not None else None
    if due != head.retention_due:
        store.refile_retention(key, head, due)
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
