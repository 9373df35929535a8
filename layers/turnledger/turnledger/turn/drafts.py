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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ..core.exceptions import ProviderError
from ..core.models import ConversationKey, Head
from ..providers.base import ModelReply, ModelRequest, Provider
from ..store import keys
from ..store.base import ConversationStore, RunFlag, Snapshot
from ..store.codec import SideItem
from ..store.runs import put_run_flag

# The reading half lives apart (a reader loads none of the writer); named here too.
from .draft_items import (
    A_CANCEL_REASON as A_CANCEL_REASON,
)
from .draft_items import (
    A_CANCELLED_BY as A_CANCELLED_BY,
)
from .draft_items import (
    A_KIND as A_KIND,
)
from .draft_items import (
    A_NEXT as A_NEXT,
)
from .draft_items import (
    A_REASON as A_REASON,
)
from .draft_items import (
    A_RESULT as A_RESULT,
)
from .draft_items import (
    A_STARTED as A_STARTED,
)
from .draft_items import (
    A_STATUS as A_STATUS,
)
from .draft_items import (
    A_TEXT as A_TEXT,
)
from .draft_items import (
    A_UPDATED as A_UPDATED,
)
from .draft_items import (
    DEFAULT_FLUSH_CHARS as DEFAULT_FLUSH_CHARS,
)
from .draft_items import (
    DEFAULT_FLUSH_MS as DEFAULT_FLUSH_MS,
)
from .draft_items import (
    DRAFT_PREFIX as DRAFT_PREFIX,
)
from .draft_items import (
    Chunk as Chunk,
)
from .draft_items import (
    DraftRead as DraftRead,
)
from .draft_items import (
    DraftState as DraftState,
)
from .draft_items import (
    cancel_key as cancel_key,
)
from .draft_items import (
    chunk_key as chunk_key,
)
from .draft_items import (
    read as read,
)
from .draft_items import (
    read_state as read_state,
)
from .draft_items import (
    request_cancel as request_cancel,
)
from .draft_items import (
    running_turn as running_turn,
)
from .draft_items import (
    state_key as state_key,
)
from .draft_items import (
    turn_prefix as turn_prefix,
)
from .lifecycle import DraftMove, DraftStatus, draft_move

logger = logging.getLogger(__name__)


class TurnCancelled(ProviderError):
    """A cancel was requested while the turn's answer was being written.

    A :class:`ProviderError`, so the pipeline ends the turn as for a failed model call
    (nothing of the answer is kept), recording ``turn_interrupted`` instead of
    ``turn_failed``; ``details`` name who cancelled (``interrupted_by``) and why.
    """

    status = 409
    code = "turn_cancelled"


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
            put_run_flag(
                self.store,
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


class DraftSink(Protocol):
    """Where a turn's run writes its draft, passed to the run as a parameter (no context
    variable): begun once the turn is admitted, the model's answer added as it streams,
    finished with the turn's answer or interrupted with its error."""

    def begin(self, head: Head | None, loaded: Snapshot | None) -> None:
        """Begin the draft of the turn admitted on ``head`` (the visible head loaded,
        ``None`` for a new life), ``loaded`` being what the turn's load read (its run flag).

        Raises:
            ConversationBusy: a run of that turn is still going.
        """

    def add(self, text: str) -> None:
        """Add a piece of the model's answer.

        Raises:
            TurnCancelled: a cancel was requested while the answer was written.
        """

    def finish(self, result: dict[str, Any] | None) -> None:
        """Mark the draft done, keeping ``result`` (``None``: only that it is done)."""

    def interrupt(self, reason: str, result: dict[str, Any] | None) -> None:
        """Mark the draft interrupted with ``reason`` and the error body ``result``."""


def model_reply(
    provider: Provider, request: ModelRequest, sink: DraftSink | None = None
) -> ModelReply:
    """The model's reply: streamed into the turn's draft ``sink`` when there is one.

    Summaries (``purpose="summary"``) never stream: they are no answer.

    Raises:
        ProviderError, ProviderTimeout: the model failed.
        TurnCancelled: a cancel was requested while the answer was written.
    """
    if sink is None or request.purpose != "turn":
        return provider.complete(request)
    return provider.stream(request, sink.add)
