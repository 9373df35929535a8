"""Storage cost of the turn pipeline: capacity units, round trips and time per turn.

Drives one conversation to ``--turns`` turns (a 300-character user message and
a 700-character reply each) through :class:`~turnledger.turn.pipeline.Conversations`
over the DynamoDB store, against DynamoDB Local (the table built from
``template.yaml``) with S3 on moto's server, on two layouts in the same run, turn by
turn alternately: the current store, and the layout before issue 21
(:mod:`tests.support.legacy_layout`) as the baseline; then, on both, a few turns an
hour apart and a short conversation through the HTTP route's path (synchronous-turn
drafts) beside one through ``Conversations.turn``; and 20 conversations at once on
threads (current layout). Issue 21's targets are judged on the current layout. The
section ``## Turn storage cost`` of ``bench/RESULTS.md`` is rewritten with the results
(:mod:`bench.turns_report`).

Every write is reported twice, because the two differ: as DynamoDB Local
reported it (the store's :class:`~turnledger.store.base.CapacityMeter`) and as
DynamoDB prices it (:mod:`bench.pricing`, from the size of each item).

Run from the repository root: ``.venv/bin/python -m bench.turns`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from turnledger.core.config import Settings
from turnledger.store.blobs import BlobStore, S3BlobStore
from turnledger.store.codec import Item
from turnledger_local.template import PROJECT_ROOT, load_template, table_definition

from bench.conversation import Conversation, TurnSample
from bench.engines import local_engines
from bench.metered import Commit
from bench.pricing import (
    TRANSACTION_FACTOR,
    IndexSpec,
    index_specs,
    item_size,
    to_wire,
    write_units,
)
from bench.results import command_line, publish
from bench.turns_report import (
    CUMULATIVE_AT,
    LAYOUT_NAMES,
    MARKED_TURNS,
    Calibration,
    Floor,
    HeadCheck,
    LayoutRun,
    ParallelRun,
    Results,
    render,
)
from tests.support.aws import (
    TABLE_RESOURCE,
    unique_name,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SECTION = "Turn storage cost"
#: Turns of the conversation whose turns come an hour apart.
IDLE_TURNS = 12
#: The context budget issue 21 states its read target at.
BUDGET_TOKENS = 4000
#: Turns of the conversations run through the HTTP route's path (drafts) and beside it.
HTTP_TURNS = 50


def scratch_table(client: DynamoDBClient) -> str:
    """A table with the conversations table's keys and no index: it prices items alone."""
    definition = table_definition(load_template(), TABLE_RESOURCE, unique_name("scratch"))
    definition.pop("GlobalSecondaryIndexes", None)
    keys = {k["AttributeName"] for k in definition["KeySchema"]}
    definition["AttributeDefinitions"] = [
        a for a in definition["AttributeDefinitions"] if a["AttributeName"] in keys
    ]
    client.create_table(**definition)
    return str(definition["TableName"])


def put_item_units(client: DynamoDBClient, table: str, item: Item) -> float:
    """The write units DynamoDB Local reports for one PutItem of ``item``."""
    response = client.put_item(TableName=table, Item=to_wire(item), ReturnConsumedCapacity="TOTAL")
    return float(response.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))


def measure_floor(client: DynamoDBClient, table: str, commits: Sequence[Commit]) -> Floor:
    """PutItem every event item of ``commits`` alone, as the cheapest layout would."""
    events = [item for commit in commits for item in commit.events]
    reported = 0.0
    computed = 0
    agreeing = 0
    for item in events:
        units = put_item_units(client, table, item)
        expected = write_units(item_size(item))
        reported += units
        computed += expected
        agreeing += units == expected
    return Floor(len(events), reported, computed, agreeing)


def calibrate(client: DynamoDBClient, table: str) -> list[Calibration]:
    """Transactions of a few item counts and sizes: what DynamoDB Local reports for them."""
    found = []
    for count, size in ((1, 500), (3, 500), (10, 500), (3, 1500)):
        items: list[Item] = [
            {"pk": f"calibration-{count}-{size}", "sk": f"{n:04d}", "d": "x" * size}
            for n in range(count)
        ]
        response = client.transact_write_items(
            TransactItems=[{"Put": {"TableName": table, "Item": to_wire(i)}} for i in items],
            ReturnConsumedCapacity="TOTAL",
        )
        reported = sum(float(c.get("CapacityUnits", 0.0)) for c in response["ConsumedCapacity"])
        priced = TRANSACTION_FACTOR * sum(write_units(item_size(i)) for i in items)
        found.append(Calibration(count, item_size(items[0]), reported, priced))
    return found


def run_parallel(
    client: DynamoDBClient,
    blobs: BlobStore,
    settings: Settings,
    indexes: Sequence[IndexSpec],
    *,
    conversations: int,
    turns: int,
) -> ParallelRun:
    """``conversations`` threads, each driving its own conversation ``turns`` turns at once."""
    start = threading.Barrier(conversations)

    def drive(index: int) -> tuple[Conversation, list[TurnSample]]:
        conversation = Conversation.open(f"parallel-{index:02d}", client, blobs, settings, indexes)
        start.wait()  # every thread begins together, so their turns interleave
        return conversation, [conversation.turn(n) for n in range(1, turns + 1)]

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=conversations) as pool:
        done = list(pool.map(drive, range(conversations)))
    seconds = time.perf_counter() - started
    return ParallelRun(
        conversations=conversations,
        turns=turns,
        conflicts=sum(c.conflicts for c, _ in done),
        intact=sum(c.is_intact() for c, _ in done),
        seconds=seconds,
        samples=[s for _, samples in done for s in samples],
    )


def ddb_local_version(jar: Path) -> str:
    """DynamoDB Local's version, from the release notes next to the jar (and its npm package)."""
    readme = jar.parent / "README.txt"
    match = re.search(r"\((\d+\.\d+\.\d+)\)", readme.read_text()) if readme.is_file() else None
    version = match.group(1) if match else "(unknown version)"
    makefile = PROJECT_ROOT / "Makefile"
    npm = re.search(r"^DDB_VERSION\s*:=\s*(\S+)", makefile.read_text(), re.MULTILINE)
    package = f" (npm amplify-dynamodb-simulator {npm.group(1)})" if npm else ""
    return f"{version}{package}"


def run(turns: int, parallel: int, parallel_turns: int, *, budget: int, http_turns: int) -> Results:
    """Start the engines, drive the conversations on both layouts, measure the floor."""
    indexes = index_specs()
    with local_engines() as engines:
        clients, jar = engines.clients, engines.jar
        settings = replace(engines.settings, context_max_tokens=budget)
        blobs = S3BlobStore(clients.s3, settings.bucket_name)
        db = clients.dynamodb

        def open_each(name: str, chosen: Settings = settings) -> dict[str, Conversation]:
            return {
                layout: Conversation.open(name, db, blobs, chosen, indexes, layout=layout)
                for layout in LAYOUT_NAMES
            }

        # Turn by turn, one layout then the other: both meet DynamoDB Local (its JIT, its
        # growing tables) in the same state, so their times compare.
        longs = open_each("bench-long")
        runs = {layout: LayoutRun(layout) for layout in LAYOUT_NAMES}
        started = time.perf_counter()
        for number in range(1, turns + 1):
            for layout, conversation in longs.items():
                began = time.perf_counter()
                runs[layout].samples.append(conversation.turn(number))
                runs[layout].seconds += time.perf_counter() - began
            if number % 100 == 0:
                print(f"  turn {number}/{turns} ({time.perf_counter() - started:.0f} s)")

        legacy_commits = longs["legacy"].commits
        scratch = scratch_table(db)
        floor = measure_floor(db, scratch, legacy_commits[: min(CUMULATIVE_AT, turns)])
        floor_all = measure_floor(db, scratch, legacy_commits) if turns > CUMULATIVE_AT else floor
        heads = [
            HeadCheck(n, item_size(head), put_item_units(db, scratch, head))
            for n in MARKED_TURNS
            if n <= turns
            for head in [legacy_commits[n - 1].head]
            if head is not None
        ]
        calibration = calibrate(db, scratch)

        idles = open_each("bench-idle")
        for number in range(1, IDLE_TURNS + 1):
            for layout, conversation in idles.items():
                runs[layout].idle.append(conversation.turn(number, gap_seconds=3601))
        plain, drafted = open_each("bench-plain"), open_each("bench-http")
        # The same path with the draft begun as the turn starts (before SYNC_DRAFT_AFTER_MS).
        eager = open_each("bench-http-eager", replace(settings, sync_draft_after_ms=0))
        for number in range(1, http_turns + 1):
            for layout in LAYOUT_NAMES:
                runs[layout].plain.append(plain[layout].turn(number))
                runs[layout].http.append(drafted[layout].turn(number, through_drafts=True))
                runs[layout].http_eager.append(eager[layout].turn(number, through_drafts=True))

        parallel_run = None
        if parallel > 0 and parallel_turns > 0:
            print(f"  {parallel} conversations x {parallel_turns} turns at once")
            parallel_run = run_parallel(
                db, blobs, settings, indexes, conversations=parallel, turns=parallel_turns
            )
    return Results(
        ddb_version=ddb_local_version(jar),
        settings=settings,
        samples=runs["current"].samples,
        seconds=runs["current"].seconds,
        floor=floor,
        heads=heads,
        calibration=calibration,
        idle=runs["current"].idle,
        parallel=parallel_run,
        layouts=runs,
        floor_all=floor_all,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.turns", description=__doc__)
    parser.add_argument("--turns", type=int, default=1000, help="turns of the long conversation")
    parser.add_argument("--parallel", type=int, default=20, help="conversations run at once")
    parser.add_argument(
        "--parallel-turns", type=int, default=20, help="turns of each parallel conversation"
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=BUDGET_TOKENS,
        help="ContextMaxTokens of the conversations (issue 21 states its read target at 4000)",
    )
    parser.add_argument(
        "--http-turns",
        type=int,
        default=HTTP_TURNS,
        help="turns of the conversations run through POST .../turns' path (drafts)",
    )
    parser.add_argument(
        "--print-only", action="store_true", help="print the section, leave RESULTS.md alone"
    )
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    print(f"turn storage benchmark: {args.turns} turns", flush=True)
    results = run(
        args.turns,
        args.parallel,
        args.parallel_turns,
        budget=args.budget,
        http_turns=args.http_turns,
    )
    command = command_line("bench.turns", sys.argv[1:] if argv is None else argv)
    markdown = render(results, command)
    publish(SECTION, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
