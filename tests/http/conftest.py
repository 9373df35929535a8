"""HTTP tests: the real handlers behind the local runner, driven with httpx.

``runner`` serves on embedded storage (moto's server), like ``make run``;
``ddb_runner`` uses DynamoDB Local for the table (the real engine, and safe
under concurrent writes, which moto's server is not).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from turnledger.config import Settings
from turnledger.local.runner import LocalConfig, LocalRunner
from turnledger.runtime import Runtime, set_runtime

from tests.support.factories import FakeClock

ANN = {"Authorization": "Bearer local:acme:ann"}
BOB = {"Authorization": "Bearer local:globex:bob"}


def start(config: LocalConfig, clock: FakeClock | None) -> Iterator[httpx.Client]:
    with LocalRunner(config) as runner:
        if clock is not None:
            # The runner built nothing yet; install a runtime with the test's clock.
            set_runtime(Runtime.from_settings(Settings.from_env(), clock=clock.now))
        with httpx.Client(base_url=runner.url, timeout=30) as client:
            yield client
        set_runtime(None)


@pytest.fixture
def runner_config() -> LocalConfig:
    """What the ``runner`` fixture starts; tests override fields with ``dataclasses.replace``.

    Runners of one test process share moto's state: each gets its own table and bucket.
    """
    suffix = uuid.uuid4().hex[:8]
    return LocalConfig(
        port=0,
        ttl_seconds=3600,
        table=f"http-{suffix}",
        bucket=f"http-{suffix}",
        idempotency_table=f"http-idem-{suffix}",
    )


@pytest.fixture
def http(runner_config: LocalConfig, clock: FakeClock) -> Iterator[httpx.Client]:
    """An httpx client for a local runner on embedded storage, with the test's clock."""
    yield from start(runner_config, clock)


@pytest.fixture
def ddb_http(
    runner_config: LocalConfig, clock: FakeClock, ddb_local_endpoint: str
) -> Iterator[httpx.Client]:
    """Like ``http``, with the table on DynamoDB Local."""
    config = dataclasses.replace(runner_config, dynamodb_endpoint=ddb_local_endpoint)
    yield from start(config, clock)


@pytest.fixture
def turn(http: httpx.Client) -> Callable[..., httpx.Response]:
    """``turn(conversation_id, input, headers=ANN, **body)``: POST a turn."""

    def post(
        conversation_id: str, text: Any, headers: dict[str, str] = ANN, **body: Any
    ) -> httpx.Response:
        return http.post(
            f"/v1/conversations/{conversation_id}/turns",
            json={"input": text, **body},
            headers=headers,
        )

    return post
