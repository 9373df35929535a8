"""The OpenAI face's forks, in process (the API's ``lambda_handler`` on moto): a
``previous_response_id`` naming an earlier response forks there; what a fork that cannot
be made, or whose turn fails, answers and leaves behind."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from turnledger.core.models import MAX_FORK_DEPTH, ConversationKey
from turnledger.runtime import get_runtime

from tests.support.lambda_api import api_handler

#: ``respond(body)``: ``POST /openai/v1/responses`` of ``body`` (model ``demo-1``); its
#: status and JSON body.
Respond = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


@pytest.fixture
def respond(
    monkeypatch: pytest.MonkeyPatch, load_event: Callable[[str], dict[str, Any]]
) -> Iterator[Respond]:
    template = load_event("openai-response")
    with api_handler(monkeypatch, "TurnFunction") as invoke:

        def call(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            event = copy.deepcopy(template)
            event["body"] = json.dumps({"model": "demo-1", **body})
            result = invoke(event)
            answer: dict[str, Any] = json.loads(result["body"])
            return result["statusCode"], answer

        yield call


def ok(respond: Respond, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = respond(body)
    assert status == 200, answer
    return answer


def forks_of(conversation_id: str) -> list[str]:
    service = get_runtime().conversations_for("acme")
    key = ConversationKey(tenant="acme", conversation_id=conversation_id)
    return [f.conversation_id for f in service.forks(key, after=None, limit=100).forks]


def test_a_fork_whose_turn_fails_is_not_kept(respond: Respond) -> None:
    """The fork is made before its turn runs; when the turn is refused, the fork goes with
    it (no response names it), and the original is as it was."""
    first = ok(respond, {"input": "My name is Sam."})
    ok(respond, {"input": "Hello", "previous_response_id": first["id"]})
    original = first["conversation"]["id"]
    status, answer = respond(
        {
            "input": "My name is Max.",
            "previous_response_id": first["id"],
            "tools": [{"type": "web_search"}],
        }
    )
    assert status == 400, answer
    assert answer["error"]["param"] == "tools.0"
    assert forks_of(original) == []
    forked = ok(respond, {"input": "My name is Max.", "previous_response_id": first["id"]})
    assert forks_of(original) == [forked["conversation"]["id"]]


def test_a_chain_of_forks_too_deep_is_refused_in_openai_s_shape(respond: Respond) -> None:
    """Each fork of a fork's own response reads one more conversation; past the lineage's
    depth the request is ``409 fork_too_deep`` naming ``previous_response_id``."""
    earlier = ok(respond, {"input": "Turn."})
    for _ in range(MAX_FORK_DEPTH):
        ok(respond, {"input": "Next.", "previous_response_id": earlier["id"]})
        # The second answer from ``earlier``: a fork of its conversation at its turn.
        earlier = ok(respond, {"input": "Again.", "previous_response_id": earlier["id"]})
    ok(respond, {"input": "Next.", "previous_response_id": earlier["id"]})
    status, answer = respond({"input": "Again.", "previous_response_id": earlier["id"]})
    assert status == 409, answer
    assert answer["error"]["code"] == "fork_too_deep"
    assert answer["error"]["param"] == "previous_response_id"
