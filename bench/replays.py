"""Replays, measured: what a pointwise replay of a conversation costs beside the original.

On DynamoDB Local (the table built from ``template.yaml``, S3 on moto's server),
:class:`~turnledger.turn.pipeline.Conversations` drives a conversation of ``--turns``
turns (a 300-character message and a 700-character reply each, as in ``bench/turns.py``;
the default context budget, so it is compacted as it grows), timing each turn and pricing
what it read and wrote. Then:

1. **the context route** of its last turn (:func:`turnledger.turn.contexts.turn_calls`,
   what ``GET .../turns/{n}/context`` answers): the whole log read once;
2. **a pointwise replay** of every turn (:func:`turnledger.turn.replays.start` and
   :func:`~turnledger.turn.replays.run`, what the turn worker runs), against the same
   offline model: the log read once, each call's context rebuilt and sent, the record
   and one item per call written.

The model answers at once, so the times are the service's own (storage round trips,
rebuilding, hashing), not a model's. Capacity is priced from the size of every item
read or written (:mod:`bench.pricing`). Writes the section ``## Replays`` of
``bench/RESULTS.md``.

Run: ``make bench ARGS=replays`` or ``.venv/bin/python -m bench.replays``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from turnledger.api.schemas import TurnRequest
from turnledger.core.models import ConversationKey
from turnledger.core.observability import metrics
from turnledger.store.blobs import S3BlobStore
from turnledger.store.codec import Item, item_size
from turnledger.turn import replay_records, replays
from turnledger.turn.contexts import turn_calls
from turnledger.turn.pipeline import Conversations

from bench.conversation import USER_CHARS, BenchClock, BenchProvider, text_of
from bench.engines import local_engines
from bench.metered import MeteredStore
from bench.pricing import index_specs, read_units
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Replays"
TENANT = "bench"
CALLER = Caller(tenant=TENANT, actor="bench")


class Candidate(BenchProvider):
    """The offline bench model, named, so a replay can name it."""

    name = "bench"


class ReplayMeteredStore(MeteredStore):
    """The metered store, pricing point reads (heads) and side-item puts (replay records)."""

    def _get_item(self, pk: str, sk: str) -> Item | None:
        item = super()._get_item(pk, sk)
        self.work.priced_rcu += read_units(item_size(item) if item is not None else 0)
        return item

    def _put_items(self, items: list[Item]) -> None:
        for item in items:
            self.work.priced_wcu += max(1, -(-item_size(item) // 1024))
        super()._put_items(items)


@dataclass(frozen=True)
class Cost:
    """Capacity and time of one measured step."""

    rcu: float
    wcu: float
    seconds: float
    items_read: int


@dataclass(frozen=True)
class Result:
    """The original's turns, the context route, and the replay."""

    turns: int
    calls: int
    events: int
    summaries: int
    original: Cost
    context: Cost
    replay: Cost
    identical: float | None


def _measure(store: ReplayMeteredStore, action: Callable[[], object]) -> Cost:
    work = store.begin()
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    metrics.clear_metrics()  # nothing to publish; keeps stdout to the benchmark's own lines
    return Cost(work.priced_rcu, work.priced_wcu, seconds, work.items_read)


def _sum(costs: Sequence[Cost]) -> Cost:
    return Cost(
        rcu=sum(c.rcu for c in costs),
        wcu=sum(c.wcu for c in costs),
        seconds=sum(c.seconds for c in costs),
        items_read=sum(c.items_read for c in costs),
    )


def run(turns: int) -> Result:
    """Measure a conversation of ``turns`` turns and its replay on DynamoDB Local."""
    with local_engines() as engines:
        clients, settings = engines.clients, engines.settings
        store = ReplayMeteredStore(
            clients.dynamodb,
            settings.table_name,
            S3BlobStore(clients.s3, settings.bucket_name),
            index_specs(),
        )
        clock = BenchClock()
        service = Conversations(store=store, provider=Candidate(), settings=settings, clock=clock)
        key = ConversationKey(tenant=TENANT, conversation_id=f"replayed-{turns}")
        original = []
        for n in range(turns):
            clock.advance(1.0)
            request = TurnRequest(input=text_of(f"user:{n}", USER_CHARS))
            original.append(
                _measure(
                    store, lambda r=request: edge.turn(service, CALLER, key.conversation_id, r)
                )
            )
        head = store.get_head(key)
        assert head is not None and head.turn == turns
        context = _measure(store, lambda: turn_calls(service, key, turns))
        spec = replay_records.ReplaySpec(provider="bench", model=settings.model)
        records: list[replay_records.ReplayRecord] = []

        def replay() -> None:
            records.append(replays.run(service, key, replays.start(service, key, spec).id))

        replayed = _measure(store, replay)
        [record] = records
        assert record.status == "complete" and record.summary is not None
        assert record.summary.context_mismatches == 0, "a rebuilt context did not match"
        after = store.get_head(key)
        assert after is not None and after.version == head.version, "the replay wrote a turn"
        events = store.read_events(key, head, after=0, limit=100_000)
        return Result(
            turns=turns,
            calls=record.summary.calls,
            events=head.event_count,
            summaries=sum(1 for e in events if e.kind == "context_compacted"),
            original=_sum(original),
            context=context,
            replay=replayed,
            identical=record.summary.text_similarity,
        )


def render(result: Result, command: str) -> str:
    """The section's markdown."""
    o, c, r = result.original, result.context, result.replay
    lines = [
        f"Command: {command}",
        "",
        machine_line(),
        "",
        f"A conversation of {result.turns} turns ({USER_CHARS}-character messages, "
        f"700-character replies; {result.events} events, context summaries written: "
        f"{result.summaries}, at the default budget) on DynamoDB Local, and a pointwise "
        "replay of all of it against the same offline model (it answers at once: the "
        "times are the service's own, storage round trips included, no model's). Capacity "
        "priced from item sizes.",
        "",
        "| | model calls | RCU | WCU | items read | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| the original, {result.turns} turns | {result.calls} | {o.rcu:g} | {o.wcu:g} | "
        f"{o.items_read} | {o.seconds:.2f} |",
        f"| `GET .../turns/{result.turns}/context` | 0 | {c.rcu:g} | {c.wcu:g} | "
        f"{c.items_read} | {c.seconds:.2f} |",
        f"| pointwise replay of every turn | {result.calls} | {r.rcu:g} | {r.wcu:g} | "
        f"{r.items_read} | {r.seconds:.2f} |",
        "",
        f"The replay reads {r.rcu / o.rcu:.2f}x the original's RCU and writes "
        f"{r.wcu / o.wcu:.2f}x its WCU (the record and one item per call, plain puts, "
        f"nothing transactional), in {r.seconds / o.seconds:.2f}x its time. It reads the log "
        "once (strongly consistent queries of the whole partition, then its own record), "
        "where each original turn read its context's window; the conversation's head and "
        "events are unchanged (checked). Every rebuilt context hashed to its run record's "
        f"(text similarity of the answers {result.identical}). The context route of one "
        "turn reads the log from its start through that turn: for the last turn, the whole "
        "log, as the replay does.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.replays", description=__doc__)
    parser.add_argument("--turns", type=int, default=50, help="the conversation's turns")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"replays benchmark: a conversation of {args.turns} turns", flush=True)
    result = run(args.turns)
    command = command_line("bench.replays", list(argv or []))
    publish(SECTION, render(result, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
