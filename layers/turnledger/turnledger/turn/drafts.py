"""Drafts: the answer of a long turn, stored chunk by chunk while the model writes it.

A draft is not the transcript. Its items live in the conversation's own
partition, after ``"HEAD"`` (so no read of the head and events ever meets one)::

    sk = "S#<turn:012>#<seq:012>"   one chunk of text, seq 1, 2, ...
    sk = "S#<turn:012>#~"           the draft's state: status, reason, next seq, result
    sk = "S#<turn:012>#~cancel"     present once a cancel was requested

``"~"`` sorts after every digit, so one query from a chunk key to the state key
reads the chunks after it *and* the state (a poll is one round trip). The cancel
flag is an item of its own, not an attribute of the state: the writer rewrites the
state without reading it, and a cancel written meanwhile must not be lost.

Every item carries the table's TTL attribute (the conversation's expiry) and is
removed by clear, erasure and the sweep with the rest of the partition.

The final ``assistant_message`` is never written from a draft: the pipeline
commits it, whole, as for a synchronous turn. A draft only shows what is being
written; when the turn fails or is cancelled the draft stays, marked
``interrupted`` with the reason.

Writes are batched (:class:`DraftWriter`): a chunk at most every
``flush_ms`` (default 250 ms) or ``flush_chars`` (default 400 characters), so a
streamed answer's extra cost is bounded by its length and duration, not by the
number of tokens.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..core.exceptions import ProviderError
from ..core.models import ConversationKey
from ..providers.base import ModelReply, ModelRequest, Provider
from ..store import keys
from ..store.base import ConversationStore, RunFlag
from ..store.codec import SideItem
from .lifecycle import DraftMove, DraftStatus, draft_move

logger = logging.getLogger(__name__)

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


class TurnCancelled(ProviderError):
    """A cancel was requested while the turn's answer was being written.

    A :class:`ProviderError`, so the pipeline ends the turn as for a failed model call
    (nothing of the answer is kept), recording ``turn_interrupted`` instead of
    ``turn_failed``; ``details`` name who cancelled (``interrupted_by``) and why.
    """

    status = 409
    code = "turn_cancelled"


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
    import json

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


class _Timers:
    """One daemon thread that runs callbacks when they are due (:meth:`DraftWriter.begin_after`).

    One thread for the process, not one per turn: a store keeps a connection per thread
    (SQLite), so a thread per turn would leave one behind for every long turn. Callbacks
    run one after another, each a single quick write.
    """

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, seconds: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in the timers' thread ``seconds`` from now."""
        with self._changed:
            entry = (time.monotonic() + seconds, next(self._order), callback)
            heapq.heappush(self._due, entry)
            if self._thread is None or not self._thread.is_alive():
                # None yet, or this is a child process (a fork keeps no other thread).
                self._thread = threading.Thread(
                    target=self._run, name="turnledger-draft-timers", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._changed.wait(wait)
                _, _, callback = heapq.heappop(self._due)
            try:
                callback()
            except Exception:
                logger.exception("a draft timer failed")


_timers = _Timers()


@dataclass
class DraftWriter:
    """Writes one run of a turn's draft: batched chunks, then the final state.

    One turn runs in one worker, which alone calls :meth:`add`, :meth:`finish` and the
    rest; the one other thread is :meth:`begin_after`'s timer (:class:`_Timers`), which
    only begins the draft, under :attr:`_lock`.
    """

    store: ConversationStore
    key: ConversationKey
    turn: int
    #: The conversation's expiry (epoch seconds), the TTL of every draft item.
    expires_at: int | None
    now: Callable[[], datetime]
    kind: str = "turn"
    #: The conversation's life the run writes to, when it has one (readers skip other lives').
    gen: str | None = None
    flush_ms: int = DEFAULT_FLUSH_MS
    flush_chars: int = DEFAULT_FLUSH_CHARS
    monotonic: Callable[[], float] = time.monotonic
    next_seq: int = 1
    started_at: str = ""
    #: Where the draft is (:data:`turnledger.turn.lifecycle.DRAFT_MOVES`); ``None``: not begun.
    status: DraftStatus | None = None
    #: The state an earlier run of the turn left, read by :meth:`begin`.
    previous: DraftState | None = None
    #: :attr:`previous` is not read yet: the draft's begin reads it (``read_later``).
    _unread: bool = False
    _buffer: list[str] = field(default_factory=list)
    _buffered: int = 0
    _last_flush: float = 0.0
    #: Whether this run wrote its draft's begin (its later writes follow only then).
    _begun: bool = False
    #: Set once the run is over (finished, interrupted, restored): a late timer does nothing.
    _settled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def begun(self) -> bool:
        """Whether this run wrote its draft's begin (:meth:`begin_after` may not have yet)."""
        return self._begun

    @property
    def pk(self) -> str:
        """The conversation's partition key."""
        return keys.partition_key(self.key)

    def begin(
        self, previous: DraftState | None = None, *, known: bool = False, read_later: bool = False
    ) -> None:
        """Mark the draft in progress; a continued turn (an approval) numbers on.

        ``known``: ``previous`` is the state just read (saves reading it again).
        ``read_later``: not read yet (the busy check read none, the run flag said no run
        of the turn is going); read as the draft begins.
        A stale cancel flag of an earlier run of the same turn is removed first. A turn's
        draft (kind ``turn``) puts the run flag first (:meth:`ConversationStore.put_run_flag`):
        a draft's state is never written without the flag naming its turn before it.
        """
        self._prepare(previous, known, read_later)
        self._start()

    def begin_after(
        self,
        delay_ms: int,
        previous: DraftState | None = None,
        *,
        known: bool = False,
        read_later: bool = False,
    ) -> None:
        """Begin the draft (as :meth:`begin`) only once the run has gone on ``delay_ms``: a
        run that is over sooner writes no draft at all (:meth:`finish`, :meth:`restore`),
        one that fails sooner writes it then, interrupted (:meth:`interrupt`). Until it
        begins, the answer is only buffered: no chunk is stored and no cancel flag looked
        for (a cancel finds no running draft to flag)."""
        self._prepare(previous, known, read_later)
        _timers.call_later(delay_ms / 1000, self._start_late)

    def _prepare(self, previous: DraftState | None, known: bool, read_later: bool) -> None:
        self._unread = read_later and not known
        if not known and not read_later:
            previous = read_state(self.store, self.key, self.turn)
        self._earlier(previous)
        self.started_at = self.now().isoformat()

    def _earlier(self, previous: DraftState | None) -> None:
        """Number on after ``previous``, the state an earlier run of the turn left."""
        self.previous = previous
        self.next_seq = previous.next_seq if previous is not None else 1
        self.status = previous.status if previous is not None else None

    def _start(self, *, running: bool = True) -> None:
        """Write the draft's begin (``running=False``: only to record a run already over)."""
        if self._unread:
            self._earlier(read_state(self.store, self.key, self.turn))
            self._unread = False
        if running and self.kind == "turn":
            # Before the state: a draft running is always named by the flag (the busy check
            # of the next turn reads the state only when the flag names its turn).
            self.store.put_run_flag(
                self.key,
                RunFlag(turn=self.turn, started_at=_ceil_seconds(self.started_at), gen=self.gen),
                expires_at=self.expires_at,
            )
        if self.previous is not None:
            # Only an earlier run of the turn can have left a flag (a cancel is set only
            # on a running draft): a new turn's begin saves the delete (1 WCU).
            self.store.delete_side_items(self.key, [cancel_key(self.turn)])
        self._last_flush = self.monotonic()
        self._begun = True
        self._put_state(DraftMove.BEGIN, None, None)

    def _start_late(self) -> None:
        """:meth:`begin_after`'s timer: begin the draft of a run still going."""
        with self._lock:
            if self._settled or self._begun:
                return
            try:
                self._start()
            except Exception:
                # The run goes on without a draft to follow, as a quick one does.
                logger.exception("could not begin a turn's draft")

    def _settle(self) -> bool:
        """Mark the run over (a timer not yet fired never begins it); whether it had begun."""
        with self._lock:
            self._settled = True
            return self._begun

    def add(self, text: str) -> None:
        """Take a piece of the answer; store it once enough is buffered or time passed.

        Raises:
            TurnCancelled: a cancel was requested (seen when a chunk is stored).
        """
        if not text:
            return
        self._buffer.append(text)
        self._buffered += len(text)
        if not self._begun:
            return  # no draft yet: the text waits in the buffer
        elapsed_ms = (self.monotonic() - self._last_flush) * 1000
        if self._buffered >= self.flush_chars or elapsed_ms >= self.flush_ms:
            self.flush()

    def flush(self, *, check_cancel: bool = True) -> None:
        """Store the buffered text as the next chunk, then look for a cancel.

        Raises:
            TurnCancelled: a cancel was requested.
        """
        if self._buffer:
            text = "".join(self._buffer)
            self._buffer.clear()
            self._buffered = 0
            self.store.put_side_item(
                self.key,
                SideItem(
                    chunk_key(self.turn, self.next_seq), {A_TEXT: text}, expires_at=self.expires_at
                ),
            )
            self.next_seq += 1
            # Readers learn of new chunks from the chunk items themselves; the state's
            # count is rewritten only at the end (one write per chunk, not two).
        self._last_flush = self.monotonic()
        if check_cancel:
            cancel = self.store.get_side_item(self.key, cancel_key(self.turn))
            if cancel is not None:
                flag = cancel.attributes
                raise TurnCancelled(
                    "the turn was cancelled while its answer was being written",
                    details={
                        "turn": self.turn,
                        "interrupted_by": str(flag.get(A_CANCELLED_BY, "system")),
                        "reason": flag.get(A_CANCEL_REASON),
                    },
                )

    def finish(self, result: dict[str, Any] | None) -> None:
        """Store what is buffered and mark the draft done with the turn's response
        (``None``: readers rebuild it from the log, so the buffered rest of the answer,
        already in the log, is not stored as a chunk either)."""
        if result is None:
            self._buffer.clear()
            self._buffered = 0
        if not self._settle():
            return  # over before its draft began: nothing to mark (the log tells the rest)
        self.flush(check_cancel=False)
        self._put_state(DraftMove.FINISH, None, result)

    def interrupt(self, reason: str, result: dict[str, Any] | None) -> None:
        """Store what is buffered and mark the draft interrupted, with why (a draft that
        had not begun yet begins now, so readers learn how the turn ended)."""
        if not self._settle():
            self._start(running=False)  # over already: no run to flag
        self.flush(check_cancel=False)
        self._put_state(DraftMove.INTERRUPT, reason, result)

    def restore(self) -> None:
        """Put back the state an earlier run of the turn left (none: remove this run's):
        a request refused before it changed the turn leaves the turn's draft as it was."""
        if not self._settle():
            return  # this run wrote nothing
        previous = self.previous
        if previous is None:
            self.store.delete_side_items(self.key, [state_key(self.turn)])
            return
        self.next_seq, self.started_at, self.kind = (
            previous.next_seq,
            previous.started_at,
            previous.kind,
        )
        self.gen = previous.gen
        # Back to where it was: done (with its answer, if kept) or interrupted (with why).
        how = DraftMove.FINISH if previous.status == "done" else DraftMove.INTERRUPT
        self._put_state(how, previous.reason, previous.result)

    def _put_state(self, how: DraftMove, reason: str | None, result: dict[str, Any] | None) -> None:
        status = self.status = draft_move(self.status, how)
        item: dict[str, Any] = {
            A_STATUS: status,
            A_NEXT: self.next_seq,
            A_STARTED: self.started_at,
            A_UPDATED: self.now().isoformat(),
            A_KIND: self.kind,
        }
        if reason:
            item[A_REASON] = reason
        if result is not None:
            item[A_RESULT] = json.dumps(result, separators=(",", ":"))
        self.store.put_side_item(
            self.key,
            SideItem(state_key(self.turn), item, expires_at=self.expires_at, gen=self.gen or None),
        )


def _ceil_seconds(iso: str) -> int:
    """Epoch seconds of ``iso``, rounded up (never before the run began)."""
    return math.ceil(datetime.fromisoformat(iso).timestamp())


#: The writer of the turn this context runs, if it streams (see :func:`streaming_into`).
_current: ContextVar[DraftWriter | None] = ContextVar("turnledger_draft_writer", default=None)


@contextmanager
def streaming_into(writer: DraftWriter) -> Iterator[DraftWriter]:
    """Within the block, model calls stream their answers into ``writer``."""
    token = _current.set(writer)
    try:
        yield writer
    finally:
        _current.reset(token)


def model_reply(provider: Provider, request: ModelRequest) -> ModelReply:
    """The model's reply: streamed into the current draft when there is one.

    Summaries (``purpose="summary"``) never stream: they are no answer.

    Raises:
        ProviderError, ProviderTimeout: the model failed.
        TurnCancelled: a cancel was requested while the answer was written.
    """
    writer = _current.get()
    if writer is None or request.purpose != "turn":
        return provider.complete(request)
    return provider.stream(request, writer.add)
