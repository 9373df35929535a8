"""The turn worker function's Lambda entry point: runs a turn accepted with
``Prefer: respond-async`` and keeps, in its draft, the HTTP answer the synchronous
request would have given (what ``GET .../turns/{n}`` then returns); also runs replays
(``POST .../replays``, :mod:`turnledger.turn.replays`).

The run itself is :func:`turnledger.turn.longturns.run_worker`; this module gives it the
answer's shapes (:mod:`.views`, :mod:`.errors`).
"""

from __future__ import annotations

from typing import Any

from ..core.deadline import request_deadline
from ..core.observability import logger
from ..runtime import get_runtime
from ..turn.longturns import run_worker
from ..turn.replays import REPLAY_EVENT, run_event
from .errors import error_body
from .views import turn_body


def worker_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The turn worker function's Lambda entry point (see :func:`run_worker`).

    The turn's deadline is the invocation's remaining time, so a provider call never
    outlives the function (the worker's timeout is minutes, not API Gateway's 30 s).
    """
    logger.append_keys(tenant=event.get("tenant"), conversation_id=event.get("conversation_id"))
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    service = get_runtime().conversations_for(str(event.get("tenant", "")))
    with request_deadline(remaining_ms() / 1000 if callable(remaining_ms) else None):
        if event.get("kind") == REPLAY_EVENT:
            return run_event(service, event)
        return run_worker(service, event, answer=turn_body, error_body=error_body)
