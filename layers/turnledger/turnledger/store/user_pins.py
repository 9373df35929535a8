"""Pins of a user: facts and constraints every conversation of that user carries, kept in
the user's memory partition (:func:`.keys.memory_items`) beside the memory records.

An active pin is one side item (sort key ``S#up#<pin id>``); removing it writes the pin
with who removed it, when and why (``S#ux#<pin id>``) before the active item is deleted.
A conversation's pins are events of its log; a user's pins belong to no conversation, so
these two records are what the log's ``pin_added`` and ``pin_removed`` are to a
conversation: the author and time of each change, in the user's partition. A pin's text
never changes, so a turn's run record naming a pin's id is enough to rebuild what the
turn sent, removed or not (:func:`pins_by_id`).

Layout of the user's partition: ``S#m#...`` the memory records, ``S#up#...`` the active
pins, ``S#ux#...`` the removed ones. A turn reads the records and the active pins in one
query (:func:`user_memory`: the range from ``S#m#`` to the end of ``S#up#``, where nothing
else lives), so carrying a user's pins adds no read to the one memory recall makes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from ..core.models import Deferred
from . import keys
from .base import ConversationStore
from .codec import SideItem
from .memories import MemoryRecord

#: The side item attribute holding a pin's (or a removal's) JSON.
_BODY = "pin"
#: The side item attribute holding a memory record's JSON (:mod:`.memories`).
_RECORD_BODY = "mem"
#: Sorts after every character of a pin id: a prefix range's end.
_END = "\x7f"

#: What a user pin may be: a user's pins name no event, so no correction.
UserPinKind = Literal["fact", "constraint"]


class UserPin(Deferred):
    """A fact or a constraint an operator pinned for a user: every model call of that
    user's conversations carries its text verbatim until it is removed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^pin_[0-9a-z]{1,40}$")
    kind: UserPinKind
    text: str = Field(min_length=1)
    reason: str | None = None
    #: Who pinned it (the caller's ``sub``).
    author: str
    added_at: datetime


class UserPinRemoval(Deferred):
    """The record of a removed user pin: the pin as it stood, who removed it, when, why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pin: UserPin
    removed_by: str
    removed_at: datetime
    reason: str | None = None


def _pin_key(pin_id: str) -> str:
    return keys.USER_PIN_PREFIX + pin_id


def _removal_key(pin_id: str) -> str:
    return keys.USER_PIN_REMOVED_PREFIX + pin_id


def user_memory(
    store: ConversationStore, tenant: str, user: str, *, consistent: bool = True
) -> tuple[list[MemoryRecord], list[UserPin]]:
    """The user's memory records (oldest first) and active pins (oldest first), in one
    query over the user's partition."""
    found = store.query_side_items(
        keys.memory_items(tenant, user),
        lower=keys.MEMORY_RECORD_PREFIX,
        upper=keys.USER_PIN_PREFIX + _END,
        consistent=consistent,
    )
    records: list[MemoryRecord] = []
    pins: list[UserPin] = []
    for item in found:
        if item.sort_key.startswith(keys.MEMORY_RECORD_PREFIX):
            records.append(MemoryRecord.model_validate_json(str(item.attributes[_RECORD_BODY])))
        elif item.sort_key.startswith(keys.USER_PIN_PREFIX):
            pins.append(UserPin.model_validate_json(str(item.attributes[_BODY])))
    return records, _oldest_first(pins)


def _oldest_first(pins: list[UserPin]) -> list[UserPin]:
    return sorted(pins, key=lambda pin: (pin.added_at, pin.id))


class UserPinBook:
    """One user's pins in one tenant."""

    def __init__(self, store: ConversationStore, tenant: str, user: str) -> None:
        self.store = store
        self.tenant = tenant
        self.user = user
        self.key = keys.memory_items(tenant, user)

    def active(self) -> list[UserPin]:
        """The active pins, oldest first (one query)."""
        found = self.store.query_side_items(
            self.key, lower=keys.USER_PIN_PREFIX, upper=keys.USER_PIN_PREFIX + _END
        )
        return _oldest_first([UserPin.model_validate_json(str(i.attributes[_BODY])) for i in found])

    def add(self, pin: UserPin) -> None:
        """Store ``pin`` as active, and file the user in the tenant's partition (tenant
        erasure finds the user's partition there, as for a memory record)."""
        self.store.put_side_item(
            keys.tenant_items(self.tenant),
            SideItem(sort_key=keys.memory_user_key(self.user), attributes={"user": self.user}),
        )
        self.store.put_side_item(
            self.key,
            SideItem(sort_key=_pin_key(pin.id), attributes={_BODY: pin.model_dump_json()}),
        )

    def remove(self, removal: UserPinRemoval) -> None:
        """Record ``removal``, then delete the active pin (a retry after a crash between
        the two finds the pin still active and does both again)."""
        self.store.put_side_item(
            self.key,
            SideItem(
                sort_key=_removal_key(removal.pin.id),
                attributes={_BODY: removal.model_dump_json()},
            ),
        )
        self.store.delete_side_items(self.key, [_pin_key(removal.pin.id)])

    def removals(self) -> list[UserPinRemoval]:
        """The records of every removed pin."""
        found = self.store.query_side_items(
            self.key,
            lower=keys.USER_PIN_REMOVED_PREFIX,
            upper=keys.USER_PIN_REMOVED_PREFIX + _END,
        )
        return [UserPinRemoval.model_validate_json(str(i.attributes[_BODY])) for i in found]


def pins_by_id(store: ConversationStore, tenant: str, user: str) -> dict[str, UserPin]:
    """Every pin the user ever had, active or removed, by id (two queries): what a run
    record's ``user_pins`` names is rebuilt from these."""
    book = UserPinBook(store, tenant, user)
    pins = {removal.pin.id: removal.pin for removal in book.removals()}
    pins.update({pin.id: pin for pin in book.active()})
    return pins
