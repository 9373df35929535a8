"""Build every dependency of the handlers once per process, from the settings.

The handlers call :func:`get_runtime`; tests and the local runner may install
their own with :func:`set_runtime` (an injected clock, a fake provider...).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3
import httpx
from botocore.config import Config

from .config import Settings
from .pipeline import Conversations
from .providers.factory import build_provider
from .session import Clock, utc_now
from .store.blobs import S3BlobStore
from .store.dynamodb import DynamoDBConversationStore
from .tools.executors import ToolRunner
from .tools.registry import ToolRegistry

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_s3 import S3Client

#: Bounded, fast-failing AWS calls: a handler should answer, not hang.
_AWS_CONFIG = Config(
    connect_timeout=3, read_timeout=10, retries={"max_attempts": 3, "mode": "standard"}
)


@dataclass
class Runtime:
    """The service and what it was built from."""

    settings: Settings
    conversations: Conversations
    store: DynamoDBConversationStore
    dynamodb: DynamoDBClient

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock = utc_now) -> Runtime:
        """Build clients, store, provider, tools and the service for ``settings``."""
        session = boto3.session.Session()
        dynamodb: DynamoDBClient = session.client(
            "dynamodb", endpoint_url=settings.dynamodb_endpoint, config=_AWS_CONFIG
        )
        s3: S3Client = session.client("s3", endpoint_url=settings.s3_endpoint, config=_AWS_CONFIG)
        store = DynamoDBConversationStore(
            dynamodb,
            settings.table_name,
            S3BlobStore(s3, settings.bucket_name),
            offload_threshold=settings.offload_threshold_bytes,
        )
        http = httpx.Client(timeout=settings.tool_timeout_seconds)

        def lambda_client() -> LambdaClient:
            return session.client("lambda", config=_AWS_CONFIG)

        conversations = Conversations(
            store=store,
            provider=build_provider(settings),
            settings=settings,
            tools=lambda: ToolRegistry.from_settings(settings),
            runner=ToolRunner(http, lambda_client, timeout_seconds=settings.tool_timeout_seconds),
            clock=clock,
        )
        return cls(settings=settings, conversations=conversations, store=store, dynamodb=dynamodb)


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
