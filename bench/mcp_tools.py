"""MCP servers as tools, measured: what a listing and a call cost, on a warm path.

On DynamoDB Local (the table built from ``template.yaml``, S3 on moto's server),
:class:`~turnledger.turn.pipeline.Conversations` runs the demo model with a registry of
one MCP server (``require_approval: {"never": {"read_only": true}}``): the files server
of ``tests/support/mcp_servers.py``, reached through the ``mcp`` package's client in
memory (:class:`~turnledger.tools.mcp_client.InMemoryMcp`: the same client and
protocol, no network), counting its sessions. Each sample, in a conversation that
already has a turn:

1. **read, listing kept**: ``/tool mcp__files__read_file`` with the listing kept by the
   process (the warm path): one call, no listing, no listing record;
2. **read, listing refreshed**: the same after the listing's age passed: a new
   listing; its hash is unchanged, so nothing new is recorded;
3. **first MCP turn of a conversation**: the listing's record is written beside its
   transcript (``S#mcpl#...``, once per listing and conversation);
4. **approval turn** (``delete_file``) and its **decision**: deciding lists the server
   anew (the definition the approval is bound to) and calls it once.

Write units are priced from item sizes (:mod:`bench.pricing`, DynamoDB Local misreports
transactions), as ``bench/approvals.py`` does. Writes the section ``## MCP tools`` of
``bench/RESULTS.md``.

Run: ``make bench ARGS=mcp`` or ``.venv/bin/python -m bench.mcp_tools``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turnledger.api.schemas import ApprovalRequest, TurnRequest
from turnledger.core.observability import metrics
from turnledger.providers.demo import DemoProvider
from turnledger.store.blobs import S3BlobStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.tools.mcp import McpCallResult, McpListing, McpServerEntry
from turnledger.tools.mcp_client import InMemoryMcp
from turnledger.tools.mcp_link import McpLink
from turnledger.turn.pipeline import Conversations

from bench.approvals import InboxMeteredStore, Work
from bench.conversation import BenchClock
from bench.engines import local_engines
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller
from tests.support.mcp_servers import files_server

SECTION = "MCP tools"
MAX_AGE = 60


class CountingMcp(InMemoryMcp):
    """The in-memory port, counting its sessions (each one listing or one call)."""

    def __init__(self, servers: Mapping[str, Any]) -> None:
        super().__init__(servers)
        self.listings = 0
        self.calls = 0

    def list_tools(self, server: McpServerEntry, timeout: float) -> McpListing:
        self.listings += 1
        return super().list_tools(server, timeout)

    def call_tool(self, *args: Any, **kwargs: Any) -> McpCallResult:
        self.calls += 1
        return super().call_tool(*args, **kwargs)


@dataclass
class Measured:
    work: Work
    listings: int
    calls: int


def _measure(store: InboxMeteredStore, port: CountingMcp, run: Any) -> Measured:
    listings, calls = port.listings, port.calls
    store.measure()
    run()
    return Measured(store.finish(), port.listings - listings, port.calls - calls)


def _sample(
    service: Conversations, store: InboxMeteredStore, port: CountingMcp, number: int
) -> dict[str, Measured]:
    caller = Caller(tenant="acme", actor="ann")
    clock = service.clock
    assert isinstance(clock, BenchClock)
    conversation = f"mcp-{number}"
    edge.turn(service, caller, conversation, TurnRequest(input="echo: hello"))
    clock.advance(1)
    read = TurnRequest(input='/tool mcp__files__read_file {"path": "notes.txt"}')

    def turn(request: TurnRequest, status: str) -> Any:
        def go() -> None:
            reply = edge.turn(service, caller, conversation, request)
            assert reply.status == status, reply.status
            found.append(reply)

        found: list[Any] = []
        return go, found

    go, _ = turn(read, "complete")
    first = _measure(store, port, go)
    clock.advance(1)
    go, _ = turn(read, "complete")
    warm = _measure(store, port, go)
    clock.advance(MAX_AGE + 1)
    go, _ = turn(read, "complete")
    refreshed = _measure(store, port, go)
    clock.advance(1)
    go, asked = turn(
        TurnRequest(input='/tool mcp__files__delete_file {"path": "notes.txt"}'),
        "awaiting_approval",
    )
    ask = _measure(store, port, go)
    [call] = asked[0].pending_tool_calls
    clock.advance(1)

    def decide() -> None:
        done = edge.approve(service, caller, conversation, ApprovalRequest(approve=[call.id]))
        assert done.status == "complete", done.status

    decision = _measure(store, port, decide)
    clock.advance(1)
    metrics.clear_metrics()
    return {
        "first": first,
        "warm": warm,
        "refreshed": refreshed,
        "ask": ask,
        "decide": decision,
    }


def run(samples: int) -> list[dict[str, Measured]]:
    """The samples, on DynamoDB Local."""
    with local_engines() as engines:
        clients, settings = engines.clients, engines.settings
        blobs = S3BlobStore(clients.s3, settings.bucket_name)
        store = InboxMeteredStore(clients.dynamodb, settings.table_name, blobs)
        port = CountingMcp({"files": files_server().server})
        clock = BenchClock()
        link = McpLink(lambda: port, clock=lambda: clock.now.timestamp())
        entry = {
            "type": "mcp",
            "server_label": "files",
            "server_url": "http://127.0.0.1:9/mcp",
            "require_approval": {"never": {"read_only": True}},
            "max_list_age_seconds": MAX_AGE,
        }
        registry = ToolRegistry.from_json(json.dumps({"tools": [entry]}), mcp=link)
        service = Conversations(
            store=store,
            provider=DemoProvider(),
            settings=settings,
            tools=registry,
            runner=ToolRunner(lambda: sys.exit("no http tool here"), None, mcp=link),
            clock=clock,
        )
        found = []
        for number in range(1, samples + 1):
            found.append(_sample(service, store, port, number))
            print(f"  sample {number}/{samples}", flush=True)
    return found


KINDS = (
    ("read, first MCP turn of a conversation (listing kept, its record written)", "first"),
    ("read, listing kept (warm)", "warm"),
    ("read, listing older than its age (refreshed, hash unchanged)", "refreshed"),
    ("approval turn (`delete_file`)", "ask"),
    ("decision (lists anew, calls once)", "decide"),
)


def render(samples: list[dict[str, Measured]], command: str) -> str:
    def m(kind: str, pick: Any) -> float:
        return statistics.median(pick(s[kind]) for s in samples)

    rows = [
        ("**WCU, priced**", lambda x: x.work.wcu),
        ("of which other items (the listing record `S#mcpl#...`)", lambda x: x.work.other_wcu),
        ("**RCU, priced**", lambda x: x.work.rcu),
        ("write requests", lambda x: x.work.writes),
        ("MCP listings (`tools/list` sessions)", lambda x: x.listings),
        ("MCP calls (`tools/call` sessions)", lambda x: x.calls),
    ]
    lines = [
        f"{command}. On DynamoDB Local; {machine_line()}.",
        "",
        f"Median of {len(samples)} samples, each in a conversation that has one text turn "
        "already; the MCP server is the files server of `tests/support/mcp_servers.py`, "
        "reached by the `mcp` package's client in memory (`InMemoryMcp`), its sessions "
        "counted. Over Streamable HTTP a listing session is two HTTP round trips "
        "(`server/discover`, `tools/list`) and a call session three (`server/discover`, "
        "`tools/call`, and the `tools/list` the `mcp` client sends after a result that is "
        "no error, to check it against the tool's output schema, which its session learns "
        "only by listing): seen in the loopback server's log of "
        "`tests/support/mcp_servers.py`. "
        f'Registry: `require_approval: {{"never": {{"read_only": true}}}}`, '
        f"`max_list_age_seconds: {MAX_AGE}` (the server gives no `ttlMs`).",
        "",
        "| | " + " | ".join(name for name, _ in KINDS) + " |",
        "| --- | " + " | ".join("---:" for _ in KINDS) + " |",
    ]
    for label, pick in rows:
        lines.append(f"| {label} | " + " | ".join(f"{m(kind, pick):g}" for _, kind in KINDS) + " |")
    lines += [
        "",
        "- The warm path of a read-only call costs the turn's own items and one `tools/call` "
        "session: no listing, no listing record.",
        "- A listing's record is written once per listing and conversation; a refresh whose "
        "hash is unchanged writes nothing.",
        "- A decision of an MCP call lists the server anew (its approval is bound to the "
        "definition's hash), then calls it once.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_tools", description=__doc__)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"MCP tools benchmark: {args.samples} samples", flush=True)
    samples = run(args.samples)
    command = command_line("bench.mcp_tools", sys.argv[1:] if argv is None else argv)
    publish(SECTION, render(samples, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
