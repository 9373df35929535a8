"""HTTP tests: the real handlers behind the local runner, driven with httpx.

``http`` serves on embedded storage (moto's server), like ``make run``;
``ddb_http`` uses DynamoDB Local for the table (the real engine, and safe
under concurrent writes, which moto's server is not). The functions run in
the runner's worker processes: tests move their time with ``runner_clock``
(a :class:`ClockFile` the workers read) and reach storage through
:func:`store_of`, never through in-process state.

A test that needs another runner builds its configuration here rather than by hand:
:func:`fresh_config` (or ``runner_config``), then :func:`on_storage`, :func:`on_ddb_local`,
:func:`tools_file` or :func:`on_openai_chat`, and :func:`serve` or :func:`start` to run it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
from tests.support.aws import unique_name
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


def fresh_config() -> LocalConfig:
    """A runner's configuration with a table and bucket of its own (runners of one test
    process share moto's state)."""
    suffix = uuid.uuid4().hex[:8]
    return LocalConfig(port=0, ttl_seconds=3600, table=f"http-{suffix}", bucket=f"http-{suffix}")


@contextmanager
def serve(
    clock: ClockFile | None, config: LocalConfig | None = None, **overrides: Any
) -> Iterator[httpx.Client]:
    """A client of a runner of ``config`` (default: :func:`fresh_config`) with ``overrides``
    applied, ``clock``'s file as the functions' clock."""
    yield from start(dataclasses.replace(config or fresh_config(), **overrides), clock)


def on_storage(config: LocalConfig, request: pytest.FixtureRequest, data_dir: Path) -> LocalConfig:
    """``config`` on the storage a parametrized fixture's ``request.param`` names:
    ``"sqlite"`` keeps conversations in ``data_dir``; ``"ddb"`` or ``"dynamodb-local"`` puts
    the table on DynamoDB Local (started only when asked); ``"moto"`` keeps the embedded one."""
    if request.param == "sqlite":
        return dataclasses.replace(config, data_dir=data_dir)
    if request.param in ("ddb", "dynamodb-local"):
        endpoint = request.getfixturevalue("ddb_local_endpoint")
        return dataclasses.replace(config, dynamodb_endpoint=endpoint)
    assert request.param == "moto", request.param
    return config


def on_ddb_local(endpoint: str, **fields: Any) -> LocalConfig:
    """A runner's configuration with its own table on DynamoDB Local (at ``endpoint``) and
    its own bucket, and ``fields``."""
    return LocalConfig(
        port=0,
        dynamodb_endpoint=endpoint,
        table=unique_name("conversations"),
        bucket=unique_name("artifacts"),
        **fields,
    )


def tools_file(folder: Path, tools: Sequence[Mapping[str, Any]]) -> Path:
    """A tool registry of ``tools``, written to ``folder``."""
    path = folder / "tools.json"
    path.write_text(json.dumps({"tools": [dict(tool) for tool in tools]}), encoding="utf-8")
    return path


#: The samples' tool registry.
SAMPLE_TOOLS = Path(__file__).resolve().parents[2] / "events" / "local-tools.json"
#: A human-input tool: a person types its answer.
ASK_OPERATOR: Mapping[str, Any] = MappingProxyType(
    {
        "name": "ask_operator",
        "description": "Ask a person; they type the answer.",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
        "executor": {"type": "human"},
    }
)


def with_ask_operator(folder: Path) -> Path:
    """The samples' registry plus :data:`ASK_OPERATOR`, written to ``folder``."""
    samples = json.loads(SAMPLE_TOOLS.read_text(encoding="utf-8"))["tools"]
    return tools_file(folder, [*samples, ASK_OPERATOR])


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
    """What the ``served`` fixture starts (:func:`fresh_config`); tests override fields with
    ``dataclasses.replace``."""
    return fresh_config()


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
