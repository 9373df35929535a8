"""The sweep function's Lambda entry point: an event in, the composition root's sweeper,
its report out.

The sweep itself (:mod:`.ops.sweep`) is a service that :meth:`.runtime.Runtime.sweeper`
wires; only this module reads the process's runtime for it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from .core.exceptions import InvalidRequest
from .core.observability import logger, metrics, traced
from .ops.sweep import RemainingTime, StreamBatch, SweepIncomplete, SweepRequest
from .runtime import get_runtime
from .turn.results import SweepReport


def sweep(event: dict[str, Any], context: RemainingTime | None) -> SweepReport:
    """Run what the sweep ``event`` asks: reclaim stream records' conversations, sweep a
    list of ids, or the scheduled sweep.

    Raises:
        InvalidRequest: the event is none of the three shapes.
        SweepIncomplete: stream records were not all reclaimed (Lambda retries the batch).
    """
    sweeper = get_runtime().sweeper(context)
    try:
        if "Records" in event:
            report = sweeper.reclaim(StreamBatch.model_validate(event).removed_conversations())
            if not report.complete:
                raise SweepIncomplete(f"stream batch not fully reclaimed: {report}")
            return report
        if "conversation_ids" in event:
            return sweeper.conversations(SweepRequest.model_validate(event).conversation_keys())
    except ValidationError as exc:
        raise InvalidRequest(
            "the sweep event does not fit its schema", details={"reason": str(exc)}
        ) from exc
    if event and event.get("detail-type") != "Scheduled Event":
        raise InvalidRequest("not a sweep event: expected a schedule, stream records or ids")
    return sweeper.expired()


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@traced
def sweep_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The sweep function: a schedule, stream records of TTL deletions, or a list of ids.

    Returns:
        The report as JSON (``conversations_removed``, ``events_removed``,
        ``objects_removed``, ``read_units``, ``complete``...).

    Raises:
        InvalidRequest: the event is none of the three shapes.
        SweepIncomplete: stream records were not all reclaimed (Lambda retries the batch).
    """
    report = sweep(event, context)
    metrics.add_metric("ConversationsSwept", MetricUnit.Count, report.conversations_removed)
    metrics.add_metric("EventsSwept", MetricUnit.Count, report.events_removed)
    metrics.add_metric("ObjectsSwept", MetricUnit.Count, report.objects_removed)
    metrics.add_metric("SweepReadUnits", MetricUnit.Count, report.read_units)
    metrics.add_metric("ApprovalsExpired", MetricUnit.Count, report.waits_expired)
    body = asdict(report)
    logger.info("sweep done", extra=body)
    return body
