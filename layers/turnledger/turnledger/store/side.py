"""Side items: items of a conversation's partition beside the transcript.

Sort keys under ``keys.SIDE_PREFIX`` (``S#...``, after ``"HEAD"``), never read by a
load: a purge deletes them with the rest, and with each its *companion* (a side item of
the tenant's own partition, :func:`.keys.tenant_items`: the OpenAI face's transcript
index). The caller (drafts: :mod:`turnledger.turn.drafts`; :mod:`turnledger.api.openai.matching`;
memories: :mod:`.memories`) hands data (:class:`.codec.SideItem`); the store owns the
item's keys, its TTL attribute, its life attribute and its companion attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.exceptions import InternalError
from ..core.models import ConversationKey
from . import codec, keys
from .codec import SideItem

if TYPE_CHECKING:
    from .base import ConversationStore


def _side_key(sort_key: str) -> str:
    """``sort_key`` if it is a side item's (never a head, an event, a record, an entry).

    Raises:
        InternalError: it is not.
    """
    if not sort_key.startswith(keys.SIDE_PREFIX):
        raise InternalError(f"not a side item key: {sort_key!r}")
    return sort_key


def put_side_item(store: ConversationStore, key: ConversationKey, side: SideItem) -> None:
    """Put ``side`` in ``key``'s partition, unconditionally (replacing what was there).

    Raises:
        PayloadTooLarge: the item is over the backend's item size limit.
        InternalError: not a side item's sort key, or a reserved attribute.
    """
    item = store.sealer.seal(codec.encode_side_item(key, side))
    codec.check_item_sizes([item])
    store._put_items([item])


def get_side_item(store: ConversationStore, key: ConversationKey, sort_key: str) -> SideItem | None:
    """The side item at ``sort_key`` of ``key``, read consistently, or ``None``."""
    item = store._get_item(keys.partition_key(key), _side_key(sort_key))
    return None if item is None else codec.decode_side_item(store.sealer.open(item))


def query_side_items(
    store: ConversationStore,
    key: ConversationKey,
    *,
    lower: str,
    upper: str,
    limit: int = 1000,
    consistent: bool = True,
) -> list[SideItem]:
    """The side items of ``key`` with ``lower <= sort key <= upper``, in key order (every
    page). ``consistent=False`` may miss the newest writes (half the price on DynamoDB).
    """
    pk = keys.partition_key(key)
    found: list[SideItem] = []
    cursor: Any = None
    while True:
        page = store._query(
            pk,
            lower=_side_key(lower),
            upper=_side_key(upper),
            descending=False,
            limit=limit,
            cursor=cursor,
            consistent=consistent,
        )
        found.extend(codec.decode_side_item(store.sealer.open(item)) for item in page.items)
        if page.cursor is None:
            return found
        cursor = page.cursor


def delete_side_items(store: ConversationStore, key: ConversationKey, sort_keys: list[str]) -> None:
    """Delete the side items of ``key`` at ``sort_keys`` (absent ones are fine)."""
    store._delete_items(keys.partition_key(key), [_side_key(sk) for sk in sort_keys])
