"""Memory ranked by embeddings (``MEMORY_EMBEDDINGS``): the OpenAI-style endpoint over
httpx and Bedrock's Titan model, and a turn whose recall follows the vectors, not the
words; an embedder that fails falls back to keywords and never fails the turn."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx
import pytest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ProviderError
from turnledger.providers.demo import DemoProvider
from turnledger.providers.embeddings import (
    BedrockEmbedder,
    Embedder,
    OpenAIEmbedder,
    build_embedder,
    decode_vector,
    encode_vector,
)
from turnledger.store.memories import MemoryBook, MemoryRecord, new_memory_id
from turnledger.store.memory import MemoryConversationStore
from turnledger.turn.commands import TurnCommand
from turnledger.turn.pipeline import Conversations

from tests.support.factories import START, FakeClock, make_key


def test_openai_style_embeddings_over_http() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        data = [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}]
        return httpx.Response(200, json={"object": "list", "data": data})

    embedder = OpenAIEmbedder(
        base_url="https://llm.example/v1/",
        model="text-embedding-3-small",
        api_key=lambda: "sk-test",
        client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    assert embedder.embed(["a", "b"]) == [[1.0, 0.0], [0.0, 1.0]]
    [request] = seen
    assert str(request.url) == "https://llm.example/v1/embeddings"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert json.loads(request.content) == {"model": "text-embedding-3-small", "input": ["a", "b"]}

    refusing = OpenAIEmbedder(
        base_url="https://llm.example/v1",
        model="m",
        client=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(429))),
    )
    with pytest.raises(ProviderError) as caught:
        refusing.embed(["a"])
    assert caught.value.details["status"] == 429


class _Titan:
    """A ``bedrock-runtime`` client answering ``invoke_model`` as Titan embeddings do."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def invoke_model(self, **call: Any) -> dict[str, Any]:
        self.calls.append(call)
        text = json.loads(call["body"])["inputText"]
        body = json.dumps({"embedding": [float(len(text)), 1.0], "inputTextTokenCount": 1})
        return {"body": io.BytesIO(body.encode())}


def test_bedrock_titan_embeddings_one_text_a_call() -> None:
    titan = _Titan()
    embedder = BedrockEmbedder(model="amazon.titan-embed-text-v2:0", client_factory=lambda: titan)  # type: ignore[arg-type,return-value]
    assert embedder.embed(["ab", "abc"]) == [[2.0, 1.0], [3.0, 1.0]]
    assert [c["modelId"] for c in titan.calls] == ["amazon.titan-embed-text-v2:0"] * 2
    settings = Settings.from_env({"MEMORY_EMBEDDINGS": "bedrock"})
    built = build_embedder(settings)
    assert isinstance(built, BedrockEmbedder) and built.model == "amazon.titan-embed-text-v2:0"
    assert build_embedder(Settings()) is None


def test_vectors_round_trip_as_float32() -> None:
    assert decode_vector(encode_vector([0.5, -1.25, 3.0])) == [0.5, -1.25, 3.0]


#: Words and the direction each points in: "animal" and "cat" are close, share no word.
_TOPICS = {"cat": [1.0, 0.0, 0.0], "animal": [0.9, 0.1, 0.0], "tea": [0.0, 1.0, 0.0]}


class TopicEmbedder(Embedder):
    """Each text's vector is the sum of its topic words' (tests)."""

    name = "topics"
    model = "topics-1"

    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        if self.failing:
            raise ProviderError("embeddings down")
        vectors = []
        for text in texts:
            vector = [0.0, 0.0, 0.01]
            for word, direction in _TOPICS.items():
                if word in text.lower():
                    vector = [a + b for a, b in zip(vector, direction, strict=True)]
            vectors.append(vector)
        return vectors


def _service(embedder: Embedder) -> tuple[Conversations, MemoryConversationStore]:
    store = MemoryConversationStore()
    # A budget where the block holds one record: the ranking decides which.
    settings = replace(
        Settings(), memory_enabled=True, context_max_tokens=200, memory_context_share=0.1
    )
    clock = FakeClock()
    service = Conversations(
        store=store, provider=DemoProvider(), settings=settings, clock=clock, embedder=embedder
    )
    return service, store


def _records(store: MemoryConversationStore, embedder: Embedder) -> dict[str, MemoryRecord]:
    book = MemoryBook(store, "acme", "ann")
    made: dict[str, MemoryRecord] = {}
    texts = ["I have a cat called Tom.", "I like drinking green tea every single morning."]
    for minutes, text in enumerate(texts):
        [vector] = embedder.embed([text])
        record = MemoryRecord(
            id=new_memory_id(),
            text=text,
            created_at=START,
            updated_at=START.replace(minute=minutes),
            embedding=encode_vector(vector),
        )
        book.put(record, first=not made)
        made[text.split()[3]] = record
    return made


def _recalled(service: Conversations, conversation: str, text: str) -> list[str]:
    key = make_key("acme", conversation)
    service.turn(key, "ann", TurnCommand(messages=[text]))
    events = service.events(key, after=0, limit=100).events
    [run] = [e.body().run for e in events if e.kind.value == "assistant_message"]  # type: ignore[union-attr]
    assert run is not None
    return run.memory_ids


def test_recall_follows_the_embeddings_not_the_words() -> None:
    embedder = TopicEmbedder()
    service, store = _service(embedder)
    made = _records(store, embedder)
    # No word of the question is in the cat's record; the newer tea record would win
    # on recency alone.
    assert _recalled(service, "c-emb", "Which animal do I keep at home?") == [made["cat"].id]


def test_a_failing_embedder_falls_back_to_keywords() -> None:
    embedder = TopicEmbedder()
    service, store = _service(TopicEmbedder(failing=True))
    made = _records(store, embedder)
    assert _recalled(service, "c-kw", "Which animal do I keep at home?") == [made["green"].id]
    assert _recalled(service, "c-kw2", "Tell me about the cat again") == [made["cat"].id]
