"""Lambda's init phase builds what every request needs; a SnapStart restore reuses nothing
unique or secret that init made.

The handler modules in ``functions/`` call :func:`turnledger.runtime.prepare` at import
(the init phase): after it, a first request builds no AWS client, no runtime and no
provider. Under SnapStart many environments resume from one snapshot of that init; the
restore hooks (:func:`~turnledger.runtime.before_snapshot`,
:func:`~turnledger.runtime.after_restore`) give each its own random state, clients,
connections, credentials and secrets. These tests run the hooks as Lambda would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.client
import botocore.session
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws
from turnledger import runtime as runtime_module
from turnledger.core.config import ForeignResource, Settings
from turnledger.core.models import ConversationKey
from turnledger.providers import factory
from turnledger.runtime import Runtime, after_restore, before_snapshot, get_runtime, set_runtime
from turnledger.store.base import PurgeReport
from turnledger.tools import http as tool_http
from turnledger.turn import callbacks
from turnledger.turn.pipeline import Conversations
from turnledger_local.gateway import LambdaContext
from turnledger_local.template import PROJECT_ROOT

from tests.support.aws import aws_clients, create_bucket, create_conversations_table

FUNCTIONS = ("turn", "read", "clear", "approve", "sweep", "worker")
TENANT_ROLE = "arn:aws:iam::123456789012:role/tenant-access"


def load_function(name: str) -> types.ModuleType:
    """Import ``functions/<name>/app.py`` by path, as Lambda's init phase does."""
    path = PROJECT_ROOT / "functions" / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"init_test_{name}_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A table and a bucket on moto, named in the environment; no runtime built yet."""
    with mock_aws():
        clients = aws_clients()
        monkeypatch.setenv("TABLE_NAME", create_conversations_table(clients.dynamodb))
        monkeypatch.setenv("BUCKET_NAME", create_bucket(clients.s3))
        monkeypatch.setenv("CALLBACK_KEY", "00" * 32)
        set_runtime(None)
        yield
        set_runtime(None)


class Counter:
    """Counts the calls of a patched callable (and passes them on)."""

    def __init__(self, wrapped: Callable[..., Any]) -> None:
        self.wrapped = wrapped
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.wrapped(*args, **kwargs)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_functions_init_builds_the_runtime(aws: None, name: str) -> None:
    load_function(name)
    assert runtime_module._runtime is not None


def test_the_first_request_builds_no_client_runtime_or_provider(
    aws: None, monkeypatch: pytest.MonkeyPatch, load_event: Callable[[str], dict[str, Any]]
) -> None:
    function = load_function("read")  # the init phase
    clients = Counter(botocore.session.Session.create_client)
    runtimes = Counter(Runtime.from_settings)
    providers = Counter(factory.build_provider)
    sessions = Counter(botocore.session.Session.__init__)
    monkeypatch.setattr(botocore.session.Session, "create_client", clients)
    monkeypatch.setattr(Runtime, "from_settings", runtimes)
    monkeypatch.setattr(factory, "build_provider", providers)
    monkeypatch.setattr(botocore.session.Session, "__init__", sessions)

    context = LambdaContext(function_name="read", memory_limit_in_mb=512, timeout_seconds=29)
    answer = function.lambda_handler(load_event("get-conversation"), context)

    assert answer["statusCode"] == 404  # it reached the store: nothing there yet
    assert (clients.calls, runtimes.calls, providers.calls, sessions.calls) == (0, 0, 0, 0)


def test_init_builds_no_http_client_until_a_tool_call_or_webhook_needs_one(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = Counter(tool_http.tool_http_client)
    # Imported by the first http tool call (turnledger.tools.executors.lazy_tool_http_client).
    monkeypatch.setattr(tool_http, "tool_http_client", made)
    load_function("turn")
    assert made.calls == 0  # its CA bundle alone is ~40 ms of init

    runner = get_runtime().conversations.runner
    assert runner is not None
    assert runner.http.client is runner.http.client
    assert made.calls == 1


_UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens


def _init_read_offline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, env: dict[str, str]
) -> tuple[list[str], Runtime]:
    """The read function's init with every AWS endpoint unreachable (plus ``env``): the AWS
    operations it called, and the runtime it built. No priming warning may be logged."""
    for name, value in {
        "TABLE_NAME": "init-priming",
        "BUCKET_NAME": "init-priming",
        "CALLBACK_KEY": "00" * 32,
        "TENANT_ROLE_ARN": TENANT_ROLE,
        "DYNAMODB_ENDPOINT": _UNREACHABLE,
        "S3_ENDPOINT": _UNREACHABLE,
        "AWS_ENDPOINT_URL_STS": _UNREACHABLE,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    calls: list[str] = []
    real = botocore.client.BaseClient._make_api_call

    def spy(client: Any, operation: str, params: dict[str, Any]) -> Any:
        calls.append(operation)
        return real(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", spy)
    set_runtime(None)
    try:
        with caplog.at_level("WARNING"):
            load_function("read")
        built = get_runtime()
    finally:
        set_runtime(None)
    assert not [r for r in caplog.records if "priming" in r.getMessage()]
    return calls, built


def test_init_makes_the_first_aws_calls_of_a_request_without_the_network(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The DynamoDB read and the tenant role's AssumeRole a first request starts with are
    made once at init and answered in-process: with every AWS endpoint unreachable, both
    still succeed."""
    calls, built = _init_read_offline(monkeypatch, caplog, {})

    assert calls == ["GetItem", "AssumeRole"]
    assert built.tenants is not None


def test_with_sealed_content_init_also_makes_the_first_kms_decrypt_without_the_network(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Content sealed as deployed (``KEYS_TABLE_NAME``): the KMS ``Decrypt`` that opens a
    tenant's key on its first request is made once at init too, answered in-process; the
    KMS client is one of those closed before a snapshot."""
    sealed = {
        "KEYS_TABLE_NAME": "init-priming-keys",
        "CONTENT_KMS_KEY_ID": "alias/init-priming",
        "KMS_ENDPOINT": _UNREACHABLE,
    }
    calls, built = _init_read_offline(monkeypatch, caplog, sealed)

    assert calls == ["GetItem", "Decrypt", "AssumeRole"]
    assert {type(c).__name__ for c in built.clients} == {"DynamoDB", "KMS", "STS"}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_kms_key_of_another_account_fails_the_init(
    aws: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """No request could use it (KMS denies it to the function's role), so the init fails
    rather than logging it for each request to meet: under SnapStart Lambda then refuses
    the version, and the deploy fails before any request. Another invalid setting is
    still left to the requests, which answer it."""
    monkeypatch.setenv("TENANT_ROLE_ARN", TENANT_ROLE)
    monkeypatch.setenv("KEYS_TABLE_NAME", "init-keys")
    monkeypatch.setenv("CONTENT_KMS_KEY_ID", "arn:aws:kms:us-east-1:444455556666:key/k")
    with pytest.raises(
        ForeignResource, match="account 444455556666, not this stack's 123456789012"
    ):
        load_function(name)
    assert "the runtime could not be built at init" in caplog.text

    monkeypatch.setenv("CONTENT_KMS_KEY_ID", "arn:aws:kms:us-east-1:123456789012:key/k")
    monkeypatch.setenv("MAX_TOOL_STEPS", "many")
    load_function(name)
    assert runtime_module._runtime is None


def test_init_registers_the_snapstart_hooks_when_the_runtime_offers_them(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: dict[str, list[Callable[[], None]]] = {"before": [], "after": []}
    hooks = types.ModuleType("snapshot_restore_py")
    hooks.register_before_snapshot = registered["before"].append  # type: ignore[attr-defined]
    hooks.register_after_restore = registered["after"].append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", hooks)
    monkeypatch.setattr(runtime_module, "_hooks_registered", False)

    load_function("turn")
    load_function("read")  # a second prepare() registers nothing more

    assert registered == {"before": [before_snapshot], "after": [after_restore]}


def test_init_runs_without_the_snapstart_module(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # ImportError on import
    monkeypatch.setattr(runtime_module, "_hooks_registered", False)
    load_function("read")
    assert runtime_module._runtime is not None
    assert runtime_module._hooks_registered is False


def _snapshot() -> Runtime:
    """What init leaves behind: a runtime on the tenant role, connections open, a secret
    read through Powertools and a callback key's cipher cached."""
    set_runtime(
        Runtime.from_settings(Settings.from_env({**_env(), "TENANT_ROLE_ARN": TENANT_ROLE}))
    )
    built = get_runtime()
    secrets = boto3.client("secretsmanager")
    secrets.create_secret(Name="init-secret", SecretString="s3cr3t")
    assert parameters.get_secret("init-secret") == "s3cr3t"
    callbacks.sign(b"k" * 32, _claims())
    return built


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.isupper()}


def _claims() -> callbacks.CallbackClaims:
    return callbacks.CallbackClaims(
        tenant="acme",
        conversation_id="c-init",
        created_at="x",
        call_id="call-1",
        idempotency_key="k",
        deadline=2_000_000_000,
    )


def test_init_builds_no_s3_client_until_a_blob_is_stored(aws: None) -> None:
    built = _snapshot()
    assert {type(c).__name__ for c in built.clients} == {"DynamoDB", "STS"}
    tenant = built.tenants.for_tenant("acme") if built.tenants else None
    assert tenant is not None

    built.store.blobs.put("init/first-blob", b"{}")
    tenant.store.blobs.put("acme/first-blob", b"{}")

    assert {type(c).__name__ for c in built.clients} == {"DynamoDB", "STS", "S3"}
    assert built.store.blobs.get("init/first-blob") == b"{}"
    # One client each, reused: the second blob builds none.
    built.store.blobs.put("init/second-blob", b"{}")
    assert len(built.clients) == 3


def test_before_snapshot_closes_every_clients_connection_pool(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _snapshot()
    built.store.blobs.put("init/blob", b"{}")  # S3's client is built on the first blob
    closed: list[object] = []
    for client in built.clients:
        session = client._endpoint.http_session
        monkeypatch.setattr(session, "close", lambda session=session: closed.append(session))

    before_snapshot()

    assert closed == [client._endpoint.http_session for client in built.clients]
    assert {type(c).__name__ for c in built.clients} == {"DynamoDB", "S3", "STS"}


def test_a_restore_reuses_nothing_unique_or_secret_from_init(aws: None) -> None:
    built = _snapshot()
    built.store.blobs.put("init/blob", b"{}")  # S3's client is built on the first blob
    state = random.getstate()
    before_snapshot()

    # Two environments restored from the same snapshot: the same memory, then the hooks.
    draws = []
    for _ in range(2):
        random.setstate(state)
        after_restore()
        draws.append([random.random() for _ in range(4)])
        restored = get_runtime()
        restored.store.blobs.put("restored/blob", b"{}")
        assert restored is not built
        assert restored.settings == built.settings
        assert restored.conversations.clock is built.conversations.clock
        for old, new in zip(built.clients, restored.clients, strict=True):
            assert new is not old
            assert new._endpoint.http_session is not old._endpoint.http_session
            # Credentials are resolved again, not the snapshot's object.
            assert new._request_signer._credentials is not old._request_signer._credentials
        assert restored.conversations.provider is not built.conversations.provider
        assert restored.tenants is not None and restored.tenants is not built.tenants
        assert parameters.base.DEFAULT_PROVIDERS == {}  # the init's secret is gone
        assert callbacks._fernet.cache_info().currsize == 0
    assert draws[0] != draws[1]


@pytest.mark.parametrize("name", ["read", "clear"])
def test_a_read_or_clear_functions_init_and_reads_leave_the_service_unbuilt(
    aws: None, name: str, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """The read and clear functions build the runtime at init but not the whole service
    (provider, tools, turn pipeline): their routes read and clear through ``reads_for``."""
    function = load_function(name)
    built = runtime_module._runtime
    assert built is not None and not built.service_built
    event = load_event("get-conversation" if name == "read" else "clear")
    context = LambdaContext(function_name=name, memory_limit_in_mb=512, timeout_seconds=29)
    answer = function.lambda_handler(event, context)
    assert answer["statusCode"] == (404 if name == "read" else 204)
    assert not built.service_built


def test_a_tenant_erasure_in_the_clear_function_leaves_the_service_unbuilt(
    aws: None, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """``DELETE /v1/conversations`` (the clear function) erases through the sweeper, which
    builds the whole service only when a provider's stored responses must be deleted or a
    wait recorded as expired: an erasure with neither loads no provider or pipeline."""
    function = load_function("clear")
    built = runtime_module._runtime
    assert built is not None and not built.service_built
    context = LambdaContext(function_name="clear", memory_limit_in_mb=512, timeout_seconds=29)
    answer = function.lambda_handler(load_event("erase-tenant"), context)
    assert answer["statusCode"] == 200, answer
    assert json.loads(answer["body"])["complete"] is True
    assert not built.service_built


@pytest.mark.parametrize("role", [None, TENANT_ROLE])
def test_a_clear_without_the_service_still_forgets_the_providers_stored_responses(
    aws: None, monkeypatch: pytest.MonkeyPatch, role: str | None
) -> None:
    """A clear on the read side builds the service (the process's, or the tenant's with a
    tenant role) when, and only when, the conversation knew of stored provider responses,
    and deletes them through it."""
    if role is not None:
        monkeypatch.setenv("TENANT_ROLE_ARN", role)
    built = Runtime.from_settings(Settings.from_env(), service=False)
    forgotten: list[list[tuple[str, str]]] = []

    def forget(_: Conversations, responses: list[tuple[str, str]]) -> int:
        forgotten.append(responses)
        return len(responses)

    monkeypatch.setattr(Conversations, "forget_provider_state", forget)
    key = ConversationKey(tenant="acme", conversation_id="c-forget")
    reads = built.reads_for("acme")
    assert not isinstance(reads, Conversations)
    reads.clear(key)  # nothing stored: no provider state to forget
    assert forgotten == []

    known = [("openai-responses", "resp_1")]
    monkeypatch.setattr(reads.store, "clear", lambda *_: PurgeReport(provider_responses=known))
    reads.clear(key)
    assert forgotten == [known]
    assert built.service_built is (role is None)  # a tenant's own service was built instead


def test_the_clear_functions_s3_client_is_built_at_init_and_again_after_a_restore(
    aws: None,
) -> None:
    """Every clear lists blobs: its init builds S3's client, and so does the rebuild of a
    restored environment (not the first request after it)."""
    load_function("clear")
    built = runtime_module._runtime
    assert built is not None and built.blobs_at_init
    assert "S3" in {type(c).__name__ for c in built.clients}
    before_snapshot()
    after_restore()
    restored = runtime_module._runtime
    assert restored is not None and restored is not built
    assert "S3" in {type(c).__name__ for c in restored.clients}
