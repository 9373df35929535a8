"""The demo model's rules, as the HTTP contract states them (API.md, "The demo model")."""

from __future__ import annotations

from typing import Any

import pytest
from turnledger.core.config import Settings
from turnledger.core.models import ToolCall
from turnledger.providers.base import Message, ModelReply, ModelRequest
from turnledger.providers.demo import DemoProvider
from turnledger.providers.factory import build_provider


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str | None = None, *calls: ToolCall) -> Message:
    return Message(role="assistant", content=text, tool_calls=list(calls))


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def result(call_id: str, name: str, output: str, *, is_error: bool = False) -> Message:
    return Message(role="tool", tool_call_id=call_id, name=name, content=output, is_error=is_error)


def ask(*messages: Message, model: str = "demo-1") -> ModelReply:
    return DemoProvider().complete(ModelRequest(model=model, messages=list(messages)))


# --- rule 3: noted ---------------------------------------------------------------------


def test_counts_user_messages_in_its_context() -> None:
    reply = ask(user("hello"), assistant("Noted (1 user messages so far)."), user("again"))

    assert reply.text == "Noted (2 user messages so far)."
    assert reply.tool_calls == []


def test_system_and_assistant_messages_are_not_counted() -> None:
    reply = ask(Message(role="system", content="be nice"), user("hi"))

    assert reply.text == "Noted (1 user messages so far)."


# --- rule 2: name recall --------------------------------------------------------------


def test_recalls_a_name_given_in_an_earlier_turn() -> None:
    reply = ask(
        user("My name is Ann."),
        assistant("Noted (1 user messages so far)."),
        user("The weather is nice."),
        assistant("Noted (2 user messages so far)."),
        user("What is my name?"),
    )

    assert reply.text == "Your name is Ann."


def test_the_latest_name_wins_across_messages() -> None:
    reply = ask(
        user("my name is Ann"),
        assistant("ok"),
        user("Actually MY NAME IS Bob, sorry."),
        assistant("ok"),
        user("what is my name"),
    )

    assert reply.text == "Your name is Bob."


def test_the_last_occurrence_within_a_message_wins() -> None:
    reply = ask(
        user("My name is Ann. No wait, my name is Cy3."),
        assistant("ok"),
        user("Tell me: WHAT IS MY NAME?"),
    )

    assert reply.text == "Your name is Cy3."


def test_a_name_in_the_question_itself_counts() -> None:
    assert ask(user("My name is Zoë. What is my name?")).text == "Your name is Zoë."


def test_a_newer_message_without_a_name_does_not_hide_an_older_one() -> None:
    reply = ask(
        user("my name is Ann"),
        assistant("ok"),
        user("hi"),
        assistant("ok"),
        user("what is my name?"),
    )

    assert reply.text == "Your name is Ann."


def test_names_in_assistant_messages_are_ignored() -> None:
    reply = ask(user("hello"), assistant("My name is Demo."), user("What is my name?"))

    assert reply.text == "I don't know your name yet."


def test_without_any_name_it_says_so() -> None:
    assert ask(user("What is my name?")).text == "I don't know your name yet."


def test_a_name_outside_the_context_is_not_known() -> None:
    """The model reads only what it is sent: a trimmed context forgets the name."""
    full = ask(user("My name is Ann."), assistant("ok"), user("What is my name?"))
    trimmed = ask(user("What is my name?"))

    assert full.text == "Your name is Ann."
    assert trimmed.text == "I don't know your name yet."


# --- rule 1: tool lines ----------------------------------------------------------------


def test_a_tool_line_becomes_a_tool_call() -> None:
    reply = ask(user('/tool get_weather {"city": "Paris"}'))

    assert reply.text is None
    assert reply.tool_calls == [
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})
    ]


def test_several_tool_lines_are_parallel_calls_in_line_order() -> None:
    text = "\n".join(
        [
            "Please do these:",
            '/tool send_email {"to": "a@example.com"}',
            "  /tool lookup_user {}",
            "/tool ping",
        ]
    )

    reply = ask(user(text))

    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "send_email", {"to": "a@example.com"}),
        ("call_2", "lookup_user", {}),
        ("call_3", "ping", {}),
    ]
    assert all(c.raw_arguments is None for c in reply.tool_calls)


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"', "42"])
def test_arguments_that_are_no_json_object_are_kept_raw(raw: str) -> None:
    reply = ask(user(f"/tool echo {raw}"))

    assert reply.tool_calls == [ToolCall(id="call_1", name="echo", arguments={}, raw_arguments=raw)]


def test_only_the_last_user_message_is_read_for_tool_lines() -> None:
    reply = ask(user("/tool ping {}"), assistant("ok"), user("and now?"))

    assert reply.tool_calls == []
    assert reply.text == "Noted (2 user messages so far)."


@pytest.mark.parametrize("text", ["/toolbox {}", "say /tool ping {}", "/tool"])
def test_lines_not_of_the_tool_form_are_plain_text(text: str) -> None:
    assert ask(user(text)).tool_calls == []


def test_tool_lines_win_over_the_name_question() -> None:
    reply = ask(user("What is my name?\n/tool lookup_user {}"))

    assert [c.name for c in reply.tool_calls] == ["lookup_user"]


# --- tool results ----------------------------------------------------------------------


def test_tool_results_are_answered_in_call_order() -> None:
    calls = (call("call_1", "get_weather", city="Paris"), call("call_2", "lookup_user"))
    reply = ask(
        user("/tool get_weather {}\n/tool lookup_user {}"),
        assistant(None, *calls),
        # Results arrive in another order than the calls: the answer follows the calls.
        result("call_2", "lookup_user", '{"name": "Ann"}'),
        result("call_1", "get_weather", "sunny"),
    )

    assert reply.text == 'Tool results: get_weather: sunny; lookup_user: {"name": "Ann"}'
    assert reply.tool_calls == []


def test_rejected_and_failed_calls_answer_with_their_error_text() -> None:
    reply = ask(
        user("/tool send_email {}\n/tool delete_record {}"),
        assistant(None, call("call_1", "send_email"), call("call_2", "delete_record")),
        result("call_1", "send_email", "rejected: wrong recipient", is_error=True),
        result("call_2", "delete_record", "error: HTTP 500", is_error=True),
    )

    assert reply.text == (
        "Tool results: send_email: rejected: wrong recipient; delete_record: error: HTTP 500"
    )


def test_tool_results_take_precedence_over_the_user_message() -> None:
    """The last user message still holds its /tool line; the results are answered instead."""
    reply = ask(
        user("/tool ping {}"),
        assistant(None, call("call_1", "ping")),
        result("call_1", "ping", "pong"),
    )

    assert reply.text == "Tool results: ping: pong"
    assert reply.tool_calls == []


def test_results_of_an_earlier_turn_do_not_answer_a_new_message() -> None:
    reply = ask(
        user("/tool ping {}"),
        assistant(None, call("call_1", "ping")),
        result("call_1", "ping", "pong"),
        assistant("Tool results: ping: pong"),
        user("thanks"),
    )

    assert reply.text == "Noted (2 user messages so far)."


# --- usage and model -------------------------------------------------------------------


def test_usage_counts_words_and_the_model_is_echoed() -> None:
    reply = ask(
        Message(role="system", content="You are terse."),
        user("My name is Ann."),
        assistant("Noted (1 user messages so far)."),
        user("What is my name?"),
        model="demo-xl",
    )

    # 3 + 4 + 6 + 4 words sent; "Your name is Ann." is 4 words.
    assert reply.usage.input_tokens == 17
    assert reply.usage.output_tokens == 4
    assert reply.model == "demo-xl"


def test_usage_of_a_tool_call_reply_counts_the_tool_lines() -> None:
    reply = ask(user('hello\n/tool get_weather {"city": "Paris"}'))

    assert reply.usage.input_tokens == 5
    assert reply.usage.output_tokens == 4


def test_the_factory_builds_the_demo_provider() -> None:
    provider = build_provider(Settings(provider="demo"))

    assert isinstance(provider, DemoProvider)
    assert (provider.name, provider.stateful, provider.estimate_is_exact) == ("demo", False, True)


def test_the_factory_rejects_an_unknown_provider_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="demo, demo-stateful, openai-chat"):
        build_provider(Settings(provider="gpt-magic"))
