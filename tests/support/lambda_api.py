"""The API's ``lambda_handler`` as Lambda invokes it, on moto: for tests that send API
Gateway's own events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from moto import mock_aws
from turnledger.api import lambda_handler
from turnledger.runtime import set_runtime
from turnledger_local.gateway import LambdaContext

from tests.support.aws import aws_clients, create_bucket, create_conversations_table

Invoke = Callable[[dict[str, Any]], dict[str, Any]]


@contextmanager
def api_handler(monkeypatch: pytest.MonkeyPatch, function_name: str) -> Iterator[Invoke]:
    """``invoke(event)``: ``lambda_handler`` on a fresh moto table and bucket, with a Lambda
    context named ``function_name``; the runtime is built anew before and after."""
    with mock_aws():
        clients = aws_clients()
        monkeypatch.setenv("TABLE_NAME", create_conversations_table(clients.dynamodb))
        monkeypatch.setenv("BUCKET_NAME", create_bucket(clients.s3))
        set_runtime(None)

        def call(event: dict[str, Any]) -> dict[str, Any]:
            context = LambdaContext(
                function_name=function_name, memory_limit_in_mb=512, timeout_seconds=29
            )
            result: dict[str, Any] = lambda_handler(event, context)
            return result

        yield call
        set_runtime(None)
