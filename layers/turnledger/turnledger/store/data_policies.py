"""A tenant's own data policies: every version kept, in the tenant's own partition.

Each ``PUT /v1/data-policy`` adds a version (side item ``S#dp#<number, 8 digits>`` in
:func:`.keys.tenant_items`); the newest number is the tenant's policy. Versions are never
rewritten by a later put, which takes the number after the newest (two puts racing for one
number: the later one's is kept, the earlier answered as kept; admins are few, and the
put's answer names its number). The store keeps the policy
as the JSON text it was given; the layers above parse it (``turnledger.context.policy``).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from ..core.models import Deferred
from . import keys
from .base import ConversationStore
from .codec import SideItem

#: Sort key prefix of a tenant's data-policy versions.
DATA_POLICY_PREFIX = f"{keys.SIDE_PREFIX}dp#"
_BODY = "dp"
_END = "\x7f"


class StoredPolicy(Deferred):
    """One version of a tenant's data policy, as it was set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int = Field(ge=1)
    #: The policy's own ``version``.
    version: str
    set_by: str
    set_at: datetime
    #: The policy as JSON text.
    policy: str


class PolicyVersions:
    """The data-policy versions of one tenant."""

    def __init__(self, store: ConversationStore, tenant: str) -> None:
        self.store = store
        self.key = keys.tenant_items(tenant)

    def all(self) -> list[StoredPolicy]:
        """Every version, oldest first."""
        found = self.store.query_side_items(
            self.key, lower=DATA_POLICY_PREFIX, upper=DATA_POLICY_PREFIX + _END
        )
        return [StoredPolicy.model_validate_json(str(i.attributes[_BODY])) for i in found]

    def latest(self) -> StoredPolicy | None:
        """The newest version, or ``None``."""
        versions = self.all()
        return versions[-1] if versions else None

    def add(self, version: str, policy: str, *, set_by: str, set_at: datetime) -> StoredPolicy:
        """Keep a new version after the newest; returns it."""
        latest = self.latest()
        stored = StoredPolicy(
            number=(latest.number + 1) if latest is not None else 1,
            version=version,
            set_by=set_by,
            set_at=set_at,
            policy=policy,
        )
        self.store.put_side_item(
            self.key,
            SideItem(
                sort_key=f"{DATA_POLICY_PREFIX}{stored.number:08d}",
                attributes={_BODY: stored.model_dump_json()},
            ),
        )
        return stored
