"""Draft items as stored, and reading them: keys, the state, the chunks.

The layout of a draft (its chunks, its state and its cancel flag) is described in
:mod:`turnledger.turn.drafts`, which writes them; this module holds only what a reader
needs, so following a turn loads none of the writing (or running) code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..core.models import ConversationKey
from ..store import keys
from ..store.base import ConversationStore
from ..store.codec import SideItem
from .lifecycle import DraftStatus

#: Draft items are the store's side items (:meth:`ConversationStore.put_side_item`).
DRAFT_PREFIX = keys.SIDE_PREFIX
_WIDTH = 12
_STATE = "~"
_CANCEL = "~cancel"

#: Attributes of draft items (short: they are paid per byte on every chunk).
A_TEXT = "tx"
A_STATUS = "st"
A_REASON = "rs"
A_NEXT = "nx"
A_RESULT = "res"
A_STARTED = "at"
A_UPDATED = "up"
#: On a cancel flag: who asked (the caller's actor) and why (``POST .../cancel``'s reason).
A_CANCELLED_BY = "by"
A_CANCEL_REASON = "why"
A_KIND = "kd"


#: Defaults of the writer's batching (``DRAFT_FLUSH_MS``, ``DRAFT_FLUSH_CHARS``).
DEFAULT_FLUSH_MS = 250
DEFAULT_FLUSH_CHARS = 400


def turn_prefix(turn: int) -> str:
    """What every draft sort key of ``turn`` starts with."""
    return f"{DRAFT_PREFIX}{turn:0{_WIDTH}d}#"


def chunk_key(turn: int, seq: int) -> str:
    """The sort key of chunk ``seq`` of ``turn``'s draft."""
    return f"{turn_prefix(turn)}{seq:0{_WIDTH}d}"


def state_key(turn: int) -> str:
    """The sort key of ``turn``'s draft state."""
    return turn_prefix(turn) + _STATE


def cancel_key(turn: int) -> str:
    """The sort key of ``turn``'s cancel flag."""
    return turn_prefix(turn) + _CANCEL


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a draft."""

    seq: int
    text: str


@dataclass(frozen=True)
class DraftState:
    """Where a turn's draft stands."""

    turn: int
    status: DraftStatus
    #: Why an interrupted draft stopped (an error code such as ``provider_error``).
    reason: str | None
    #: The seq the next chunk gets (chunks so far: ``next_seq - 1``).
    next_seq: int
    #: When the run that writes it began (ISO 8601).
    started_at: str
    #: The turn's final response (the synchronous turn's shape) or error body, once over.
    result: dict[str, Any] | None = None
    #: ``turn`` (a turn's input) or ``approval`` (decisions continuing the turn).
    kind: str = "turn"
    #: The life (``gen``) of the conversation the run wrote to (``None``: it had none yet).
    gen: str | None = None

    @property
    def done(self) -> bool:
        """Whether nothing more will be written."""
        return self.status != "in_progress"


@dataclass(frozen=True)
class DraftRead:
    """One read of a draft: the chunks after a point, and the state when there is one."""

    chunks: list[Chunk]
    state: DraftState | None


def _decode_state(turn: int, side: SideItem) -> DraftState:
    item = side.attributes
    raw = item.get(A_RESULT)
    status = str(item.get(A_STATUS, "in_progress"))
    return DraftState(
        turn=turn,
        status=status if status in ("done", "interrupted") else "in_progress",  # type: ignore[arg-type]
        reason=str(item[A_REASON]) if item.get(A_REASON) else None,
        next_seq=int(item.get(A_NEXT, 1)),
        started_at=str(item.get(A_STARTED, "")),
        result=json.loads(raw) if isinstance(raw, str) and raw else None,
        kind=str(item.get(A_KIND, "turn")),
        gen=side.gen,
    )


def read_state(store: ConversationStore, key: ConversationKey, turn: int) -> DraftState | None:
    """``turn``'s draft state, or ``None`` when the turn has no draft."""
    item = store.get_side_item(key, state_key(turn))
    return None if item is None else _decode_state(turn, item)


def read(
    store: ConversationStore,
    key: ConversationKey,
    turn: int,
    *,
    after: int = 0,
    consistent: bool = True,
) -> DraftRead:
    """The chunks of ``turn``'s draft after seq ``after``, and its state, in one query.

    ``consistent=False`` reads at half the price and may miss the newest writes.
    """
    items = store.query_side_items(
        key,
        lower=chunk_key(turn, after + 1),
        upper=state_key(turn),
        consistent=consistent,
    )
    chunks: list[Chunk] = []
    state: DraftState | None = None
    for item in items:
        suffix = item.sort_key.removeprefix(turn_prefix(turn))
        if suffix == _STATE:
            state = _decode_state(turn, item)
        elif suffix.isdigit():
            chunks.append(Chunk(seq=int(suffix), text=str(item.attributes.get(A_TEXT, ""))))
    if state is not None and state.done:
        # Past a finished draft's count, a chunk can only be a leftover of an abandoned run.
        chunks = [c for c in chunks if c.seq < state.next_seq]
    return DraftRead(chunks=chunks, state=state)


def request_cancel(
    store: ConversationStore,
    key: ConversationKey,
    turn: int,
    *,
    now: datetime,
    ttl_seconds: int,
    by: str = "system",
    reason: str | None = None,
) -> bool:
    """Ask the run writing ``turn``'s draft to stop; returns whether one is in progress.

    The writer sees the flag before its next chunk and raises :class:`TurnCancelled`;
    the turn then records ``turn_interrupted`` (``interrupted_by`` = ``by``, with
    ``reason``), keeps nothing of the answer, and the draft is marked ``interrupted``.
    A draft that is over (or absent) is left alone.
    """
    state = read_state(store, key, turn)
    if state is None or state.done:
        return False
    expires = int(now.timestamp()) + ttl_seconds if ttl_seconds else None
    store.put_side_item(
        key,
        SideItem(
            cancel_key(turn),
            {
                A_UPDATED: now.isoformat(),
                A_CANCELLED_BY: by,
                **({A_CANCEL_REASON: reason} if reason else {}),
            },
            expires_at=expires,
        ),
    )
    return True


def running_turn(
    store: ConversationStore, key: ConversationKey, head_turn: int
) -> DraftState | None:
    """The draft being written now, if any: a new turn (``head_turn + 1``, not committed
    yet) or the head's own turn continued by an approval. For a cancel route: pass the
    returned state's ``turn`` to :func:`request_cancel`.
    """
    for turn in (head_turn + 1, head_turn):
        if turn < 1:
            continue
        state = read_state(store, key, turn)
        if state is not None and not state.done:
            return state
    return None
