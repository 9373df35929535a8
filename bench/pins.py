"""Pins, measured: what adding one costs, and what active pins cost every later turn.

On DynamoDB Local (the table built from ``template.yaml``, S3 on moto's server),
:class:`~turnledger.turn.pipeline.Conversations` drives one conversation per case, the
same ``--turns`` turns each (a 300-character message and a 700-character reply, as in
``bench/turns.py``). After turn 10 each case pins its pins (``POST .../pins``: one
``pin_added`` event and the head's pins, :mod:`turnledger.turn.pins`), then runs the rest:

* **add**: the priced WCU and RCU of each pin's commit (a turn item and ``HEAD``, whose
  slow state the pins are);
* **per turn**: the median priced WCU, RCU and estimated tokens sent of turns 11..N,
  beside the conversation with no pin.

Pins of a user (``/v1/memories/pins``, :mod:`turnledger.turn.user_pins`) are measured the
same way on a deployment with memory on, the turns' user being the caller: a conversation
without a memory user (memory off), one of a user with no pin, and one of a user with
pins, each with its read requests per turn (the user's pins come in the query that
recalls the user's memory).

Capacity is priced from the size of every item read or written (:mod:`bench.pricing`);
DynamoDB Local misreports transactions. Writes the section ``## Pins`` of
``bench/RESULTS.md``.

Run: ``make bench ARGS=pins`` or ``.venv/bin/python -m bench.pins``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from turnledger.api.schemas import TurnRequest
from turnledger.core.observability import metrics
from turnledger.store.blobs import S3BlobStore
from turnledger.turn.pins import PinCommand, Pins
from turnledger.turn.pipeline import Conversations
from turnledger.turn.user_pins import UserPins

from bench.conversation import REPLY_CHARS, USER_CHARS, BenchClock, BenchProvider, text_of
from bench.engines import local_engines
from bench.metered import MeteredStore
from bench.pricing import index_specs
from bench.results import command_line, machine_line, publish
from tests.support import edge
from tests.support.edge import Caller

SECTION = "Pins"
TENANT = "bench"
CALLER = Caller(tenant=TENANT, actor="bench")
#: The turn after which each case pins.
PINNED_AFTER = 10
#: The cases: (pins, characters each).
CASES = ((0, 0), (1, 200), (5, 200), (1, 2000))


#: The cases of a user's pins: (memory user, pins, characters each).
USER_CASES = ((False, 0, 0), (True, 0, 0), (True, 1, 200), (True, 5, 200))


@dataclass(frozen=True)
class Measured:
    """One case's medians: of its pins' adds, and of its turns after them."""

    add_wcu: float
    add_rcu: float
    turn_wcu: float
    turn_rcu: float
    turn_reads: float
    tokens: float


@dataclass(frozen=True)
class Row(Measured):
    """One case's results."""

    pins: int
    chars: int


@dataclass(frozen=True)
class UserRow(Measured):
    """One case of a user's pins: its results."""

    memory_user: bool
    pins: int
    chars: int


def _measure(
    service: Conversations,
    store: MeteredStore,
    who: Caller,
    conversation: str,
    turns: int,
    adds: Sequence[Callable[[], object]],
) -> Measured:
    """Turns 1..:data:`PINNED_AFTER` of ``conversation``, then each of ``adds`` (a pin's
    add) and the rest of the ``turns`` turns, measured."""
    for n in range(PINNED_AFTER):
        edge.turn(service, who, conversation, _request(n))
        metrics.clear_metrics()
    added = []
    for add in adds:
        work = store.begin()
        add()
        added.append(work)
    wcu, rcu, reads, tokens = [], [], [], []
    for n in range(PINNED_AFTER, turns):
        work = store.begin()
        answer = edge.turn(service, who, conversation, _request(n))
        metrics.clear_metrics()
        wcu.append(work.priced_wcu)
        rcu.append(work.priced_rcu)
        reads.append(work.read_requests)
        tokens.append(answer.context.tokens_estimated)
    return Measured(
        add_wcu=statistics.median(a.priced_wcu for a in added) if added else 0.0,
        add_rcu=statistics.median(a.priced_rcu for a in added) if added else 0.0,
        turn_wcu=statistics.median(wcu),
        turn_rcu=statistics.median(rcu),
        turn_reads=statistics.median(reads),
        tokens=statistics.median(tokens),
    )


def _case(service: Conversations, store: MeteredStore, pins: int, chars: int, turns: int) -> Row:
    conversation = f"pins-{pins}-{chars}"
    control = Pins(service)
    adds = [
        functools.partial(
            control.add,
            CALLER.key(conversation),
            CALLER.actor,
            PinCommand(text_of(f"pin:{index}", chars), "fact"),
        )
        for index in range(pins)
    ]
    measured = _measure(service, store, CALLER, conversation, turns, adds)
    return Row(pins=pins, chars=chars, **dataclasses.asdict(measured))


def _user_case(
    service: Conversations, store: MeteredStore, case: tuple[bool, int, int], turns: int
) -> UserRow:
    memory_user, pins, chars = case
    who = Caller(tenant=TENANT, actor=f"user-{int(memory_user)}-{pins}-{chars}")
    conversation = f"user-pins-{int(memory_user)}-{pins}-{chars}"
    control = UserPins(service)
    adds = [
        functools.partial(
            control.add, TENANT, who.actor, "bench", text_of(f"upin:{index}", chars), "fact", None
        )
        for index in range(pins)
    ]
    measured = _measure(service, store, who, conversation, turns, adds)
    return UserRow(memory_user=memory_user, pins=pins, chars=chars, **dataclasses.asdict(measured))


def _request(n: int) -> TurnRequest:
    return TurnRequest(input=text_of(f"user:{n}", USER_CHARS))


def run(turns: int) -> tuple[list[Row], list[UserRow]]:
    """Measure every case on DynamoDB Local."""
    with local_engines() as engines:
        clients, settings = engines.clients, engines.settings
        store = MeteredStore(
            clients.dynamodb,
            settings.table_name,
            S3BlobStore(clients.s3, settings.bucket_name),
            index_specs(),
        )
        service = Conversations(
            store=store, provider=BenchProvider(), settings=settings, clock=BenchClock()
        )
        rows = []
        for pins, chars in CASES:
            rows.append(_case(service, store, pins, chars, turns))
            print(f"  {pins} pin(s) of {chars} characters measured", flush=True)
        remembering = Conversations(
            store=store,
            provider=BenchProvider(),
            settings=dataclasses.replace(settings, memory_enabled=True),
            clock=BenchClock(),
        )
        user_rows = []
        for case in USER_CASES:
            user_rows.append(_user_case(remembering if case[0] else service, store, case, turns))
            print(f"  a user's pins {case} measured", flush=True)
        return rows, user_rows


def render(rows: list[Row], command: str, turns: int, user_rows: Sequence[UserRow] = ()) -> str:
    """The section's markdown."""
    base = rows[0]
    lines = [
        f"Command: {command}",
        "",
        machine_line(),
        "",
        f"One conversation per case, {turns} turns of {USER_CHARS}-character messages and "
        f"{REPLY_CHARS}-character replies on DynamoDB Local; the pins added after turn "
        f"{PINNED_AFTER}; medians of turns {PINNED_AFTER + 1}..{turns}. Capacity priced from "
        "item sizes (transactional writes at twice the standard rate, index entries "
        "included); tokens are the context's estimate (the deployment's, characters-based).",
        "",
        "| pins | characters each | add one pin, WCU / RCU | turn WCU | turn RCU | "
        "tokens sent per call | tokens more than no pin |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        add = f"{r.add_wcu:g} / {r.add_rcu:g}" if r.pins else "-"
        lines.append(
            f"| {r.pins} | {r.chars} | {add} | {r.turn_wcu:g} | {r.turn_rcu:g} | "
            f"{r.tokens:g} | {r.tokens - base.tokens:+g} |"
        )
    lines += [
        "",
        "A pin is added in one commit of its `pin_added` event that also rewrites `HEAD` "
        "(the pins are its slow state); a turn after it reads the pins with the head it "
        "reads anyway and writes nothing more for them (`HEAD` is not rewritten by a "
        "plain turn), so what a pin costs a turn is its tokens, sent with every model "
        "call, and the head item's size on each read (1 RCU per started 4 KiB).",
    ]
    if user_rows:
        lines += _render_users(user_rows)
    return "\n".join(lines) + "\n"


def _render_users(rows: Sequence[UserRow]) -> list[str]:
    """The lines of the pins of a user (``/v1/memories/pins``)."""
    base = next((r for r in rows if r.memory_user and not r.pins), rows[0])
    lines = [
        "",
        "Pins of a user (`/v1/memories/pins`), the same turns on a deployment with memory "
        "on (memory off for the first row: no memory user):",
        "",
        "| memory user | user pins | characters each | add one pin, WCU / RCU | turn WCU | "
        "turn RCU | read requests per turn | tokens sent per call | tokens more than the "
        "user with no pin |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        add = f"{r.add_wcu:g} / {r.add_rcu:g}" if r.pins else "-"
        more = f"{r.tokens - base.tokens:+g}" if r.memory_user else "-"
        lines.append(
            f"| {'yes' if r.memory_user else 'no'} | {r.pins} | {r.chars} | {add} | "
            f"{r.turn_wcu:g} | {r.turn_rcu:g} | {r.turn_reads:g} | {r.tokens:g} | {more} |"
        )
    lines += [
        "",
        "A user's pins are read in the query that recalls the user's memory (one range of "
        "the user's partition: the records, then the active pins), so a turn with a memory "
        "user makes the same read requests with pins as without, and a turn without one "
        "reads nothing of them; adding one is two puts (the pin, the user's entry for "
        "tenant erasure) after a query of the user's active pins (the budget check). The "
        "turn's one more WCU is its turn item's size: the run record names the user and the "
        "pins it carried (`memory_user`, `user_pins`), which the row with no pin (no record "
        "recalled either) does not.",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.pins", description=__doc__)
    parser.add_argument("--turns", type=int, default=40, help="turns per conversation")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    if args.turns <= PINNED_AFTER + 1:
        parser.error(f"--turns must be over {PINNED_AFTER + 1}")
    print(f"pins benchmark: {len(CASES)} conversations of {args.turns} turns", flush=True)
    rows, user_rows = run(args.turns)
    command = command_line("bench.pins", list(argv or []))
    publish(SECTION, render(rows, command, args.turns, user_rows), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
