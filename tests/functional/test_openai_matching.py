"""The OpenAI face's stateless matching, in process (the API's ``lambda_handler`` on moto):
what continuing a history reads."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from turnledger.core.models import ConversationKey
from turnledger.runtime import get_runtime
from turnledger.store import keys
from turnledger.turn.pipeline import Conversations

from tests.support.factories import START, data_sort_keys, raw_sort_keys
from tests.support.lambda_api import api_handler

Respond = Callable[[list[dict[str, Any]]], dict[str, Any]]


@pytest.fixture
def respond(
    monkeypatch: pytest.MonkeyPatch, load_event: Callable[[str], dict[str, Any]]
) -> Iterator[Respond]:
    """``respond(items)``: a stateless ``POST /openai/v1/responses`` of ``items``; its body."""
    template = load_event("openai-response")
    with api_handler(monkeypatch, "TurnFunction") as invoke:

        def call(items: list[dict[str, Any]]) -> dict[str, Any]:
            event = copy.deepcopy(template)
            event["body"] = json.dumps({"model": "demo-1", "input": items})
            result = invoke(event)
            assert result["statusCode"] == 200, result["body"]
            body: dict[str, Any] = json.loads(result["body"])
            return body

        yield call


def test_continuing_a_long_history_reads_only_the_events_it_adds(respond: Respond) -> None:
    """The match is by the hash of the request's items, never by reading the stored
    transcript: the sixth call reads the two events it adds (to extend the chain), not
    the ten before them."""
    history: list[dict[str, Any]] = []
    conversations = set()
    for n in range(5):
        history.append({"role": "user", "content": f"Message {n}."})
        body = respond(history)
        conversations.add(body["conversation"]["id"])
        history += body["output"]
    history.append({"role": "user", "content": "Message 5."})
    read: list[int] = []
    original = Conversations.events

    def counted(self: Conversations, key: Any, *, after: int, limit: int) -> Any:
        page = original(self, key, after=after, limit=limit)
        read.append(len(page.events))
        return page

    looked_up: list[str] = []
    store = get_runtime().store
    original_get = store.get_side_item

    def lookup(key: ConversationKey, sort_key: str) -> Any:
        if key == keys.tenant_items("acme"):
            looked_up.append(sort_key)
        return original_get(key, sort_key)

    with (
        mock.patch.object(Conversations, "events", counted),
        mock.patch.object(store, "get_side_item", lookup),
    ):
        body = respond(history)
    conversations.add(body["conversation"]["id"])
    assert len(conversations) == 1
    assert sum(read) == 2  # its user message and the answer
    # One index item read, the hit (read again when the new response retires it): the
    # input's own end, a user message, ends no response, so it is never looked up.
    assert len(set(looked_up)) == 1


def test_one_index_item_per_conversation_cleared_with_it(respond: Respond) -> None:
    """The tenant's index names only the latest response of a conversation, and clearing the
    conversation deletes it: no hash of a cleared transcript is left behind."""
    history: list[dict[str, Any]] = []
    for n in range(3):
        history.append({"role": "user", "content": f"Message {n}."})
        body = respond(history)
        history += body["output"]
    key = ConversationKey(tenant="acme", conversation_id=body["conversation"]["id"])
    store = get_runtime().store
    index = keys.tenant_items("acme")
    [entry] = raw_sort_keys(store, index)
    assert store.get_side_item(index, entry).attributes == {  # type: ignore[union-attr]
        "c": key.conversation_id,
        "t": 3,
    }
    store.clear(key, START)
    assert data_sort_keys(store, index) == []
