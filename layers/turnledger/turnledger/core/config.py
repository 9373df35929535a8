"""Deployment settings, read once from the environment (template.yaml sets them).

| variable | default | meaning |
| --- | --- | --- |
| ``TABLE_NAME`` | ``turnledger`` | the conversations table |
| ``BUCKET_NAME`` | ``turnledger-artifacts`` | the bucket for offloaded payloads |
| ``TTL_SECONDS`` | ``604800`` (7 days) | idle expiry; ``0`` disables |
| ``TENANT_TTL_SECONDS`` | ``{}`` | JSON object: tenant -> TTL seconds, overriding the default |
| ``OFFLOAD_THRESHOLD_BYTES`` | ``65536`` | payloads at or over this go to S3 |
| ``MAX_INPUT_BYTES`` | ``4194304`` (4 MiB) | larger request bodies get ``413`` (see below) |
| ``IMPORT_MAX_EVENTS`` | ``5000`` | an import with more events gets ``413 import_too_large`` |
| ``EXPORT_INLINE_MAX_BYTES`` | ``4194304`` | larger exports go to S3, answered with a link |
| ``EXPORT_URL_TTL_SECONDS`` | ``300`` | how long an export's link works |
| ``CONTEXT_MAX_EVENTS`` / ``CONTEXT_MAX_CHARS`` | ``400`` / ``400000`` | cap on one turn's read |
| ``CONTEXT_MAX_TOKENS`` | (per model) | context budget; the model's window less reserve caps it |
| ``MODELS`` | ``{}`` | JSON: model -> :class:`ModelSpec` fields (window, reserve, prices) |
| ``CONVERSATION_TOKEN_BUDGET`` | ``0`` (off) | input + output tokens a conversation may use |
| ``TURN_TOKEN_BUDGET`` | ``0`` (off) | input + output tokens one turn may use |
| ``TENANT_CONVERSATION_TOKEN_BUDGET`` | ``{}`` | JSON: tenant -> tokens, overriding it |
| ``TENANT_TURN_TOKEN_BUDGET`` | ``{}`` | JSON: tenant -> tokens, overriding it |
| ``SUMMARIZER_PROVIDER`` / ``_MODEL`` | (the turn's) | who writes context summaries |
| ``REDACTION_FILE`` | (none: off) | redaction rule set bundled with the function |
| ``REDACTION_PARAMETER`` | (none: off) | SSM parameter holding the rule set |
| ``DATA_POLICY_FILE`` | (none: off) | data policy (classes, detectors) bundled with the function |
| ``DATA_POLICY_PARAMETER`` | (none: off) | SSM parameter holding the data policy |
| ``DATA_POLICY_ADMIN_SCOPE`` | (empty: off) | value that may ``PUT /v1/data-policy`` |
| ``TENANT_CLAIM`` | ``tenant_id`` | JWT claim holding the tenant |
| ``APPROVER_CLAIM`` | ``scope`` | JWT claim that must hold ``APPROVER_SCOPE`` to decide approvals |
| ``APPROVER_SCOPE`` | ``turnledger/approve`` | the value required (empty: anyone in the tenant) |
| ``APPROVAL_FOUR_EYES`` | ``false`` | ``true``: nobody approves a call their own turn asked for |
| ``PROVIDER`` | ``demo`` | ``demo`` or ``openai-chat`` |
| ``MODEL`` | ``demo-1`` | default model name |
| ``ALLOWED_MODELS`` | ``MODEL``, ``MODELS`` | other models a turn may name (``*``: any) |
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
| ``CALLBACK_SECRET_ARN`` | (none) | Secrets Manager secret: the callback token key |
| ``CALLBACK_KEY`` | (none) | the signing key itself, hex (local runner: generated) |
| ``PUBLIC_BASE_URL`` | (none) | this API's public URL, the base of ``callback_url`` |
| ``CALLBACK_MAX_INPUT_BYTES`` | ``262144`` | larger callback bodies get ``413`` |

**Limits Lambda can carry.** A synchronous Lambda invocation carries at most
:data:`LAMBDA_SYNC_PAYLOAD_BYTES` (6 MiB) of event, and of response. An HTTP API event holds
the body base64-encoded when it is not text (4/3 of its size) plus the envelope (headers,
at most 10 KiB on an HTTP API, request context and JWT claims, a few KiB more). So
``MAX_INPUT_BYTES`` defaults to 4 MiB: 4,194,304 x 4/3 = 5,592,406 bytes of base64, and
about 699,050 bytes are left for the envelope. A body between that and the HTTP API's own
10 MB could never reach the function: the platform would refuse it with its own error,
not ``413 payload_too_large``. An export is measured the same way, JSON-escaped as it sits
in Lambda's response: over ``EXPORT_INLINE_MAX_BYTES`` it goes to S3 instead.

``CALLBACK_*`` and ``PUBLIC_BASE_URL`` are not settings: they
are read where they are used (:mod:`turnledger.turn.callbacks`), as are the notifications'
variables (:mod:`turnledger.ops.notifications`).

Providers (``PROVIDER`` also takes ``openai-responses``, ``bedrock-converse``, ``demo-stateful``):

| variable | default | meaning |
| --- | --- | --- |
| ``PROVIDERS`` | (none) | other providers a turn may name (comma-separated) |
| ``OPENAI_RESPONSES_STORE`` | ``true`` | ``false``: ``openai-responses`` never keeps responses |
| ``PROVIDER_STATE_RETENTION_SECONDS`` | ``2592000`` (30 days) | older stored state is not used |
| ``BEDROCK_REGION`` | (the function's region) | region of ``bedrock-runtime`` |
| ``BEDROCK_ENDPOINT`` | (AWS) | another ``bedrock-runtime`` endpoint (tests, VPC endpoints) |
| ``BEDROCK_MAX_TOKENS`` | ``0`` (the model's default) | ``inferenceConfig.maxTokens`` |
| ``BEDROCK_JSON_MODE`` | ``tool`` | JSON mode: ``tool`` (a forced answer tool) or ``native`` |
| ``DEMO_STATE_DIR`` | (none: memory) | where ``demo-stateful`` keeps state (shared by processes) |
| ``STORE`` | ``dynamodb`` | ``sqlite``: conversations in ``DATA_DIR`` (``local --data-dir``) |
| ``DATA_DIR`` | (none) | the folder of the SQLite store: database file and offloaded payloads |
| ``MASTER_KEY_FILE`` | (state folder) | the SQLite store's master key (outside ``DATA_DIR``) |

Long and streamed turns (``Prefer: respond-async``):

| variable | default | meaning |
| --- | --- | --- |
| ``TURN_WORKER_FUNCTION`` | (none: async turns refused) | the function async turns run in |
| ``TURN_WORKER_ENDPOINT`` | (AWS) | the Lambda endpoint that starts it (local runner) |
| ``DRAFT_FLUSH_MS``, ``_CHARS`` | ``250``, ``400`` | a draft chunk at most this often, or size |
| ``SYNC_TURN_DRAFTS`` | ``true`` | synchronous turns write a draft (followed while they run) |
| ``SYNC_DRAFT_AFTER_MS`` | ``1000`` | ... once they have run this long (``0``: from the start) |
| ``DEMO_TOKEN_DELAY_MS`` | ``0`` | the demo models wait this long before each streamed word |

Long-term memory per user (:mod:`turnledger.store.memories`, :mod:`turnledger.context.memory`):

| variable | default | meaning |
| --- | --- | --- |
| ``MEMORY_ENABLED`` | ``false`` | ``true``: turns recall and write back the user's memory |
| ``MEMORY_MAX_RECORDS`` | ``200`` | records a user may keep (write-back drops the oldest beyond) |
| ``MEMORY_CONTEXT_SHARE`` | ``0.1`` | share of the context budget the recalled records may take |
| ``MEMORY_USER_SCOPE`` | (empty: off) | holding it (``APPROVER_CLAIM``): may name the user |
| ``MEMORY_EMBEDDINGS`` | (none: keywords) | ``openai`` or ``bedrock``: rank by embeddings |
| ``MEMORY_EMBEDDING_MODEL`` | (per kind) | see :mod:`turnledger.providers.embeddings` |
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .models import Usage

#: What a synchronous Lambda invocation carries, each way (request event, response).
LAMBDA_SYNC_PAYLOAD_BYTES = 6 * 1024 * 1024
#: The default request body limit: base64-encoded (x 4/3) it leaves ~680 KiB of the
#: payload limit for the event's envelope (see the module's docstring).
DEFAULT_MAX_INPUT_BYTES = 4 * 1024 * 1024

#: Where conversations can be kept (``STORE``).
STORES = ("dynamodb", "sqlite")

#: The Region and account a KMS key's (or alias's) or a secret's ARN names.
_SCOPED_ARN = re.compile(r"^arn:[^:]+:(?:kms|secretsmanager):(?P<region>[^:]*):(?P<account>[^:]*):")
#: The account an IAM role's ARN names.
_ROLE_ARN = re.compile(r"^arn:[^:]+:iam::(?P<account>[0-9]+):")


class ForeignResource(ValueError):
    """A KMS key or a secret the settings name is of another account or Region than the
    function's: its role may use this account's in this Region only, so every call would
    be denied (raised at init, which fails the deploy under SnapStart)."""


def _refuse_foreign_resources(settings: Settings, env: Mapping[str, str]) -> None:
    """Refuse an ARN in ``CONTENT_KMS_KEY_ID``, ``TENANT_KMS_KEY_IDS``,
    ``OPENAI_API_KEY_SECRET`` or ``NOTIFY_SECRET_ARN`` of another account than the tenant
    role's or another Region than Lambda's ``AWS_REGION``.

    The template grants KMS on ``arn:...:kms:<Region>:<account>:key/*`` and the customer
    key only through this Region's services (``TenantKeys``, ``UseCustomerKey``): a key of
    another account passes ``KmsKeyArn``'s pattern, and KMS denies every call. A secret of
    another account could be read only under a key of that account, which no role here may
    use; one of another Region is not found by this Region's endpoint. A key id or an alias
    name is of this account and Region by definition; without a tenant role (the local
    runner, the sweep) the account is not known and only the Region is compared.
    """
    role = _ROLE_ARN.match(settings.tenant_role_arn or "")
    account = role["account"] if role else None
    region = env.get("AWS_REGION")
    named = {
        "CONTENT_KMS_KEY_ID": settings.content_kms_key_id,
        **{f"TENANT_KMS_KEY_IDS[{t!r}]": k for t, k in settings.tenant_kms_key_ids.items()},
        "OPENAI_API_KEY_SECRET": settings.openai_api_key_secret,
        "NOTIFY_SECRET_ARN": env.get("NOTIFY_SECRET_ARN"),
    }
    for name, value in named.items():
        arn = _SCOPED_ARN.match(value or "")
        if arn is None:
            continue
        wrong = []
        if account and arn["account"] != account:
            wrong.append(f"account {arn['account']}, not this stack's {account}")
        if region and arn["region"] != region:
            wrong.append(f"Region {arn['region']}, not this stack's {region}")
        if wrong:
            raise ForeignResource(
                f"{name} names a resource of {' and '.join(wrong)}: {value}. The functions "
                "may use only keys and secrets of their own account and Region "
                "(docs/DEPLOY.md, Parameters of this account)"
            )


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


def _names(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of names (blanks dropped; unset: none)."""
    return tuple(part.strip() for part in env.get(name, "").split(",") if part.strip())


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be true or false, got {env[name]!r}")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if raw not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def _share(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be over 0 and at most 1, got {value}")
    return value


def _tenant_map(raw: str, name: str, valid: Callable[[object], bool], what: str) -> dict[str, Any]:
    """The JSON object ``raw`` of tenant -> value (empty: none), every value ``valid``."""
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and valid(v) for k, v in parsed.items()
    ):
        raise ValueError(f"{name} must be a JSON object of tenant -> {what}")
    return parsed


def _tenant_ints(raw: str, name: str) -> dict[str, int]:
    return _tenant_map(raw, name, lambda v: type(v) is int and v >= 0, "integer >= 0")


def _tenant_strings(raw: str, name: str) -> dict[str, str]:
    return _tenant_map(raw, name, lambda v: isinstance(v, str) and bool(v), "non-empty string")


def _patterns(raw: str, name: str) -> dict[str, str]:
    """The JSON object ``raw`` of name -> regular expression (empty: none), each compiled."""
    if not raw.strip():
        return {}
    try:
        patterns = json.loads(raw)
    except ValueError:
        patterns = None
    if not isinstance(patterns, dict) or not all(
        isinstance(v, str) and v for v in patterns.values()
    ):
        raise ValueError(f"{name} must be a JSON object of name -> regular expression")
    for key, pattern in patterns.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{name}: {key!r} is not a regular expression: {exc}") from None
    return patterns


@dataclass(frozen=True)
class ModelSpec:
    """What the deployment knows of one model: its window, answer reserve and prices."""

    context_window: int
    answer_reserve: int
    #: US dollars per million tokens.
    input_price_per_mtok: float = 0.0
    output_price_per_mtok: float = 0.0
    #: Per million input tokens read from the provider's prompt cache; ``None``: the
    #: input price.
    cached_input_price_per_mtok: float | None = None
    #: Per million input tokens written to the prompt cache; ``None``: the input price.
    cache_write_input_price_per_mtok: float | None = None

    def cost(self, usage: Usage) -> float:
        """Estimated cost in US dollars of one call's usage: cached and cache-written input
        tokens at their own rates, the rest of the input at the input price."""
        cached = usage.cached_input_tokens
        written = usage.cache_write_input_tokens
        plain = max(usage.input_tokens - cached - written, 0)
        cached_rate = self.cached_input_price_per_mtok
        write_rate = self.cache_write_input_price_per_mtok
        return (
            plain * self.input_price_per_mtok
            + cached * (self.input_price_per_mtok if cached_rate is None else cached_rate)
            + written * (self.input_price_per_mtok if write_rate is None else write_rate)
            + usage.output_tokens * self.output_price_per_mtok
        ) / 1_000_000


#: Models the deployment knows without configuration. The demo model's window is
#: small on purpose, so compaction is easy to see locally.
BUILTIN_MODELS = {"demo-1": ModelSpec(context_window=8192, answer_reserve=1024)}
#: A model nobody described: a window every current chat model has, and a reserve
#: for a long answer.
DEFAULT_MODEL = ModelSpec(context_window=32768, answer_reserve=4096)


def _models(raw: str) -> dict[str, ModelSpec]:
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            raise TypeError("not an object")
        models = {}
        for name, spec in parsed.items():
            model = ModelSpec(**spec)
            if not (0 <= model.answer_reserve < model.context_window):
                raise ValueError(f"{name}: answer_reserve must be >= 0 and < context_window")
            models[str(name)] = model
    except (ValueError, TypeError) as exc:
        raise ValueError(
            'MODELS must be a JSON object of model -> {"context_window", "answer_reserve", '
            f'"input_price_per_mtok", "output_price_per_mtok", "cached_input_price_per_mtok", '
            f'"cache_write_input_price_per_mtok"}}: {exc}'
        ) from None
    return models


@dataclass(frozen=True)
class Settings:
    """Everything a handler needs to know about its deployment."""

    table_name: str = "turnledger"
    bucket_name: str = "turnledger-artifacts"
    ttl_seconds: int = 7 * 24 * 3600
    tenant_ttl_seconds: dict[str, int] = field(default_factory=dict)
    offload_threshold_bytes: int = 64 * 1024
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    #: The most events an import through the API may hold: its commits (99 events each)
    #: must end well inside the API's 29 seconds (see docs/API.md, Export and import).
    import_max_events: int = 5000
    #: An export larger than this once JSON-escaped in Lambda's response is written to the
    #: bucket and answered with a presigned link (where the blob store can make one).
    export_inline_max_bytes: int = DEFAULT_MAX_INPUT_BYTES
    export_url_ttl_seconds: int = 300
    context_max_events: int = 400
    context_max_chars: int = 400_000
    tenant_claim: str = "tenant_id"
    #: The claim that must hold :attr:`approver_scope` (one of its space-, comma- or
    #: bracket-separated values) for the approvals routes; an empty scope requires nothing.
    approver_claim: str = "scope"
    approver_scope: str = "turnledger/approve"
    #: Four-eyes for every tool: the approver must differ from the turn's actor.
    approval_four_eyes: bool = False
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
    # --- content encryption (store/keyring.py, issue 24) ---
    #: The table of wrapped content keys (``None``: content is stored in clear, as before).
    keys_table_name: str | None = None
    #: The KMS key that wraps tenant keys (id, ARN or alias); needed with ``keys_table_name``.
    content_kms_key_id: str | None = None
    #: Tenants that name their own customer-managed KMS key (tenant -> key id or ARN).
    tenant_kms_key_ids: dict[str, str] = field(default_factory=dict)
    kms_endpoint: str | None = None
    #: How long an execution environment reuses an unwrapped data key: after an erasure,
    #: another environment that held the key may open a restored copy for at most this long.
    key_cache_seconds: int = 300
    # --- the working context -------------------------------------------------------------
    #: ``None``: the model's window less its answer reserve.
    context_max_tokens: int | None = None
    models: dict[str, ModelSpec] = field(default_factory=dict)
    #: Models a turn may name besides ``model`` and ``models``' (``"*"``: any at all).
    allowed_models: tuple[str, ...] = ()
    conversation_token_budget: int = 0
    turn_token_budget: int = 0
    tenant_conversation_token_budget: dict[str, int] = field(default_factory=dict)
    tenant_turn_token_budget: dict[str, int] = field(default_factory=dict)
    summarizer_provider: str | None = None
    summarizer_model: str | None = None
    #: ``SUMMARY_MUST_KEEP``: name -> regular expression of the values a summary must keep
    #: (each match in the summarized range, or the previous summary, must be in the new one).
    summary_must_keep: dict[str, str] = field(default_factory=dict)
    redaction_file: str | None = None
    redaction_parameter: str | None = None
    # --- the data policy (context/policy.py) ---
    data_policy_file: str | None = None
    data_policy_parameter: str | None = None
    #: The value ``approver_claim`` must hold to set a tenant's own data policy (empty:
    #: tenants have none, and turns never read one).
    data_policy_admin_scope: str = ""

    # --- providers: stored state, Bedrock, the stateful demo model ---------------------------
    #: Other providers a turn may name (``"provider"``); ``provider`` is always allowed.
    providers: tuple[str, ...] = ()
    openai_responses_store: bool = True
    provider_state_retention_seconds: int = 30 * 24 * 3600
    bedrock_region: str | None = None
    bedrock_endpoint: str | None = None
    bedrock_max_tokens: int = 0
    bedrock_json_mode: str = "tool"
    demo_state_dir: str | None = None

    # Local storage (``turnledger local --data-dir``); Lambda keeps the defaults.
    #: ``dynamodb`` (table and bucket) or ``sqlite`` (a database file and objects in ``data_dir``).
    store: str = "dynamodb"
    data_dir: str | None = None
    #: The file of the SQLite store's master key
    #: (``None``: :func:`turnledger.store.local_folder.local_master_key_file`).
    master_key_file: str | None = None
    # --- tenant isolation (store/tenancy.py) ---
    #: Role assumed per tenant, with the tenant's session policy and tag, for every
    #: table and bucket access of that tenant's requests (``None``: the process's own
    #: credentials, as the local runner and tests use).
    tenant_role_arn: str | None = None
    # --- long and streamed turns (turn/drafts.py, turn/longturns.py) ---
    #: The demo models wait this long before each streamed word (a slow model).
    demo_token_delay_ms: int = 0
    #: A draft chunk is stored at most this often, or once this many characters wait.
    draft_flush_ms: int = 250
    draft_flush_chars: int = 400
    #: Synchronous turns run through their draft, so any client follows them while they
    #: run (``GET .../turns/{n}``); off: they write none (finished turns still read back).
    sync_turn_drafts: bool = True
    #: ... begun only once the turn has run this long: a quicker one writes no draft
    #: (``0``: begun as the turn starts).
    sync_draft_after_ms: int = 1000
    #: The function that runs ``Prefer: respond-async`` turns (invoked asynchronously).
    turn_worker_function: str | None = None
    #: Another Lambda endpoint to start it at (the local runner's own Invoke API).
    turn_worker_endpoint: str | None = None
    # --- long-term memory per user (store/memories.py, context/memory.py) ---
    #: Turns recall the user's records and write back what the user said about themselves.
    memory_enabled: bool = False
    #: Records one user may keep; write-back drops the least recently updated beyond it.
    memory_max_records: int = 200
    #: The share of the context budget the recalled records may take.
    memory_context_share: float = 0.1
    #: A caller holding this value in ``approver_claim`` may name the memory's user
    #: (``X-Memory-User``); empty: nobody may, the user is always the caller's ``sub``.
    memory_user_scope: str = ""
    #: ``openai`` or ``bedrock``: rank records by embeddings (``None``: keywords, recency).
    memory_embeddings: str | None = None
    memory_embedding_model: str | None = None

    @property
    def models_allowed(self) -> frozenset[str] | None:
        """The models a turn may name (``None``: any): ``ALLOWED_MODELS``, the default
        model and the models ``MODELS`` describes."""
        if "*" in self.allowed_models:
            return None
        return frozenset({*self.allowed_models, self.model, *self.models})

    @property
    def allowed_providers(self) -> tuple[str, ...]:
        """The providers a turn may name: the default one first."""
        return (self.provider, *(p for p in self.providers if p != self.provider))

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ValueError(f"STORE must be one of {', '.join(STORES)}, got {self.store!r}")
        if self.store == "sqlite" and not self.data_dir:
            raise ValueError("STORE=sqlite needs DATA_DIR, the folder to keep conversations in")
        if self.keys_table_name and not self.content_kms_key_id:
            raise ValueError("KEYS_TABLE_NAME needs CONTENT_KMS_KEY_ID, the key that wraps keys")

    def ttl_for(self, tenant: str) -> int:
        """The idle TTL of ``tenant``'s conversations (``0``: never expire)."""
        return self.tenant_ttl_seconds.get(tenant, self.ttl_seconds)

    def model_spec(self, model: str) -> ModelSpec:
        """What is known of ``model``: configured, built in, or the default."""
        return self.models.get(model) or BUILTIN_MODELS.get(model) or DEFAULT_MODEL

    def context_budget(self, model: str) -> int:
        """Tokens the context sent to ``model`` may hold: the configured budget, capped
        by the model's window less its answer reserve."""
        spec = self.model_spec(model)
        room = spec.context_window - spec.answer_reserve
        return min(self.context_max_tokens, room) if self.context_max_tokens else room

    def conversation_budget_for(self, tenant: str) -> int:
        """Tokens ``tenant``'s conversations may use in all (``0``: unlimited)."""
        return self.tenant_conversation_token_budget.get(tenant, self.conversation_token_budget)

    def turn_budget_for(self, tenant: str) -> int:
        """Tokens one turn of ``tenant`` may use (``0``: unlimited)."""
        return self.tenant_turn_token_budget.get(tenant, self.turn_token_budget)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``).

        Raises:
            ForeignResource: a KMS key or secret of another account or Region (a
                ``ValueError``).
            ValueError: a variable is set to something unusable.
        """
        env = os.environ if env is None else env

        def opt(name: str) -> str | None:
            return env.get(name) or None

        settings = cls(
            table_name=env.get("TABLE_NAME", cls.table_name),
            bucket_name=env.get("BUCKET_NAME", cls.bucket_name),
            ttl_seconds=_int(env, "TTL_SECONDS", cls.ttl_seconds),
            tenant_ttl_seconds=_tenant_ints(
                env.get("TENANT_TTL_SECONDS", ""), "TENANT_TTL_SECONDS"
            ),
            offload_threshold_bytes=_int(
                env, "OFFLOAD_THRESHOLD_BYTES", cls.offload_threshold_bytes
            ),
            max_input_bytes=_int(env, "MAX_INPUT_BYTES", cls.max_input_bytes),
            import_max_events=_int(env, "IMPORT_MAX_EVENTS", cls.import_max_events),
            export_inline_max_bytes=_int(
                env, "EXPORT_INLINE_MAX_BYTES", cls.export_inline_max_bytes
            ),
            export_url_ttl_seconds=_int(env, "EXPORT_URL_TTL_SECONDS", cls.export_url_ttl_seconds),
            context_max_events=_int(env, "CONTEXT_MAX_EVENTS", cls.context_max_events),
            context_max_chars=_int(env, "CONTEXT_MAX_CHARS", cls.context_max_chars),
            tenant_claim=env.get("TENANT_CLAIM", cls.tenant_claim),
            approver_claim=env.get("APPROVER_CLAIM") or cls.approver_claim,
            approver_scope=env.get("APPROVER_SCOPE", cls.approver_scope).strip(),
            approval_four_eyes=_bool(env, "APPROVAL_FOUR_EYES", cls.approval_four_eyes),
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
            keys_table_name=opt("KEYS_TABLE_NAME"),
            content_kms_key_id=opt("CONTENT_KMS_KEY_ID"),
            tenant_kms_key_ids=_tenant_strings(
                env.get("TENANT_KMS_KEY_IDS", ""), "TENANT_KMS_KEY_IDS"
            ),
            kms_endpoint=opt("KMS_ENDPOINT"),
            key_cache_seconds=_int(env, "KEY_CACHE_SECONDS", cls.key_cache_seconds),
            context_max_tokens=_int(env, "CONTEXT_MAX_TOKENS", 0) or None,
            models=_models(env.get("MODELS", "")),
            conversation_token_budget=_int(env, "CONVERSATION_TOKEN_BUDGET", 0),
            turn_token_budget=_int(env, "TURN_TOKEN_BUDGET", 0),
            tenant_conversation_token_budget=_tenant_ints(
                env.get("TENANT_CONVERSATION_TOKEN_BUDGET", ""), "TENANT_CONVERSATION_TOKEN_BUDGET"
            ),
            tenant_turn_token_budget=_tenant_ints(
                env.get("TENANT_TURN_TOKEN_BUDGET", ""), "TENANT_TURN_TOKEN_BUDGET"
            ),
            summarizer_provider=opt("SUMMARIZER_PROVIDER"),
            summarizer_model=opt("SUMMARIZER_MODEL"),
            summary_must_keep=_patterns(env.get("SUMMARY_MUST_KEEP", ""), "SUMMARY_MUST_KEEP"),
            redaction_file=opt("REDACTION_FILE"),
            redaction_parameter=opt("REDACTION_PARAMETER"),
            data_policy_file=opt("DATA_POLICY_FILE"),
            data_policy_parameter=opt("DATA_POLICY_PARAMETER"),
            data_policy_admin_scope=env.get(
                "DATA_POLICY_ADMIN_SCOPE", cls.data_policy_admin_scope
            ).strip(),
            # --- providers: stored state, Bedrock, the stateful demo model ---
            providers=_names(env, "PROVIDERS"),
            allowed_models=_names(env, "ALLOWED_MODELS"),
            openai_responses_store=_bool(env, "OPENAI_RESPONSES_STORE", cls.openai_responses_store),
            provider_state_retention_seconds=_int(
                env, "PROVIDER_STATE_RETENTION_SECONDS", cls.provider_state_retention_seconds
            ),
            bedrock_region=opt("BEDROCK_REGION"),
            bedrock_endpoint=opt("BEDROCK_ENDPOINT"),
            bedrock_max_tokens=_int(env, "BEDROCK_MAX_TOKENS", cls.bedrock_max_tokens),
            bedrock_json_mode=_choice(
                env, "BEDROCK_JSON_MODE", ("tool", "native"), cls.bedrock_json_mode
            ),
            demo_state_dir=opt("DEMO_STATE_DIR"),
            store=env.get("STORE") or cls.store,
            data_dir=opt("DATA_DIR"),
            master_key_file=opt("MASTER_KEY_FILE"),
            tenant_role_arn=opt("TENANT_ROLE_ARN"),
            demo_token_delay_ms=_int(env, "DEMO_TOKEN_DELAY_MS", cls.demo_token_delay_ms),
            draft_flush_ms=_int(env, "DRAFT_FLUSH_MS", cls.draft_flush_ms),
            draft_flush_chars=_int(env, "DRAFT_FLUSH_CHARS", cls.draft_flush_chars),
            sync_turn_drafts=_bool(env, "SYNC_TURN_DRAFTS", cls.sync_turn_drafts),
            sync_draft_after_ms=_int(env, "SYNC_DRAFT_AFTER_MS", cls.sync_draft_after_ms),
            turn_worker_function=opt("TURN_WORKER_FUNCTION"),
            turn_worker_endpoint=opt("TURN_WORKER_ENDPOINT"),
            memory_enabled=_bool(env, "MEMORY_ENABLED", cls.memory_enabled),
            memory_max_records=_int(env, "MEMORY_MAX_RECORDS", cls.memory_max_records),
            memory_context_share=_share(env, "MEMORY_CONTEXT_SHARE", cls.memory_context_share),
            memory_user_scope=env.get("MEMORY_USER_SCOPE", "").strip(),
            memory_embeddings=_choice(env, "MEMORY_EMBEDDINGS", ("openai", "bedrock"), "") or None,
            memory_embedding_model=opt("MEMORY_EMBEDDING_MODEL"),
        )
        _refuse_foreign_resources(settings, env)
        return settings
