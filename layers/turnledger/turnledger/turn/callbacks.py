"""Signed callback tokens of deferred tool calls.

The executor request of a call whose tool is declared ``deferred`` (only those: a
synchronous tool is never handed a credential that settles its call) carries
``callback_url`` = ``<PUBLIC_BASE_URL>/v1/callbacks/<token>``. The token is its own credential (the
route has no authorizer), so it says everything the settle needs, and is opaque:
a Fernet token (AES-128-CBC, then HMAC-SHA256 over the ciphertext) of the claims
JSON, its ``=`` padding dropped. Its HMAC is checked (constant time) before anything
is decrypted; whoever holds the URL (the tool's operator) cannot read the tenant or
the conversation from it.

The claims: tenant, conversation id, the conversation's ``created_at`` (the time
stamp that tells its lives apart: a cleared and re-created conversation of the same
id is another life, with another ``gen`` and another ``created_at``), call id, the
call's idempotency key and the token's deadline (epoch seconds; by default
:data:`DEFAULT_DEFERRED_SECONDS` after the call was deferred).
Single use is not the token's business: the settle is a conditional commit on the
call's ``deferred`` state, so a token used twice finds its call settled and is refused.

The key: ``CALLBACK_KEY`` (hex; the local runner generates one), else the Secrets
Manager secret ``CALLBACK_SECRET_ARN`` (read through Powertools parameters,
cached). Fernet's two keys are derived from it with HKDF-SHA256. No key: deferred
calls get no ``callback_url`` (the application settles them with ``outputs`` on the
approvals route) and every callback is refused.

A callback's body may hold at most ``CALLBACK_MAX_INPUT_BYTES`` (default
:data:`DEFAULT_MAX_INPUT_BYTES`); the API checks the token, then that limit, before
it reads the body (:func:`turnledger.api.callback_gate.refuse_early`).
"""

from __future__ import annotations

import base64
import functools
import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core.exceptions import CallbackInvalid
from ..core.strict_json import parse

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

#: How long a key read from Secrets Manager is cached (seconds).
SECRET_MAX_AGE_SECONDS = 300

#: Tokens longer than this are refused unread (a real one is ~300-700 characters).
MAX_TOKEN_CHARS = 2048

#: How long a deferred call waits for its callback, and its token lives, unless its tool
#: sets ``deferred_ttl_seconds`` (seconds; never past the conversation's TTL).
DEFAULT_DEFERRED_SECONDS = 3600

#: The default of ``CALLBACK_MAX_INPUT_BYTES``: the largest callback body (bytes).
DEFAULT_MAX_INPUT_BYTES = 262144

#: HKDF ``info``: the derived key serves callback tokens only.
_KEY_PURPOSE = b"turnledger callback token v2"


@dataclass(frozen=True)
class CallbackClaims:
    """What a callback token binds: one deferred call of one conversation's life."""

    tenant: str
    conversation_id: str
    #: The conversation's ``created_at`` (ISO 8601, :func:`created_stamp`): which life
    #: of the conversation the call belongs to.
    created_at: str
    call_id: str
    idempotency_key: str
    #: Epoch seconds after which the token is refused.
    deadline: int

    def to_json(self) -> bytes:
        """The claims as compact JSON (what is signed)."""
        return json.dumps(
            [
                self.tenant,
                self.conversation_id,
                self.created_at,
                self.call_id,
                self.idempotency_key,
                self.deadline,
            ],
            separators=(",", ":"),
            ensure_ascii=True,
        ).encode("ascii")


def created_stamp(created_at: datetime) -> str:
    """The ``created_at`` claim of a conversation created at ``created_at``."""
    return created_at.isoformat()


@functools.lru_cache(maxsize=4)
def _fernet(key: bytes) -> Fernet:
    """The Fernet of ``key`` (cached: a rotated secret is a new key, the old one ages out)."""
    # Imported here: only requests that sign or verify a callback pay for it.
    from cryptography.fernet import Fernet
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_PURPOSE).derive(key)
    return Fernet(base64.urlsafe_b64encode(derived))


def clear_key_cache() -> None:
    """Forget the ciphers derived from callback keys (a restored snapshot derives its own)."""
    _fernet.cache_clear()


def sign(key: bytes, claims: CallbackClaims) -> str:
    """The opaque token of ``claims`` under ``key`` (URL-safe, no padding)."""
    return _fernet(key).encrypt(claims.to_json()).decode("ascii").rstrip("=")


def verify(key: bytes | None, token: str, *, now: datetime) -> CallbackClaims:
    """The claims of a genuine, unexpired token.

    The HMAC is checked first, in constant time; only a genuine token is decrypted.

    Raises:
        CallbackInvalid: no key, a malformed or forged token, or one past its deadline.
            The message never says which, so a forger learns nothing.
    """
    refused = CallbackInvalid("this callback token is not valid (forged, expired or used)")
    # Only the spelling :func:`sign` makes: base64url without padding, so ``=`` (which
    # the decoder would ignore at the end) makes a token another one's twin.
    if (
        key is None
        or not token
        or len(token) > MAX_TOKEN_CHARS
        or not token.isascii()
        or "=" in token
    ):
        raise refused
    from cryptography.fernet import InvalidToken

    padded = token + "=" * (-len(token) % 4)
    try:
        # One spelling per token: base64 that decodes, and re-encodes to the same text
        # (no ignored characters or padding bits).
        if base64.urlsafe_b64encode(base64.urlsafe_b64decode(padded)).decode() != padded:
            raise refused
        body = _fernet(key).decrypt(padded)
        claims = CallbackClaims(*parse(body, "the claims"))
    except (InvalidToken, ValueError, TypeError):
        raise refused from None
    if not isinstance(claims.deadline, int) or now.timestamp() >= claims.deadline:
        raise refused
    return claims


def max_input_bytes() -> int:
    """The largest callback body accepted (``CALLBACK_MAX_INPUT_BYTES``).

    Raises:
        ValueError: the variable is not a positive integer.
    """
    raw = os.environ.get("CALLBACK_MAX_INPUT_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_INPUT_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"CALLBACK_MAX_INPUT_BYTES must be a positive integer, got {raw!r}")
    return int(raw)


def signing_key() -> bytes | None:
    """The deployment's callback signing key, or ``None`` when none is configured.

    Raises:
        ValueError: ``CALLBACK_KEY`` is not hex.
    """
    local = os.environ.get("CALLBACK_KEY")
    if local:
        return bytes.fromhex(local)
    arn = os.environ.get("CALLBACK_SECRET_ARN")
    if not arn:
        return None
    # Imported here: only requests that sign or verify a callback pay for it.
    from aws_lambda_powertools.utilities import parameters

    secret = parameters.get_secret(arn, max_age=SECRET_MAX_AGE_SECONDS)
    text = secret.decode() if isinstance(secret, bytes) else str(secret)
    return text.encode("utf-8")


def public_base_url() -> str | None:
    """This API's public base URL (``PUBLIC_BASE_URL``), without a trailing slash."""
    url = os.environ.get("PUBLIC_BASE_URL", "").strip()
    return url.rstrip("/") or None


def callback_url(claims: CallbackClaims) -> str | None:
    """The URL a deferred call's tool POSTs its outcome to (``None``: not configured)."""
    base = public_base_url()
    key = signing_key()
    if base is None or key is None:
        return None
    return f"{base}/v1/callbacks/{sign(key, claims)}"


def callback_output(value: Any) -> str:
    """A callback's ``output`` as the call's result text: a string as itself, nothing as
    empty, any other JSON value as compact JSON (as an http tool's answer is kept)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
