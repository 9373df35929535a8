"""The demo model: deterministic, and it reads only the context it is sent.

Because it remembers nothing between calls, it shows whether the working
context a turn sends really carries the conversation (``What is my name?``
is answered from an earlier turn's user message, or not at all). Its rules,
from the HTTP contract, applied in this order:

* the context ends with tool results: ``Tool results: NAME: OUTPUT; ...`` in
  the order of the calling assistant message's tool calls (a rejected or
  failed call's OUTPUT is its error text);
* each line ``/tool NAME {json}`` of the last user message is one tool call
  (ids ``call_1``, ``call_2``, ... in line order);
* the last user message starts with ``echo:``: the rest of it, trimmed, exactly
  as received (so redaction can be seen);
* the last user message asks ``what is my name``: ``Your name is X.`` from the
  latest ``my name is X`` of the user messages, else of the summaries in its
  context, else of the recalled memory block (a system message starting with
  ``Memory of this user``), or ``I don't know your name yet.``;
* otherwise ``Noted (K user messages so far).``

In JSON mode (``response_format`` set) a text answer ``T`` comes as the JSON
object ``{"answer": T}``.

As a summarizer (``purpose="summary"``, the request
:func:`turnledger.context.assembly.summary_request`
builds) it answers ``Summary of earlier conversation: `` and items joined by
`` | ``: the previous summary's items, then each newly summarized user message
cut to 60 characters; past 12 items it keeps every item holding ``my name
is`` and the newest others, 12 in all.

As the memory extractor (``purpose="memory"``, the request
:func:`turnledger.context.memory.extraction_request` builds) it answers the JSON
``{"memories": [{"key": K, "text": T}, ...]}`` from each user message, by these
rules (X runs to the end of its sentence): ``my name is X`` -> ``name``,
``My name is X.``; ``I live in X`` or ``I moved to X`` -> ``city``, ``I live in X.``;
``answer in X`` -> ``language``, ``Answer in X.``; ``I work on X`` -> ``work``,
``I work on X.``. A later statement of a key wins.

Usage is counted in words: ``input_tokens`` over every message's content,
``output_tokens`` over the reply's text (for tool calls: over the ``/tool``
lines that asked for them).
"""

from __future__ import annotations

import json
import re
import time

from ..core.exceptions import ProviderError
from ..core.models import ToolCall, Usage
from ..core.strict_json import tool_arguments
from .base import Message, ModelReply, ModelRequest, Provider, TextSink

_TOOL_LINE = re.compile(r"/tool\s+(?P<name>\S+)(?:\s+(?P<arguments>.*))?", re.DOTALL)
_ASKS_NAME = re.compile(r"what\s+is\s+my\s+name", re.IGNORECASE)
# `[^\W_]` is a letter or a digit, in any script.
_GIVES_NAME = re.compile(r"\bmy\s+name\s+is\s+(?P<name>[^\W_]+)", re.IGNORECASE)


#: What a recalled memory block starts with (``turnledger.context.memory.MEMORY_PREFIX``).
MEMORY_PREFIX = "Memory of this user"
#: The demo extractor's rules: (pattern, key, the record's text for the matched ``X``).
_FACTS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (_GIVES_NAME, "name", "My name is {}."),
    (
        re.compile(r"\bI\s+(?:live\s+in|moved\s+to)\s+(?P<x>[^.!?,;\n]+)", re.I),
        "city",
        "I live in {}.",
    ),
    (re.compile(r"\banswer\s+in\s+(?P<x>[^.!?,;\n]+)", re.I), "language", "Answer in {}."),
    (re.compile(r"\bI\s+work\s+on\s+(?P<x>[^.!?,;\n]+)", re.I), "work", "I work on {}."),
)


def extract(request: ModelRequest) -> str:
    """The demo extractor's answer to a memory request (see the module docstring).

    Raises:
        ProviderError: the request is not the JSON a memory request holds.
    """
    user = next((m.content for m in request.messages if m.role == "user"), None)
    try:
        texts = [str(text) for text in json.loads(user or "")["messages"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProviderError(
            "the demo extractor got a request it cannot read",
            details={"reason": "invalid_memory_request", "error": type(exc).__name__},
        ) from exc
    found: dict[str, str] = {}
    for text in texts:
        for pattern, key, template in _FACTS:
            for match in pattern.finditer(text):
                value = " ".join((match.groupdict().get("x") or match["name"]).split())
                found.pop(key, None)  # the latest statement goes last
                found[key] = template.format(value)
    memories = [{"key": key, "text": text} for key, text in found.items()]
    return json.dumps({"memories": memories}, ensure_ascii=False)


#: A word with the whitespace before it: the pieces the demo model streams.
_PIECE = re.compile(r"\s*\S+")


def stream_words(text: str | None, on_text: TextSink, delay_ms: int) -> None:
    """Hand ``text`` to ``on_text`` word by word, word ``i`` (from 1) ready ``i * delay_ms``
    after the call: a model writes at its own pace, so the time ``on_text`` takes (a draft's
    write) delays a word only when it outlasts the word's own delay, as a real model's
    stream buffers what its reader has not read yet."""
    if not text:
        return
    pieces = _PIECE.findall(text)
    tail = text[sum(len(p) for p in pieces) :]  # trailing whitespace, kept exactly
    started = time.monotonic()
    for number, piece in enumerate(pieces, start=1):
        if delay_ms:
            time.sleep(max(started + number * delay_ms / 1000 - time.monotonic(), 0))
        on_text(piece)
    if tail:
        on_text(tail)


def _words(text: str | None) -> int:
    return len(text.split()) if text else 0


def _tool_results(messages: list[Message]) -> str | None:
    """The answer to a context that ends with tool results, or ``None`` if it does not."""
    end = len(messages)
    first = end
    while first > 0 and messages[first - 1].role == "tool":
        first -= 1
    if first == end:
        return None
    results = messages[first:end]
    calls = messages[first - 1].tool_calls if first > 0 else []
    outputs = {result.tool_call_id: result for result in results}
    parts: list[str] = []
    for call in calls:
        result = outputs.pop(call.id, None)
        if result is not None:
            parts.append(f"{call.name}: {result.content or ''}")
    # Results the assistant message did not ask for still reach the answer, so a
    # broken context shows up instead of vanishing.
    for result in outputs.values():
        parts.append(f"{result.name or result.tool_call_id}: {result.content or ''}")
    return "Tool results: " + "; ".join(parts)


def _tool_calls(text: str) -> tuple[list[ToolCall], int]:
    """The ``/tool`` lines of ``text`` as calls, and how many words those lines hold."""
    calls: list[ToolCall] = []
    words = 0
    for line in text.splitlines():
        match = _TOOL_LINE.fullmatch(line.strip())
        if match is None:
            continue
        arguments, raw = tool_arguments(match["arguments"] or "")
        calls.append(
            ToolCall(
                id=f"call_{len(calls) + 1}",
                name=match["name"],
                arguments=arguments,
                raw_arguments=raw,
            )
        )
        words += _words(line)
    return calls, words


def _latest_name(texts: list[str]) -> str | None:
    for text in reversed(texts):
        found = list(_GIVES_NAME.finditer(text))
        if found:
            return found[-1]["name"]
    return None


#: How every summary starts (the same text as ``turnledger.context.assembly.SUMMARY_PREFIX``).
SUMMARY_PREFIX = "Summary of earlier conversation:"
#: Items a demo summary keeps, and how long a summarized user message may be.
SUMMARY_ITEMS = 12
SUMMARY_ITEM_CHARS = 60
_ITEM_SEPARATOR = " | "


def _summary_items(summary: str | None) -> list[str]:
    if not summary:
        return []
    text = summary.strip().removeprefix(SUMMARY_PREFIX).strip()
    return [item for item in text.split(_ITEM_SEPARATOR) if item]


def _keep(items: list[str]) -> list[str]:
    """At most :data:`SUMMARY_ITEMS` items: every name, then the newest others, in order."""
    if len(items) <= SUMMARY_ITEMS:
        return items
    names = [i for i, item in enumerate(items) if _GIVES_NAME.search(item)][-SUMMARY_ITEMS:]
    others = [i for i in range(len(items)) if i not in set(names)]
    keep = set(names) | set(others[len(others) - (SUMMARY_ITEMS - len(names)) :])
    return [item for i, item in enumerate(items) if i in keep]


def summarize(request: ModelRequest) -> str:
    """The demo summarizer's answer to a summary request (see the module docstring).

    Raises:
        ProviderError: the request is not the JSON a summary request holds.
    """
    user = next((m.content for m in request.messages if m.role == "user"), None)
    try:
        payload = json.loads(user or "")
        previous = payload.get("previous_summary")
        messages = payload["messages"]
        new = [
            " ".join(str(m.get("content") or "").split())[:SUMMARY_ITEM_CHARS]
            for m in messages
            if m.get("role") == "user"
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProviderError(
            "the demo summarizer got a request it cannot read",
            details={"reason": "invalid_summary_request", "error": type(exc).__name__},
        ) from exc
    items = _keep([*_summary_items(previous), *(item for item in new if item)])
    return f"{SUMMARY_PREFIX} " + _ITEM_SEPARATOR.join(items)


class DemoProvider(Provider):
    """A deterministic stand-in model for local use and tests (provider ``demo``)."""

    name = "demo"
    #: Its estimate is its usage: nothing to calibrate.
    estimate_is_exact = True

    def __init__(self, token_delay_ms: int = 0) -> None:
        """``token_delay_ms``: how long the model takes per word of its answer (a slow
        model): :meth:`complete` waits it for every word, :meth:`stream` before each."""
        self.token_delay_ms = max(token_delay_ms, 0)

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """The same answer as :meth:`complete`, handed over word by word.

        Each piece is a word with the whitespace before it, so the pieces join to
        exactly the answer; ``token_delay_ms`` passes before each one.
        """
        reply = self.answer(request)
        stream_words(reply.text, on_text, self.token_delay_ms)
        return reply

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer by the demo rules (see the module docstring); never fails.

        With a token delay, the whole answer takes as long as streaming it would.
        """
        reply = self.answer(request)
        if self.token_delay_ms and reply.text and request.purpose == "turn":
            time.sleep(self.token_delay_ms * len(_PIECE.findall(reply.text)) / 1000)
        return reply

    def estimate_tokens(self, text: str) -> int:
        """Whitespace-separated words: exactly what the demo model counts as usage."""
        return _words(text)

    def answer(self, request: ModelRequest) -> ModelReply:
        """The demo rules' answer to ``request``, at once (see the module docstring)."""
        messages = request.messages
        usage_in = sum(_words(message.content) for message in messages)

        if request.purpose == "memory":
            text: str | None = extract(request)
        elif request.purpose == "summary":
            text = summarize(request)
        else:
            text = _tool_results(messages)
        if text is None:
            user_texts = [m.content or "" for m in messages if m.role == "user"]
            last = user_texts[-1] if user_texts else ""
            calls, words = _tool_calls(last)
            if calls:
                return ModelReply(
                    tool_calls=calls,
                    usage=Usage(input_tokens=usage_in, output_tokens=words),
                    model=request.model,
                )
            summaries = [
                m.content or ""
                for m in messages
                if m.role == "system" and (m.content or "").startswith(SUMMARY_PREFIX)
            ]
            memory = [
                m.content or ""
                for m in messages
                if m.role == "system" and (m.content or "").startswith(MEMORY_PREFIX)
            ]
            text = self._answer(last, user_texts, [*memory, *summaries])

        if request.response_format is not None and request.purpose == "turn":
            text = json.dumps({"answer": text}, ensure_ascii=False)
        return ModelReply(
            text=text,
            usage=Usage(input_tokens=usage_in, output_tokens=_words(text)),
            model=request.model,
        )

    @staticmethod
    def _answer(last: str, user_texts: list[str], summaries: list[str]) -> str:
        if last.startswith("echo:"):
            return last.removeprefix("echo:").strip()
        if _ASKS_NAME.search(last):
            name = _latest_name(user_texts) or _latest_name(summaries)
            return f"Your name is {name}." if name else "I don't know your name yet."
        return f"Noted ({len(user_texts)} user messages so far)."
