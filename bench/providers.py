"""Provider state: what a turn sends when the provider's stored state is used, and when not.

Drives one conversation of ``--turns`` turns (a 300-character user message
each, a 700-character answer) through :class:`~turnledger.turn.pipeline.Conversations`
with the ``openai-responses`` provider, over real HTTP to the fake Responses
API of the tests (``tests/functional/fake_openai.py``, which keeps stored
responses and their ``previous_response_id`` chains as OpenAI does), on the
in-memory store. The same conversation is run three times:

* ``fresh``: the provider keeps nothing (``OPENAI_RESPONSES_STORE=false``), so
  no cursor is ever usable and every turn sends the whole context;
* ``continued``: every turn after the first sends ``previous_response_id``
  and only its new items;
* ``fallback``: as ``continued``, but the provider loses its state just
  before the last turn, which then sends the refused continuation and the
  whole context again, in the same request cycle.

For each turn it records the bytes of every ``POST /responses`` body the turn
sent, the input items of the last one, ``context.messages_sent`` and the input
tokens the provider billed. The fake's model checks every answer: it counts
the user messages it *saw* (stored state plus new items), which must be the
turn's number, so a continuation that lost anything fails the run. The
section ``## Provider state`` of ``bench/RESULTS.md`` is rewritten.

Run from the repository root: ``.venv/bin/python -m bench.providers`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from turnledger.api.schemas import TurnRequest
from turnledger.core.config import ModelSpec, Settings
from turnledger.core.observability import metrics
from turnledger.providers.openai_responses import OpenAIResponsesProvider
from turnledger.store.memory import MemoryConversationStore
from turnledger.turn.pipeline import Conversations

from bench.conversation import REPLY_CHARS, USER_CHARS, text_of
from bench.results import command_line, machine_line, publish
from tests.functional.fake_openai import (
    RESPONSES_PATH,
    FakeOpenAI,
    RecordedRequest,
    Scripted,
    response_reply,
)
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Provider state"
MODEL = "gpt-bench"
CALLER = Caller(tenant="bench", actor="bench")
#: Turns shown one by one in the table (the last turn is always shown).
MARKS = (1, 2, 10, 25)
MODES = ("fresh", "continued", "fallback")


@dataclass(frozen=True)
class Sample:
    """What one turn sent."""

    turn: int
    state: str
    requests: int
    bytes_sent: int
    items_sent: int
    messages_sent: int
    input_tokens: int
    seconds: float


def _words(item: dict[str, Any]) -> int:
    content = item.get("content") or item.get("output") or item.get("arguments") or ""
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) for part in content)
    return len(str(content).split())


def model_of(fake: FakeOpenAI) -> Callable[[RecordedRequest], Scripted]:
    """The fake's model: a long answer naming how many user messages it saw."""

    def respond(request: RecordedRequest) -> Scripted:
        body = request.json()
        items = body.get("input", [])
        previous = body.get("previous_response_id")
        context = [*fake.stored.get(previous, []), *items] if previous else list(items)
        users = sum(
            1 for item in context if item.get("type") == "message" and item.get("role") == "user"
        )
        text = f"[{users} user messages seen] " + text_of(f"reply:{users}", REPLY_CHARS)
        billed = sum(_words(item) for item in context)
        return response_reply(text, model=body["model"], input_tokens=billed, output_tokens=100)

    return respond


def run(mode: str, turns: int) -> list[Sample]:
    """Drive one conversation of ``turns`` turns in ``mode``; its samples, turn by turn."""
    with FakeOpenAI() as fake:
        fake.default = model_of(fake)
        provider = OpenAIResponsesProvider(
            base_url=fake.base_url, max_retries=0, store=mode != "fresh"
        )
        settings = replace(
            Settings(),
            provider=provider.name,
            model=MODEL,
            # A window the whole conversation fits in: what is measured is provider state,
            # not compaction.
            models={MODEL: ModelSpec(context_window=1_000_000, answer_reserve=4096)},
        )
        service = Conversations(
            store=MemoryConversationStore(), provider=provider, settings=settings
        )
        samples: list[Sample] = []
        for number in range(1, turns + 1):
            if mode == "fallback" and number == turns:
                fake.lose_responses()
            seen = len(fake.requests)
            started = time.perf_counter()
            reply = edge.turn(
                service, CALLER, "bench", TurnRequest(input=text_of(f"user:{number}", USER_CHARS))
            )
            seconds = time.perf_counter() - started
            # A Lambda invocation flushes its metrics; here they would pile up until
            # Powertools prints them at 100 values (POWERTOOLS_METRICS_DISABLED or not).
            metrics.clear_metrics()
            sent = [
                r for r in fake.requests[seen:] if r.method == "POST" and r.path == RESPONSES_PATH
            ]
            assert reply.output_text is not None
            assert reply.output_text.startswith(f"[{number} user messages seen]"), (
                f"{mode} turn {number}: the model did not see the whole conversation"
            )
            assert reply.context.summary_through is None, "no compaction is measured here"
            samples.append(
                Sample(
                    turn=number,
                    state=reply.context.provider_state,
                    requests=len(sent),
                    bytes_sent=sum(len(r.body) for r in sent),
                    items_sent=len(sent[-1].json()["input"]),
                    messages_sent=reply.context.messages_sent,
                    input_tokens=reply.usage.input_tokens,
                    seconds=seconds,
                )
            )
    return samples


def render(results: dict[str, list[Sample]], turns: int, seconds: float, command: str) -> str:
    """The markdown section (without its heading)."""
    fresh, continued, fallback = (results[mode] for mode in MODES)
    last_fresh, last_continued, last_fallback = fresh[-1], continued[-1], fallback[-1]
    lines = [
        f"{command}; {machine_line()}.",
        "",
        f"One conversation of {turns} turns ({USER_CHARS}-character user messages, "
        f"{REPLY_CHARS}-character answers), `openai-responses` over HTTP to the fake",
        "Responses API of the tests (which keeps stored responses as OpenAI does), in-memory "
        "store. `fresh`: the provider stores nothing (`OPENAI_RESPONSES_STORE=false`), so no",
        "cursor is usable and the whole context is sent; `continued`: `previous_response_id` "
        "plus only the new items. The fake model checked on every turn that it saw every "
        "user message.",
        "",
        "| turn | fresh: bytes sent | continued: bytes sent | fresh: items | "
        "continued: items | state (continued run) |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for mark in sorted({*(m for m in MARKS if m < turns), turns}):
        a, b = fresh[mark - 1], continued[mark - 1]
        lines.append(
            f"| {mark} | {a.bytes_sent:,} | {b.bytes_sent:,} | {a.items_sent} | "
            f"{b.items_sent} | {b.state} |"
        )
    total_fresh = sum(s.bytes_sent for s in fresh)
    total_continued = sum(s.bytes_sent for s in continued)
    lines += [
        "",
        f"- At turn {turns}, `continued` sends {last_continued.bytes_sent:,} bytes and "
        f"{last_continued.messages_sent} message (`context.messages_sent`) where `fresh` "
        f"sends {last_fresh.bytes_sent:,} bytes and {last_fresh.messages_sent} messages: "
        f"{last_fresh.bytes_sent / last_continued.bytes_sent:.0f}x fewer bytes. Over the "
        f"{turns} turns: {total_continued:,} bytes against {total_fresh:,} "
        f"({total_fresh / total_continued:.1f}x).",
        f"- A continued request stays the same size whatever the conversation's length "
        f"({min(s.bytes_sent for s in continued[1:]):,}-"
        f"{max(s.bytes_sent for s in continued[1:]):,} bytes from turn 2 on); a fresh one "
        f"grows by about {(last_fresh.bytes_sent - fresh[0].bytes_sent) / (turns - 1):,.0f} "
        "bytes a turn.",
        f"- Input tokens billed at turn {turns} are the same either way "
        f"({last_fresh.input_tokens:,} fresh, {last_continued.input_tokens:,} continued, by "
        "the fake's word count): the provider bills the stored context too. What stored "
        "state saves is what crosses the network and what the provider must parse (and, at "
        "OpenAI, cached input is billed at a discount).",
        f"- Losing the state before turn {turns} (`fallback`): that turn sent "
        f"{last_fallback.requests} requests, {last_fallback.bytes_sent:,} bytes (the refused "
        f"continuation, then the whole context, {last_fallback.messages_sent} messages), "
        f"state `{last_fallback.state}`, and answered correctly.",
        f"- Median time of the last 10 turns (pipeline, loopback HTTP): fresh "
        f"{statistics.median(s.seconds for s in fresh[-10:]) * 1000:.1f} ms, continued "
        f"{statistics.median(s.seconds for s in continued[-10:]) * 1000:.1f} ms. "
        f"The three runs took {seconds:.1f} s.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.providers", description=__doc__)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    if args.turns < 2:
        parser.error("--turns must be at least 2")
    # The service's CloudWatch metrics would print a JSON blob per turn.
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
    print(f"provider state benchmark: {args.turns} turns, {', '.join(MODES)}", flush=True)
    started = time.perf_counter()
    results = {mode: run(mode, args.turns) for mode in MODES}
    seconds = time.perf_counter() - started
    assert all(s.state == "fresh" for s in results["fresh"])
    assert [s.state for s in results["continued"]][1:] == ["continued"] * (args.turns - 1)
    assert results["fallback"][-1].state == "fallback"
    command = command_line("bench.providers", sys.argv[1:] if argv is None else argv)
    markdown = render(results, args.turns, seconds, command)
    publish(SECTION, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
