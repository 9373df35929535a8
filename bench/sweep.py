"""The sweep against a table scan: read units and time to find (and purge) what expired.

Seeds a table of ``--conversations`` conversations (default 10,000; two turns,
four events each, realistic sizes) on DynamoDB Local, ``--expired-share`` of
them (default 1 %) with ``expires_at`` in the last hour, the others expiring
within the next 7 days. Then measures, as a median of ``--runs`` runs:

* the scheduled sweep in steady state (its cursor where last hour's run left
  it), re-seeding the expired conversations between runs: read units, split
  into finding (``by-expiry`` queries), head reads and purging, and wall time;
* the sweep's first run (no cursor: a 7-day lookback) and a run with nothing
  expired (its fixed cost);
* a full table ``Scan`` of the same table: what finding expired heads would
  cost without the index (before deleting anything).

DynamoDB TTL stays off on the benchmark table: DynamoDB Local deletes expired
items in the background against the real clock, which would race the sweep.
The sweep runs on an injected clock. Results go to the ``## Sweep`` section of
``bench/RESULTS.md``.

Run from the repository root: ``.venv/bin/python -m bench.sweep``.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from turnledger.core.models import ConversationKey, ConversationStatus, Event, EventKind, Head
from turnledger.ops.sweep import SWEEP_LOOKBACK_BUCKETS, Sweeper
from turnledger.store import codec, keys
from turnledger.store.base import new_generation
from turnledger.store.blobs import MemoryBlobStore
from turnledger.store.codec import Item
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.indexes import CURSOR_PK, CURSOR_SK
from turnledger_local.template import load_template, table_definition

from bench.pricing import to_wire
from bench.results import command_line, machine_line, write_section
from bench.turns import ddb_local_version
from tests.support.aws import TABLE_RESOURCE, aws_clients, unique_name
from tests.support.dynamodb_local import DynamoDBLocal, find_jar

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SECTION = "Sweep"
HOUR = keys.EXPIRY_BUCKET_SECONDS
TTL_SECONDS = 7 * 24 * 3600
TENANTS = 20
#: Eventually consistent reads cost half a unit per 4 KiB; DynamoDB bills a request
#: at least that much even when it reads nothing (DynamoDB Local reports 0).
MIN_EVENTUAL_READ = 0.5
_BATCH = 25


# --- the table ----------------------------------------------------------------------------


def conversation_items(
    key: ConversationKey, expires_at: int, rng: random.Random, now: datetime
) -> list[Item]:
    """The head and four event items of a two-turn conversation, as the store writes them."""
    gen = new_generation()
    events: list[Event] = []
    for turn in (1, 2):
        for kind, low, high in (
            (EventKind.USER_MESSAGE, 150, 400),
            (EventKind.ASSISTANT_MESSAGE, 400, 1200),
        ):
            text = "".join(rng.choices("abcdefghij klmnopqrstuvwxyz.", k=rng.randint(low, high)))
            events.append(
                Event(
                    event_id=f"ev_{rng.getrandbits(64):016x}",
                    conversation_id=key.conversation_id,
                    sequence=len(events) + 1,
                    turn=turn,
                    kind=kind,
                    actor="user" if kind is EventKind.USER_MESSAGE else "assistant",
                    occurred_at=now,
                    payload={"content": text},
                )
            )
    head = Head(
        gen=gen,
        version=4,
        base=0,
        seq=len(events),
        turn=2,
        status=ConversationStatus.COMPLETE,
        created_at=now - timedelta(hours=1),
        updated_at=now,
        ttl_seconds=TTL_SECONDS,
        expires_at=expires_at,
    )
    items = [codec.encode_event(key, head, event, None) for event in events]
    items.append(codec.encode_head(key, head))
    return items


def batch_put(client: DynamoDBClient, table: str, items: Sequence[Item], workers: int = 8) -> None:
    """Write ``items`` with BatchWriteItem on ``workers`` threads (set-up, not measured)."""

    def put(chunk: Sequence[Item]) -> None:
        pending: Any = {table: [{"PutRequest": {"Item": to_wire(i)}} for i in chunk]}
        while pending:
            pending = client.batch_write_item(RequestItems=pending).get("UnprocessedItems")

    chunks = [items[n : n + _BATCH] for n in range(0, len(items), _BATCH)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(put, chunks))


@dataclass
class Table:
    """The benchmark table: its client, name, and who expires when."""

    client: DynamoDBClient
    name: str
    now: datetime
    expired: dict[ConversationKey, int]
    rng: random.Random

    def seed_expired(self) -> None:
        """(Re)write every expired conversation, as before the sweep removed them."""
        items = [
            item
            for key, at in self.expired.items()
            for item in conversation_items(key, at, self.rng, self.now)
        ]
        batch_put(self.client, self.name, items)

    def set_cursor(self, bucket: int | None) -> None:
        """Put the sweep cursor at ``bucket`` (``None``: no cursor, as on a first run)."""
        key = {codec.A_PK: {"S": CURSOR_PK}, codec.A_SK: {"S": CURSOR_SK}}
        self.client.delete_item(TableName=self.name, Key=key)
        if bucket is not None:
            store = DynamoDBConversationStore(self.client, self.name, MemoryBlobStore())
            store.advance_sweep_cursor(bucket)


def build_table(client: DynamoDBClient, size: int, share: float, rng: random.Random) -> Table:
    """Create the table from ``template.yaml`` and write ``size`` conversations."""
    name = unique_name("sweep-bench")
    client.create_table(**table_definition(load_template(), TABLE_RESOURCE, name))
    client.get_waiter("table_exists").wait(TableName=name)
    # Mid-hour, so last hour's expiries span the previous bucket and the current one.
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    epoch = int(now.timestamp())
    expired_count = round(size * share)
    expired: dict[ConversationKey, int] = {}
    live: list[Item] = []
    for n in range(size):
        key = ConversationKey(tenant=f"tenant-{n % TENANTS:02d}", conversation_id=f"conv-{n:06d}")
        if n % (size // max(expired_count, 1)) == 0 and len(expired) < expired_count:
            expired[key] = epoch - rng.randint(1, HOUR)
        else:
            live.extend(conversation_items(key, epoch + rng.randint(60, TTL_SECONDS), rng, now))
    batch_put(client, name, live)
    table = Table(client, name, now, expired, rng)
    table.seed_expired()
    return table


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Requests:
    """The DynamoDB read requests of a run, by kind, with what DynamoDB Local reported."""

    calls: dict[str, int] = field(default_factory=dict)
    units: dict[str, float] = field(default_factory=dict)
    empty_index_queries: int = 0

    def add(self, kind: str, units: float) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.units[kind] = self.units.get(kind, 0.0) + units


class RequestLog:
    """Records every read request made through ``client`` (botocore event hooks)."""

    _READS = ("Query", "GetItem", "Scan")

    def __init__(self, client: DynamoDBClient) -> None:
        self.current = Requests()
        self._index: str | None = None
        events = client.meta.events
        for operation in self._READS:
            events.register(f"provide-client-params.dynamodb.{operation}", self._before)
            events.register(f"after-call.dynamodb.{operation}", self._after)

    def _before(self, params: dict[str, Any], **_: Any) -> None:
        self._index = params.get("IndexName")

    def _after(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        units = float(parsed.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))
        if model.name == "Query" and self._index:
            self.current.add("index query", units)
            self.current.empty_index_queries += parsed.get("Count", 0) == 0
        elif model.name == "Query":
            self.current.add("table query", units)
        else:
            self.current.add(model.name, units)

    def take(self) -> Requests:
        """What was recorded since the last call."""
        done, self.current = self.current, Requests()
        return done


@dataclass(frozen=True)
class Sample:
    """One measured run."""

    seconds: float
    read_units: float
    write_units: float
    removed: int
    requests: Requests

    def priced_reads(self) -> float:
        """Read units with each empty index query billed at DynamoDB's minimum."""
        return self.read_units + MIN_EVENTUAL_READ * self.requests.empty_index_queries


def run_sweep(table: Table, log: RequestLog, cursor: int | None) -> Sample:
    """One scheduled sweep over ``table`` with its cursor at ``cursor``."""
    table.set_cursor(cursor)
    store = DynamoDBConversationStore(table.client, table.name, MemoryBlobStore())
    log.take()
    started = time.perf_counter()
    report = Sweeper(store, clock=lambda: table.now).expired()
    seconds = time.perf_counter() - started
    assert report.complete
    return Sample(
        seconds,
        report.read_units,
        store.meter.write_units,
        report.conversations_removed,
        log.take(),
    )


def run_scan(table: Table, log: RequestLog) -> Sample:
    """A full table Scan (eventually consistent, every attribute), finding expired heads."""
    log.take()
    epoch = int(table.now.timestamp())
    found = 0
    units = 0.0
    started = time.perf_counter()
    paginator = table.client.get_paginator("scan")
    for page in paginator.paginate(TableName=table.name, ReturnConsumedCapacity="TOTAL"):
        units += float(page.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))
        for item in page.get("Items", []):
            at = item.get(codec.A_EXPIRES, {}).get("N")
            found += item[codec.A_SK]["S"] == keys.HEAD_SK and at is not None and int(at) <= epoch
    seconds = time.perf_counter() - started
    return Sample(seconds, units, 0.0, found, log.take())


def median_of(samples: Sequence[Sample], value: Callable[[Sample], float]) -> float:
    return statistics.median(value(s) for s in samples)


# --- report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Results:
    """Everything the section shows."""

    conversations: int
    expired: int
    items: int
    runs: int
    steady: list[Sample]
    first: Sample
    idle: Sample
    scans: list[Sample]
    engine: str
    seed_seconds: float


def _row(label: str, samples: Sequence[Sample], note: str = "") -> str:
    reads = median_of(samples, lambda s: s.read_units)
    priced = median_of(samples, Sample.priced_reads)
    calls = median_of(samples, lambda s: sum(s.requests.calls.values()))
    seconds = median_of(samples, lambda s: s.seconds)
    return f"| {label} | {reads:,.1f} | {priced:,.1f} | {calls:,.0f} | {seconds:,.2f} s | {note} |"


def render(r: Results, args: Sequence[str]) -> str:
    steady = r.steady
    find_units = median_of(steady, lambda s: s.requests.units.get("index query", 0.0))
    find_calls = median_of(steady, lambda s: s.requests.calls.get("index query", 0))
    head_units = median_of(steady, lambda s: s.requests.units.get("GetItem", 0.0))
    # GetItem calls: the cursor, then one per candidate head (expired or not yet).
    waiting = median_of(steady, lambda s: s.requests.calls.get("GetItem", 1) - 1 - s.removed)
    idle_waiting = r.idle.requests.calls.get("GetItem", 1) - 1
    purge_units = median_of(steady, lambda s: s.requests.units.get("table query", 0.0))
    scan_units = median_of(r.scans, lambda s: s.read_units)
    total_priced = median_of(steady, Sample.priced_reads)
    find_priced = find_units + MIN_EVENTUAL_READ * median_of(
        steady, lambda s: s.requests.empty_index_queries
    )
    lines = [
        f"Command: {command_line('bench.sweep', args)}. Run: {machine_line()}.",
        "",
        f"DynamoDB Local {r.engine}, in memory, on loopback; the table built from "
        f"`template.yaml` (`ConversationsTable`, both indexes), DynamoDB TTL off (DynamoDB "
        f"Local would delete the expired heads in the background). "
        f"{r.conversations:,} conversations over {TENANTS} tenants, two turns each (a "
        f"150-400 character user message and a 400-1,200 character reply per turn: four "
        f"event items and a head, {r.items:,} items), written with BatchWriteItem in "
        f"{r.seed_seconds:.0f} s. {r.expired} of them ({r.expired / r.conversations:.0%}) "
        f"expired within the last hour; the others expire within the next 7 days (idle TTL "
        f"604,800 s). Medians of {r.runs} runs; the expired conversations are written again "
        f"before each sweep.",
        "",
        "| run | read units (DynamoDB Local) | read units, empty queries at 0.5 "
        "| read requests | wall time | notes |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        _row(
            "sweep, steady state (cursor at last hour)",
            steady,
            f"removed {steady[0].removed} conversations; finding {find_units:,.1f} RU in "
            f"{find_calls:.0f} `by-expiry` queries, head reads {head_units:,.1f} (the cursor, "
            f"{steady[0].removed} expired heads and {waiting:.0f} of the current hour not yet "
            f"expired), purge queries {purge_units:,.1f}",
        ),
        _row(
            "sweep, nothing expired",
            [r.idle],
            f"the fixed cost: 2 buckets x {keys.EXPIRY_SHARDS} shards, the cursor and "
            f"{idle_waiting} heads of the current hour that expire later",
        ),
        _row(
            f"sweep, first run (no cursor: {SWEEP_LOOKBACK_BUCKETS}-hour lookback)",
            [r.first],
            f"{SWEEP_LOOKBACK_BUCKETS + 1} buckets x {keys.EXPIRY_SHARDS} shards, once per table",
        ),
        _row(
            "table `Scan` (finding only)",
            r.scans,
            f"eventually consistent, {median_of(r.scans, lambda s: s.removed):.0f} expired "
            f"heads found; deleting them would add the purge reads",
        ),
        "",
        f"Finding what expired costs the sweep {find_priced:,.1f} read units against "
        f"{scan_units:,.1f} for the scan ({scan_units / max(find_priced, 0.5):,.0f}x); the "
        f"whole sweep, head reads and purges included, {total_priced:,.1f} "
        f"({scan_units / max(total_priced, 0.5):,.1f}x less than the scan alone). The sweep's "
        f"reads follow what expired: one `by-expiry` query per shard and bucket walked (keys "
        f"only), then per expired conversation one consistent head read and the purge's "
        f"queries of its own partition. The only live conversations it reads are those whose "
        f"head expires later in the current hour (the index holds keys only, so their head "
        f"is read to learn that). The scan reads every item of the table, every time. "
        f"`tests/integration/test_sweep_dynamodb_local.py` checks the same property: four "
        f"times the live conversations, the same read units.",
        "",
        "DynamoDB Local reports 0 units for a query that returns nothing, where DynamoDB "
        "bills at least 0.5 (eventually consistent); the second column adds that minimum "
        "for every empty `by-expiry` query. Write units of the steady-state sweep (as "
        f"DynamoDB Local reports them): {median_of(steady, lambda s: s.write_units):,.1f}.",
    ]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------


def run(conversations: int, share: float, runs: int) -> Results:
    """Start DynamoDB Local, seed the table, measure everything."""
    jar = find_jar()
    logging.getLogger("turnledger").setLevel(logging.WARNING)
    with DynamoDBLocal(jar) as ddb:
        client = aws_clients(ddb.endpoint).dynamodb
        started = time.perf_counter()
        table = build_table(client, conversations, share, random.Random(20251202))
        seed_seconds = time.perf_counter() - started
        items = conversations * 5
        print(f"  seeded {items:,} items in {seed_seconds:.0f} s", flush=True)
        log = RequestLog(client)
        current = int(table.now.timestamp()) // HOUR
        steady = []
        for number in range(runs):
            if number:
                table.seed_expired()
            steady.append(run_sweep(table, log, current - 1))
            print(f"  sweep {number + 1}/{runs}: {steady[-1].read_units:.1f} RU", flush=True)
            if steady[-1].removed != len(table.expired):
                raise RuntimeError(f"the sweep removed {steady[-1].removed} conversations")
        idle = run_sweep(table, log, current - 1)
        table.seed_expired()
        first = run_sweep(table, log, None)
        table.seed_expired()
        scans = []
        for number in range(runs):
            scans.append(run_scan(table, log))
            print(f"  scan {number + 1}/{runs}: {scans[-1].read_units:.1f} RU", flush=True)
        return Results(
            conversations=conversations,
            expired=len(table.expired),
            items=items,
            runs=runs,
            steady=steady,
            first=first,
            idle=idle,
            scans=scans,
            engine=ddb_local_version(jar),
            seed_seconds=seed_seconds,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite the ``## Sweep`` section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__)
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--expired-share", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--no-write", action="store_true", help="print the section instead of writing it"
    )
    args = parser.parse_args(argv)
    given = list(argv if argv is not None else sys.argv[1:])
    results = run(args.conversations, args.expired_share, args.runs)
    section = render(results, [a for a in given if a != "--no-write"])
    if args.no_write:
        print(section)
    else:
        write_section(SECTION, section)
        print(f"  wrote the '## {SECTION}' section of bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
