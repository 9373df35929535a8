"""HTTP tests: the real handlers behind the local runner, driven with httpx.

``http`` serves on embedded storage (moto's server), like ``make run``;
``ddb_http`` uses DynamoDB Local for the table (the real engine, and safe
under concurrent writes, which moto's server is not). The functions run in
the runner's worker processes: tests move their time with ``runner_clock``
(a :class:`ClockFile` the workers read) and reach storage through
:func:`store_of`, never through in-process state.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest
from turnledger.core.config import Settings
from turnledger.runtime import Runtime
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.functional.fake_openai import FakeOpenAI
from tests.support.factories import START

#: Read-only: a library that writes into the headers it is given (httpx_sse's ``connect_sse``
#: sets Accept) fails loudly here instead of changing every later request of the process;
#: hand such a library ``dict(ANN)``.
ANN: Mapping[str, str] = MappingProxyType({"Authorization": "Bearer local:acme:ann"})
BOB: Mapping[str, str] = MappingProxyType({"Authorization": "Bearer local:globex:bob"})


def start(config: LocalConfig, clock: ClockFile | None) -> Iterator[httpx.Client]:
    """Serve ``config`` (with ``clock``'s file as the functions' clock); yield a client."""
    if clock is not None:
        config = dataclasses.replace(config, clock_file=clock.path)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as client:
        yield client


def on_openai_chat(config: LocalConfig, fake: FakeOpenAI, **env: str) -> LocalConfig:
    """``config`` answering with openai-chat's ``gpt-test`` from ``fake``; ``env`` adds to
    (and overrides) the environment that points it there."""
    openai = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "sk-test"}
    return dataclasses.replace(
        config, provider="openai-chat", model="gpt-test", env={**config.env, **openai, **env}
    )


def store_of(runner: LocalRunner) -> DynamoDBConversationStore:
    """A store on the runner's table and bucket, as its functions see them."""
    return Runtime.from_settings(Settings.from_env(runner.environment)).store


@pytest.fixture
def runner_clock(tmp_path: Path) -> ClockFile:
    """The functions' clock: starts at the fake clocks' instant; ``advance`` moves it."""
    return ClockFile(tmp_path / "clock", START)


@pytest.fixture
def runner_config() -> LocalConfig:
    """What the ``served`` fixture starts; tests override fields with ``dataclasses.replace``.

    Runners of one test process share moto's state: each gets its own table and bucket.
    """
    suffix = uuid.uuid4().hex[:8]
    return LocalConfig(port=0, ttl_seconds=3600, table=f"http-{suffix}", bucket=f"http-{suffix}")


@pytest.fixture
def served(runner_config: LocalConfig, runner_clock: ClockFile) -> Iterator[LocalRunner]:
    """A local runner on embedded storage, with ``runner_clock`` as its functions' clock."""
    config = dataclasses.replace(runner_config, clock_file=runner_clock.path)
    with LocalRunner(config) as runner:
        yield runner


@pytest.fixture
def http(served: LocalRunner) -> Iterator[httpx.Client]:
    """An httpx client of the ``served`` runner."""
    with httpx.Client(base_url=served.url, timeout=30) as client:
        yield client


@pytest.fixture
def ddb_http(
    runner_config: LocalConfig, runner_clock: ClockFile, ddb_local_endpoint: str
) -> Iterator[httpx.Client]:
    """Like ``http``, with the table on DynamoDB Local."""
    config = dataclasses.replace(runner_config, dynamodb_endpoint=ddb_local_endpoint)
    yield from start(config, runner_clock)


@pytest.fixture
def turn(http: httpx.Client) -> Callable[..., httpx.Response]:
    """``turn(conversation_id, input, headers=ANN, **body)``: POST a turn."""

    def post(
        conversation_id: str, text: Any, headers: Mapping[str, str] = ANN, **body: Any
    ) -> httpx.Response:
        return http.post(
            f"/v1/conversations/{conversation_id}/turns",
            json={"input": text, **body},
            headers=headers,
        )

    return post


def all_events(http: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    """Every event of ``conversation`` (as ann of acme), paging ``GET .../events`` to its end."""
    events: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = http.get(
            f"/v1/conversations/{conversation}/events",
            params={"after": after, "limit": 1000},
            headers=ANN,
        ).json()
        events.extend(page["events"])
        after = page["next_after"]
    return events
