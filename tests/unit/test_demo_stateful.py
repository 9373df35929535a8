"""demo-stateful: the demo model over Responses-style stored state, in memory or a directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from turnledger.core.models import ToolCall
from turnledger.providers.base import Continuation, Message, ModelRequest
from turnledger.providers.demo_stateful import (
    RESPONSE_ID,
    DemoStatefulProvider,
    DirectoryDemoState,
    MemoryDemoState,
    demo_state_store,
)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def ask(messages: list[Message], previous: str | None = None, new_from: int = 0) -> ModelRequest:
    continuation = (
        Continuation(previous_response_id=previous, new_from=new_from) if previous else None
    )
    return ModelRequest(model="demo-1", messages=messages, store=True, continuation=continuation)


FIRST = [user("my name is Ann")]


def second(answer: str) -> list[Message]:
    """The next turn's whole context: the first turn, its answer, and the question."""
    return [*FIRST, Message(role="assistant", content=answer), user("what is my name?")]


@pytest.fixture(params=["memory", "directory"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> DemoStatefulProvider:
    if request.param == "memory":
        return DemoStatefulProvider(MemoryDemoState())
    return DemoStatefulProvider(DirectoryDemoState(tmp_path / "state"))


def test_a_stored_response_is_continued_from_its_state(provider: DemoStatefulProvider) -> None:
    first = provider.complete(ask(FIRST))
    assert first.response_id is not None and RESPONSE_ID.fullmatch(first.response_id)
    assert (first.text, first.provider_state) == ("Noted (1 user messages so far).", "fresh")

    # Only the question is new; the name comes from the stored state.
    reply = provider.complete(ask(second(first.text or ""), first.response_id, new_from=2))

    assert (reply.text, reply.provider_state) == ("Your name is Ann.", "continued")
    assert reply.response_id not in (None, first.response_id)


def test_the_continued_context_is_the_stored_one_plus_the_new_messages(
    provider: DemoStatefulProvider,
) -> None:
    first = provider.complete(ask(FIRST))
    assert first.response_id is not None
    # A caller whose context lost the first turn still gets it from the state.
    partial = [Message(role="assistant", content="x"), user("again"), user("what is my name?")]

    reply = provider.complete(ask(partial, first.response_id, new_from=1))

    assert reply.text == "Your name is Ann."
    # Word usage counts the whole rebuilt context: stored (4 + 6) plus new (1 + 4).
    assert reply.usage.input_tokens == 4 + 6 + 1 + 4


def test_an_unknown_id_falls_back_to_the_whole_context(provider: DemoStatefulProvider) -> None:
    reply = provider.complete(ask(second("Noted."), "resp_" + "0" * 24, new_from=2))

    assert (reply.text, reply.provider_state) == ("Your name is Ann.", "fallback")


def test_a_malformed_id_is_unknown_and_never_a_path(provider: DemoStatefulProvider) -> None:
    reply = provider.complete(ask(second("Noted."), "../../etc/passwd", new_from=2))

    assert reply.provider_state == "fallback"


def test_forget_makes_the_next_turn_fall_back(provider: DemoStatefulProvider) -> None:
    first = provider.complete(ask(FIRST))
    assert first.response_id is not None

    assert provider.forget() == 1
    reply = provider.complete(ask(second(first.text or ""), first.response_id, new_from=2))

    assert (reply.text, reply.provider_state) == ("Your name is Ann.", "fallback")


def test_without_store_nothing_is_kept_and_no_id_is_given(provider: DemoStatefulProvider) -> None:
    reply = provider.complete(ModelRequest(model="demo-1", messages=FIRST))

    assert (reply.response_id, reply.provider_state) == (None, "fresh")
    assert provider.forget() == 0


def test_delete_state_deletes_the_ids_it_has(provider: DemoStatefulProvider) -> None:
    kept = [provider.complete(ask(FIRST)).response_id for _ in range(2)]
    assert None not in kept

    deleted = provider.delete_state([*(i for i in kept if i), "resp_" + "f" * 24, "bogus"])

    assert deleted == 2
    assert provider.forget() == 0


def test_tool_calls_are_kept_in_the_state(provider: DemoStatefulProvider) -> None:
    calling = provider.complete(ask([user('/tool lookup {"q": 1}')]))
    assert calling.tool_calls == [ToolCall(id="call_1", name="lookup", arguments={"q": 1})]
    assert calling.response_id is not None
    context = [
        user('/tool lookup {"q": 1}'),
        Message(role="assistant", tool_calls=calling.tool_calls),
        Message(role="tool", tool_call_id="call_1", name="lookup", content="found"),
    ]

    reply = provider.complete(ask(context, calling.response_id, new_from=2))

    assert (reply.text, reply.provider_state) == ("Tool results: lookup: found", "continued")


def test_the_directory_state_is_shared_by_two_instances(tmp_path: Path) -> None:
    one = DemoStatefulProvider(demo_state_store(str(tmp_path)))
    other = DemoStatefulProvider(demo_state_store(str(tmp_path)))
    first = one.complete(ask(FIRST))
    assert first.response_id is not None
    assert (tmp_path / f"{first.response_id}.json").is_file()

    reply = other.complete(ask(second(first.text or ""), first.response_id, new_from=2))
    assert (reply.text, reply.provider_state) == ("Your name is Ann.", "continued")

    assert other.forget() == 2  # both responses, whichever instance stored them
    gone = one.complete(ask(second(first.text or ""), first.response_id, new_from=2))
    assert gone.provider_state == "fallback"
    # Only the fallback's own response is kept; no temporary file is left behind.
    assert [path.name for path in tmp_path.iterdir()] == [f"{gone.response_id}.json"]


def test_the_directory_state_is_shared_with_another_process(tmp_path: Path) -> None:
    first = DemoStatefulProvider(DirectoryDemoState(tmp_path)).complete(ask(FIRST))
    script = f"""
import json
from turnledger.providers.base import Continuation, Message, ModelRequest
from turnledger.providers.demo_stateful import DemoStatefulProvider, DirectoryDemoState
provider = DemoStatefulProvider(DirectoryDemoState({str(tmp_path)!r}))
reply = provider.complete(ModelRequest(
    model="demo-1",
    messages=[Message(role="user", content="what is my name?")],
    continuation=Continuation(previous_response_id={first.response_id!r}, new_from=0),
))
print(json.dumps([reply.text, reply.provider_state]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )

    assert json.loads(done.stdout) == ["Your name is Ann.", "continued"]


def test_an_unreadable_state_file_is_an_unknown_id(tmp_path: Path) -> None:
    store = DirectoryDemoState(tmp_path)
    response_id = "resp_" + "a" * 24
    (tmp_path / f"{response_id}.json").write_text("{not json")

    assert store.get(response_id) is None


def test_the_default_store_is_memory() -> None:
    assert isinstance(demo_state_store(None), MemoryDemoState)
    assert isinstance(DemoStatefulProvider().state, MemoryDemoState)
