"""Chat Completions on the OpenAI face beside its Responses API, measured in one run.

As :mod:`bench.openai_face` runs its loops (DynamoDB Local, the table built from
``template.yaml``, S3 on moto's server; the API's ``lambda_handler`` answering API
Gateway's own events, ``events/openai-response.json`` and
``events/openai-chat-completion.json`` with body and tenant replaced; the demo model echoing
a 700-character answer to each 300-character user message), two stateless loops of
``--calls`` calls each, interleaved call by call, each in its own tenant:

1. **responses**: ``POST /openai/v1/responses``, each call resending every earlier input and
   output item and the new user message;
2. **chat**: ``POST /openai/v1/chat/completions``, each call resending every earlier message
   (the answers as assistant messages) and the new user message.

Both faces find the conversation a history continues by the same transcript chain
(:mod:`turnledger.api.openai.matching`); a chat call also looks its whole history up once
(:func:`~turnledger.api.openai.matching.repeated`: the same request again after a paused
turn). Capacity is priced as :mod:`bench.openai_face` prices it; handler time is the whole
``lambda_handler`` call. Writes the section ``## OpenAI face: Chat Completions beside
Responses`` of ``bench/RESULTS.md``.

Run: ``make bench ARGS=chat`` or ``.venv/bin/python -m bench.openai_chat``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.openai_face import EVENTS_DIR, Call, Face, Loop, alternate, face_on_engines, message
from bench.results import command_line, machine_line, publish

SECTION = "OpenAI face: Chat Completions beside Responses"


def loops(face: Face, calls: int) -> tuple[Loop, Loop]:
    """The stateless Responses loop and the Chat Completions loop, ``calls`` calls each,
    interleaved (:func:`~bench.openai_face.alternate`)."""
    face.templates["chat-completion"] = json.loads(
        (EVENTS_DIR / "openai-chat-completion.json").read_text(encoding="utf-8")
    )
    items: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []

    def responses_call(number: int) -> Call:
        nonlocal items
        sent = [*items, message(number)]
        body = {"model": "demo-1", "input": sent}
        answer, sample = face.call("response", "bench-responses", body, items_sent=len(sent))
        items = [*sent, *answer["output"]]
        return sample

    def chat_call(number: int) -> Call:
        nonlocal messages
        said = message(number)
        sent = [*messages, {"role": "user", "content": said["content"]}]
        body = {"model": "demo-1", "messages": sent}
        answer, sample = face.call("chat-completion", "bench-chat", body, items_sent=len(sent))
        reply = answer["choices"][0]["message"]
        messages = [*sent, {"role": "assistant", "content": reply["content"]}]
        return sample

    with (
        face.loop("responses", "bench-responses") as responses,
        face.loop("chat", "bench-chat") as chat,
    ):
        alternate(calls, responses, responses_call, chat, chat_call)
    return responses, chat


@dataclass(frozen=True)
class Results:
    """Everything the section reports."""

    calls: int
    responses: Loop
    chat: Loop
    ddb_version: str


def run(calls: int) -> Results:
    """Start the engines and run the two loops."""
    with face_on_engines() as (face, ddb_version):
        responses_loop, chat_loop = loops(face, calls)
    return Results(calls, responses_loop, chat_loop, ddb_version)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def render(results: Results, command: str) -> str:
    """The section's markdown."""
    n = results.calls
    marked = sorted({1, max(1, n // 2), n})
    pair = (("responses", results.responses), ("chat", results.chat))
    lines = [
        f"Command: {command}; alone: `make bench ARGS=chat`. Run: {machine_line()}.",
        "",
        f"DynamoDB Local {results.ddb_version}, in memory, on loopback; S3 on moto's server. "
        "The API's `lambda_handler` answers API Gateway events "
        "(`events/openai-response.json`, `events/openai-chat-completion.json`, body and "
        "tenant replaced); the demo model echoes a 700-character answer to each user "
        "message. Two stateless loops, interleaved call by call, each in its own tenant: "
        "**responses** resends every earlier item and the new message to `POST "
        "/openai/v1/responses`; **chat** resends every earlier message and the new one to "
        "`POST /openai/v1/chat/completions`. Capacity priced as *OpenAI face: chained and "
        "stateless loops* prices it.",
        "",
        "### Stored",
        "",
        "| loop | calls | conversations kept | events stored | expected (2 per call) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, loop in pair:
        lines.append(
            f"| {name} | {len(loop.calls)} | {loop.conversations} | {loop.events} | {2 * n} |"
        )
    lines += [
        "",
        "### Per call",
        "",
        "| call | loop | items sent | WCU priced | RCU priced | WCU reported | RCU reported "
        "| storage ms | handler ms |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for number in marked:
        for name, loop in pair:
            c = loop.calls[number - 1]
            lines.append(
                f"| {number} | {name} | {c.items_sent} | {c.wcu:g} | {c.rcu:g} | "
                f"{c.reported_wcu:g} | {c.reported_rcu:g} | {_ms(c.storage_seconds)} | "
                f"{_ms(c.handler_seconds)} |"
            )
    for name, loop in pair:
        lines.append(
            f"| **1..{n}** | {name} | {sum(c.items_sent for c in loop.calls)} | "
            f"{sum(c.wcu for c in loop.calls):g} | {sum(c.rcu for c in loop.calls):g} | "
            f"{sum(c.reported_wcu for c in loop.calls):g} | "
            f"{sum(c.reported_rcu for c in loop.calls):g} | | |"
        )

    def median(loop: Loop, attribute: str) -> float:
        return statistics.median(getattr(c, attribute) for c in loop.calls)

    lines += [
        "",
        "### Median per call",
        "",
        "| | responses | chat | chat / responses |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, attribute, scale in (
        ("WCU priced", "wcu", 1.0),
        ("RCU priced", "rcu", 1.0),
        ("storage ms", "storage_seconds", 1000.0),
        ("handler ms", "handler_seconds", 1000.0),
    ):
        left = median(results.responses, attribute) * scale
        right = median(results.chat, attribute) * scale
        ratio = f"{right / left:.2f}" if left else "-"
        lines.append(f"| {label} | {left:.1f} | {right:.1f} | {ratio} |")
    extra_rcu = median(results.chat, "rcu") - median(results.responses, "rcu")
    lines += [
        "",
        "### Reading",
        "",
        f"- Stored: each loop keeps {results.responses.conversations} and "
        f"{results.chat.conversations} conversation(s) with {results.responses.events} and "
        f"{results.chat.events} events for {2 * n} messages: each message once on either face.",
        f"- Reads: a chat call reads {extra_rcu:g} RCU more than a Responses call (median): "
        "its look-up of its whole history (a paused turn's request sent again), one `GetItem` "
        "that misses. Writes are the same: both faces write the same turn, chain and index.",
        "- Time: the two medians differ by the chat call's extra look-up and its reading of "
        "messages into items; the machine is shared, compare the medians, not single calls.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its section."""
    parser = argparse.ArgumentParser(prog="python -m bench.openai_chat", description=__doc__)
    parser.add_argument("--calls", type=int, default=20, help="calls per loop (default 20)")
    parser.add_argument("--print-only", action="store_true", help="print, do not write")
    args = parser.parse_args(argv)
    print(f"chat completions benchmark: {args.calls} calls per loop", flush=True)
    results = run(args.calls)
    command = command_line("bench.openai_chat", sys.argv[1:] if argv is None else argv)
    publish(SECTION, render(results, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
