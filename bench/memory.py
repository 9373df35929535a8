"""Long-term memory's storage cost per turn: memory off, and on with a user holding 0, 50
and 200 (the default cap) records.

Drives ``--turns`` turns per scenario (each a new conversation of the same user, a plain
user message with nothing to remember, the demo model answering, the demo extractor
writing nothing back) through :class:`~turnledger.turn.pipeline.Conversations` over the
DynamoDB store on DynamoDB Local, and one more turn that states a fact (one record
written back). Units are priced from item sizes (:mod:`bench.pricing`): recall is one
eventually consistent query of the user's partition; a record write is a plain put (1
WCU per started KiB). The section ``## Long-term memory`` of ``bench/RESULTS.md`` is
rewritten.

Run from the repository root: ``.venv/bin/python -m bench.memory`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from turnledger.api.schemas import TurnRequest
from turnledger.core.observability import metrics
from turnledger.providers.demo import DemoProvider
from turnledger.store.blobs import S3BlobStore
from turnledger.store.memories import MemoryBook, MemoryRecord, new_memory_id
from turnledger.turn.pipeline import Conversations

from bench.conversation import BenchClock, text_of
from bench.engines import local_engines
from bench.metered import MeteredStore
from bench.pricing import index_specs
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Long-term memory"
TENANT = "bench"
#: Records the user holds in each memory-on scenario (200: the default cap).
HOLDINGS = (0, 50, 200)
#: The length of each preloaded record's text (a sentence or two).
RECORD_CHARS = 120


class PutMeteredStore(MeteredStore):
    """The metered store (side-item puts and deletes, memory's writes, are priced on the
    wire too)."""


@dataclass(frozen=True)
class Row:
    """One scenario: records held, and the mean cost of its plain turns and of a fact."""

    name: str
    records: int
    rcu: float
    wcu: float
    fact_wcu: float
    block_records: int


def run(turns: int) -> list[Row]:
    """Every scenario, on one DynamoDB Local."""
    rows: list[Row] = []
    with local_engines() as engines:
        clients, base = engines.clients, engines.settings
        blobs = S3BlobStore(clients.s3, base.bucket_name)
        store = PutMeteredStore(clients.dynamodb, base.table_name, blobs, index_specs())
        clock = BenchClock()
        scenarios = [("memory off", 0, False)] + [
            (f"memory on, {n} records", n, True) for n in HOLDINGS
        ]
        for name, held, enabled in scenarios:
            settings = replace(base, memory_enabled=enabled)
            service = Conversations(
                store=store, provider=DemoProvider(), settings=settings, clock=clock
            )
            user = f"user-{len(rows)}"
            book = MemoryBook(store, TENANT, user)
            for n in range(held):
                at = clock() - timedelta(minutes=held - n)
                text = text_of(f"record:{n}", RECORD_CHARS)
                book.put(
                    MemoryRecord(id=new_memory_id(), text=text, created_at=at, updated_at=at),
                    first=n == 0,
                )
            who = Caller(tenant=TENANT, actor=user)
            rcu, wcu, taken = [], [], []
            for number in range(turns):
                clock.advance(1.0)
                work = store.begin()
                edge.turn(
                    service,
                    who,
                    f"{user}-c{number}",
                    TurnRequest(input=text_of(f"turn:{number}", 200)),
                )
                rcu.append(work.priced_rcu)
                wcu.append(work.priced_wcu)
                metrics.clear_metrics()
                taken.append(_recalled(service, store, who, f"{user}-c{number}"))
            clock.advance(1.0)
            work = store.begin()
            edge.turn(service, who, f"{user}-fact", TurnRequest(input="I work on payments."))
            metrics.clear_metrics()
            rows.append(
                Row(
                    name=name,
                    records=held,
                    rcu=statistics.mean(rcu),
                    wcu=statistics.mean(wcu),
                    fact_wcu=work.priced_wcu,
                    block_records=max(taken),
                )
            )
    return rows


def _recalled(service: Conversations, store: MeteredStore, who: Caller, conversation: str) -> int:
    """How many records the conversation's answer carried (its run record's ids)."""
    key = who.key(conversation)
    head = store.get_head(key)
    assert head is not None
    events = store.read_events(key, head, after=0, limit=head.event_count)
    runs = [e.payload.get("run") or {} for e in events if e.kind.value == "assistant_message"]
    return max((len(run.get("memory_ids") or []) for run in runs), default=0)


def render(rows: list[Row], turns: int, command: str) -> str:
    """The markdown section."""
    off = rows[0]
    lines = [
        f"{command}; on DynamoDB Local ({machine_line()}): per scenario {turns} turns of one",
        "user, each a new conversation with a 200-character message and nothing to remember",
        f"(the user holds {RECORD_CHARS}-character records), then one turn stating a fact.",
        "Units are priced from item sizes (eventually consistent query: 8 KiB a unit).",
        "",
        "| scenario | RCU per turn | WCU per turn | WCU, a turn with a fact "
        "| records in the context |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.rcu:g} | {row.wcu:g} | {row.fact_wcu:g} | {row.block_records} |"
        )
    full = rows[-1]
    lines += [
        "",
        f"- Recall is one eventually consistent query a turn: {full.rcu - off.rcu:g} RCU more "
        f"than memory off at the cap of {full.records} records "
        f"({rows[1].rcu - off.rcu:g} with none).",
        f"- A turn with nothing to remember puts no record; the {full.wcu - off.wcu:g} WCU more "
        "at 50 and more records is its answer's event growing past a KiB with the ids of the "
        "records it carried (`memory_ids`; a transaction prices 2 units per started KiB).",
        "- A turn with a fact adds one put (1 WCU), the user's entry on their first record, "
        "and at the cap the delete of the least recently updated record.",
        "- The context carries only the records that fit `MEMORY_CONTEXT_SHARE` (10 % of the "
        "budget): the read grows with the records held, the tokens sent do not.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"memory benchmark: {args.turns} turns a scenario", flush=True)
    rows = run(args.turns)
    command = command_line("bench.memory", sys.argv[1:] if argv is None else argv)
    publish(SECTION, render(rows, args.turns, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
