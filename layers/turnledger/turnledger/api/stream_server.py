"""The streaming function's HTTP server, deployed behind the Lambda Web Adapter.

Lambda's Python runtime answers an invocation whole; the Lambda Web Adapter (a layer, see
docs/DEPLOY.md) turns each function URL request into an HTTP request to this server and
streams its answer back (``AWS_LWA_INVOKE_MODE=response_stream``). The server turns the
request into the event a function URL sends (payload 2.0, the HTTP API's shape), with the
caller's verified JWT claims where the HTTP API's JWT authorizer puts them, and writes what
the streaming handler (:mod:`turnledger.api.live`) yields as it comes, chunked.

The URL is ``AWS_IAM``: SigV4 takes the ``Authorization`` header, so the caller's JWT comes
in ``X-Turnledger-Authorization: Bearer <jwt>`` (or in ``Authorization`` when the signature
travels in the query string). It is verified as the HTTP API's authorizer verifies it: the
issuer's keys (its JWKS), the issuer and one of the audiences of the HTTP API's own JWT
authorizer (read at init, ``JWT_AUTHORIZER_API``), expiry. No valid token: ``401
unauthorized``, before any handler runs.

Run as ``python -m turnledger.api.stream_server`` (the function's ``run.sh``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import urlsplit

from .live import Head, StreamingHandler

#: The header that carries the caller's JWT beside a SigV4 ``Authorization``.
TOKEN_HEADER = "x-turnledger-authorization"
#: The adapter's readiness check (its default: a ``GET /``, no route of the API).
READY_PATH = "/"
#: The adapter's default port.
PORT = 8080
#: What the adapter passes of the invocation (its request context and Lambda context).
_REQUEST_CONTEXT = "x-amzn-request-context"
_LAMBDA_CONTEXT = "x-amzn-lambda-context"


class Unauthorized(Exception):
    """No JWT, or one that does not verify."""


class JwtVerifier:
    """Verifies a caller's JWT as the HTTP API's JWT authorizer does (RS256 from the
    issuer's JWKS, issuer, audience, expiry)."""

    def __init__(self, issuer: str, audience: list[str]) -> None:
        import jwt  # only the streaming function's server loads it

        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self._jwt = jwt
        self._keys = jwt.PyJWKClient(f"{self.issuer}/.well-known/jwks.json", cache_keys=True)

    def claims(self, token: str) -> dict[str, Any]:
        """The token's claims.

        Raises:
            Unauthorized: the token does not verify.
        """
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            claims: dict[str, Any] = self._jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                issuer=self.issuer,
                options={"require": ["exp", "iss"], "verify_aud": False},
            )
        except self._jwt.PyJWTError as exc:
            raise Unauthorized(str(exc)) from exc
        # As API Gateway: ``aud`` names an audience, or (Cognito's access tokens, which
        # carry none) ``client_id`` does.
        named = claims.get("aud", claims.get("client_id"))
        given = {named} if isinstance(named, str) else set(named or [])
        if self.audience and not given & set(self.audience):
            raise Unauthorized("the token is for another audience")
        return claims


def bearer(headers: dict[str, str]) -> str:
    """The caller's JWT from ``headers`` (lower-case names).

    Raises:
        Unauthorized: none is given.
    """
    for name in (TOKEN_HEADER, "authorization"):
        value = headers.get(name) or ""
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    raise Unauthorized("no bearer token")


def function_url_event(
    method: str, target: str, headers: dict[str, str], body: bytes, claims: dict[str, Any]
) -> dict[str, Any]:
    """The function URL event (payload 2.0) of a request, its verified ``claims`` where the
    HTTP API's JWT authorizer puts them."""
    split = urlsplit(target)
    scopes = str(claims.get("scope") or "").split()
    context = json.loads(headers.get(_REQUEST_CONTEXT) or "{}")
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": split.path,
        "rawQueryString": split.query,
        "headers": {k: v for k, v in headers.items() if not k.startswith("x-amzn-")},
        "requestContext": {
            **context,
            "http": {
                "method": method,
                "path": split.path,
                "protocol": "HTTP/1.1",
                "sourceIp": str((context.get("http") or {}).get("sourceIp") or ""),
                "userAgent": headers.get("user-agent", ""),
            },
            "authorizer": {"jwt": {"claims": claims, "scopes": scopes}},
        },
        "body": body.decode("utf-8", "replace"),
        "isBase64Encoded": False,
    }


@dataclass
class AdapterContext:
    """The Lambda context the adapter passes (``x-amzn-lambda-context``)."""

    function_name: str
    aws_request_id: str
    deadline_ms: int

    def get_remaining_time_in_millis(self) -> int:
        return max(self.deadline_ms - int(time.time() * 1000), 0)


def _context(headers: dict[str, str]) -> AdapterContext:
    raw = json.loads(headers.get(_LAMBDA_CONTEXT) or "{}")
    return AdapterContext(
        function_name=str(raw.get("function_name") or os.environ.get("AWS_LAMBDA_FUNCTION_NAME")),
        aws_request_id=str(raw.get("request_id") or ""),
        deadline_ms=int(raw.get("deadline") or (time.time() + 300) * 1000),
    )


def serve(handler: StreamingHandler, verifier: JwtVerifier, port: int) -> None:
    """Serve ``handler`` on ``port`` until the environment ends."""

    class Request(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == READY_PATH:
                self._answer(200, b'{"ready":true}')
                return
            self._invoke()

        def do_POST(self) -> None:
            self._invoke()

        do_PUT = do_PATCH = do_DELETE = do_POST

        def _invoke(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            body = self.rfile.read(int(headers.get("content-length") or 0))
            try:
                claims = verifier.claims(bearer(headers))
            except Unauthorized:
                error = {"error": {"code": "unauthorized", "message": "Unauthorized"}}
                self._answer(401, json.dumps(error).encode())
                return
            event = function_url_event(self.command, self.path, headers, body, claims)
            for piece in handler(event, _context(headers)):
                if isinstance(piece, Head):
                    self.send_response(piece.status)
                    for name, value in piece.headers.items():
                        self.send_header(name, value)
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                else:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    HTTPServer(("127.0.0.1", port), Request).serve_forever()


def authorizer_settings(api_id: str) -> tuple[str, list[str]]:
    """The issuer and audiences of the HTTP API ``api_id``'s JWT authorizer (read once, at
    init: the stream verifies what the API verifies, from one configuration).

    Raises:
        LookupError: the API has no JWT authorizer.
    """
    import boto3

    client = boto3.client("apigatewayv2")
    for authorizer in client.get_authorizers(ApiId=api_id).get("Items", []):
        config = authorizer.get("JwtConfiguration")
        if authorizer.get("AuthorizerType") == "JWT" and config and config.get("Issuer"):
            return str(config["Issuer"]), [str(a) for a in config.get("Audience", [])]
    raise LookupError(f"the HTTP API {api_id} has no JWT authorizer")


def main() -> None:
    """The function's server: its handler (``app.lambda_handler``) behind the adapter."""
    import importlib

    handler = importlib.import_module("app").lambda_handler
    issuer, audience = authorizer_settings(os.environ["JWT_AUTHORIZER_API"])
    serve(handler, JwtVerifier(issuer, audience), int(os.environ.get("AWS_LWA_PORT", PORT)))


if __name__ == "__main__":
    main()
