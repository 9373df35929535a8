"""A turn's telemetry (:mod:`turnledger.core.telemetry`) at the runner's two seams: a
session opened (which conversation and turn the request's span runs, linked to the
request that left the turn waiting) and a commit that leaves the turn waiting (its trace
context stored with the wait, in the turn's options on the head). Each commit also says
the turn again: a request that begins a turn opened its session on the one before.
"""

from __future__ import annotations

from ..core import telemetry
from .session import Session


def opened(session: Session) -> None:
    """Name the conversation on the request's span; when the turn waits, link the span to
    the one that stored the wait."""
    waiting = bool(session.machine.pending)
    _name(session, session.options.trace_context if waiting else None)


def _name(session: Session, resumes: str | None) -> None:
    head = session.head
    fork = head.fork if head is not None else None
    telemetry.conversation(
        session.key.conversation_id,
        session.key.tenant,
        session.turn,
        fork_of=fork.conversation_id if fork is not None else None,
        resumes=resumes,
    )


def committing(session: Session) -> None:
    """Before a commit: when the turn waits for someone, store this request's trace
    context with it (the request that resumes it links there)."""
    _name(session, None)
    if not session.machine.awaiting():
        return
    context = telemetry.trace_context()
    if context is not None and context != session.options.trace_context:
        session.options = session.options.model_copy(update={"trace_context": context})
