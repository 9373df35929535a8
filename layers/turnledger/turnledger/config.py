"""Deployment settings, read once from the environment (template.yaml sets them).

| variable | default | meaning |
| --- | --- | --- |
| ``TABLE_NAME`` | ``turnledger`` | the conversations table |
| ``BUCKET_NAME`` | ``turnledger-artifacts`` | the bucket for offloaded payloads |
| ``TTL_SECONDS`` | ``604800`` (7 days) | idle expiry; ``0`` disables |
| ``TENANT_TTL_SECONDS`` | ``{}`` | JSON object: tenant -> TTL seconds, overriding the default |
| ``OFFLOAD_THRESHOLD_BYTES`` | ``65536`` | payloads at or over this go to S3 |
| ``MAX_INPUT_BYTES`` | ``10485760`` | larger request bodies get ``413`` |
| ``CONTEXT_MAX_EVENTS`` / ``CONTEXT_MAX_CHARS`` | ``400`` / ``400000`` | history a turn reads |
| ``TENANT_CLAIM`` | ``tenant_id`` | JWT claim holding the tenant |
| ``PROVIDER`` | ``demo`` | ``demo`` or ``openai-chat`` |
| ``MODEL`` | ``demo-1`` | default model name |
| ``SYSTEM_PROMPT`` | (empty) | sent first on every turn |
| ``OPENAI_BASE_URL`` | ``https://api.openai.com/v1`` | any OpenAI-compatible endpoint |
| ``OPENAI_API_KEY`` | (none) | the key itself (local use) |
| ``OPENAI_API_KEY_SECRET`` | (none) | Secrets Manager secret id holding the key |
| ``OPENAI_API_KEY_PARAMETER`` | (none) | SSM parameter name holding the key (SecureString) |
| ``PROVIDER_TIMEOUT_SECONDS`` | ``60`` | per attempt |
| ``PROVIDER_MAX_RETRIES`` | ``2`` | retries on 429/5xx/timeouts, with backoff |
| ``TOOLS_FILE`` | (none) | tool registry JSON bundled with the function |
| ``TOOLS_PARAMETER`` | (none) | SSM parameter holding the tool registry JSON |
| ``APPROVAL_TTL_SECONDS`` | ``86400`` | how long a pending approval stays open |
| ``MAX_TOOL_STEPS`` | ``8`` | model calls per turn before it stops with a reason |
| ``TOOL_TIMEOUT_SECONDS`` | ``30`` | per tool execution |
| ``DYNAMODB_ENDPOINT`` / ``S3_ENDPOINT`` | (AWS) | other endpoints (local runner, tests) |
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _tenant_ttls(raw: str) -> dict[str, int]:
    if not raw.strip():
        return {}
    parsed = json.loads(raw)
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in parsed.items()
    ):
        raise ValueError("TENANT_TTL_SECONDS must be a JSON object of tenant -> seconds >= 0")
    return parsed


@dataclass(frozen=True)
class Settings:
    """Everything a handler needs to know about its deployment."""

    table_name: str = "turnledger"
    bucket_name: str = "turnledger-artifacts"
    ttl_seconds: int = 7 * 24 * 3600
    tenant_ttl_seconds: dict[str, int] = field(default_factory=dict)
    offload_threshold_bytes: int = 64 * 1024
    max_input_bytes: int = 10 * 1024 * 1024
    context_max_events: int = 400
    context_max_chars: int = 400_000
    tenant_claim: str = "tenant_id"
    provider: str = "demo"
    model: str = "demo-1"
    system_prompt: str = ""
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: str | None = None
    openai_api_key_secret: str | None = None
    openai_api_key_parameter: str | None = None
    provider_timeout_seconds: int = 60
    provider_max_retries: int = 2
    tools_file: str | None = None
    tools_parameter: str | None = None
    approval_ttl_seconds: int = 24 * 3600
    max_tool_steps: int = 8
    tool_timeout_seconds: int = 30
    dynamodb_endpoint: str | None = None
    s3_endpoint: str | None = None

    def ttl_for(self, tenant: str) -> int:
        """The idle TTL of ``tenant``'s conversations (``0``: never expire)."""
        return self.tenant_ttl_seconds.get(tenant, self.ttl_seconds)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``).

        Raises:
            ValueError: a variable is set to something unusable.
        """
        env = os.environ if env is None else env

        def opt(name: str) -> str | None:
            return env.get(name) or None

        return cls(
            table_name=env.get("TABLE_NAME", cls.table_name),
            bucket_name=env.get("BUCKET_NAME", cls.bucket_name),
            ttl_seconds=_int(env, "TTL_SECONDS", cls.ttl_seconds),
            tenant_ttl_seconds=_tenant_ttls(env.get("TENANT_TTL_SECONDS", "")),
            offload_threshold_bytes=_int(
                env, "OFFLOAD_THRESHOLD_BYTES", cls.offload_threshold_bytes
            ),
            max_input_bytes=_int(env, "MAX_INPUT_BYTES", cls.max_input_bytes),
            context_max_events=_int(env, "CONTEXT_MAX_EVENTS", cls.context_max_events),
            context_max_chars=_int(env, "CONTEXT_MAX_CHARS", cls.context_max_chars),
            tenant_claim=env.get("TENANT_CLAIM", cls.tenant_claim),
            provider=env.get("PROVIDER", cls.provider),
            model=env.get("MODEL", cls.model),
            system_prompt=env.get("SYSTEM_PROMPT", ""),
            openai_base_url=env.get("OPENAI_BASE_URL", cls.openai_base_url),
            openai_api_key=opt("OPENAI_API_KEY"),
            openai_api_key_secret=opt("OPENAI_API_KEY_SECRET"),
            openai_api_key_parameter=opt("OPENAI_API_KEY_PARAMETER"),
            provider_timeout_seconds=_int(
                env, "PROVIDER_TIMEOUT_SECONDS", cls.provider_timeout_seconds
            ),
            provider_max_retries=_int(env, "PROVIDER_MAX_RETRIES", cls.provider_max_retries),
            tools_file=opt("TOOLS_FILE"),
            tools_parameter=opt("TOOLS_PARAMETER"),
            approval_ttl_seconds=_int(env, "APPROVAL_TTL_SECONDS", cls.approval_ttl_seconds),
            max_tool_steps=_int(env, "MAX_TOOL_STEPS", cls.max_tool_steps),
            tool_timeout_seconds=_int(env, "TOOL_TIMEOUT_SECONDS", cls.tool_timeout_seconds),
            dynamodb_endpoint=opt("DYNAMODB_ENDPOINT"),
            s3_endpoint=opt("S3_ENDPOINT"),
        )
