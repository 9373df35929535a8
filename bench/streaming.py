"""Long and streamed turns: what streaming a 700-character answer costs, and how soon it shows.

On DynamoDB Local (which reports consumed capacity, ``ReturnConsumedCapacity``),
the demo model answers a 700-character text word by word with a token delay.
Each sample runs the same turn twice on fresh conversations:

* **synchronous**: ``Conversations.turn`` as ``POST .../turns`` runs it: its
  capacity and its total time (what a client waits before it sees anything);
* **streamed**: as ``Prefer: respond-async`` runs it: ``longturns.accept`` (the
  draft marked in progress) and the turn worker (``longturns.run_worker`` on a
  thread, standing in for the asynchronous Lambda invocation), while one client
  long-polls ``GET .../turns/{n}/stream`` (``api.streaming.stream_page``, ``wait=20``)
  from the start to the end: the writer's and the reader's capacity (separate store
  clients, so each is counted apart) and the time to the first chunk.

Extra WCU / RCU = the streamed turn's (writer + reader) less the synchronous
turn's. Writes the section ``## Long and streamed turns`` of ``bench/RESULTS.md``.
Run: ``make bench ARGS=streaming`` or ``.venv/bin/python -m bench.streaming``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.observability import metrics
from turnledger.providers.demo import DemoProvider
from turnledger.store.blobs import S3BlobStore
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.turn import turn_reads
from turnledger.turn.pipeline import Conversations

from bench.conversation import REPLY_CHARS, BenchClock, text_of
from bench.engines import local_engines
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Long and streamed turns"
TENANT = "bench"
CALLER = Caller(tenant=TENANT, actor="bench")


@dataclass(frozen=True)
class Sample:
    """One synchronous and one streamed run of the same answer."""

    sync_wcu: float
    sync_rcu: float
    sync_seconds: float
    writer_wcu: float
    writer_rcu: float
    reader_rcu: float
    reader_requests: int
    chunks: int
    first_chunk_seconds: float
    streamed_seconds: float

    @property
    def extra_wcu(self) -> float:
        """What streaming wrote beyond the synchronous turn."""
        return self.writer_wcu - self.sync_wcu

    @property
    def extra_rcu(self) -> float:
        """What streaming and reading the stream read beyond the synchronous turn."""
        return self.writer_rcu + self.reader_rcu - self.sync_rcu


def _service(store: DynamoDBConversationStore, settings: Settings, delay_ms: int) -> Conversations:
    return Conversations(
        store=store,
        provider=DemoProvider(token_delay_ms=delay_ms),
        settings=settings,
        clock=BenchClock(),
    )


def _sample(writer: Conversations, reader: Conversations, number: int, answer: str) -> Sample:
    """Run the answer synchronously, then streamed and followed by one polling client."""
    request = TurnRequest(input=f"echo: {answer}")
    before = writer.store.meter.snapshot()
    started = time.perf_counter()
    reply = edge.turn(writer, CALLER, f"sync-{number}", request)
    sync_seconds = time.perf_counter() - started
    sync = writer.store.meter.since(before)
    assert reply.output_text == answer

    conversation = f"streamed-{number}"
    before = writer.store.meter.snapshot()
    read_before = reader.store.meter.snapshot()
    worker_done = threading.Event()

    def invoke(payload: dict[str, Any]) -> None:
        def run() -> None:
            try:
                edge.run_worker(writer, payload)
            finally:
                worker_done.set()

        threading.Thread(target=run, daemon=True).start()

    started = time.perf_counter()
    turn = edge.accept(writer, CALLER, conversation, request, invoke)
    first_chunk: float | None = None
    chunks: list[str] = []
    requests = 0
    after = 0
    while True:
        page = edge.stream_page(reader, CALLER, conversation, turn, after=after, wait=20)
        requests += 1
        if page.chunks and first_chunk is None:
            first_chunk = time.perf_counter() - started
        chunks.extend(c.text for c in page.chunks)
        after = page.next_after
        if page.done:
            break
    streamed_seconds = time.perf_counter() - started
    worker_done.wait(30)
    assert page.status == "done" and "".join(chunks) == answer, page.reason
    written = writer.store.meter.since(before)
    read = reader.store.meter.since(read_before)
    metrics.clear_metrics()
    return Sample(
        sync_wcu=sync.write_units,
        sync_rcu=sync.read_units,
        sync_seconds=sync_seconds,
        writer_wcu=written.write_units,
        writer_rcu=written.read_units,
        reader_rcu=read.read_units,
        reader_requests=requests,
        chunks=len(chunks),
        first_chunk_seconds=first_chunk if first_chunk is not None else streamed_seconds,
        streamed_seconds=streamed_seconds,
    )


def run(samples: int, delay_ms: int) -> tuple[list[Sample], str]:
    """Run ``samples`` pairs on DynamoDB Local; returns them and the answer."""
    answer = text_of("streamed answer", REPLY_CHARS)
    with local_engines(turn_worker_function="bench-worker") as engines:
        clients, settings = engines.clients, engines.settings

        def store() -> DynamoDBConversationStore:
            blobs = S3BlobStore(clients.s3, settings.bucket_name)
            return DynamoDBConversationStore(clients.dynamodb, settings.table_name, blobs)

        writer = _service(store(), settings, delay_ms)
        reader = _service(store(), settings, delay_ms)
        results = []
        for number in range(1, samples + 1):
            results.append(_sample(writer, reader, number, answer))
            print(f"  sample {number}/{samples}", flush=True)
    return results, answer


def render(
    samples: list[Sample], answer: str, delay_ms: int, settings: Settings, command: str
) -> str:
    """The section's markdown."""

    def median(values: list[float]) -> float:
        return statistics.median(values)

    words = len(answer.split())
    rows = [
        ("WCU", median([s.sync_wcu for s in samples]), median([s.writer_wcu for s in samples])),
        (
            "RCU",
            median([s.sync_rcu for s in samples]),
            median([s.writer_rcu + s.reader_rcu for s in samples]),
        ),
    ]
    lines = [
        f"{command}; alone: `make bench ARGS=streaming`. On DynamoDB Local, which reports "
        f"consumed capacity; {machine_line()}.",
        "",
        f"One answer of {len(answer)} characters ({words} words), the demo model streaming it "
        f"word by word with a {delay_ms} ms token delay; drafts batched at most every "
        f"{settings.draft_flush_ms} ms or {settings.draft_flush_chars} characters. "
        f"Median of {len(samples)} samples, each a synchronous turn and the same turn sent "
        "(each the first turn of a new conversation, so the synchronous turn reads next to "
        "nothing) "
        "with `Prefer: respond-async` and followed to the end by one client long-polling "
        "`GET .../turns/1/stream?wait=20`.",
        "",
        "| capacity | synchronous turn | streamed turn (writer + one reader) | extra |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, sync, streamed in rows:
        lines.append(f"| {name} | {sync:.1f} | {streamed:.1f} | {streamed - sync:+.1f} |")
    first = median([s.first_chunk_seconds for s in samples])
    total = median([s.sync_seconds for s in samples])
    lines += [
        "",
        f"- Extra WCU: median {median([s.extra_wcu for s in samples]):.1f} "
        f"({median([float(s.chunks) for s in samples]):.0f} chunks of the draft, plus its "
        "state written at the start, by the worker, and at the end); the writer also read "
        f"{median([s.writer_rcu for s in samples]):.1f} RCU (the cancel flag between chunks, "
        "the head and state before it ran) where the synchronous turn read "
        f"{median([s.sync_rcu for s in samples]):.1f}.",
        f"- Extra RCU: median {median([s.extra_rcu for s in samples]):.1f}, of which the "
        f"polling client read {median([s.reader_rcu for s in samples]):.1f} in "
        f"{median([float(s.reader_requests) for s in samples]):.0f} requests "
        "(each: the head, the draft state, then eventually consistent queries every "
        f"{turn_reads.POLL_SECONDS * 1000:.0f} ms while it waits).",
        f"- Time to the first chunk: median {first * 1000:.0f} ms, against "
        f"{total * 1000:.0f} ms for the synchronous turn's whole answer "
        f"({first / total:.2f}x); the streamed turn ended after "
        f"{median([s.streamed_seconds for s in samples]) * 1000:.0f} ms.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--token-delay-ms", type=int, default=20)
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"streaming benchmark: {args.samples} samples", flush=True)
    samples, answer = run(args.samples, args.token_delay_ms)
    command = command_line("bench.streaming", sys.argv[1:] if argv is None else argv)
    markdown = render(samples, answer, args.token_delay_ms, Settings(), command)
    publish(SECTION, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
