"""The Lambda entry point of every API function, over the resolver and its routes.

The resolver (:mod:`.resolver`) answers; this module checks a request's body (and
``X-Memory-User``, :func:`.resolver.named_memory_user`) before routing and decodes its
path as API Gateway does (an open callback's token first: :mod:`.callback_gate`). It
imports no route module: each function imports its own (:mod:`.functions`), and each
registers its routes on the resolver. No route module imports this one.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from aws_lambda_powertools.event_handler import content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from ..core.deadline import request_deadline
from ..core.exceptions import InvalidRequest, PayloadTooLarge, TurnledgerError
from ..core.models import CONVERSATION_ID_PATTERN, build_deferred
from ..core.observability import logger, metrics, traced
from ..core.strict_json import BodyError, parse_object
from ..runtime import get_runtime
from .callback_gate import refuse_early
from .errors import body_for
from .resolver import app, json_text, methods_of, named_memory_user, raw_body

__all__ = ["app", "lambda_handler"]

#: Routes whose body is not one JSON object (an import is NDJSON).
_NDJSON_ROUTES = ("/import",)
#: ``AWS_LAMBDA_INITIALIZATION_TYPE`` values whose init phase no caller waits for.
AHEAD_OF_REQUESTS = frozenset({"snap-start", "provisioned-concurrency"})


def prepare_routes() -> int:
    """Build every registered route's request models, and every deferred model of the
    modules loaded (:class:`~turnledger.core.models.Deferred`), now; returns how many
    routes there are.

    Powertools builds a route's parameter and body models (its ``dependant``) on the
    route's first request: about 8 ms a route, 0.2 s for all of them here. Where init
    runs ahead of requests (:data:`AHEAD_OF_REQUESTS`: a SnapStart snapshot,
    provisioned concurrency) a function's init builds those of its routes
    (:func:`.functions.serve`), so no route's first request pays; elsewhere each route
    keeps paying only for itself, on its first request, rather than every route's on
    the init a caller waits for.
    """
    # Powertools keeps its routes in these two lists and offers no public way to build
    # their models ahead of a request (get_openapi_schema would also render the document).
    registered = [*getattr(app, "_static_routes", ()), *getattr(app, "_dynamic_routes", ())]
    for route in registered:
        _ = route.dependant, route.body_field
    # The request and response bodies the routes build and validate themselves.
    build_deferred()
    return len(registered)


def _with_decoded_path(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with its path's parameters decoded, as API Gateway decodes them.

    HTTP APIs deliver ``pathParameters`` percent-decoded and ``rawPath`` as sent;
    Powertools matches routes on the path. A parameter that is a valid
    conversation id once decoded (``a%3Ab`` is ``a:b``) is put back decoded; any
    other keeps its raw form, which the id rule then refuses.
    """
    parameters = event.get("pathParameters") or {}
    template = str(event.get("routeKey") or "").partition(" ")[2]
    raw = str(event.get("rawPath") or "")
    template_segments, raw_segments = template.split("/"), raw.split("/")
    if not parameters or len(template_segments) != len(raw_segments):
        return event
    segments: list[str] = []
    for pattern, segment in zip(template_segments, raw_segments, strict=True):
        name = pattern[1:-1] if pattern.startswith("{") and pattern.endswith("}") else None
        value = parameters.get(name) if name else None
        if isinstance(value, str) and re.fullmatch(CONVERSATION_ID_PATTERN, value):
            segments.append(quote(value, safe=":"))
        else:
            segments.append(segment)
    path = "/".join(segments)
    return event if path == raw else {**event, "rawPath": path}


def _answer(error: TurnledgerError, event: dict[str, Any]) -> dict[str, Any]:
    return {
        "statusCode": error.status,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": json_text(body_for(error, str(event.get("rawPath", "")))),
    }


def _check_body(event: dict[str, Any], limit: int) -> None:
    """Refuse a body over ``limit`` bytes, or one that is no JSON object within the limits of
    :mod:`turnledger.core.strict_json` (any bytes get a 4xx, never a crash deeper in).

    Raises:
        PayloadTooLarge: over ``limit``.
        InvalidRequest: not UTF-8, not JSON, not an object, or over a parsing limit.
    """
    raw = raw_body(event)
    if len(raw) > limit:
        raise PayloadTooLarge(
            f"the request body is over the limit of {limit} bytes", details={"limit": limit}
        )
    method = str(((event.get("requestContext") or {}).get("http") or {}).get("method", ""))
    if method.upper() not in {"POST", "PUT", "PATCH"}:
        return
    if method.upper() not in methods_of(str(event.get("rawPath") or "")):
        return  # no route takes it: routing answers 404/405 before any body is read
    if str(event.get("routeKey") or "").endswith(_NDJSON_ROUTES):
        return  # checked line by line by the route (turnledger.ops.transfer)
    try:
        parse_object(raw)
    except BodyError as exc:
        raise InvalidRequest(str(exc), details=exc.details) from exc


@logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_HTTP,
    # Keys appended for one request (tenant, conversation id) never reach the next one's lines.
    clear_state=True,
)
@metrics.log_metrics
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The Lambda entry point of every API function."""
    try:
        # The open callback route: its token and its own limit first, the body unread.
        callback_limit = refuse_early(event)
        limit = get_runtime().settings.max_input_bytes
        _check_body(event, limit if callback_limit is None else min(limit, callback_limit))
        if methods_of(str(event.get("rawPath") or "")):
            # A header that chooses whose data is used is honoured or refused on every
            # route of every face, never dropped: refused here without the scope.
            named_memory_user(event)
    except TurnledgerError as exc:
        return _answer(exc, event)
    event = _with_decoded_path(event)
    headers = event.get("headers") or {}
    if (
        event.get("body")
        and headers.get("content-type") != content_types.APPLICATION_JSON
        and not str(event.get("routeKey") or "").endswith(_NDJSON_ROUTES)
    ):
        # Bodies are JSON whatever the client labels them (``curl -d`` says form data):
        # a form or an unlabeled body would otherwise fail validation with a puzzling error.
        event = {**event, "headers": {**headers, "content-type": content_types.APPLICATION_JSON}}
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    with request_deadline(remaining_ms() / 1000 if callable(remaining_ms) else None):
        return app.resolve(event, context)
