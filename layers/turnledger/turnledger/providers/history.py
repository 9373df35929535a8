"""Strict chat histories: built from the working context, then checked.

Strict chat APIs (OpenAI Chat Completions, Bedrock Converse, the models behind
OpenRouter) reject, or worse silently misread, a history whose roles do not
alternate or whose tool results do not line up with the tool calls that asked
for them. The working context is rebuilt from canonical events, and some
perfectly valid conversations are not strict as they are: a turn whose input
holds several user items gives several user messages in a row, and a summary
adds a second system message. :func:`build_strict_history` turns the context
into the history a strict provider accepts, losing nothing:

* every system message joins one system message, first (the system prompt,
  then the summary), joined by a blank line;
* consecutive user messages become one user message, joined by a blank line;
* an assistant answer with no text and no tool calls (the model said
  nothing) is left out, and an assistant text followed by another assistant
  message becomes one assistant message.

What cannot be built without inventing a conversation that did not happen (a
tool result no call asked for, a call without its result) is a bug on our
side: :func:`check_strict_history` reports it as
:class:`~turnledger.core.exceptions.InvalidHistory` after building, and nothing is
sent.
"""

from __future__ import annotations

from ..core.exceptions import InvalidHistory
from .base import Message

#: What joins merged messages: a blank line, so the model still reads separate inputs.
MERGE_SEPARATOR = "\n\n"


def normalize_history(messages: list[Message]) -> list[Message]:
    """The rebuilding of :func:`build_strict_history`, without the final check.

    Usable on a part of a history (the new messages sent over a provider's
    stored state), which on its own need not start with a user message.
    """
    systems = [m.content for m in messages if m.role == "system" and m.content]
    built: list[Message] = []
    if systems:
        built.append(Message(role="system", content=MERGE_SEPARATOR.join(systems)))
    for message in messages:
        if message.role == "system":
            continue
        if (
            message.role == "assistant"
            and not message.tool_calls
            and not (message.content or "").strip()
        ):
            continue  # an empty answer gives the model nothing to read
        previous = built[-1] if built else None
        if previous is not None and previous.role == message.role == "user":
            built[-1] = Message(
                role="user",
                content=MERGE_SEPARATOR.join(
                    text for text in (previous.content, message.content) if text
                ),
            )
        elif (
            previous is not None
            and previous.role == message.role == "assistant"
            and not previous.tool_calls
        ):
            texts = [text for text in (previous.content, message.content) if text]
            built[-1] = Message(
                role="assistant",
                content=MERGE_SEPARATOR.join(texts) if texts else None,
                tool_calls=message.tool_calls,
            )
        else:
            built.append(message)
    return built


def build_strict_history(messages: list[Message]) -> list[Message]:
    """The history a strict chat API accepts for ``messages`` (see the module docstring).

    Args:
        messages: the working context, oldest first.

    Returns:
        The rebuilt history: at most one system message (first), alternating
        user and assistant messages, each tool turn's results right after it.

    Raises:
        InvalidHistory: what is left breaks a rule no rebuilding may repair
            (a bug: the context builder produced tool results out of place).
    """
    built = normalize_history(messages)
    check_strict_history(built)
    return built


def _broken(index: int, rule: str, message: str) -> InvalidHistory:
    return InvalidHistory(
        f"history message {index}: {message}", details={"index": index, "rule": rule}
    )


def check_strict_history(messages: list[Message]) -> None:
    """Check that ``messages`` is a history a strict chat API accepts as it is.

    The rules:

    * an optional ``system`` message first, then only ``user``, ``assistant``
      and ``tool`` messages;
    * the first message after it is a ``user`` message, and ``user`` and
      ``assistant`` messages alternate;
    * an ``assistant`` message with tool calls is followed immediately by
      ``tool`` messages holding exactly one result per call id (no more, no
      fewer, no unknown ids); a completed tool turn is followed by the next
      ``assistant`` message or by a new ``user`` input (a turn that stopped at
      its step limit, or whose client sent a new message, ends on tool results);
    * the history ends with a ``user`` message (the new input) or with a
      completed tool turn (results for every call of the last assistant message).

    Args:
        messages: the working context, oldest first.

    Raises:
        InvalidHistory: a rule is broken; ``details`` has the ``index`` of the
            offending message and the ``rule`` it breaks.
    """
    start = 1 if messages and messages[0].role == "system" else 0
    # What the previous message allows next: "user" (start, or after an
    # assistant answer), "assistant" (after a user message), "after_tools" (an
    # assistant message or a new user input, after a completed tool turn), or
    # "tool" (results still owed for the calls in `open_calls`).
    expect = "user"
    open_calls: set[str] = set()
    calling_index = -1

    for index in range(start, len(messages)):
        message = messages[index]
        role = message.role
        if role == "system":
            raise _broken(index, "system_first", "a system message is only allowed first")

        if expect == "tool":
            if role != "tool":
                missing = sorted(open_calls)
                raise _broken(
                    index,
                    "results_complete",
                    f"tool calls of message {calling_index} have no result: {missing}",
                )
            call_id = message.tool_call_id
            if call_id is None or call_id not in open_calls:
                raise _broken(
                    index,
                    "result_matches_call",
                    f"tool result for {call_id!r} answers no open call of message "
                    f"{calling_index} (unknown id or a second result)",
                )
            open_calls.remove(call_id)
            if not open_calls:
                expect = "after_tools"
            continue

        if role == "tool":
            raise _broken(
                index,
                "result_follows_call",
                "a tool result must follow an assistant message with tool calls",
            )
        if role != expect and not (expect == "after_tools" and role in ("user", "assistant")):
            raise _broken(
                index,
                "alternation",
                f"expected a {expect.replace('after_tools', 'user or assistant')} message, "
                f"found a {role} message",
            )
        if role == "user":
            expect = "assistant"
            continue

        ids = [call.id for call in message.tool_calls]
        if len(set(ids)) != len(ids):
            raise _broken(index, "unique_call_ids", f"tool call ids repeat: {ids}")
        if ids:
            open_calls = set(ids)
            calling_index = index
            expect = "tool"
        else:
            expect = "user"

    last = len(messages) - 1
    if expect == "tool":
        raise _broken(
            last,
            "results_complete",
            f"tool calls of message {calling_index} have no result: {sorted(open_calls)}",
        )
    if last < start:
        raise _broken(max(last, 0), "ends_with_input", "the history has no user message")
    if expect == "user":
        raise _broken(
            last,
            "ends_with_input",
            "the history ends with an assistant answer; expected the new user "
            "message or tool results",
        )
