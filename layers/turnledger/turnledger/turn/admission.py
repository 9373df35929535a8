"""Admission: whether a request may act on a conversation now, asked once per request.

Every entry that writes (a turn, an approval, an append, a compaction, a callback, a
long turn's ``202``) is admitted here, through :func:`admit`, before anything of it runs
or is written; the entries differ only in which questions their :class:`Rules` ask.
The questions, in order: a live lease (another request runs the conversation's tools),
the conversation's token budget, undecided approvals (a new turn), the calls still
waiting for a person or a job (an append, a compaction), then a cancel that asked a run
which died (stopped here, by the caller's ``stop``), and last the run flag (a turn whose
draft is being written: the sink's ``begin``, :mod:`.drafts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..core.models import Head
from .lifecycle import (
    AWAITING_DECISION,
    lapsed,
    refuse_if_running,
    refuse_if_spent,
    require_settled,
)


@dataclass(frozen=True)
class Rules:
    """Which admission questions an entry asks, beyond the lease that all ask."""

    #: The conversation's token budget (``0``: none, or not asked).
    budget: int = 0
    #: Refuse while approvals of the conversation are undecided (an expired one no longer
    #: blocks: the turn itself records its expiry).
    undecided: bool = False
    #: Refuse while calls await a decision or an output (:func:`.lifecycle.require_settled`).
    settled: bool = False


def admit(
    head: Head | None,
    now: datetime,
    rules: Rules,
    *,
    run_flag: Callable[[], object] | None = None,
    stop: Callable[[], object] | None = None,
) -> None:
    """Admit a request on the conversation whose visible head was just read as ``head``.

    ``run_flag``: refuses while a run of the turn is going (the draft sink's ``begin``,
    which then begins the turn's draft). ``stop``: stops (and commits) the turn a cancel
    asked to stop when the head carries one. Both are asked last, in that order.

    Raises:
        ConversationBusy: ``head`` holds a live lease (``retry_after_seconds``).
        BudgetExceeded: the conversation's token budget is spent.
        ApprovalPending: calls await a decision (``undecided`` or ``settled``).
        InputPending: calls wait for their output (``settled``).
        ConversationBusy: a run of the turn is going (``run_flag``).
    """
    refuse_if_running(head, now)
    if head is not None:
        refuse_if_spent(head.usage, rules.budget)
        if rules.undecided:
            require_settled(
                [p for p in head.pending if p.state in AWAITING_DECISION and not lapsed(p, now)]
            )
        if rules.settled:
            require_settled(head.pending)
    if run_flag is not None:
        run_flag()
    if stop is not None:
        stop()
