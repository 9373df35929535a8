"""Build the configured :class:`Provider` from :class:`~turnledger.config.Settings`.

Handlers call :func:`build_provider` once at import time. Nothing here calls
AWS or the model: the API key of ``openai-chat`` is read on the first request
(and then from Powertools' cache), and Powertools Parameters is imported only
then, so a cold start pays for neither.
"""

from __future__ import annotations

import json

import httpx

from ..config import Settings
from .base import Provider
from .demo import DemoProvider
from .openai_chat import ApiKeyProvider, OpenAIChatProvider

#: The names ``PROVIDER`` accepts.
PROVIDERS = ("demo", "openai-chat")

#: Seconds a key read from Secrets Manager or SSM is cached: a rotated key is
#: picked up within this, without a read on every turn.
KEY_MAX_AGE_SECONDS = 300

#: Field names tried, in order, when a secret holds a JSON object instead of the bare key.
_SECRET_KEY_FIELDS = ("api_key", "OPENAI_API_KEY", "key")


def _key_from_secret(value: str | bytes, name: str) -> str:
    """The key in a secret: the bare string, or one field of a JSON object.

    Raises:
        ValueError: the secret is a JSON object without a usable key field.
    """
    text = value.decode() if isinstance(value, bytes) else value
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if not isinstance(parsed, dict):
        return text
    for field in _SECRET_KEY_FIELDS:
        if isinstance(parsed.get(field), str):
            return str(parsed[field])
    strings = [v for v in parsed.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    raise ValueError(f"secret {name!r} is a JSON object without one of {_SECRET_KEY_FIELDS}")


def _secret_key(secret_id: str) -> ApiKeyProvider:
    def read() -> str:
        from aws_lambda_powertools.utilities import parameters

        value: str | bytes = parameters.get_secret(secret_id, max_age=KEY_MAX_AGE_SECONDS)
        return _key_from_secret(value, secret_id)

    return read


def _parameter_key(name: str) -> ApiKeyProvider:
    def read() -> str:
        from aws_lambda_powertools.utilities import parameters

        return parameters.get_parameter(name, decrypt=True, max_age=KEY_MAX_AGE_SECONDS)

    return read


def api_key_source(settings: Settings) -> ApiKeyProvider | None:
    """Where ``openai-chat`` gets its key: the first of these that is set.

    ``OPENAI_API_KEY`` (the key itself), ``OPENAI_API_KEY_SECRET`` (a Secrets
    Manager secret: the bare key, or a JSON object with an ``api_key`` field),
    ``OPENAI_API_KEY_PARAMETER`` (an SSM SecureString). ``None`` when none is
    set: local servers such as Ollama need no key.
    """
    if settings.openai_api_key:
        key = settings.openai_api_key
        return lambda: key
    if settings.openai_api_key_secret:
        return _secret_key(settings.openai_api_key_secret)
    if settings.openai_api_key_parameter:
        return _parameter_key(settings.openai_api_key_parameter)
    return None


def build_provider(settings: Settings, *, http_client: httpx.Client | None = None) -> Provider:
    """The provider ``settings.provider`` names.

    Args:
        settings: the deployment's settings.
        http_client: the HTTP client ``openai-chat`` uses (tests, shared pools);
            one is built when not given.

    Raises:
        ValueError: ``settings.provider`` is not one of :data:`PROVIDERS`.
    """
    if settings.provider == "demo":
        return DemoProvider()
    if settings.provider == "openai-chat":
        return OpenAIChatProvider(
            base_url=settings.openai_base_url,
            api_key=api_key_source(settings),
            client=http_client,
            timeout_seconds=settings.provider_timeout_seconds,
            max_retries=settings.provider_max_retries,
        )
    raise ValueError(
        f"unknown provider {settings.provider!r}; valid providers: {', '.join(PROVIDERS)}"
    )
