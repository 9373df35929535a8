"""Cached input tokens over HTTP (issue 26), through the local runner against the fake
OpenAI and Bedrock servers, on the SQLite data folder and on DynamoDB Local: recorded per
call, priced at the model's cached rate, rolled up on the head, shown by the OpenAI face.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.fake_bedrock import FakeBedrock, converse_body
from tests.functional.fake_openai import FakeOpenAI, completion, json_reply
from tests.http.conftest import ANN, on_openai_chat, on_storage, serve

pytestmark = pytest.mark.http

#: Per million tokens: input 2.00, cached input 0.50, output 8.00 (no cache-write rate:
#: the input price).
GPT = {
    "context_window": 128000,
    "answer_reserve": 4096,
    "input_price_per_mtok": 2.0,
    "cached_input_price_per_mtok": 0.5,
    "output_price_per_mtok": 8.0,
}
#: Bedrock's: input 3.00, cache read 0.30, cache write 3.75, output 15.00.
CLAUDE = {
    "context_window": 200000,
    "answer_reserve": 4096,
    "input_price_per_mtok": 3.0,
    "cached_input_price_per_mtok": 0.3,
    "cache_write_input_price_per_mtok": 3.75,
    "output_price_per_mtok": 15.0,
}
CLAUDE_ID = "anthropic.claude-test-v1:0"


@pytest.fixture(params=["sqlite", pytest.param("ddb", marks=pytest.mark.integration)])
def storage(
    request: pytest.FixtureRequest, runner_config: LocalConfig, tmp_path: Path
) -> LocalConfig:
    """The runner's configuration on each storage."""
    return on_storage(runner_config, request, tmp_path / "data")


def cached_completion(text: str, prompt: int, cached: int, output: int) -> dict[str, Any]:
    body = completion(text, model="gpt-test", prompt_tokens=prompt, completion_tokens=output)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


def answer_of(http: httpx.Client, conversation: str) -> dict[str, Any]:
    events = http.get(f"/v1/conversations/{conversation}/events", headers=ANN).json()["events"]
    [answer] = [e for e in events if e["kind"] == "assistant_message"][-1:]
    payload: dict[str, Any] = answer["payload"]
    return payload


def test_openai_cached_tokens_are_priced_at_the_cached_rate(
    storage: LocalConfig, runner_clock: ClockFile
) -> None:
    with FakeOpenAI() as fake:
        config = on_openai_chat(storage, fake, MODELS=json.dumps({"gpt-test": GPT}))
        with serve(runner_clock, config) as http:
            fake.script(json_reply(cached_completion("Hello Ann.", 1000, 800, 10)))
            turn = http.post("/v1/conversations/cache-1/turns", json={"input": "Hi"}, headers=ANN)
            assert turn.status_code == 200, turn.text
            # Zero counts are left out (no cache writes here).
            usage = {"input_tokens": 1000, "output_tokens": 10, "cached_input_tokens": 800}
            assert turn.json()["usage"] == usage
            # 200 input tokens at 2.00, 800 cached at 0.50, 10 output at 8.00 (per million).
            cost = (200 * 2.0 + 800 * 0.5 + 10 * 8.0) / 1_000_000
            answer = answer_of(http, "cache-1")
            assert answer["usage"] == usage and answer["run"]["usage"] == usage
            assert answer["run"]["cost_usd"] == pytest.approx(cost)
            head = http.get("/v1/conversations/cache-1", headers=ANN).json()
            assert head["usage"] == usage and head["cost_usd"] == pytest.approx(cost)
            [summary] = http.get("/v1/conversations/cache-1/turns", headers=ANN).json()["turns"]
            assert summary["usage"] == usage and summary["cost_usd"] == pytest.approx(cost)

            # The OpenAI face shows them where OpenAI does.
            fake.script(json_reply(cached_completion("Hello again.", 1200, 1024, 5)))
            face = http.post(
                "/openai/v1/responses", json={"model": "gpt-test", "input": "Hi"}, headers=ANN
            )
            assert face.status_code == 200, face.text
            assert face.json()["usage"]["input_tokens"] == 1200
            assert face.json()["usage"]["input_tokens_details"] == {"cached_tokens": 1024}
            # And Chat Completions, where its usage has them.
            fake.script(json_reply(cached_completion("Hello once more.", 1300, 1152, 5)))
            chat = http.post(
                "/openai/v1/chat/completions",
                json={"model": "gpt-test", "messages": [{"role": "user", "content": "Hi"}]},
                headers=ANN,
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["prompt_tokens"] == 1300
            assert chat.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 1152


def test_bedrock_cache_reads_and_writes_are_priced_at_their_rates(
    storage: LocalConfig, runner_clock: ClockFile
) -> None:
    with FakeBedrock() as fake:
        body = converse_body("Hello Ann.", input_tokens=100, output_tokens=10)
        body["usage"].update({"cacheReadInputTokens": 800, "cacheWriteInputTokens": 100})
        fake.script(json_reply(body))
        env = {"BEDROCK_ENDPOINT": fake.url, "MODELS": json.dumps({CLAUDE_ID: CLAUDE})}
        with serve(
            runner_clock, storage, provider="bedrock-converse", model=CLAUDE_ID, env=env
        ) as http:
            turn = http.post("/v1/conversations/cache-2/turns", json={"input": "Hi"}, headers=ANN)
            assert turn.status_code == 200, turn.text
            # Converse counts the cache apart from inputTokens: all of it is input here.
            usage = {
                "input_tokens": 1000,
                "output_tokens": 10,
                "cached_input_tokens": 800,
                "cache_write_input_tokens": 100,
            }
            assert turn.json()["usage"] == usage
            cost = (100 * 3.0 + 800 * 0.3 + 100 * 3.75 + 10 * 15.0) / 1_000_000
            answer = answer_of(http, "cache-2")
            assert answer["run"]["usage"] == usage
            assert answer["run"]["cost_usd"] == pytest.approx(cost)
            head = http.get("/v1/conversations/cache-2", headers=ANN).json()
            assert head["usage"] == usage and head["cost_usd"] == pytest.approx(cost)
