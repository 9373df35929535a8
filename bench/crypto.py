"""Content encryption's cost per turn (issue 24): KMS calls, keys-table reads, latency
and priced write units, sealed against clear, over one warm execution environment.

Two conversations of ``--turns`` turns each (a 300-character message, a 700-character
reply: :mod:`bench.conversation`) run through
:class:`~turnledger.turn.pipeline.Conversations` on DynamoDB Local (the table from
``template.yaml``), S3 and KMS on moto's server, turn by turn alternately: one on a store
without keys, one on a store that seals with a :class:`~turnledger.store.keyring.Keyring`
(KMS-wrapped tenant keys, wrapped keys in a keys table on DynamoDB Local). The keyring's
cache runs on the conversation's clock (``--gap`` seconds between turns), so the cache
expires as it would in a warm environment serving one conversation at that pace. The
section ``## Content encryption`` of ``bench/RESULTS.md`` is rewritten with the results.

Run from the repository root: ``.venv/bin/python -m bench.crypto``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import boto3
from turnledger.store.blobs import BlobStore, S3BlobStore
from turnledger.store.keyring import (
    DEFAULT_CACHE_SECONDS,
    DEFAULT_TENANT_CACHE_SECONDS,
    DynamoDBKeyItems,
    Keyring,
    KmsMasterKey,
)
from turnledger.store.sealed import ItemSealer, SealedBlobStore
from turnledger.turn.pipeline import Conversations

from bench.conversation import BenchClock, BenchProvider, Conversation, TurnSample
from bench.engines import local_engines
from bench.metered import MeteredStore
from bench.pricing import index_specs
from bench.results import command_line, machine_line, publish
from tests.support.aws import create_keys_table

TITLE = "Content encryption"


@dataclass
class Side:
    """One conversation's measurements."""

    samples: list[TurnSample] = field(default_factory=list)
    #: Wall time of each whole turn (pipeline, storage, sealing), milliseconds.
    turn_ms: list[float] = field(default_factory=list)


class _KeyReads(DynamoDBKeyItems):
    """The keys table, counting its reads."""

    reads = 0

    def get(self, name: str) -> bytes | None:
        self.reads += 1
        return super().get(name)


def _sealed(store: MeteredStore, blobs: BlobStore, keyring: Keyring) -> MeteredStore:
    # MeteredStore builds its own DynamoDB store; sealing is the base store's two fields.
    store.blobs = SealedBlobStore(blobs, keyring)
    store.sealer = ItemSealer(keyring)
    return store


def run(turns: int, gap: float) -> tuple[Side, Side, KmsMasterKey, _KeyReads, float]:
    """Drive both conversations; returns both sides, the master key (its call count), the
    keys table (its read count) and the cache time."""
    indexes = index_specs()
    with local_engines() as engines:
        clients, settings = engines.clients, engines.settings
        endpoint = clients.s3.meta.endpoint_url  # moto's server: S3 and KMS
        kms = boto3.client(
            "kms",
            endpoint_url=endpoint,
            region_name=clients.s3.meta.region_name,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        master = KmsMasterKey(kms, kms.create_key(Description="bench")["KeyMetadata"]["KeyId"])
        key_items = _KeyReads(clients.dynamodb, create_keys_table(clients.dynamodb))
        blobs = S3BlobStore(clients.s3, settings.bucket_name)
        sides: dict[str, tuple[Conversation, Side]] = {}
        for name in ("clear", "sealed"):
            clock = BenchClock()
            store = MeteredStore(clients.dynamodb, settings.table_name, blobs, indexes)
            if name == "sealed":
                # The cache expires on the conversation's clock, as it would over real time.
                keyring = Keyring(master, key_items, clock=lambda c=clock: c().timestamp())
                store = _sealed(store, blobs, keyring)
            service = Conversations(
                store=store, provider=BenchProvider(), settings=settings, clock=clock
            )
            sides[name] = (Conversation(f"bench-crypto-{name}", store, clock, service), Side())
        for number in range(1, turns + 1):
            for conversation, side in sides.values():
                began = time.perf_counter()
                side.samples.append(conversation.turn(number, gap_seconds=gap))
                side.turn_ms.append((time.perf_counter() - began) * 1000)
            if number == 1:
                master.calls = 0  # the first turn makes the tenant key: cold, not steady
                key_items.reads = 0
            if number % 100 == 0:
                print(f"  turn {number}/{turns}", flush=True)
        for conversation, _ in sides.values():
            assert conversation.is_intact(), conversation.conversation_id
    return sides["clear"][1], sides["sealed"][1], master, key_items, DEFAULT_CACHE_SECONDS


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


@dataclass(frozen=True)
class Pace:
    """KMS calls and keys-table reads of the sealed side at one pace of turns."""

    gap: float
    turns: int
    kms_calls: int
    key_reads: int


def report(
    clear: Side,
    sealed: Side,
    paces: Sequence[Pace],
    cache_seconds: float,
    *,
    gap: float,
    args: Sequence[str],
) -> str:
    """The section's markdown."""
    added = [s - c for s, c in zip(sealed.turn_ms[1:], clear.turn_ms[1:], strict=True)]
    rows = [
        ("turn, mean ms", _mean(clear.turn_ms[1:]), _mean(sealed.turn_ms[1:])),
        (
            "turn, median ms",
            statistics.median(clear.turn_ms[1:]),
            statistics.median(sealed.turn_ms[1:]),
        ),
        (
            "storage, mean ms",
            _mean([s.storage_ms for s in clear.samples[1:]]),
            _mean([s.storage_ms for s in sealed.samples[1:]]),
        ),
        (
            "priced WCU per turn",
            _mean([s.priced_wcu for s in clear.samples]),
            _mean([s.priced_wcu for s in sealed.samples]),
        ),
        (
            "priced RCU per turn",
            _mean([s.priced_rcu for s in clear.samples]),
            _mean([s.priced_rcu for s in sealed.samples]),
        ),
        (
            "transcript bytes per turn",
            _mean([s.transcript_bytes for s in clear.samples]),
            _mean([s.transcript_bytes for s in sealed.samples]),
        ),
    ]
    lines = [
        f"Command: {command_line('bench.crypto', args)}",
        "",
        machine_line(),
        "",
        f"{len(sealed.samples)} turns of one conversation per side, {gap:g} s apart on the",
        "conversation's clock, alternately clear and sealed, through `Conversations.turn` on",
        "DynamoDB Local, S3 and KMS on moto's server; one warm environment, its key cache on",
        f"the same clock ({cache_seconds:g} s for data keys, {DEFAULT_TENANT_CACHE_SECONDS:g} s",
        "for tenant keys). Turn 1 (which creates the tenant key: one `GenerateDataKey`) is",
        "left out of the per-turn rates.",
        "",
        "| | clear | sealed |",
        "| --- | ---: | ---: |",
        *[f"| {name} | {a:.2f} | {b:.2f} |" for name, a, b in rows],
        "",
        f"- Added latency per turn (sealed - clear, same turn): mean {_mean(added):.2f} ms, "
        f"median {statistics.median(added):.2f} ms.",
        "",
        "KMS calls and keys-table reads per warm turn (turns 2 on), by the time between",
        "turns (one conversation per environment: the worst case, nothing shares the keys):",
        "",
        "| seconds between turns | warm turns | KMS calls | per turn | key reads | per turn |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        *[
            f"| {p.gap:g} | {p.turns} | {p.kms_calls} | **{p.kms_calls / p.turns:.4f}** "
            f"| {p.key_reads} | {p.key_reads / p.turns:.4f} |"
            for p in paces
        ],
        "",
        "KMS is called once per tenant per tenant-key period in an environment, the keys",
        "table once per conversation life per data-key period: at steady state, KMS calls per",
        "turn = tenants an environment serves / turns it serves per tenant-key period (one",
        f"conversation every {paces[-1].gap:g} s: "
        f"{paces[-1].gap / DEFAULT_TENANT_CACHE_SECONDS:.4f}). A sealed value is a binary",
        "attribute 34 bytes longer than its clear text: the transcript's write units do not",
        "change.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.crypto", description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between turns")
    parser.add_argument(
        "--slow-gap",
        type=float,
        default=10.0,
        help="seconds between turns of a second, slower run (KMS calls only; 0: none)",
    )
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    clear, sealed, master, key_items, cache = run(args.turns, args.gap)
    warm = args.turns - 1
    paces = [Pace(args.gap, warm, master.calls, key_items.reads)]
    if args.slow_gap > 0:
        _, _, slow_master, slow_reads, _ = run(args.turns, args.slow_gap)
        paces.append(Pace(args.slow_gap, warm, slow_master.calls, slow_reads.reads))
    markdown = report(clear, sealed, paces, cache, gap=args.gap, args=raw)
    publish(TITLE, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
