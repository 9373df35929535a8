"""Build a :class:`Provider` from :class:`~turnledger.core.config.Settings`.

The runtime builds the deployment's provider once per process (and the
pipeline may build others by name, for a turn that switches provider).
Nothing here calls AWS or the model: the API key of the OpenAI-style
providers is read on the first request (and then from Powertools' cache),
Powertools Parameters is imported only then, and the Bedrock client is
created on the first call, so a cold start pays for none of them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from ..core.config import Settings
from .base import ApiKeyProvider, Provider

if TYPE_CHECKING:
    import httpx

# Each provider's module (and its client library: httpx, boto3's bedrock-runtime model)
# is imported by the branch that builds it, so a deployment pays only for its own.


#: The names ``PROVIDER`` (and a turn's ``"provider"``) accepts.
PROVIDERS = ("demo", "demo-stateful", "openai-chat", "openai-responses", "bedrock-converse")

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
    """Where the OpenAI-style providers get their key: the first of these that is set.

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


def build_provider(
    settings: Settings, name: str | None = None, *, http_client: httpx.Client | None = None
) -> Provider:
    """The provider ``name`` (default: ``settings.provider``), configured from ``settings``.

    Args:
        settings: the deployment's settings.
        name: one of :data:`PROVIDERS`; ``None`` is the deployment's default.
        http_client: the HTTP client the OpenAI-style providers use (tests,
            shared pools); one is built when not given.

    Raises:
        ValueError: the name is not one of :data:`PROVIDERS`.
    """
    name = settings.provider if name is None else name
    if name == "demo":
        from .demo import DemoProvider

        return DemoProvider(token_delay_ms=settings.demo_token_delay_ms)
    if name == "demo-stateful":
        from .demo_stateful import DemoStatefulProvider, demo_state_store

        return DemoStatefulProvider(
            demo_state_store(settings.demo_state_dir),
            token_delay_ms=settings.demo_token_delay_ms,
        )
    if name in ("openai-chat", "openai-responses"):
        from .openai_chat import OpenAIChatProvider
        from .openai_responses import OpenAIResponsesProvider

        options: dict[str, Any] = {
            "base_url": settings.openai_base_url,
            "api_key": api_key_source(settings),
            "client": http_client,
            "timeout_seconds": settings.provider_timeout_seconds,
            "max_retries": settings.provider_max_retries,
        }
        if name == "openai-chat":
            return OpenAIChatProvider(**options)
        return OpenAIResponsesProvider(store=settings.openai_responses_store, **options)
    if name == "bedrock-converse":
        from .bedrock_converse import BedrockConverseProvider, JsonMode

        return BedrockConverseProvider(
            region=settings.bedrock_region,
            endpoint_url=settings.bedrock_endpoint,
            timeout_seconds=settings.provider_timeout_seconds,
            max_retries=settings.provider_max_retries,
            max_tokens=settings.bedrock_max_tokens or None,
            json_mode=cast(JsonMode, settings.bedrock_json_mode),
        )
    raise ValueError(f"unknown provider {name!r}; valid providers: {', '.join(PROVIDERS)}")
