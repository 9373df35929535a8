"""What API Gateway does around a function, for the local runner.

An HTTP API with a JWT authorizer matches the route, authenticates the caller,
builds a payload format 2.0 event, invokes the function with a Lambda context
and turns its result back into an HTTP response. This module does the same
steps with local credentials (``Bearer local:<tenant>[:<user>]``), so the
handlers run locally exactly as they are invoked when deployed.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from .template import Route

#: API Gateway's own ceiling on a request body (10 MiB, plus slack for the envelope).
#: The handlers enforce the configured, lower limit themselves.
MAX_BODY_BYTES = 10 * 1024 * 1024 + 1024

#: The ``sub`` claim of a local token that names no user.
DEFAULT_USER = "local-user"

#: Where the OpenAI-compatible face's routes live: errors there are in OpenAI's shape.
OPENAI_PREFIX = "/openai/"
#: OpenAI's error ``type`` of a status, where it is not ``invalid_request_error`` (4xx)
#: or ``server_error`` (5xx).
_OPENAI_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error"}

ACCOUNT_ID = "123456789012"
API_ID = "local"


class GatewayError(Exception):
    """A request the gateway answers itself, before any function runs."""

    def __init__(
        self, status: int, code: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = details or {}
        self.headers: dict[str, str] = {}

    def to_response(self, path: str = "") -> HttpResponse:
        """The error as the contract's ``{"error": {code, message, details}}`` response; for a
        request to ``path`` under :data:`OPENAI_PREFIX`, in OpenAI's shape, as the functions
        answer there (``turnledger/api/errors.py``), so the SDKs raise their typed errors."""
        if path.startswith(OPENAI_PREFIX):
            body: dict[str, Any] = {
                "error": {
                    "message": self.message,
                    "type": _OPENAI_ERROR_TYPES.get(self.status)
                    or ("server_error" if self.status >= 500 else "invalid_request_error"),
                    "param": None,
                    "code": self.code,
                }
            }
        else:
            body = {"error": {"code": self.code, "message": self.message, "details": self.details}}
        return HttpResponse.json(self.status, body, headers=self.headers)


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request as the gateway received it."""

    method: str
    raw_path: str
    raw_query: str = ""
    #: In arrival order; names as sent (the event lower-cases them).
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    source_ip: str = "127.0.0.1"
    protocol: str = "HTTP/1.1"

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or ``None``."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)


@dataclass(frozen=True)
class HttpResponse:
    """One HTTP response to write back."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def json(
        cls, status: int, payload: Any, *, headers: Mapping[str, str] | None = None
    ) -> HttpResponse:
        """A JSON response of ``payload``."""
        merged = {"content-type": "application/json", **(headers or {})}
        # Compact, as the functions write their answers.
        body = json.dumps(payload, separators=(",", ":"))
        return cls(status, tuple(merged.items()), body.encode())


@dataclass(frozen=True)
class _CompiledRoute:
    route: Route
    pattern: re.Pattern[str]
    params: tuple[str, ...]
    #: Literal segments first: API Gateway prefers the most specific match.
    specificity: int


def _compile(route: Route) -> _CompiledRoute:
    parts: list[str] = []
    params: list[str] = []
    literal = 0
    for segment in route.path.strip("/").split("/"):
        greedy = re.fullmatch(r"\{(\w+)\+\}", segment)
        named = re.fullmatch(r"\{(\w+)\}", segment)
        if greedy:
            params.append(greedy.group(1))
            parts.append(r"(.+)")
        elif named:
            params.append(named.group(1))
            parts.append(r"([^/]+)")
        else:
            literal += 1
            parts.append(re.escape(segment))
    pattern = re.compile("/" + "/".join(parts) if parts != [""] else "/")
    return _CompiledRoute(route, pattern, tuple(params), literal)


class RouteTable:
    """Matches request paths to the template's routes, like an HTTP API does."""

    def __init__(self, routes: Iterable[Route]) -> None:
        compiled = [_compile(route) for route in routes]
        self._routes = sorted(compiled, key=lambda c: c.specificity, reverse=True)

    def resolve(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]]:
        """The route of ``method raw_path`` and its decoded path parameters.

        Raises:
            GatewayError: ``404 not_found`` for a path no route has, ``405
                method_not_allowed`` for a known path with another method.
        """
        allowed: list[str] = []
        for candidate in self._routes:
            match = candidate.pattern.fullmatch(raw_path)
            if match is None:
                continue
            if candidate.route.method != method.upper():
                allowed.append(candidate.route.method)
                continue
            values = (unquote(value) for value in match.groups())
            return candidate.route, dict(zip(candidate.params, values, strict=True))
        if allowed:
            error = GatewayError(
                405,
                "method_not_allowed",
                f"{method.upper()} is not allowed on {raw_path}",
                details={"allowed": sorted(set(allowed))},
            )
            error.headers["allow"] = ", ".join(sorted(set(allowed)))
            raise error
        raise GatewayError(404, "not_found", f"no route for {raw_path}")


def authenticate(
    authorization: str | None, tenant_claim: str, approver: tuple[str, str] | None = None
) -> dict[str, str]:
    """The JWT claims a local bearer token stands for.

    ``Bearer local:<tenant>`` and ``Bearer local:<tenant>:<user>`` are the local runner's
    tokens; the user defaults to :data:`DEFAULT_USER`. The local identity may decide
    approvals: it carries ``approver`` (the functions' ``APPROVER_CLAIM`` and
    ``APPROVER_SCOPE``). ``;<claim>=<value>`` after the token (repeatable) sets other
    claims, or replaces that one: ``Bearer local:acme:eve;scope=read`` may not decide.

    Args:
        authorization: the ``Authorization`` header, if any.
        tenant_claim: the claim that carries the tenant (``TENANT_CLAIM``).
        approver: the claim and value that allow deciding approvals (``None``: none needed).

    Returns:
        ``{tenant_claim: tenant, "sub": user}``, the approver claim and the extra claims.

    Raises:
        GatewayError: ``401 unauthorized`` for a missing or unusable token.
    """
    if not authorization:
        raise GatewayError(401, "unauthorized", "missing Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise GatewayError(401, "unauthorized", "expected a Bearer token")
    identity, *extras = token.strip().split(";")
    prefix, _, rest = identity.partition(":")
    tenant, _, user = rest.partition(":")
    if prefix != "local" or not tenant.strip():
        raise GatewayError(
            401,
            "unauthorized",
            "expected 'Bearer local:<tenant>' or 'Bearer local:<tenant>:<user>'",
        )
    claims = {tenant_claim: tenant.strip(), "sub": user.strip() or DEFAULT_USER}
    if approver is not None:
        claims[approver[0]] = approver[1]
    for extra in extras:
        name, equals, value = extra.partition("=")
        if not equals or not name.strip() or name.strip() in {tenant_claim, "sub"}:
            raise GatewayError(
                401, "unauthorized", "extra claims go as ';<claim>=<value>' (not the tenant or sub)"
            )
        claims[name.strip()] = value.strip()
    return claims


def _joined(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    # HTTP APIs deliver repeated headers and query parameters as one comma-joined value.
    joined: dict[str, str] = {}
    for key, value in pairs:
        joined[key] = f"{joined[key]},{value}" if key in joined else value
    return joined


def _body_fields(body: bytes) -> dict[str, Any]:
    if not body:
        return {"isBase64Encoded": False}
    try:
        return {"body": body.decode("utf-8"), "isBase64Encoded": False}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode("ascii"), "isBase64Encoded": True}


def build_event(
    request: HttpRequest,
    route: Route,
    path_parameters: Mapping[str, str],
    claims: Mapping[str, str] | None,
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The payload format 2.0 event an HTTP API sends for ``request`` on ``route``.

    Args:
        request: the request as received.
        route: the matched route.
        path_parameters: decoded values of the route's ``{name}`` segments.
        claims: the authorizer's claims, or ``None`` on a route without authorizer.
        now: the request time (default: now).
    """
    moment = now or datetime.now(UTC)
    cookies: list[str] = []
    plain: list[tuple[str, str]] = []
    for name, value in request.headers:
        if name.lower() == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
        else:
            plain.append((name.lower(), value))
    headers = _joined(plain)
    host = headers.get("host", "127.0.0.1")
    context: dict[str, Any] = {
        "accountId": ACCOUNT_ID,
        "apiId": API_ID,
        "domainName": host,
        "domainPrefix": host.split(".", 1)[0],
        "http": {
            "method": request.method.upper(),
            "path": request.raw_path,
            "protocol": request.protocol,
            "sourceIp": request.source_ip,
            "userAgent": headers.get("user-agent", ""),
        },
        "requestId": str(uuid.uuid4()),
        "routeKey": route.route_key,
        "stage": "$default",
        "time": moment.strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(moment.timestamp() * 1000),
    }
    if claims is not None:
        context["authorizer"] = {"jwt": {"claims": dict(claims), "scopes": None}}
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route.route_key,
        "rawPath": request.raw_path,
        "rawQueryString": request.raw_query,
        "headers": headers,
    }
    if cookies:
        event["cookies"] = cookies
    if request.raw_query:
        event["queryStringParameters"] = _joined(
            parse_qsl(request.raw_query, keep_blank_values=True)
        )
    if path_parameters:
        event["pathParameters"] = dict(path_parameters)
    event["requestContext"] = context
    event.update(_body_fields(request.body))
    return event


def scheduled_event(rule_name: str, *, region: str, now: datetime | None = None) -> dict[str, Any]:
    """The event an EventBridge schedule rule named ``rule_name`` sends."""
    moment = now or datetime.now(UTC)
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT_ID,
        "time": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:events:{region}:{ACCOUNT_ID}:rule/{rule_name}"],
        "detail": {},
    }


@dataclass
class LambdaContext:
    """The parts of Lambda's context object handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int
    timeout_seconds: float
    region: str = "us-east-1"
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: Set by mobile SDK invocations only; never through API Gateway.
    identity: None = None
    client_context: None = None
    _deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_seconds

    def set_deadline(self, monotonic: float) -> None:
        """End the invocation at ``monotonic`` (a ``time.monotonic()`` value) instead."""
        self._deadline = monotonic

    @property
    def invoked_function_arn(self) -> str:
        """The ARN the function was invoked by."""
        return f"arn:aws:lambda:{self.region}:{ACCOUNT_ID}:function:{self.function_name}"

    @property
    def log_group_name(self) -> str:
        """The function's log group, named the way Lambda names it."""
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        """A log stream name of Lambda's shape."""
        return f"{datetime.now(UTC):%Y/%m/%d}/[{self.function_version}]local"

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before Lambda would stop this invocation."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def to_http(result: Any) -> HttpResponse:
    """The HTTP response API Gateway makes of a function's result (payload format 2.0).

    A result with ``statusCode`` is taken as given; any other JSON result is a
    ``200`` with that JSON as the body.

    Raises:
        GatewayError: ``500 internal_error`` for a result API Gateway could not use.
    """
    if not (isinstance(result, dict) and "statusCode" in result):
        try:
            return HttpResponse.json(200, result)
        except (TypeError, ValueError) as exc:
            raise _bad_result(f"the result is not JSON: {exc}") from exc
    status = result["statusCode"]
    headers = result.get("headers") or {}
    cookies = result.get("cookies") or []
    body = result.get("body") or ""
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise _bad_result(f"statusCode {status!r} is not an HTTP status")
    if not isinstance(headers, dict) or not isinstance(cookies, list):
        raise _bad_result("headers must be an object and cookies a list")
    if not isinstance(body, str):
        raise _bad_result("body must be a string")
    if result.get("isBase64Encoded"):
        try:
            payload = base64.b64decode(body, validate=True)
        except binascii.Error as exc:
            raise _bad_result("body is not valid base64") from exc
    else:
        payload = body.encode("utf-8")
    pairs = [(str(name).lower(), str(value)) for name, value in headers.items()]
    pairs.extend(("set-cookie", str(cookie)) for cookie in cookies)
    return HttpResponse(status, tuple(pairs), payload)


def _bad_result(reason: str) -> GatewayError:
    return GatewayError(500, "internal_error", f"the function returned a bad response: {reason}")
