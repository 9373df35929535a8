"""Structured logs, EMF metrics and X-Ray traces (Powertools), shared by every handler.

``Tracer`` imports the X-Ray SDK, which costs most of a second of cold start:
it is created only where tracing is on (deployed with ``Tracing: Active``),
never in tests or the local runner (``POWERTOOLS_TRACE_DISABLED=true``). Where it
is on, it is created during init (:func:`turnledger.runtime.prepare`) and patches
only the libraries the service calls through (:data:`TRACED_LIBRARIES`), not every
library the X-Ray SDK knows.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import cache, wraps
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

if TYPE_CHECKING:
    from aws_lambda_powertools import Tracer

#: The service's name in logs, metrics (their ``service`` dimension) and traces; the
#: template leaves it to this default (its functions' environment is full).
SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "turnledger")
logger = Logger(service=SERVICE)
metrics = Metrics(
    namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "turnledger"), service=SERVICE
)

# Reads publish no metrics by design; Powertools would warn about it on every one of them.
warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)


#: The libraries whose calls are traced: AWS calls (botocore) and HTTP calls to models and
#: tools (httpx).
TRACED_LIBRARIES = ("botocore", "httpx")


def tracing_enabled() -> bool:
    """True in a Lambda function with tracing not disabled."""
    disabled = os.environ.get("POWERTOOLS_TRACE_DISABLED", "").lower() in {"1", "true"}
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME")) and not disabled


@cache
def tracer() -> Tracer | None:
    """The process's Tracer, or ``None`` where tracing is off."""
    if not tracing_enabled():
        return None
    from aws_lambda_powertools import Tracer

    return Tracer(service=SERVICE, patch_modules=TRACED_LIBRARIES)


def traced[F: Callable[..., Any]](handler: F) -> F:
    """Trace a Lambda handler with Powertools' ``capture_lambda_handler`` (cold-start and
    service annotations, the error on failure) where tracing is on; a plain call elsewhere."""

    @wraps(handler)
    def wrapper(event: Any, context: Any) -> Any:
        active = tracer()
        if active is None:
            return handler(event, context)
        return active.capture_lambda_handler(handler)(event, context)

    return cast(F, wrapper)


@contextmanager
def timed(metric: str) -> Iterator[None]:
    """Record the block's duration in milliseconds as ``metric`` (and a trace subsegment)."""
    active = tracer()
    segment = nullcontext() if active is None else active.provider.in_subsegment(f"## {metric}")
    started = perf_counter()
    with segment:
        try:
            yield
        finally:
            metrics.add_metric(metric, MetricUnit.Milliseconds, (perf_counter() - started) * 1000)
