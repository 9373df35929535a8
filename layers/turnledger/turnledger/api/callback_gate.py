"""The open callback route's gate: its token and its body's size, before the body is read.

``POST /v1/callbacks/{token}`` has no authorizer (the template opens it with ``Auth:
NONE``): the signed token is the credential (:mod:`turnledger.turn.callbacks`). Being
open, it is refused cheaply: the entry point (:mod:`.app`) calls :func:`refuse_early`
on every event before it reads a body. The check lives apart from the route module
(:mod:`.waits`), so that only the function serving the route registers the route.
"""

from __future__ import annotations

from typing import Any

from ..core.exceptions import PayloadTooLarge
from ..runtime import get_runtime
from ..turn.callbacks import max_input_bytes, signing_key, verify

#: The route key of the callback route (as the HTTP API and the local runner name it).
CALLBACK_ROUTE = "POST /v1/callbacks/{token}"


def refuse_early(event: dict[str, Any]) -> int | None:
    """For a callback, check its token and the size of its body without reading the body.

    Returns the body limit of the route (``None``: not a callback, the API's limit holds).
    The size is judged on the event's body field as given (a string of N characters
    encodes to at least N bytes, base64 of N characters to at least 3N/4 - 2): the exact
    check of the decoded bytes against the returned limit follows in the entry point.

    Raises:
        CallbackInvalid: the token is not genuine or is past its deadline (``410``).
        PayloadTooLarge: the body field is over the route's limit (``413``).
    """
    if event.get("routeKey") != CALLBACK_ROUTE:
        return None
    token = (event.get("pathParameters") or {}).get("token")
    verify(signing_key(), str(token or ""), now=get_runtime().clock())
    limit = max_input_bytes()
    body = event.get("body")
    if isinstance(body, str):
        least = len(body) * 3 // 4 - 2 if event.get("isBase64Encoded") else len(body)
        if least > limit:
            raise PayloadTooLarge(
                f"a callback body is over the limit of {limit} bytes", details={"limit": limit}
            )
    return limit
