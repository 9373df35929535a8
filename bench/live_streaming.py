"""Streaming at the model's speed: time to the first text and to the whole answer, from
outside, through the local runner, beside the model's own first token (issue 43).

The demo model writes a 100-word answer at ``D`` ms a word (its first word is ready ``D``
ms after it is called). Each sample sends the same answer, each on a new conversation:

* **face**: the ``openai`` SDK, ``responses.create(stream=True)``: the first
  ``response.output_text.delta`` and ``response.completed``;
* **native**: ``POST .../turns`` with ``Accept: text/event-stream``: the first ``chunk``
  event and ``done``;
* **synchronous**: ``POST .../turns``: the answer (first text = whole answer); and
  **face, not streamed**: ``responses.create`` without ``stream`` (the face's own work
  before and after the turn, matching the input and recording the transcript chain,
  is in both of its rows).

The model's own first token is when the demo model handed over its first word (a worker
hook, :func:`record_first_token`, writes the machine's monotonic clock, which the bench
reads too: both run on this machine). The capacity of a streamed turn beside a synchronous
one is measured in process on DynamoDB Local (which reports consumed capacity), as
``tests/integration/test_live_streaming_costs.py`` checks it.

Writes the section ``## Streaming at the model's speed`` of ``bench/RESULTS.md``.
Run: ``.venv/bin/python -m bench.live_streaming``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from httpx_sse import connect_sse
from openai import OpenAI
from turnledger_local.runner import LocalConfig, LocalRunner

from bench.results import command_line, machine_line, publish

SECTION = "Streaming at the model's speed"
ANN = {"Authorization": "Bearer local:bench:ann"}
TOKEN = "local:bench:ann"
WORDS = " ".join(f"word{i}" for i in range(100))
#: Where the worker hook writes the model's first tokens (one monotonic time a line).
FIRST_TOKEN_FILE = "BENCH_FIRST_TOKEN_FILE"
PATHS = ("face", "face, not streamed", "native", "synchronous")


def record_first_token() -> None:
    """Worker hook: the demo model writes when it hands over its first word (streaming) or
    when its first word is ready (a whole answer: ``token_delay_ms`` after it was called)."""
    from turnledger.providers.base import ModelReply, ModelRequest, TextSink
    from turnledger.providers.demo import DemoProvider

    target = Path(os.environ[FIRST_TOKEN_FILE])
    stream, complete = DemoProvider.stream, DemoProvider.complete

    def note(at: float) -> None:
        with target.open("a") as out:
            out.write(f"{at}\n")

    def streamed(self: DemoProvider, request: ModelRequest, on_text: TextSink) -> ModelReply:
        first = True

        def on_piece(text: str) -> None:
            nonlocal first
            if first and request.purpose == "turn":
                first = False
                note(time.monotonic())
            on_text(text)

        return stream(self, request, on_piece)

    def whole(self: DemoProvider, request: ModelRequest) -> ModelReply:
        if request.purpose == "turn":
            note(time.monotonic() + self.token_delay_ms / 1000)
        return complete(self, request)

    DemoProvider.stream = streamed  # type: ignore[method-assign]
    DemoProvider.complete = whole  # type: ignore[method-assign]


@dataclass(frozen=True)
class Sample:
    """One request: seconds from sending it to its first text, to its whole answer, and to
    the model's first token."""

    path: str
    first_text: float
    whole: float
    model_first: float


def _model_first(file: Path, sent: float) -> float:
    lines = file.read_text().split()
    return float(lines[-1]) - sent


def _face(url: str, file: Path) -> Sample:
    with OpenAI(base_url=f"{url}/openai/v1", api_key=TOKEN, max_retries=0) as client:
        sent = time.monotonic()
        first: float | None = None
        text = ""
        with client.responses.create(model="demo-1", input=f"echo: {WORDS}", stream=True) as s:
            for event in s:
                if event.type == "response.output_text.delta":
                    first = time.monotonic() - sent if first is None else first
                elif event.type == "response.completed":
                    text = event.response.output_text
        whole = time.monotonic() - sent
    assert text == WORDS and first is not None
    return Sample("face", first, whole, _model_first(file, sent))


def _face_whole(url: str, file: Path) -> Sample:
    with OpenAI(base_url=f"{url}/openai/v1", api_key=TOKEN, max_retries=0) as client:
        sent = time.monotonic()
        response = client.responses.create(model="demo-1", input=f"echo: {WORDS}")
        whole = time.monotonic() - sent
    assert response.output_text == WORDS
    return Sample("face, not streamed", whole, whole, _model_first(file, sent))


def _native(http: httpx.Client, file: Path) -> Sample:
    path = f"/v1/conversations/n-{uuid.uuid4().hex[:8]}/turns"
    headers = {**ANN, "Accept": "text/event-stream"}
    sent = time.monotonic()
    first: float | None = None
    pieces: list[str] = []
    with connect_sse(http, "POST", path, json={"input": f"echo: {WORDS}"}, headers=headers) as s:
        for sse in s.iter_sse():
            if sse.event == "chunk":
                first = time.monotonic() - sent if first is None else first
                pieces.append(sse.json()["text"])
    whole = time.monotonic() - sent
    assert "".join(pieces) == WORDS and first is not None
    return Sample("native", first, whole, _model_first(file, sent))


def _synchronous(http: httpx.Client, file: Path) -> Sample:
    path = f"/v1/conversations/s-{uuid.uuid4().hex[:8]}/turns"
    sent = time.monotonic()
    answer = http.post(path, json={"input": f"echo: {WORDS}"}, headers=ANN)
    whole = time.monotonic() - sent
    assert answer.status_code == 200 and answer.json()["output_text"] == WORDS
    return Sample("synchronous", whole, whole, _model_first(file, sent))


def run(samples: int, delay_ms: int) -> list[Sample]:
    """``samples`` rounds of the three paths, through one runner at ``delay_ms``."""
    with tempfile.TemporaryDirectory() as scratch:
        file = Path(scratch) / "first-token"
        file.touch()
        suffix = uuid.uuid4().hex[:8]
        config = LocalConfig(
            port=0,
            table=f"bench-{suffix}",
            bucket=f"bench-{suffix}",
            worker_hook="bench.live_streaming:record_first_token",
            env={"DEMO_TOKEN_DELAY_MS": str(delay_ms), FIRST_TOKEN_FILE: str(file)},
        )
        found: list[Sample] = []
        with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=60) as http:
            for _ in range(2):  # warm every environment first
                _face(runner.url, file), _native(http, file), _synchronous(http, file)
                _face_whole(runner.url, file)
            for number in range(1, samples + 1):
                found += [
                    _face(runner.url, file),
                    _face_whole(runner.url, file),
                    _native(http, file),
                    _synchronous(http, file),
                ]
                print(f"  {delay_ms} ms/word: sample {number}/{samples}", flush=True)
    return found


def capacity() -> tuple[float, float, float, float]:
    """WCU and RCU of a synchronous and of a streamed turn of the answer, on DynamoDB Local:
    ``(sync WCU, sync RCU, streamed WCU, streamed RCU)``."""
    from turnledger.api import views
    from turnledger.api.schemas import TurnRequest
    from turnledger.core.models import ConversationKey
    from turnledger.providers.demo import DemoProvider
    from turnledger.store.blobs import S3BlobStore
    from turnledger.store.dynamodb import DynamoDBConversationStore
    from turnledger.turn import longturns
    from turnledger.turn.live import Delta
    from turnledger.turn.pipeline import Conversations

    from bench.conversation import BenchClock
    from bench.engines import local_engines

    class Listener:
        def started(self, turn: int) -> None:
            pass

        def delta(self, delta: Delta) -> None:
            pass

    with local_engines() as engines:
        blobs = S3BlobStore(engines.clients.s3, engines.settings.bucket_name)
        store = DynamoDBConversationStore(
            engines.clients.dynamodb, engines.settings.table_name, blobs
        )
        service = Conversations(
            store=store,
            provider=DemoProvider(token_delay_ms=20),
            settings=replace(engines.settings),
            clock=BenchClock(),
        )
        command = views.turn_command(TurnRequest(input=f"echo: {WORDS}"), None, None)
        before = store.meter.snapshot()
        longturns.run_synchronously(
            service, ConversationKey(tenant="b", conversation_id="s"), "a", command
        )
        sync = store.meter.since(before)
        before = store.meter.snapshot()
        longturns.run_drafted(
            service,
            ConversationKey(tenant="b", conversation_id="l"),
            "a",
            command,
            answer=lambda result: views.turn_response(result).model_dump(mode="json"),
            read_back=False,
            listener=Listener(),
        )
        streamed = store.meter.since(before)
    return sync.write_units, sync.read_units, streamed.write_units, streamed.read_units


def render(by_delay: dict[int, list[Sample]], units: tuple[float, ...], command: str) -> str:
    """The section's markdown."""

    def median(values: list[float]) -> float:
        return statistics.median(values)

    samples = len(next(iter(by_delay.values()))) // len(PATHS)
    lines = [
        f"{command}. Through the local runner (its workers, moto's server for storage); "
        f"{machine_line()}.",
        "",
        "The demo model writes a 100-word answer at 20 and 50 ms a word; each path sends it "
        f"on a new conversation, {samples} samples each (medians), after two warm-up rounds. "
        "Times from sending the request; the model's first token is when the demo model "
        "handed over its first word (a worker hook, the same monotonic clock).",
        "",
        "| ms/word | path | model's first token | first text at the client | gap | whole answer "
        "| vs synchronous |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for delay, found in by_delay.items():
        sync = median([s.whole for s in found if s.path == "synchronous"])
        for path in PATHS:
            mine = [s for s in found if s.path == path]
            model = median([s.model_first for s in mine])
            first = median([s.first_text for s in mine])
            gap = median([s.first_text - s.model_first for s in mine])
            whole = median([s.whole for s in mine])
            lines.append(
                f"| {delay} | {path} | {model * 1000:.0f} ms | {first * 1000:.0f} ms "
                f"| {gap * 1000:+.0f} ms | {whole * 1000:.0f} ms | {whole / sync:.2f}x |"
            )
    sync_wcu, sync_rcu, streamed_wcu, streamed_rcu = units
    lines += [
        "",
        "Capacity of the same answer at 20 ms a word, in process on DynamoDB Local (which "
        "reports it): the synchronous turn as `POST .../turns` runs it (its draft begun after "
        "`SYNC_DRAFT_AFTER_MS`), the streamed turn as the streaming function runs it (its "
        "draft begun at once, keeping the response); the live client reads nothing.",
        "",
        "| capacity | synchronous turn | streamed turn | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| WCU | {sync_wcu:.1f} | {streamed_wcu:.1f} | {streamed_wcu / sync_wcu:.2f}x |",
        f"| RCU | {sync_rcu:.1f} | {streamed_rcu:.1f} (live client: 0) | "
        f"{streamed_rcu / sync_rcu if sync_rcu else 0:.2f}x |",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.live_streaming", description=__doc__)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    by_delay: dict[int, list[Sample]] = {}
    for delay in (20, 50):
        by_delay[delay] = run(args.samples, delay)
    units = capacity()
    command = command_line("bench.live_streaming", sys.argv[1:] if argv is None else argv)
    publish(SECTION, render(by_delay, units, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
