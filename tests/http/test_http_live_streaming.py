"""Streamed turns at the model's speed, through the local runner (issue 43).

``POST .../turns`` with ``Accept: text/event-stream`` and the face's ``stream: true`` go to
the template's streaming function (its URL deployed, the same port and paths here), which
writes each delta as the model writes it. These tests judge order and spread, never
wall-clock limits (the timings are the bench's, ``bench/live_streaming.py``): the first
delta reaches the client before half of the answer is written, i.e. before half of the time
from the request to the answer's end has passed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from httpx_sse import EventSource, connect_sse
from openai import AsyncOpenAI, OpenAI
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN, BOB
from tests.support.worker_hooks import FAIL_MID_STREAM

pytestmark = pytest.mark.http

SSE = {**ANN, "Accept": "text/event-stream"}
TOKEN = "local:acme:ann"
#: 40 words: at 20 ms a word the answer takes about 0.8 s to write.
WORDS = " ".join(f"word{i}" for i in range(40))


@pytest.fixture
def streaming(runner_config: LocalConfig) -> Iterator[LocalRunner]:
    """A runner whose demo model writes slowly, drafts stored every 100 ms."""
    config = dataclasses.replace(
        runner_config,
        env={"DEMO_TOKEN_DELAY_MS": "20", "DRAFT_FLUSH_MS": "100"},
        worker_hook="tests.support.worker_hooks:demo_fails_mid_stream",
    )
    with LocalRunner(config) as runner:
        yield runner


@pytest.fixture
def client(streaming: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=streaming.url, timeout=30) as http:
        # A first turn: the functions' environments are warm before anything is judged.
        assert http.post("/v1/conversations/warm/turns", json={"input": "hi"}, headers=ANN)
        yield http


@dataclasses.dataclass
class Timed:
    """What a streamed request received, and when (seconds after it was sent)."""

    events: list[tuple[float, str, dict[str, Any], str]]
    ended: float

    def of(self, kind: str) -> list[tuple[float, dict[str, Any], str]]:
        return [(at, data, last_id) for at, event, data, last_id in self.events if event == kind]


def _read(source: EventSource, sent: float) -> Timed:
    events = []
    for sse in source.iter_sse():
        events.append((time.monotonic() - sent, sse.event, json.loads(sse.data), sse.id))
    return Timed(events, time.monotonic() - sent)


def _spread(first: float, end: float) -> None:
    """The first delta came before half of the answer was written."""
    assert first < end / 2, f"first delta after {first:.3f} s of {end:.3f} s"


def _stored_answer(client: httpx.Client, conversation_id: str) -> str:
    events = client.get(f"/v1/conversations/{conversation_id}/events", headers=ANN).json()
    answers = [e for e in events["events"] if e["kind"] == "assistant_message"]
    assert len(answers) == 1
    text: str = answers[0]["payload"]["content"]
    return text


def test_a_streamed_turn_writes_each_delta_as_the_model_writes_it(client: httpx.Client) -> None:
    sent = time.monotonic()
    with connect_sse(
        client, "POST", "/v1/conversations/c1/turns", json={"input": f"echo: {WORDS}"}, headers=SSE
    ) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        assert source.response.headers["content-location"] == "/v1/conversations/c1/turns/1/stream"
        timed = _read(source, sent)
    chunks = timed.of("chunk")
    (done,) = timed.of("done")
    assert [kind for _, kind, _, _ in timed.events][-1] == "done"
    assert len(chunks) == 40  # one event per word the model wrote
    _spread(chunks[0][0], done[0])
    text = "".join(data["text"] for _, data, _ in chunks)
    assert text == WORDS
    assert done[1]["status"] == "done"
    assert done[1]["result"]["output_text"] == WORDS
    assert _stored_answer(client, "c1") == text
    # Chunk numbers rise, and an id is announced only for a chunk already stored.
    seqs = [data["seq"] for _, data, _ in chunks]
    assert seqs == sorted(seqs) and seqs[-1] > 1


def test_a_refused_streamed_turn_is_the_json_error(client: httpx.Client) -> None:
    missing = client.post("/v1/conversations/c2/turns", json={}, headers=SSE)
    assert missing.status_code == 422
    assert missing.headers["content-type"] == "application/json"
    assert "error" in missing.json()
    anonymous = client.post(
        "/v1/conversations/c2/turns",
        json={"input": "hi"},
        headers={"Accept": "text/event-stream"},
    )
    assert anonymous.status_code == 401


def test_a_client_that_reconnects_with_last_event_id_gets_each_later_delta_once(
    client: httpx.Client,
) -> None:
    kept: list[str] = []  # what the client keeps: the deltas through the last id it saw
    pending: list[str] = []  # deltas after it, sent again from the draft on reconnecting
    last_id = ""
    with connect_sse(
        client, "POST", "/v1/conversations/c3/turns", json={"input": f"echo: {WORDS}"}, headers=SSE
    ) as source:
        for sse in source.iter_sse():
            assert sse.event == "chunk"
            pending.append(json.loads(sse.data)["text"])
            if sse.id and sse.id != last_id:
                last_id = sse.id
                kept.extend(pending)
                pending.clear()
            if last_id and len(pending) >= 2:
                break  # hang up mid-answer, two deltas after the last id
    assert last_id, "no chunk was stored before the client hung up"
    resumed: list[str] = []
    with connect_sse(
        client,
        "GET",
        "/v1/conversations/c3/turns/1/stream",
        headers={**SSE, "Last-Event-ID": last_id},
    ) as source:
        for sse in source.iter_sse():
            if sse.event == "chunk":
                resumed.append(json.loads(sse.data)["text"])
            else:
                assert sse.event == "done"
                assert json.loads(sse.data)["status"] == "done"
    assert resumed, "the turn went on after the client hung up"
    assert "".join(kept + resumed) == WORDS
    assert _stored_answer(client, "c3") == WORDS


def test_the_openai_sdk_receives_its_deltas_as_they_are_written(
    streaming: LocalRunner, client: httpx.Client
) -> None:
    with OpenAI(base_url=f"{streaming.url}/openai/v1", api_key=TOKEN, max_retries=0) as openai:
        sent = time.monotonic()
        deltas: list[tuple[float, str]] = []
        with openai.responses.create(model="demo-1", input=f"echo: {WORDS}", stream=True) as s:
            for event in s:
                if event.type == "response.output_text.delta":
                    deltas.append((time.monotonic() - sent, event.delta))
                if event.type == "response.completed":
                    completed = event.response
        ended = time.monotonic() - sent
    _spread(deltas[0][0], ended)
    assert len(deltas) == 40
    assert "".join(d for _, d in deltas) == WORDS == completed.output_text
    conversation = completed.conversation
    assert conversation is not None
    assert _stored_answer(client, conversation.id) == WORDS


def test_the_agents_sdk_run_streamed_receives_its_deltas_as_they_are_written(
    streaming: LocalRunner, client: httpx.Client
) -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI

    async def scenario() -> tuple[list[tuple[float, str]], float, Any]:
        openai = AsyncOpenAI(base_url=f"{streaming.url}/openai/v1", api_key=TOKEN, max_retries=0)
        agent = Agent(name="a", model=OpenAIResponsesModel(model="demo-1", openai_client=openai))
        sent = time.monotonic()
        streamed = Runner.run_streamed(agent, f"echo: {WORDS}")
        deltas = [
            (time.monotonic() - sent, event.data.delta)
            async for event in streamed.stream_events()
            if event.type == "raw_response_event"
            and event.data.type == "response.output_text.delta"
        ]
        return deltas, time.monotonic() - sent, streamed.final_output

    deltas, ended, final = asyncio.run(scenario())
    _spread(deltas[0][0], ended)
    assert "".join(d for _, d in deltas) == WORDS == final


def test_a_streamed_turn_of_another_tenant_is_not_found(client: httpx.Client) -> None:
    assert client.post("/v1/conversations/c4/turns", json={"input": "hi"}, headers=SSE)
    other = client.get("/v1/conversations/c4/turns/1/stream", headers={**BOB, "Accept": "x"})
    assert other.status_code == 404


def test_a_turn_that_fails_mid_stream_ends_its_stream_interrupted(client: httpx.Client) -> None:
    """The model fails after three words: they were sent; the stream ends with ``done``,
    interrupted, carrying the error the synchronous turn would answer; nothing is kept."""
    with connect_sse(
        client,
        "POST",
        "/v1/conversations/c5/turns",
        json={"input": f"echo: {FAIL_MID_STREAM} a b c d"},
        headers=SSE,
    ) as source:
        events = [(sse.event, json.loads(sse.data)) for sse in source.iter_sse()]
    kinds = [kind for kind, _ in events]
    assert kinds == ["chunk", "chunk", "chunk", "done"]
    done = events[-1][1]
    assert done["status"] == "interrupted"
    assert done["result"]["error"]["code"] == done["reason"] == "provider_error"
    kept = client.get("/v1/conversations/c5/events", headers=ANN).json()["events"]
    assert "assistant_message" not in [e["kind"] for e in kept]


def test_the_shared_headers_refuse_what_connect_sse_writes_into_them() -> None:
    """Handed ``ANN`` itself, connect_sse fails before sending anything, instead of leaving
    Accept: text/event-stream in the headers of every later test of the process."""
    with (
        httpx.Client(base_url="http://127.0.0.1:9") as nowhere,
        pytest.raises(TypeError),
        connect_sse(nowhere, "GET", "/stream", headers=ANN),
    ):
        pass
    assert dict(ANN) == {"Authorization": "Bearer local:acme:ann"}


def test_a_face_stream_that_fails_mid_answer_ends_with_an_error_event(
    client: httpx.Client,
) -> None:
    with connect_sse(
        client,
        "POST",
        "/openai/v1/responses",
        json={"model": "demo-1", "input": f"echo: {FAIL_MID_STREAM} a b c d", "stream": True},
        headers=dict(ANN),  # a copy: connect_sse writes Accept into the dict it is given
    ) as source:
        kinds = [(sse.event, json.loads(sse.data)) for sse in source.iter_sse()]
    deltas = [data["delta"] for kind, data in kinds if kind == "response.output_text.delta"]
    assert len(deltas) == 3
    kind, error = kinds[-1]
    assert kind == "error" and error["code"] == "provider_error"
    assert "response.completed" not in [k for k, _ in kinds]


def test_a_retried_streamed_turn_answers_its_recorded_response_and_runs_nothing(
    client: httpx.Client,
) -> None:
    keyed = {**SSE, "Idempotency-Key": "stream-once"}
    answers = []
    for _ in range(2):
        with connect_sse(
            client, "POST", "/v1/conversations/c6/turns", json={"input": "echo: a b"}, headers=keyed
        ) as source:
            answers.append([(sse.event, json.loads(sse.data)) for sse in source.iter_sse()])
    first, retry = answers
    assert [kind for kind, _ in first] == ["chunk", "chunk", "done"]
    assert [kind for kind, _ in retry] == ["done"]
    assert retry[0][1]["result"] == first[-1][1]["result"]
    assert _stored_answer(client, "c6") == "a b"  # one answer: the retry ran nothing
