"""The composition root: every dependency of the handlers, built once per process from
the settings.

:class:`Runtime` wires the store, providers, tools, redaction and notifications into
the service (:class:`~turnledger.turn.pipeline.Conversations`, one per tenant when
``TENANT_ROLE_ARN`` scopes credentials), and builds the sweeper and the export/import
service on demand. Reads and clears go through :meth:`Runtime.reads_for`
(:class:`~turnledger.turn.reads.Reads`), which needs no provider, tool or turn pipeline.
The handlers call :func:`get_runtime`; tests and the local runner may install their own
with :func:`set_runtime` (an injected clock, a fake provider...).

:func:`prepare` builds it during Lambda's init phase (the handler modules in
``functions/`` call it at import), so a first request costs about what a warm one
does (the read and clear functions leave the whole service to its first use: none of
their requests but two rare ones needs it), and registers the SnapStart runtime hooks
(:func:`before_snapshot`, :func:`after_restore`) that keep a restored snapshot from
reusing what init made.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property, partial
from typing import TYPE_CHECKING, Any

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.config import Config

from .core import instrumentation
from .core.aws import AwsSession
from .core.config import ForeignResource, Settings
from .core.models import ConversationKey
from .core.observability import logger, tracer
from .store.base import ConversationStore
from .store.blobs import S3BlobStore
from .store.dynamodb import DynamoDBConversationStore
from .store.keyring import DynamoDBKeyItems, Keyring, KmsMasterKey
from .store.local_folder import sqlite_store
from .store.tenancy import (
    SESSION_SECONDS,
    TENANT_TAG,
    TenantAccess,
    TenantCredentials,
    session_name,
    session_policy,
    tag_value,
)
from .turn import callbacks
from .turn.reads import Reads
from .turn.session import Clock, utc_now

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_kms import KMSClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_s3 import S3Client

    from .context.policy import DataPolicy
    from .context.redaction import Redactor
    from .ops.sweep import RemainingTime, Sweeper
    from .ops.transfer import Transfer
    from .turn.pipeline import Conversations

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
    #: The reads and the clear of the tenant's store.
    reads: Reads
    #: Builds the whole service over ``store`` (on the first request that needs it).
    build: Callable[[ConversationStore], Conversations]

    @cached_property
    def conversations(self) -> Conversations:
        """The whole service on the tenant's store, built on first use."""
        return self.build(self.store)


class Runtime:
    """The service and what it was built from.

    The whole service (:class:`~turnledger.turn.pipeline.Conversations`: providers, tools,
    the turn pipeline) is built on first use, or at init by :func:`prepare` where the
    function runs turns; :meth:`reads_for` answers reads and clears without it.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        conversations: Conversations | Callable[[], Conversations],
        store: ConversationStore,
        dynamodb: DynamoDBClient | None,
        clock: Clock | None = None,
        tenants: TenantAccess[TenantScope] | None = None,
        clients: list[Any] | None = None,
    ) -> None:
        self.settings = settings
        # The service on the process's credentials (:attr:`conversations`), or what builds it.
        self._conversations = conversations
        self.store = store
        #: The DynamoDB client the store was built on (``None`` with ``STORE=sqlite``).
        self.dynamodb = dynamodb
        if clock is None:
            clock = utc_now if callable(conversations) else conversations.clock
        #: The service's clock.
        self.clock: Clock = clock
        #: Per-tenant credentials and clients (``None``: no ``TENANT_ROLE_ARN``).
        self.tenants = tenants
        #: Every AWS client built so far for the process's own credentials (closed by
        #: :meth:`close`); one built on first use (S3's) joins it then.
        self.clients: list[Any] = [] if clients is None else clients
        self._service_lock = threading.Lock()
        #: Whether S3's client was built with the runtime (``from_settings(blobs=True)``).
        self.blobs_at_init = False
        #: The process's keyring (``None``: content stays clear), shared by every tenant.
        self.keyring: Keyring | None = None
        #: The reads and the clear on the process's store: the service itself once built
        #: with it, else reads that build it only to forget a provider's stored responses.
        self.reads = (
            conversations
            if isinstance(conversations, Reads)
            else Reads(store=store, settings=settings, clock=self.clock, forget=self._forget)
        )

    @property
    def conversations(self) -> Conversations:
        """The service on the process's credentials: sweep, erasure, and every request when
        no tenant role is configured (tenants' requests use :meth:`conversations_for`);
        built on first use."""
        with self._service_lock:
            if callable(self._conversations):
                self._conversations = self._conversations()
            return self._conversations

    @property
    def service_built(self) -> bool:
        """Whether the process's service (:attr:`conversations`) is built yet."""
        return not callable(self._conversations)

    def _forget(self, responses: list[tuple[str, str]]) -> int:
        # A clear that must delete a provider's stored responses builds the service then.
        return self.conversations.forget_provider_state(responses)

    def close(self) -> None:
        """Close the process's AWS clients' connection pools (they reconnect when used)."""
        for client in self.clients:
            client.close()

    def reads_for(self, tenant: str) -> Reads:
        """The reads and the clear for one request of ``tenant``: its store reaches only that
        tenant; no provider, tool or turn pipeline is loaded for them."""
        return self.reads if self.tenants is None else self.tenants.for_tenant(tenant).reads

    def data_policy(self, tenant: str) -> DataPolicy | None:
        """The data policy ``tenant``'s conversations are held to (``None``: none); the
        service is built only where a policy may be configured."""
        s = self.settings
        if s.data_policy_file or s.data_policy_parameter or s.data_policy_admin_scope:
            return self.conversations_for(tenant).data_policy(tenant)
        return None

    def conversations_for(self, tenant: str) -> Conversations:
        """The service for one request of ``tenant``: its store reaches only that tenant."""
        return (
            self.conversations
            if self.tenants is None
            else self.tenants.for_tenant(tenant).conversations
        )

    def dynamodb_for(self, tenant: str) -> DynamoDBClient | None:
        """The DynamoDB client of ``tenant``'s requests (its own partitions; ``None`` with
        ``STORE=sqlite``)."""
        return self.dynamodb if self.tenants is None else self.tenants.for_tenant(tenant).dynamodb

    def sweeper(self, context: RemainingTime | None) -> Sweeper:
        """The sweep, reclaim and tenant erasure over the process's store, within
        ``context``'s time (``None``: no limit); the whole service is built by the first
        provider response to delete or wait to expire (a tenant erasure seldom has one)."""
        # Imported here: the API's cold start loads the sweep only for an erasure.
        from .ops.sweep import Deadline, Sweeper

        def forget(responses: list[tuple[str, str]]) -> int:
            # Nothing to delete at a provider: the service (providers, tools) stays unbuilt.
            return self._forget(responses) if responses else 0

        def expire_waits(key: ConversationKey) -> list[str]:
            return self.conversations.expire_waits(key)

        return Sweeper(
            self.store,
            clock=self.clock,
            deadline=Deadline.of(context),
            forget=forget,
            expire_waits=expire_waits,
            policy_of=self.data_policy,
        )

    def transfer_for(self, tenant: str) -> Transfer:
        """Export and import for one request of ``tenant`` (its store, its TTL)."""
        # Imported here, as the sweep: only the export and import routes need it.
        from .ops.transfer import Transfer

        service = self.reads_for(tenant)
        return Transfer(
            store=service.store,
            clock=service.clock,
            ttl_for=self.settings.ttl_for,
            max_bytes=self.settings.max_input_bytes,
            max_events=self.settings.import_max_events,
            export_inline_max_bytes=self.settings.export_inline_max_bytes,
            export_url_ttl_seconds=self.settings.export_url_ttl_seconds,
        )

    def prime(self) -> None:
        """Make the first call of each AWS call a request starts with, without the network:
        a ``GetItem`` on the process's DynamoDB client, with sealed content the KMS
        ``Decrypt`` that opens a tenant's key and, with a tenant role, the ``AssumeRole`` of
        a tenant's first request, each answered in-process.

        A client's first call of an operation builds its models, resolves its endpoint
        and its credentials and signs; done here, during init, a request's first call
        costs what a later one does (a tenant's own clients, built on its first request,
        still make their own first call then).
        """
        if self.dynamodb is None:
            return
        with _answered_in_process(self.dynamodb, b"{}"):
            self.dynamodb.get_item(
                TableName=self.settings.table_name,
                Key={"pk": {"S": _PRIMING}, "sk": {"S": _PRIMING}},
                ConsistentRead=True,
            )
        master = self.keyring.master if self.keyring is not None else None
        if isinstance(master, KmsMasterKey):
            with _answered_in_process(master.client, _DECRYPTED):
                master.client.decrypt(
                    CiphertextBlob=_PRIMING.encode(),
                    KeyId=master.default_key_id,
                    EncryptionContext={"turnledger:tenant": _PRIMING},
                )
        if self.tenants is not None:
            with _answered_in_process(self.tenants.sts, _ASSUMED_ROLE):
                self.tenants.sts.assume_role(
                    RoleArn=self.tenants.role_arn,
                    RoleSessionName=session_name(_PRIMING),
                    DurationSeconds=SESSION_SECONDS,
                    Policy=session_policy(_PRIMING, bucket=self.settings.bucket_name),
                    Tags=[{"Key": TENANT_TAG, "Value": tag_value(_PRIMING)}],
                )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        clock: Clock = utc_now,
        service: bool = True,
        blobs: bool = False,
    ) -> Runtime:
        """Build clients, store, provider, tools and the service for ``settings``.

        Args:
            service: build the whole service now (its provider, tools and the turn pipeline,
                with their setting errors raised here); ``False`` leaves it to its first use,
                for a function that only reads or clears (:meth:`reads_for`).
            blobs: build S3's client now (its service model then parsed for the tenants'
                S3 clients too), for a function whose every request reads or lists blobs;
                ``False`` leaves it to the first blob.
        """
        session = AwsSession()
        clients: list[Any] = []
        dynamodb: DynamoDBClient | None = None
        keyring: Keyring | None = None
        if settings.store == "dynamodb":
            # Not with the SQLite store: a client needs a region, and a data folder
            # (``turnledger replay --data-dir``) needs no AWS configuration at all.
            dynamodb = session.client(
                "dynamodb", endpoint_url=settings.dynamodb_endpoint, config=_AWS_CONFIG
            )
            clients.append(dynamodb)
            keyring = _keyring(settings, session, dynamodb)
        if keyring is not None and isinstance(keyring.master, KmsMasterKey):
            clients.append(keyring.master.client)  # closed before a snapshot with the rest
        store = _build_store(settings, session, dynamodb, clients, keyring, blobs=blobs)
        build = partial(_service_builder, settings, session, clock)
        if service:
            made = build()
            conversations: Conversations | Callable[[], Conversations] = made(store)
            services: Callable[[ConversationStore], Conversations] = made
        else:
            once = cache(build)
            conversations = lambda: once()(store)  # noqa: E731  # built on first use
            services = lambda tenant_store: once()(tenant_store)  # noqa: E731
        runtime = cls(
            settings=settings,
            conversations=conversations,
            store=store,
            dynamodb=dynamodb,
            clock=clock,
        )
        if settings.tenant_role_arn and dynamodb is not None:
            sts = session.client("sts", config=_AWS_CONFIG)
            clients.append(sts)
            runtime.tenants = TenantAccess(
                sts,
                settings.tenant_role_arn,
                bucket=settings.bucket_name,
                build=partial(_tenant_scope, settings, session, clock, services, keyring, dynamodb),
            )
        runtime.clients = clients
        runtime.blobs_at_init = blobs
        runtime.keyring = keyring
        return runtime


def _service_builder(
    settings: Settings, session: AwsSession, clock: Clock
) -> Callable[[ConversationStore], Conversations]:
    """Build the provider, the tool runner, the redaction, the notifications and the
    embedder of ``settings``; returns what builds the service over a store with them.

    Imported here: the functions that only read or clear never load providers, tools or
    the turn pipeline (:meth:`Runtime.reads_for`).

    Raises:
        ValueError: ``PROVIDERS`` names an unknown provider; or as the provider, the
            redaction file and the notifications' settings raise.
    """
    from .context.policy import policy_source
    from .context.redaction import load_redactor
    from .ops.notifications import environment, publisher_from_env
    from .providers.embeddings import build_embedder
    from .providers.factory import PROVIDERS, api_key_source, build_provider
    from .tools.executors import ToolRunner, lazy_tool_http_client
    from .tools.mcp_link import McpLink
    from .tools.registry import ToolRegistry
    from .turn.pipeline import Conversations

    # Built on the first http tool call or webhook: most requests make neither.
    http = lazy_tool_http_client(settings.tool_timeout_seconds)

    def lambda_client(config: Config) -> LambdaClient:
        client: LambdaClient = session.client("lambda", config=config)
        return client

    redactor: Redactor | Callable[[], Redactor | None] | None = None
    if settings.redaction_file:
        redactor = load_redactor(settings)  # a bad rule set fails here, loudly
    elif settings.redaction_parameter:
        redactor = partial(load_redactor, settings)  # Powertools caches the parameter
    data_policy = policy_source(settings)  # a bad policy file fails here, loudly
    unknown = [name for name in settings.allowed_providers if name not in PROVIDERS]
    if unknown:
        # Fail at start, like an unknown PROVIDER, not on the first turn that names one.
        raise ValueError(
            f"PROVIDERS names unknown providers {unknown}; valid: {', '.join(PROVIDERS)}"
        )
    provider = build_provider(settings)
    # MCP servers' listings, kept across requests; the mcp package loads on first use.
    mcp = McpLink()
    runner = ToolRunner(http, lambda_client, timeout_seconds=settings.tool_timeout_seconds, mcp=mcp)

    # Webhook URLs from the registry, read once per process (on the first notification).
    registry = cache(partial(ToolRegistry.from_settings, settings, mcp=mcp))
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
            data_policy=data_policy,
            settings=settings,
            tools=lambda: ToolRegistry.from_settings(settings, mcp=mcp),
            runner=runner,
            clock=clock,
            embedder=embedder,
        )
        conversations.on_commit = publisher.on_commit if publisher else None
        return conversations

    return service


def _tenant_scope(
    settings: Settings,
    session: AwsSession,
    clock: Clock,
    service: Callable[[ConversationStore], Conversations],
    keyring: Keyring | None,
    process_dynamodb: DynamoDBClient,
    tenant: str,
    credentials: TenantCredentials,
) -> TenantScope:
    """Clients, store and service of ``tenant``, on its own credentials.

    Its clients come from the process's ``session`` (its models, parsed at init) with the
    tenant's credentials: a tenant's first request builds no session of its own. Its
    DynamoDB client sends over ``process_dynamodb``'s connection pool
    (:func:`_share_connections`).
    """
    signed: dict[str, Any] = {
        "config": _AWS_CONFIG,
        "aws_access_key_id": credentials.access_key_id,
        "aws_secret_access_key": credentials.secret_access_key,
        "aws_session_token": credentials.session_token,
    }
    dynamodb: DynamoDBClient = session.client(
        "dynamodb", endpoint_url=settings.dynamodb_endpoint, **signed
    )
    _share_connections(dynamodb, process_dynamodb)
    s3 = _on_first_use(partial(session.client, "s3", endpoint_url=settings.s3_endpoint, **signed))
    # The process's keyring: keys are read on the process's credentials, cached for all
    # tenants; the content they open is read only through the tenant's own.
    store = _dynamodb_store(settings, dynamodb, s3, keyring)

    def forget(responses: list[tuple[str, str]]) -> int:
        # A clear that must delete a provider's stored responses builds the tenant's service.
        return scope.conversations.forget_provider_state(responses)

    reads = Reads(store=store, settings=settings, clock=clock, forget=forget)
    scope = TenantScope(dynamodb=dynamodb, store=store, reads=reads, build=service)
    return scope


def _share_connections(client: Any, like: Any) -> None:
    """Send ``client``'s requests over ``like``'s connection pool (same endpoint, same
    configuration): a tenant's first request reuses a connection the process (or an
    earlier tenant) opened rather than opening its own, and :meth:`Runtime.close`
    closes them all.

    A connection carries no credentials: each request is signed by its own client
    (``client``'s credentials) before it is sent. botocore offers no public way to give
    a client a connection pool; its endpoint's ``http_session`` is where it keeps it.
    """
    if client.meta.endpoint_url != like.meta.endpoint_url:
        return
    client._endpoint.http_session = like._endpoint.http_session


def _on_first_use[T](build: Callable[[], T], built: list[Any] | None = None) -> Callable[[], T]:
    """What returns ``build()``'s client, built by its first call only (most requests read
    or write no blob: S3's client, whose model alone takes about 40 ms to load, is built
    by the first that does); the client joins ``built`` then, when given.

    Two threads' first calls build it once.
    """
    made: list[T] = []
    lock = threading.Lock()

    def client() -> T:
        with lock:
            if not made:
                made.append(build())
                if built is not None:
                    built.append(made[0])
            return made[0]

    return client


def store_from_settings(settings: Settings) -> ConversationStore:
    """The conversation store alone, for the command line's export and import.

    With ``STORE=sqlite`` it builds no AWS client, so it needs no AWS configuration.

    Raises:
        botocore.exceptions.BotoCoreError: DynamoDB's client cannot be built (no region).
    """
    if settings.store == "sqlite":
        return sqlite_store(settings)
    session = AwsSession()
    dynamodb: DynamoDBClient = session.client(
        "dynamodb", endpoint_url=settings.dynamodb_endpoint, config=_AWS_CONFIG
    )
    return _build_store(settings, session, dynamodb, None, _keyring(settings, session, dynamodb))


def _keyring(settings: Settings, session: AwsSession, dynamodb: DynamoDBClient) -> Keyring | None:
    """The keyring of a DynamoDB store: wrapped keys in ``keys_table_name``, tenant keys
    from KMS (``None``: no keys table configured, content stays clear). KMS's client is
    built here but called only when a tenant key is first needed in this environment."""
    if settings.store != "dynamodb" or not settings.keys_table_name:
        return None
    assert settings.content_kms_key_id is not None  # Settings refuses one without the other
    kms: KMSClient = session.client("kms", endpoint_url=settings.kms_endpoint, config=_AWS_CONFIG)
    master = KmsMasterKey(kms, settings.content_kms_key_id, settings.tenant_kms_key_ids)
    return Keyring(
        master,
        DynamoDBKeyItems(dynamodb, settings.keys_table_name),
        cache_seconds=settings.key_cache_seconds,
    )


def _build_store(
    settings: Settings,
    session: AwsSession,
    dynamodb: DynamoDBClient | None,
    clients: list[Any] | None = None,
    keyring: Keyring | None = None,
    *,
    blobs: bool = False,
) -> ConversationStore:
    """The conversation store ``settings.store`` names: DynamoDB and S3, or SQLite and files.

    S3's client is built on the store's first blob (here with ``blobs``) and then added to
    ``clients`` when given.
    """
    if settings.store == "sqlite":
        return sqlite_store(settings)
    assert dynamodb is not None  # built for every store but SQLite
    s3 = _on_first_use(
        partial(session.client, "s3", endpoint_url=settings.s3_endpoint, config=_AWS_CONFIG),
        clients,
    )
    if blobs:
        s3()
    return _dynamodb_store(settings, dynamodb, s3, keyring)


def _dynamodb_store(
    settings: Settings,
    dynamodb: DynamoDBClient,
    s3: Callable[[], S3Client],
    keyring: Keyring | None = None,
) -> DynamoDBConversationStore:
    return DynamoDBConversationStore(
        dynamodb,
        settings.table_name,
        S3BlobStore(s3, settings.bucket_name),
        offload_threshold=settings.offload_threshold_bytes,
        keyring=keyring,
    )


#: The key and the tenant of :meth:`Runtime.prime`'s calls (never sent).
_PRIMING = "turnledger-priming"
#: What :meth:`Runtime.prime`'s KMS ``Decrypt`` is answered (no key anyone uses).
_DECRYPTED = b'{"KeyId":"priming","Plaintext":"cHJpbWluZw=="}'
#: What :meth:`Runtime.prime`'s ``AssumeRole`` is answered: STS's answer, with no credentials
#: anyone could use.
_ASSUMED_ROLE = (
    b'<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult>'
    b"<Credentials><AccessKeyId>priming</AccessKeyId><SecretAccessKey>priming</SecretAccessKey>"
    b"<SessionToken>priming</SessionToken><Expiration>2000-01-01T00:00:00Z</Expiration>"
    b"</Credentials><AssumedRoleUser><Arn>arn:aws:sts::000000000000:assumed-role/priming</Arn>"
    b"<AssumedRoleId>priming</AssumedRoleId></AssumedRoleUser></AssumeRoleResult>"
    b"</AssumeRoleResponse>"
)


class _Body:
    """A response body botocore reads as it reads the network's."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


@contextmanager
def _answered_in_process(client: Any, body: bytes) -> Iterator[None]:
    """Within the block, ``client``'s calls send nothing: each is answered ``200`` with
    ``body``. (A ``before-send`` handler that returns a response replaces the request's
    sending, botocore's documented hook; everything before and after it runs as usual.)"""

    def answer(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, 200, HTTPHeaders(), _Body(body))

    client.meta.events.register_first("before-send", answer, unique_id=_PRIMING)
    try:
        yield
    finally:
        client.meta.events.unregister("before-send", unique_id=_PRIMING)


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    """The process's runtime, built from the environment on first use."""
    return _runtime_or_build(service=True)


def _runtime_or_build(*, service: bool, blobs: bool = False) -> Runtime:
    """The process's runtime; the first call builds it (the whole service too with
    ``service``, S3's client with ``blobs``, see :meth:`Runtime.from_settings`)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime.from_settings(Settings.from_env(), service=service, blobs=blobs)
        return _runtime


def set_runtime(runtime: Runtime | None) -> None:
    """Install ``runtime`` (``None``: rebuild from the environment on next use)."""
    global _runtime
    with _lock:
        _runtime = runtime


def prepare(*, service: bool = True, blobs: bool = False) -> Runtime | None:
    """Build, during Lambda's init phase, what every request needs: the runtime (settings,
    clients, store and, with ``service``, the provider, tools and the whole service; with
    ``blobs``, S3's client), its AWS clients' first calls made without the network
    (:meth:`Runtime.prime`), and the Tracer where tracing is on (``Tracing=Calls``); and
    register the SnapStart hooks. The handler modules in ``functions/`` call it at import;
    the functions that only read or clear pass ``service=False`` (their routes use
    :meth:`Runtime.reads_for`), the one whose every request lists blobs (clear)
    ``blobs=True``.

    Returns:
        The runtime, or ``None`` when the settings are invalid: the error is logged here
        and each request then meets it in :func:`get_runtime` and answers it as it should.

    Raises:
        ForeignResource: a KMS key or secret of another account or Region, which the
            function's role can never use: the init fails (under SnapStart, Lambda then
            refuses the version, and the deploy fails).
    """
    _register_snapshot_hooks()
    instrumentation.configure()
    try:
        built = _runtime_or_build(service=service, blobs=blobs)
    except ForeignResource:
        # A deployment mistake no request can work around (KMS or Secrets Manager denies the
        # role every call): the init fails, and with SnapStart so does the version's
        # publication, hence the deploy, before any request meets it.
        logger.exception("the runtime could not be built at init")
        raise
    except Exception:
        logger.exception("the runtime could not be built at init")
        tracer()
        return None
    try:
        # Before the Tracer patches botocore: a traced call at init logs a discarded segment.
        built.prime()
    except Exception:  # priming is an optimisation: a request makes the same calls for real
        logger.warning("priming the AWS clients at init failed", exc_info=True)
    tracer()
    return built


def before_snapshot() -> None:
    """SnapStart: close the open connections before the snapshot (no socket is restored)."""
    with _lock:
        runtime = _runtime
    if runtime is not None:
        runtime.close()


def after_restore() -> None:
    """SnapStart: give a restored environment its own state, nothing shared with the others
    restored from the same snapshot.

    Reseeds :mod:`random` from the OS; drops the cached secrets and parameters (Powertools'
    cache, the callback keys' derived ciphers); rebuilds the runtime on a new AWS session
    (new credentials, clients, connection pools, HTTP clients, tenant credentials cache),
    with the settings and clock init built it with; the parsed service models are kept.
    """
    random.seed()
    # Powertools' parameters (they import boto3) are loaded only by what reads one: without
    # them nothing is cached.
    parameters = sys.modules.get("aws_lambda_powertools.utilities.parameters")
    if parameters is not None:
        parameters.clear_caches()
    callbacks.clear_key_cache()
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = Runtime.from_settings(
                _runtime.settings,
                clock=_runtime.clock,
                # A service init left to its first use stays so (reads and clears).
                service=_runtime.service_built,
                blobs=_runtime.blobs_at_init,
            )


_hooks_registered = False


def _register_snapshot_hooks() -> None:
    """Register :func:`before_snapshot` and :func:`after_restore` with Lambda's SnapStart
    hooks (the ``snapshot_restore_py`` module of the Python runtime), once; without the
    module (outside Lambda) there is nothing to register."""
    global _hooks_registered
    if _hooks_registered:
        return
    try:
        from snapshot_restore_py import (  # type: ignore[import-not-found,unused-ignore]
            register_after_restore,
            register_before_snapshot,
        )
    except ImportError:
        return
    register_before_snapshot(before_snapshot)
    register_after_restore(after_restore)
    _hooks_registered = True
