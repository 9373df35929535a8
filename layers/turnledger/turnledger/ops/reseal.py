"""Seal what was written before content sealing was on (issue 24's migration), one
conversation or a whole tenant at a time: ``turnledger seal-existing``.

The store rewrites each clear item as a write would seal it, on the condition that it is
unchanged since it was read (:meth:`~turnledger.store.base.ConversationStore.seal_existing`);
this module walks a tenant's conversations (``by-tenant``, paged) and its own partitions.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.models import ConversationKey
from ..store import keys
from ..store.base import ConversationStore, SealReport
from ..store.memories import memory_users


def seal_conversations(
    store: ConversationStore, conversations: Iterable[ConversationKey]
) -> SealReport:
    """Seal the clear items of each of ``conversations``; returns the summed report."""
    report = SealReport()
    for key in conversations:
        report += store.seal_existing(key)
    return report


def seal_tenant(store: ConversationStore, tenant: str) -> SealReport:
    """Seal the clear items of every conversation of ``tenant`` that has a head, of the
    tenant's own partition (the OpenAI face's index) and of its users' memory partitions."""
    report = seal_conversations(store, store.of_tenant(tenant))
    report += store.seal_existing(keys.tenant_items(tenant))
    report += seal_conversations(
        store, (keys.memory_items(tenant, user) for user in memory_users(store, tenant))
    )
    return report
