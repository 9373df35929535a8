"""The streaming edge without a network: the handler's stream (:mod:`turnledger.api.live`)
and the deployed server's checks (:mod:`turnledger.api.stream_server`), issue 43.

A route that opens the channel is streamed piece by piece, in order, before it returns; one
that does not is answered whole; a consumer that stops early still lets the route finish.
The server verifies a caller's JWT as the HTTP API's authorizer does (signature, issuer,
audience, expiry) and puts its claims where the authorizer puts them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from turnledger.api.live import Head, channel, streaming, wants_stream
from turnledger.api.stream_server import (
    TOKEN_HEADER,
    JwtVerifier,
    Unauthorized,
    bearer,
    function_url_event,
)

ISSUER = "https://issuer.example"


def test_a_route_that_opens_the_channel_streams_before_it_returns() -> None:
    release = threading.Event()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        opened = channel()
        assert opened is not None
        opened.open(200, {"content-type": "text/event-stream"})
        opened.write(b"one")
        release.wait(5)  # the route is still running while its first piece is read
        opened.write(b"two")
        return {"statusCode": 200, "body": ""}

    pieces = streaming(handler)({}, None)
    assert next(pieces) == Head(200, {"content-type": "text/event-stream"})
    assert next(pieces) == b"one"
    release.set()
    assert list(pieces) == [b"two"]


def test_a_route_that_does_not_open_it_is_answered_whole() -> None:
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 409, "headers": {"content-type": "application/json"}, "body": "{}"}

    assert list(streaming(handler)({}, None)) == [
        Head(409, {"content-type": "application/json"}),
        b"{}",
    ]
    assert channel() is None  # only the streaming handler's thread has one


def test_a_consumer_that_stops_early_lets_the_route_finish() -> None:
    finished = threading.Event()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        opened = channel()
        assert opened is not None
        opened.open()
        for _ in range(3):
            time.sleep(0.01)
            opened.write(b"x")
        finished.set()
        return {"statusCode": 200}

    pieces = streaming(handler)({}, None)
    next(pieces)
    pieces.close()  # the client hung up after the head
    assert finished.is_set()


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "streams"),
    [
        ("POST", "/v1/conversations/c1/turns", {"accept": "text/event-stream"}, b"", True),
        ("POST", "/v1/conversations/c1/turns", {}, b"", False),
        (
            "POST",
            "/v1/conversations/c1/turns",
            {"accept": "text/event-stream", "prefer": "respond-async"},
            b"",
            False,
        ),
        ("GET", "/v1/conversations/c1/turns/1/stream", {"accept": "text/event-stream"}, b"", False),
        ("POST", "/openai/v1/responses", {}, b'{"stream": true}', True),
        ("POST", "/openai/v1/responses", {}, b'{"stream": false}', False),
        ("POST", "/openai/v1/responses", {}, b"not json", False),
    ],
)
def test_which_requests_stream(
    method: str, path: str, headers: dict[str, str], body: bytes, streams: bool
) -> None:
    assert wants_stream(method, path, headers, body) is streams


@pytest.fixture
def signer(monkeypatch: pytest.MonkeyPatch) -> rsa.RSAPrivateKey:
    """The issuer's key, served as its JWKS would be (no network)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def signing_key(self: jwt.PyJWKClient, token: str) -> jwt.PyJWK:
        return jwt.PyJWK.from_dict(
            {**jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True), "alg": "RS256"}
        )

    monkeypatch.setattr(jwt.PyJWKClient, "get_signing_key_from_jwt", signing_key)
    return key


def _token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    body = {"iss": ISSUER, "aud": "app", "exp": int(time.time()) + 60, "sub": "ann", **claims}
    return jwt.encode(body, key, algorithm="RS256")


def test_a_valid_token_gives_its_claims_where_the_authorizer_puts_them(
    signer: rsa.RSAPrivateKey,
) -> None:
    verifier = JwtVerifier(ISSUER, ["app"])
    token = _token(signer, tenant_id="acme", scope="turnledger/approve")
    headers = {TOKEN_HEADER: f"Bearer {token}", "authorization": "AWS4-HMAC-SHA256 ..."}
    claims = verifier.claims(bearer(headers))
    assert claims["tenant_id"] == "acme"
    event = function_url_event("POST", "/v1/conversations/c1/turns?x=1", headers, b"{}", claims)
    assert event["rawPath"] == "/v1/conversations/c1/turns"
    assert event["rawQueryString"] == "x=1"
    assert event["requestContext"]["http"]["method"] == "POST"
    assert event["requestContext"]["authorizer"]["jwt"] == {
        "claims": claims,
        "scopes": ["turnledger/approve"],
    }


@pytest.mark.parametrize(
    "claims",
    [
        {"iss": "https://another.example"},
        {"aud": "another-app"},
        {"exp": int(time.time()) - 60},
    ],
    ids=["issuer", "audience", "expired"],
)
def test_a_token_the_authorizer_would_refuse_is_unauthorized(
    signer: rsa.RSAPrivateKey, claims: dict[str, Any]
) -> None:
    with pytest.raises(Unauthorized):
        JwtVerifier(ISSUER, ["app"]).claims(_token(signer, **claims))


def test_an_access_token_names_its_audience_as_client_id(signer: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(
        {"iss": ISSUER, "exp": int(time.time()) + 60, "client_id": "app"}, signer, "RS256"
    )
    assert JwtVerifier(ISSUER, ["app"]).claims(token)["client_id"] == "app"


def test_a_token_signed_by_another_key_is_unauthorized(signer: rsa.RSAPrivateKey) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(Unauthorized):
        JwtVerifier(ISSUER, ["app"]).claims(_token(other))


def test_no_bearer_token_is_unauthorized() -> None:
    with pytest.raises(Unauthorized):
        bearer({"authorization": "AWS4-HMAC-SHA256 Credential=..."})
