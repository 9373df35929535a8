"""The run flag: which turn's draft began last in a conversation (``HEAD#run``).

Every begin of a turn's draft puts the flag before the draft's state
(:mod:`turnledger.turn.drafts`); a load reads it with the head in the same query
(:attr:`.reads.Snapshot.run`), so a new turn learns in that one read whether a draft may
be running. It holds no content (nothing of it is sealed); a purge deletes it with the
partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.models import ConversationKey
from . import codec, keys
from .backend import Page
from .codec import Item

if TYPE_CHECKING:
    from .base import ConversationStore


@dataclass(frozen=True)
class RunFlag:
    """The partition's run flag: the turn whose draft began last, when, and in what life.

    Every begin of a turn's draft puts it before the draft's state
    (:mod:`turnledger.turn.drafts`), so no draft of a turn the flag does not name is
    running: the load's one read tells a new turn whether it must read its draft's state
    (the busy check)."""

    turn: int
    #: When the run began (epoch seconds).
    started_at: int
    gen: str | None = None


def flag_off(page: Page) -> tuple[Item | None, Page]:
    """The run flag's item, when ``page`` (descending from it) begins with it, and the page
    without it."""
    items = page.items
    if items and items[0].get(codec.A_SK) == keys.RUN_FLAG_SK:
        return items[0], Page(items[1:], page.cursor)
    return None, page


#: Attributes of the run flag (numbers: it holds no content, so nothing of it is sealed).
_A_RUN_TURN = "rt"
_A_RUN_AT = "ra"


def decode_flag(item: Item | None) -> RunFlag | None:
    """The run flag ``item`` holds (``None``: none, or one this code cannot read)."""
    if item is None:
        return None
    turn, at, gen = item.get(_A_RUN_TURN), item.get(_A_RUN_AT), item.get(codec.A_GEN)
    if not isinstance(turn, int | float) or not isinstance(at, int | float):
        return None
    return RunFlag(turn=int(turn), started_at=int(at), gen=str(gen) if gen else None)


def put_run_flag(
    store: ConversationStore, key: ConversationKey, flag: RunFlag, *, expires_at: int | None = None
) -> None:
    """Put ``key``'s run flag (``HEAD#run``, replacing the one there): what a load
    reads with the head (:attr:`.reads.Snapshot.run`). ``expires_at``: its TTL (epoch seconds).
    A purge deletes it with the partition (a flag of another life than the next)."""
    item: Item = {
        codec.A_PK: keys.partition_key(key),
        codec.A_SK: keys.RUN_FLAG_SK,
        _A_RUN_TURN: flag.turn,
        _A_RUN_AT: flag.started_at,
    }
    if flag.gen is not None:
        item[codec.A_GEN] = flag.gen
    if expires_at is not None:
        item[codec.A_EXPIRES] = expires_at
    store._put_items([item])
