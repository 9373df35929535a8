"""Live deltas: the model's answer handed to a listener as it is written, beside the draft.

A streamed turn (``Accept: text/event-stream``, the face's ``stream: true``) runs through
its draft exactly as a synchronous one (:func:`.longturns.run_drafted`), with its draft sink
wrapped in a :class:`LiveDraft`: each piece the provider streams goes to the draft (stored
at the draft's coarse interval, for readers that come later) and then, at once, to the
:class:`Listener`, which writes it to the client. The listener reads nothing from the
store: what it sends is what the model wrote, as it wrote it.

Each :class:`Delta` names the draft chunk its text is stored in and whether that chunk is
stored yet, so a client can resume from the draft (``Last-Event-ID``) without a delta
twice or missing: a chunk's number is announced only once every delta in it was sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.models import Head
    from ..store.base import Snapshot
    from .longturns import DraftedRun


@dataclass(frozen=True)
class Delta:
    """One piece of the answer as the model wrote it."""

    text: str
    #: The seq of the draft chunk that holds (or will hold) this text.
    chunk: int
    #: Whether chunk :attr:`chunk` is stored, this text and every earlier one with it:
    #: a reader resuming after :attr:`chunk` misses nothing and gets nothing twice.
    stored: bool


class Listener(Protocol):
    """Who follows a streamed turn live (the edge, writing to its client)."""

    def started(self, turn: int) -> None:
        """The turn was admitted as ``turn`` and its draft begun; deltas follow."""

    def delta(self, delta: Delta) -> None:
        """A piece of the answer, as the model wrote it."""


class LiveDraft:
    """A draft sink (:class:`.drafts.DraftSink`) that hands the answer to ``listener`` as
    it streams, after the draft ``run`` took it."""

    def __init__(self, run: DraftedRun, listener: Listener) -> None:
        self.run = run
        self.listener = listener
        #: The turn the listener was told of (``None``: not started yet).
        self.turn: int | None = None

    def begin(self, head: Head | None, loaded: Snapshot | None) -> None:
        self.run.begin(head, loaded)
        self.start()

    def start(self) -> None:
        """Tell the listener the turn began (once; a run begun before it, an approval's,
        tells it at its first delta or when it ends)."""
        if self.turn is None:
            self.turn = self.run.writer.turn
            self.listener.started(self.turn)

    def add(self, text: str) -> None:
        writer = self.run.writer
        chunk = writer.next_seq
        try:
            self.run.add(text)  # buffered; stored with the chunk once it is due
        finally:
            self.start()
            # The chunk was stored in this add if the writer moved on past it.
            self.listener.delta(Delta(text=text, chunk=chunk, stored=writer.next_seq > chunk))

    def finish(self, result: dict[str, Any] | None) -> None:
        self.run.finish(result)

    def interrupt(self, reason: str, result: dict[str, Any] | None) -> None:
        self.run.interrupt(reason, result)
