"""The composition root: every dependency of the handlers, built once per process from
the settings.

:class:`Runtime` wires the store, providers, tools, redaction and notifications into
the service (:class:`~turnledger.turn.pipeline.Conversations`, one per tenant when
``TENANT_ROLE_ARN`` scopes credentials), and builds the sweeper and the export/import
service on demand. The handlers call :func:`get_runtime`; tests and the local runner may
install their own with :func:`set_runtime` (an injected clock, a fake provider...).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from .context.redaction import Redactor, load_redactor
from .core.config import Settings
from .ops.notifications import environment, publisher_from_env
from .providers.embeddings import build_embedder
from .providers.factory import PROVIDERS, api_key_source, build_provider
from .store.base import ConversationStore
from .store.blobs import S3BlobStore
from .store.dynamodb import DynamoDBConversationStore
from .store.tenancy import TenantAccess, TenantCredentials
from .tools.executors import ToolRunner, tool_http_client
from .tools.registry import ToolRegistry
from .turn.pipeline import Conversations
from .turn.session import Clock, utc_now

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_s3 import S3Client

    from .ops.sweep import RemainingTime, Sweeper
    from .ops.transfer import Transfer

#: Bounded, fast-failing AWS calls: a handler should answer, not hang. Not for invoking
#: ``lambda`` tools: their client never retries (see ``tools.executors.invoke_config``).
_AWS_CONFIG = Config(
    connect_timeout=3, read_timeout=10, retries={"max_attempts": 3, "mode": "standard"}
)


@dataclass
class TenantScope:
    """What one tenant's requests use, on that tenant's credentials (see :mod:`.store.tenancy`)."""

    dynamodb: DynamoDBClient
    store: ConversationStore
    conversations: Conversations


@dataclass
class Runtime:
    """The service and what it was built from."""

    settings: Settings
    #: The service on the process's credentials: sweep, erasure, and every request when
    #: no tenant role is configured. Tenants' requests use :meth:`conversations_for`.
    conversations: Conversations
    store: ConversationStore
    #: The DynamoDB client the store was built on (with ``STORE=dynamodb``).
    dynamodb: DynamoDBClient
    #: Per-tenant credentials and clients (``None``: no ``TENANT_ROLE_ARN``).
    tenants: TenantAccess[TenantScope] | None = None

    def conversations_for(self, tenant: str) -> Conversations:
        """The service for one request of ``tenant``: its store reaches only that tenant."""
        return (
            self.conversations
            if self.tenants is None
            else self.tenants.for_tenant(tenant).conversations
        )

    def dynamodb_for(self, tenant: str) -> DynamoDBClient:
        """The DynamoDB client of ``tenant``'s requests (its own partitions)."""
        return self.dynamodb if self.tenants is None else self.tenants.for_tenant(tenant).dynamodb

    def sweeper(self, context: RemainingTime | None) -> Sweeper:
        """The sweep, reclaim and tenant erasure over the process's store, within
        ``context``'s time (``None``: no limit)."""
        # Imported here: the API's cold start loads the sweep only for an erasure.
        from .ops.sweep import Deadline, Sweeper

        return Sweeper(
            self.store,
            clock=self.conversations.clock,
            deadline=Deadline.of(context),
            forget=self.conversations.forget_provider_state,
            expire_waits=self.conversations.expire_waits,
        )

    def transfer_for(self, tenant: str) -> Transfer:
        """Export and import for one request of ``tenant`` (its store, its TTL)."""
        # Imported here, as the sweep: only the export and import routes need it.
        from .ops.transfer import Transfer

        service = self.conversations_for(tenant)
        return Transfer(
            store=service.store,
            clock=service.clock,
            ttl_for=self.settings.ttl_for,
            max_bytes=self.settings.max_input_bytes,
            max_events=self.settings.import_max_events,
            export_inline_max_bytes=self.settings.export_inline_max_bytes,
            export_url_ttl_seconds=self.settings.export_url_ttl_seconds,
        )

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock = utc_now) -> Runtime:
        """Build clients, store, provider, tools and the service for ``settings``."""
        session = boto3.session.Session()
        dynamodb: DynamoDBClient = session.client(
            "dynamodb", endpoint_url=settings.dynamodb_endpoint, config=_AWS_CONFIG
        )
        store = _build_store(settings, session, dynamodb)
        http = tool_http_client(settings.tool_timeout_seconds)

        def lambda_client(config: Config) -> LambdaClient:
            return session.client("lambda", config=config)

        redactor: Redactor | Callable[[], Redactor | None] | None = None
        if settings.redaction_file:
            redactor = load_redactor(settings)  # a bad rule set fails here, loudly
        elif settings.redaction_parameter:
            redactor = partial(load_redactor, settings)  # Powertools caches the parameter
        unknown = [name for name in settings.allowed_providers if name not in PROVIDERS]
        if unknown:
            # Fail at start, like an unknown PROVIDER, not on the first turn that names one.
            raise ValueError(
                f"PROVIDERS names unknown providers {unknown}; valid: {', '.join(PROVIDERS)}"
            )
        provider = build_provider(settings)
        runner = ToolRunner(http, lambda_client, timeout_seconds=settings.tool_timeout_seconds)

        # Webhook URLs from the registry, read once per process (on the first notification).
        registry = cache(partial(ToolRegistry.from_settings, settings))
        publisher = publisher_from_env(
            environment(),
            session=session,
            post=http.post,
            webhook_of=lambda tool: registry().get(tool).notify,
        )

        # Memory's embedder, built on the first turn that ranks records (if configured).
        embedder = cache(partial(build_embedder, settings, api_key_source(settings)))

        def service(store: ConversationStore) -> Conversations:
            # One service per store: the process's, and one per tenant on its own
            # credentials; all share the provider, the tool runner and the settings.
            conversations = Conversations(
                store=store,
                provider=provider,
                # Other providers a turn may name, built on first use.
                providers=partial(build_provider, settings),
                redactor=redactor,
                settings=settings,
                tools=lambda: ToolRegistry.from_settings(settings),
                runner=runner,
                clock=clock,
                embedder=embedder,
            )
            conversations.on_commit = publisher.on_commit if publisher else None
            return conversations

        conversations = service(store)
        runtime = cls(
            settings=settings, conversations=conversations, store=store, dynamodb=dynamodb
        )
        if settings.tenant_role_arn and settings.store == "dynamodb":
            runtime.tenants = TenantAccess(
                session.client("sts", config=_AWS_CONFIG),
                settings.tenant_role_arn,
                bucket=settings.bucket_name,
                build=partial(_tenant_scope, settings, service),
            )
        return runtime


def _tenant_scope(
    settings: Settings,
    service: Callable[[ConversationStore], Conversations],
    tenant: str,
    credentials: TenantCredentials,
) -> TenantScope:
    """Clients, store and service of ``tenant``, on its own credentials."""
    session = credentials.session()
    dynamodb: DynamoDBClient = session.client(
        "dynamodb", endpoint_url=settings.dynamodb_endpoint, config=_AWS_CONFIG
    )
    store = _build_store(settings, session, dynamodb)
    return TenantScope(dynamodb=dynamodb, store=store, conversations=service(store))


def store_from_settings(settings: Settings) -> ConversationStore:
    """The conversation store alone, for the command line's export and import.

    With ``STORE=sqlite`` it builds no AWS client, so it needs no AWS configuration.

    Raises:
        botocore.exceptions.BotoCoreError: DynamoDB's client cannot be built (no region).
    """
    if settings.store == "sqlite":
        return _sqlite_store(settings)
    session = boto3.session.Session()
    dynamodb: DynamoDBClient = session.client(
        "dynamodb", endpoint_url=settings.dynamodb_endpoint, config=_AWS_CONFIG
    )
    return _build_store(settings, session, dynamodb)


def _sqlite_store(settings: Settings) -> ConversationStore:
    # Imported here: Lambda never runs it, and its cold start should not pay for it.
    from .store.sqlite import SQLiteConversationStore

    assert settings.data_dir is not None  # Settings refuses sqlite without a folder
    return SQLiteConversationStore.in_folder(
        settings.data_dir, offload_threshold=settings.offload_threshold_bytes
    )


def _build_store(
    settings: Settings, session: boto3.session.Session, dynamodb: DynamoDBClient
) -> ConversationStore:
    """The conversation store ``settings.store`` names: DynamoDB and S3, or SQLite and files."""
    if settings.store == "sqlite":
        return _sqlite_store(settings)
    s3: S3Client = session.client("s3", endpoint_url=settings.s3_endpoint, config=_AWS_CONFIG)
    return DynamoDBConversationStore(
        dynamodb,
        settings.table_name,
        S3BlobStore(s3, settings.bucket_name),
        offload_threshold=settings.offload_threshold_bytes,
    )


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    """The process's runtime, built from the environment on first use."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime.from_settings(Settings.from_env())
        return _runtime


def set_runtime(runtime: Runtime | None) -> None:
    """Install ``runtime`` (``None``: rebuild from the environment on next use)."""
    global _runtime
    with _lock:
        _runtime = runtime
