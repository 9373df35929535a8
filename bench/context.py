"""The working context over a long conversation: read cost, tokens sent, compaction.

Drives one conversation of ``--turns`` turns (a 300-character user message
each, the demo model answering) through :class:`~turnledger.turn.pipeline.Conversations`
over the DynamoDB store on DynamoDB Local, with ``ContextMaxTokens`` set to
``--budget``, on the current store and, turn by turn beside it, on the layout before
issue 21 (:mod:`tests.support.legacy_layout`, the baseline). For every turn it records
the priced read and write units (:mod:`bench.pricing`, from item sizes; DynamoDB Local
misreports transaction capacity), the tokens the context held, and whether the turn compacted. The
section ``## Working context`` of ``bench/RESULTS.md`` is rewritten.

A turn's read cost rises and falls with the context between two compactions
(it grows by a turn each turn, then drops to half the budget), so it is
reported per turn *and* as the mean over the 100 turns ending at a mark:
the second is what "flat" means here.

Run from the repository root: ``.venv/bin/python -m bench.context`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from turnledger.api.schemas import TurnRequest
from turnledger.core.models import ConversationKey, EventKind
from turnledger.core.observability import metrics
from turnledger.providers.base import ModelReply, ModelRequest
from turnledger.providers.demo import DemoProvider
from turnledger.store.blobs import S3BlobStore
from turnledger.turn.pipeline import Conversations

from bench.conversation import LAYOUT_TENANTS, USER_CHARS, BenchClock, text_of
from bench.engines import local_engines
from bench.metered import LAYOUTS
from bench.pricing import index_specs
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Working context"
#: Turns whose cost is reported (each alone, and as the mean of the 100 ending there).
MARKS = (100, 300, 1000, 2000)
WINDOW = 100


class CountingDemo(DemoProvider):
    """The demo model, counting its summarizer calls."""

    def __init__(self) -> None:
        super().__init__()
        self.summaries = 0

    def complete(self, request: ModelRequest) -> ModelReply:
        if request.purpose == "summary":
            self.summaries += 1
        return super().complete(request)


@dataclass(frozen=True)
class Sample:
    """One turn: what its storage cost and what its context held."""

    turn: int
    rcu: float
    wcu: float
    read_calls: int
    items_read: int
    tokens: int
    messages: int
    compacted: bool


@dataclass
class LayoutRun:
    """One layout's conversation: its samples, summarizer calls, time and events stored."""

    samples: list[Sample]
    summaries: int
    seconds: float
    events: int


def run(turns: int, budget: int) -> dict[str, LayoutRun]:
    """Drive one conversation per layout (:data:`bench.metered.LAYOUTS`: the legacy layout
    before issue 21 and the current one), turn by turn alternately, on one DynamoDB Local."""
    with local_engines(context_max_tokens=budget) as engines:
        clients, settings = engines.clients, engines.settings
        blobs = S3BlobStore(clients.s3, settings.bucket_name)
        drives = {}
        for layout, store_class in LAYOUTS.items():
            store = store_class(clients.dynamodb, settings.table_name, blobs, index_specs())
            provider = CountingDemo()
            clock = BenchClock()
            service = Conversations(store=store, provider=provider, settings=settings, clock=clock)
            drives[layout] = (store, provider, clock, service)
        samples: dict[str, list[Sample]] = {layout: [] for layout in drives}
        seconds = dict.fromkeys(drives, 0.0)
        started = time.perf_counter()
        for number in range(1, turns + 1):
            text = text_of(f"user:{number}", USER_CHARS)
            for layout, (store, provider, clock, service) in drives.items():
                clock.advance(1.0)
                before = provider.summaries
                work = store.begin()
                began = time.perf_counter()
                reply = edge.turn(
                    service,
                    Caller(tenant=LAYOUT_TENANTS[layout], actor="bench"),
                    "long",
                    TurnRequest(input=text),
                )
                seconds[layout] += time.perf_counter() - began
                samples[layout].append(
                    Sample(
                        turn=number,
                        rcu=work.priced_rcu,
                        wcu=work.priced_wcu,
                        read_calls=work.read_requests,
                        items_read=work.items_read,
                        tokens=reply.context.tokens_estimated,
                        messages=reply.context.messages_sent,
                        compacted=provider.summaries > before,
                    )
                )
                # A Lambda invocation flushes its metrics; here they would pile up and print.
                metrics.clear_metrics()
            if number % 250 == 0:
                print(f"  turn {number}/{turns} ({time.perf_counter() - started:.0f} s)")
        runs = {}
        for layout, (store, provider, _, _) in drives.items():
            key = ConversationKey(tenant=LAYOUT_TENANTS[layout], conversation_id="long")
            head = store.get_head(key)
            assert head is not None
            events = store.read_events(key, head, after=0, limit=head.event_count)
            kinds = {kind: sum(e.kind is kind for e in events) for kind in EventKind}
            assert kinds[EventKind.USER_MESSAGE] == turns, "every user message is kept"
            runs[layout] = LayoutRun(
                samples[layout], provider.summaries, seconds[layout], head.event_count
            )
    return runs


#: Issue 21's read target: RCU per turn at steady state (the mean of the 100 turns to 300).
RCU_TARGET = 3.0
STEADY_MARK = 300


def _window(samples: Sequence[Sample], end: int) -> list[Sample]:
    return [s for s in samples if end - WINDOW < s.turn <= end]


def render(runs: dict[str, LayoutRun], budget: int, command: str) -> str:
    """The markdown section (the current layout's figures, the legacy one's beside them)."""
    current, legacy = runs["current"], runs["legacy"]
    samples, summaries, seconds, events = (
        current.samples,
        current.summaries,
        current.seconds,
        current.events,
    )
    turns = len(samples)
    plain = [s for s in samples if not s.compacted]
    compacting = [s for s in samples if s.compacted]
    lines = [
        f"{command}; on DynamoDB Local ({machine_line()}): one conversation of {turns} turns",
        f"(a {USER_CHARS}-character user message each, the demo model answering) with",
        f"`ContextMaxTokens` {budget}. Units are priced from item sizes (strongly consistent",
        "reads: 4 KiB a unit per query, eventually consistent ones half that; transactions:",
        "2 units per started KiB of each item).",
        "",
        "Both layouts run in the same run, turn by turn alternately: the current store, and "
        "the layout before issue 21 (`tests/support/legacy_layout.py`) as the baseline.",
        "",
        "| turn | RCU this turn | mean RCU, 100 turns to here | read round trips | tokens sent "
        "| legacy: RCU this turn | legacy: mean RCU, 100 turns | legacy: read round trips |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mark in MARKS:
        if mark > turns:
            continue
        sample, old = samples[mark - 1], legacy.samples[mark - 1]
        window, old_window = _window(samples, mark), _window(legacy.samples, mark)
        lines.append(
            f"| {mark} | {sample.rcu:g} | {statistics.mean(s.rcu for s in window):.2f} | "
            f"{sample.read_calls} | {sample.tokens} | {old.rcu:g} | "
            f"{statistics.mean(s.rcu for s in old_window):.2f} | {old.read_calls} |"
        )
    late = [m for m in MARKS if m <= turns]
    lines += [""]
    if turns >= STEADY_MARK:
        new = statistics.mean(s.rcu for s in _window(samples, STEADY_MARK))
        old_mean = statistics.mean(s.rcu for s in _window(legacy.samples, STEADY_MARK))
        verdict = "met" if new <= RCU_TARGET else "**missed**"
        one_trip = sum(s.read_calls <= 1 for s in samples[1:]) / max(len(samples) - 1, 1)
        old_trip = sum(s.read_calls <= 1 for s in legacy.samples[1:]) / max(turns - 1, 1)
        lines.append(
            f"- Issue 21's read target, <= {RCU_TARGET:g} RCU per turn at steady state "
            f"(mean of turns {STEADY_MARK - WINDOW + 1}..{STEADY_MARK}): current {new:.2f}, "
            f"legacy {old_mean:.2f}: {verdict}. Turns with one read round trip: current "
            f"{one_trip:.0%}, legacy {old_trip:.0%}."
        )
    if len(late) >= 2 and 300 in late:
        early_mean = statistics.mean(s.rcu for s in _window(samples, 300))
        last_mean = statistics.mean(s.rcu for s in _window(samples, late[-1]))
        lines.append(
            f"- Mean RCU per turn at turn {late[-1]} is {last_mean / early_mean:.3f}x that at "
            f"turn 300; the highest single turn read {max(s.rcu for s in samples):g} RCU."
        )
    lines += [
        f"- Tokens sent: never over the budget ({max(s.tokens for s in samples)} at most of "
        f"{budget}; median {statistics.median(s.tokens for s in samples):g}).",
        f"- WCU per plain turn: median {statistics.median(s.wcu for s in plain):g} "
        f"(max {max(s.wcu for s in plain):g}); a compacting turn: median "
        f"{statistics.median(s.wcu for s in compacting) if compacting else 0:g} (it also "
        "writes the `context_compacted` event).",
        f"- Summarizer calls: {summaries} in {turns} turns = "
        f"{summaries * 100 / turns:.1f} per 100 turns; every turn's user message is kept "
        f"({events} events stored).",
        f"- {turns} turns took {seconds:.0f} s ({seconds * 1000 / turns:.1f} ms a turn, loopback).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.context", description=__doc__)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=4000, help="ContextMaxTokens")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"working context benchmark: {args.turns} turns, budget {args.budget}", flush=True)
    runs = run(args.turns, args.budget)
    command = command_line("bench.context", sys.argv[1:] if argv is None else argv)
    markdown = render(runs, args.budget, command)
    publish(SECTION, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
