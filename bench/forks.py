"""Forks, measured: what a fork writes, and what a turn on a fork reads.

On DynamoDB Local (the table built from ``template.yaml``, S3 on moto's server),
:class:`~turnledger.turn.pipeline.Conversations` drives conversations of 10, 100 and
``--turns`` turns (a 300-character message and a 700-character reply each, as in
``bench/turns.py``). For each length:

1. **fork writes**: ``POST .../fork`` after the latest turn and after the middle one
   (:func:`turnledger.turn.forks.create_fork`), priced from the items of its one
   transaction (the fork's head, the reference in the parent's partition, the fork's
   origin, and the condition check on the parent's head) and their index entries;
2. **turn reads**: one more turn on the unforked conversation and on a fork after its
   latest turn (the same length, the same input): capacity read, and queries.

Capacity is priced from the size of every item read or written (:mod:`bench.pricing`);
DynamoDB Local misreports transactions. Writes the section ``## Forks`` of
``bench/RESULTS.md``.

Run: ``make bench ARGS=forks`` or ``.venv/bin/python -m bench.forks``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from turnledger.api.schemas import TurnRequest
from turnledger.core.models import ConversationKey
from turnledger.core.observability import metrics
from turnledger.store.blobs import S3BlobStore
from turnledger.turn.forks import create_fork
from turnledger.turn.pipeline import Conversations

from bench.conversation import REPLY_CHARS, USER_CHARS, BenchClock, BenchProvider, text_of
from bench.engines import local_engines
from bench.metered import MeteredStore, StorageWork
from bench.pricing import index_specs
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Forks"
TENANT = "bench"
CALLER = Caller(tenant=TENANT, actor="bench")


@dataclass(frozen=True)
class Row:
    """One conversation length's results."""

    turns: int
    events: int
    fork_latest_wcu: float
    fork_middle_wcu: float
    fork_rcu: float
    fork_middle_rcu: float
    unforked_turn_rcu: float
    forked_turn_rcu: float
    unforked_queries: int
    forked_queries: int


class ForkMeteredStore(MeteredStore):
    """The metered store (point reads, which a fork makes, are priced on the wire too)."""


def _measure(store: MeteredStore, action: Callable[[], object]) -> StorageWork:
    work = store.begin()
    action()
    metrics.clear_metrics()  # nothing to publish; keeps stdout to the benchmark's own lines
    return work


def _length(service: Conversations, store: MeteredStore, turns: int) -> Row:
    key = ConversationKey(tenant=TENANT, conversation_id=f"long-{turns}")
    for n in range(turns):
        edge.turn(service, CALLER, key.conversation_id, _request(f"{turns}:{n}"))
        metrics.clear_metrics()
    head = store.get_head(key)
    assert head is not None and head.turn == turns

    def fork(to: str, after: int | None) -> None:
        target = ConversationKey(tenant=TENANT, conversation_id=to)
        create_fork(
            store,
            key,
            target,
            after_turn=after,
            ttl_seconds=service.settings.ttl_for(TENANT),
            clock=service.clock,
            visible_head=service._visible_head,
        )

    latest = _measure(store, lambda: fork(f"fork-{turns}", None))
    middle = _measure(store, lambda: fork(f"mid-{turns}", turns // 2))
    question = _request(f"next:{turns}")
    unforked = _measure(store, lambda: edge.turn(service, CALLER, key.conversation_id, question))
    forked = _measure(store, lambda: edge.turn(service, CALLER, f"fork-{turns}", question))
    return Row(
        turns=turns,
        events=head.event_count,
        fork_latest_wcu=latest.priced_wcu,
        fork_middle_wcu=middle.priced_wcu,
        fork_rcu=latest.priced_rcu,
        fork_middle_rcu=middle.priced_rcu,
        unforked_turn_rcu=unforked.priced_rcu,
        forked_turn_rcu=forked.priced_rcu,
        unforked_queries=len(unforked.query_limits),
        forked_queries=len(forked.query_limits),
    )


def _request(seed: str) -> TurnRequest:
    return TurnRequest(input=text_of(f"user:{seed}", USER_CHARS))


def run(lengths: Sequence[int]) -> list[Row]:
    """Measure each length on DynamoDB Local."""
    with local_engines() as engines:
        clients, settings = engines.clients, engines.settings
        store = ForkMeteredStore(
            clients.dynamodb,
            settings.table_name,
            S3BlobStore(clients.s3, settings.bucket_name),
            index_specs(),
        )
        service = Conversations(
            store=store, provider=BenchProvider(), settings=settings, clock=BenchClock()
        )
        rows = []
        for turns in lengths:
            rows.append(_length(service, store, turns))
            print(f"  {turns} turns measured", flush=True)
        return rows


def render(rows: list[Row], command: str) -> str:
    """The section's markdown."""
    lines = [
        f"Command: {command}",
        "",
        machine_line(),
        "",
        f"Conversations of {USER_CHARS}-character messages and {REPLY_CHARS}-character "
        "replies on DynamoDB Local; capacity priced from item sizes (transactional writes "
        "at twice the standard rate, index entries included).",
        "",
        "| turns | events | fork after latest turn, WCU | fork after middle turn, WCU | "
        "fork after latest / middle turn, RCU | next turn unforked, RCU | "
        "next turn on the fork, RCU | queries unforked / fork |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.turns} | {r.events} | {r.fork_latest_wcu:g} | {r.fork_middle_wcu:g} | "
            f"{r.fork_rcu:g} / {r.fork_middle_rcu:g} | {r.unforked_turn_rcu:g} | "
            f"{r.forked_turn_rcu:g} | "
            f"{r.unforked_queries} / {r.forked_queries} |"
        )
    wcu = sorted({r.fork_latest_wcu for r in rows} | {r.fork_middle_wcu for r in rows})
    ratio = statistics.median(r.forked_turn_rcu / r.unforked_turn_rcu for r in rows)
    lines += [
        "",
        f"A fork writes {', '.join(f'{w:g}' for w in wcu)} WCU whatever the parent's length: "
        "its head, one reference in the parent's partition, its origin, and the check of "
        "the parent's head, in one transaction (no event is copied). Forking after an "
        "earlier turn also reads a few events to find that turn's end (a bisection, one "
        "point read each). A turn on a fork reads the same events as a turn on the unforked "
        "conversation of the same length, with at most one more query per ancestor its "
        f"context reaches (median RCU ratio fork / unforked {ratio:.2f}): here the fork's "
        "first query holds only its head, and one query of its parent's partition reads the "
        "rest, eventually consistent; past the history cap (400 events) both read the same "
        "number of events.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.forks", description=__doc__)
    parser.add_argument("--turns", type=int, default=1000, help="the longest conversation")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    lengths = sorted({10, 100, args.turns})
    print(f"forks benchmark: conversations of {', '.join(map(str, lengths))} turns", flush=True)
    rows = run(lengths)
    command = command_line("bench.forks", list(argv or []))
    publish(SECTION, render(rows, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
