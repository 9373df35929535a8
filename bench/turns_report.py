"""What the turn storage benchmark found, and its markdown for ``bench/RESULTS.md``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from turnledger.core.config import Settings
from turnledger.store.base import FIRST_PAGE

from bench.conversation import REPLY_CHARS, USER_CHARS, TurnSample
from bench.pricing import TRANSACTION_FACTOR, write_units
from bench.results import machine_line

#: The turns the per-turn table shows, and where the cumulative figures stop.
MARKED_TURNS = (1, 10, 100, 300, 1000)
CUMULATIVE_AT = 300


@dataclass(frozen=True)
class Floor:
    """The cheapest possible write of the messages: one PutItem per event item."""

    messages: int
    put_item_wcu: float
    computed_wcu: int
    #: Event items whose PutItem capacity equals the 1 KiB rule on their computed size.
    agreeing: int


@dataclass(frozen=True)
class Calibration:
    """DynamoDB Local's capacity for one transaction, next to DynamoDB's price."""

    items: int
    item_bytes: int
    reported: float
    priced: int


@dataclass(frozen=True)
class HeadCheck:
    """A head item's size and what one PutItem of it costs on DynamoDB Local."""

    turn: int
    size: int
    put_item_wcu: float


@dataclass(frozen=True)
class ParallelRun:
    """Many conversations driven at once."""

    conversations: int
    turns: int
    conflicts: int
    intact: int
    seconds: float
    samples: list[TurnSample]


@dataclass
class Results:
    """Everything the section reports."""

    ddb_version: str
    settings: Settings
    samples: list[TurnSample]
    seconds: float
    floor: Floor
    heads: list[HeadCheck]
    calibration: list[Calibration]
    #: A conversation whose turns come more than an hour apart.
    idle: list[TurnSample]
    parallel: ParallelRun | None


# --- formatting -------------------------------------------------------------------------------


def _num(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=10)[-1]


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{_num(min(values))} / {_num(_median(values))} / {_num(max(values))}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


# --- the section --------------------------------------------------------------------------------


def render(results: Results, command: str) -> str:
    """The markdown of the section (without its ``## `` heading)."""
    parts: list[str | None] = [
        _introduction(results, command),
        _targets(results),
        _misses(results),
        _per_turn(results),
        _timing(results.samples),
        _item_sizes(results),
        _commit_explanation(results),
        _idle(results),
        _calibration(results.calibration),
    ]
    if results.parallel is not None:
        parts.append(_parallel(results.parallel, results.samples))
    return "\n\n".join(part for part in parts if part) + "\n"


def _cumulative(results: Results) -> tuple[int, list[TurnSample]]:
    turns = min(CUMULATIVE_AT, results.samples[-1].turn)
    return turns, results.samples[:turns]


def _introduction(results: Results, command: str) -> str:
    last = results.samples[-1].turn
    settings = results.settings
    return (
        f"Command: {command}. Run: {machine_line()}.\n\n"
        f"DynamoDB Local {results.ddb_version}, in memory, on loopback; S3 on moto's server "
        "(nothing is offloaded at these sizes). The table is built from `template.yaml` "
        "(`ConversationsTable`, both indexes). One conversation of "
        f"{last} turns, each a {USER_CHARS}-character user message and a {REPLY_CHARS}-character "
        "reply from a deterministic offline provider, through `Conversations.turn` and "
        f"`DynamoDBConversationStore`; the {last} turns took {results.seconds:.0f} s. "
        "Context budget in effect: the default for the model "
        f"`{settings.model}` ({settings.context_budget(settings.model)} tokens, by the "
        "provider's characters-based estimate): older turns are summarized (by the same "
        "offline provider) into `context_compacted` events, and a turn reads only the "
        "events after the newest summary. Every answer carries its run record "
        "(`run`, about 200 bytes), which takes a 700-character reply's event over 1 KiB: "
        "2 WCU, 4 in the transaction (answers under about 800 characters stay at 1). "
        "See *Working context* for the read cost of a long conversation.\n\n"
        "**Priced** = what DynamoDB bills for the requests the store made, from the byte size "
        "of every item written and read (1 WCU per started KiB per item, x2 inside a "
        "transaction, 1 WCU per index entry put or deleted; 1 RCU per started 4 KiB of a "
        "strongly consistent query, at least 1). **Reported** = the `ConsumedCapacity` "
        "DynamoDB Local returned, as summed by the store's `CapacityMeter`. Reads agree "
        "(DynamoDB Local reports 0 for a query that finds nothing). Transaction writes do "
        "not: DynamoDB Local mis-reports `TransactWriteItems` (calibration below), so the "
        "targets are judged on the priced figure."
    )


def _targets(results: Results) -> str:
    samples = results.samples
    by_turn = {s.turn: s for s in samples}
    first, final = samples[0], samples[-1]
    floor = results.floor
    turns, upto = _cumulative(results)
    cum_priced = sum(s.priced_wcu for s in upto)
    cum_reported = sum(s.reported_wcu for s in upto)
    lines = ["### Targets", "", "| target | measured | verdict |", "| --- | --- | --- |"]

    ratio = final.priced_wcu / first.priced_wcu
    lines.append(
        f"| WCU of turn {final.turn} <= 1.1 x turn 1 | {_num(final.priced_wcu)} / "
        f"{_num(first.priced_wcu)} = {ratio:.2f} (reported: {_num(final.reported_wcu)} / "
        f"{_num(first.reported_wcu)}) | {_verdict(ratio <= 1.1)} |"
    )

    floor_ratio = cum_priced / floor.put_item_wcu
    table_only = cum_priced - sum(s.priced_index_wcu for s in upto)
    lines.append(
        f"| cumulative WCU at {turns} turns <= 3 x the floor (one PutItem per message) | "
        f"{_num(cum_priced)} / {_num(floor.put_item_wcu)} = {floor_ratio:.3f}; table items "
        f"alone {_num(table_only)} / {_num(floor.put_item_wcu)} = "
        f"{table_only / floor.put_item_wcu:.3f}, the rest index entries (reported: "
        f"{_num(cum_reported)} / {_num(floor.put_item_wcu)} = "
        f"{cum_reported / floor.put_item_wcu:.3f}) | {_verdict(floor_ratio <= 3.0)} |"
    )

    over = [s.turn for s in samples if s.read_calls > 1 or s.write_calls > 1]
    calls = (
        f"at most {max(s.read_calls for s in samples)} read and "
        f"{max(s.write_calls for s in samples)} write calls"
    )
    if over:
        calls += f"; more than one on turns {over[0]}..{over[-1]} ({len(over)} of {len(samples)})"
    lines.append(
        f"| <= 1 read and 1 write round trip on a plain turn | {calls} | {_verdict(not over)} |"
    )

    peak = max(s.items_read for s in samples)
    at_300 = _num(by_turn[300].priced_rcu) if 300 in by_turn else "-"
    # A turn reads the head and the events after the newest summary: what its context
    # may hold, and at most the first page's look-ahead beyond (events below the summary).
    plain = [s for s in samples if not s.compacted]
    worst = max(s.items_read - 1 - s.context_events for s in plain)
    compacting = len(samples) - len(plain)
    reads = (
        f"at most {peak} items read on a turn; beyond the events sent to the model a turn "
        f"that did not compact read at most {worst} more (a summary's own event, the first "
        f"page reaching below the summary; the {compacting} compacting turns also read the "
        f"turns they summarized); RCU "
        f"turn 300: {at_300}, turn {final.turn}: {_num(final.priced_rcu)} (compaction keeps "
        "the context, and so the read, between half and all of the budget)"
    )
    verdict = _verdict(worst <= FIRST_PAGE)
    lines.append(f"| reads per turn bounded by what the context needs | {reads} | {verdict} |")
    return "\n".join(lines)


def _misses(results: Results) -> str | None:
    """Why each missed target is missed, from what the run measured; ``None`` if none is."""
    samples = results.samples
    first, final = samples[0], samples[-1]
    _, upto = _cumulative(results)
    floor = results.floor.put_item_wcu
    found = []
    if final.priced_wcu > 1.1 * first.priced_wcu:
        found.append(
            f"- **WCU of turn {final.turn}**: items grew from {first.user_bytes} / "
            f"{first.assistant_bytes} / {first.head_bytes} bytes (user / assistant / head) "
            f"on turn 1 to {final.user_bytes} / {final.assistant_bytes} / {final.head_bytes}."
        )
    index = sum(s.priced_index_wcu for s in upto)
    cumulative = sum(s.priced_wcu for s in upto)
    if cumulative > 3 * floor:
        found.append(
            f"- **Cumulative WCU**: the table writes alone are {_num(cumulative - index)} WCU, "
            f"{(cumulative - index) / floor:.3f}x the floor: the transaction's 2x on the two "
            "event items and on the head, each under 1 KiB, is exactly 3x. What goes over is "
            f"{_num(index)} WCU of index entries (the head's `by-expiry` and `by-tenant` "
            "entries, put once, by the first turn: every later turn is exactly 3x). They are "
            "what lets the sweep find expired conversations without a scan and erasure list "
            "a tenant; a head is only re-filed in the expiry index when its bucket came due "
            "while it was still in use (see *Turns an hour apart*)."
        )
    over = [s for s in samples if s.read_calls > 1]
    if over:
        found.append(
            f"- **Read round trips**: `ConversationStore.load` reads the head and the newest "
            f"{FIRST_PAGE - 1} events in one consistent query; from turn {over[0].turn} on the "
            "context needs more, and the rest of it comes in one more query at the eventually "
            "consistent price (half): a trade of one round trip for half-price reads. The "
            "first page stays small because what it reads below the newest summary is paid "
            "for too."
        )
    if not found:
        return None
    return "### Why the missed targets are missed\n\n" + "\n".join(found)


def _per_turn(results: Results) -> str:
    samples = results.samples
    by_turn = {s.turn: s for s in samples}
    turns, upto = _cumulative(results)
    floor = results.floor
    lines = [
        "### Per turn",
        "",
        "| turn | WCU priced | WCU reported | RCU priced | RCU reported | read calls | "
        "write calls | items read | events in context | storage ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for number in (t for t in MARKED_TURNS if t in by_turn):
        s = by_turn[number]
        lines.append(
            f"| {number} | {_num(s.priced_wcu)} | {_num(s.reported_wcu)} | "
            f"{_num(s.priced_rcu)} | {_num(s.reported_rcu)} | {s.read_calls} | "
            f"{s.write_calls} | {s.items_read} | {s.context_events} | {s.storage_ms:.1f} |"
        )
    lines.append(
        f"| **1..{turns} cumulative** | {_num(sum(s.priced_wcu for s in upto))} | "
        f"{_num(sum(s.reported_wcu for s in upto))} | "
        f"{_num(sum(s.priced_rcu for s in upto))} | {_num(sum(s.reported_rcu for s in upto))} "
        f"| {sum(s.read_calls for s in upto)} | {sum(s.write_calls for s in upto)} | "
        f"{sum(s.items_read for s in upto)} | | |"
    )
    lines += [
        "",
        f"Floor: the {floor.messages} messages of turns 1..{turns}, each event item put alone "
        "(`PutItem`) into a scratch table on DynamoDB Local (same keys, no index) = "
        f"**{_num(floor.put_item_wcu)} WCU**. The 1 KiB rule on the computed item sizes gives "
        f"{floor.computed_wcu}, and agrees with DynamoDB Local for {floor.agreeing} of "
        f"{floor.messages} items.",
    ]
    return "\n".join(lines)


def _timing(samples: Sequence[TurnSample]) -> str:
    last = samples[-1].turn
    lines = [
        "### Storage time per turn",
        "",
        "Milliseconds inside the store's public calls (`load`: the query or queries and "
        "decoding; `commit`: encoding and the transaction), measured in the client; the "
        "provider is not included. DynamoDB Local on loopback has no network latency; a "
        "Lambda function in the table's region adds a few milliseconds per round trip. "
        "Turn 1 includes the first connection to DynamoDB Local.",
        "",
        "| turns | median ms | p90 ms | max ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for low, high in ((1, 10), (11, 100), (101, 300), (301, 1000), (1, last)):
        values = [s.storage_ms for s in samples if low <= s.turn <= high]
        if not values:
            continue
        label = f"{low}..{min(high, last)}" + (" (all)" if (low, high) == (1, last) else "")
        lines.append(
            f"| {label} | {_median(values):.1f} | {_p90(values):.1f} | {max(values):.1f} |"
        )
    return "\n".join(lines)


def _item_sizes(results: Results) -> str:
    samples = results.samples
    user = round(_median([s.user_bytes for s in samples]))
    assistant = round(_median([s.assistant_bytes for s in samples]))
    lines = [
        "### Item sizes",
        "",
        "| item | bytes | WCU of one PutItem | WCU in the commit transaction |",
        "| --- | ---: | ---: | ---: |",
        f"| user event ({USER_CHARS}-character message), median | {user} | "
        f"{write_units(user)} | {TRANSACTION_FACTOR * write_units(user)} |",
        f"| assistant event ({REPLY_CHARS}-character reply), median | {assistant} | "
        f"{write_units(assistant)} | {TRANSACTION_FACTOR * write_units(assistant)} |",
    ]
    for head in results.heads:
        lines.append(
            f"| head after turn {head.turn} | {head.size} | {_num(head.put_item_wcu)} | "
            f"{TRANSACTION_FACTOR * write_units(head.size)} |"
        )
    lines += [
        "",
        f"Over the run: user events {min(s.user_bytes for s in samples)}.."
        f"{max(s.user_bytes for s in samples)} bytes, assistant events "
        f"{min(s.assistant_bytes for s in samples)}..{max(s.assistant_bytes for s in samples)}, "
        f"heads {min(s.head_bytes for s in samples)}..{max(s.head_bytes for s in samples)}. "
        f"The assistant event is {1024 - max(s.assistant_bytes for s in samples)} bytes under "
        "the 1 KiB step at its largest: that many more characters of reply and it costs 2 WCU "
        "(4 in the transaction). Of its bytes, the reply text is "
        f"{REPLY_CHARS}; the rest is keys, the event's envelope (id, kind, actor, time, turn) "
        "and the payload's field names and empty defaults, stored as JSON in `d`.",
    ]
    return "\n".join(lines)


def _commit_explanation(results: Results) -> str:
    first, final = results.samples[0], results.samples[-1]
    turns, upto = _cumulative(results)
    user = write_units(final.user_bytes)
    assistant = write_units(final.assistant_bytes)
    head = write_units(final.head_bytes)
    per_turn = TRANSACTION_FACTOR * (user + assistant + head)
    floor_turn = user + assistant
    index_first = first.priced_index_wcu
    cumulative = sum(s.priced_wcu for s in upto)
    return (
        "### What the commit costs, and why it is a transaction\n\n"
        "A plain turn commits once: one `TransactWriteItems` with a conditional put of each "
        "new event item (`attribute_not_exists(pk) OR g <> :g`) and a put of the head "
        "conditioned on the version the turn read (`ver = :ver`). DynamoDB writes every item "
        "of a transaction twice (prepare and commit) and bills 2 WCU per started KiB of each: "
        f"2 x {user} (user event) + 2 x {assistant} (assistant event) + 2 x {head} (head) = "
        f"**{per_turn} WCU per turn**, against {floor_turn} for one PutItem per message: "
        f"{per_turn / floor_turn:.2f}x (2 x (user + assistant + head) / (user + assistant) "
        "is exactly 3x while the three items cost the same). Turn 1 also puts the head's two "
        "index entries (`by-expiry`, `by-tenant`): "
        f"+{_num(index_first)} WCU. So {turns} turns cost {_num(cumulative)} WCU for a floor "
        f"of {_num(results.floor.put_item_wcu)}; anything beyond the table writes (the first "
        "turn's index entries, an expiry that moves to another hour, below) lands above 3x.\n\n"
        "Why a transaction and not cheaper separate writes: a turn's events and its head "
        "must land together or not at all, and only if no other request committed on the "
        "conversation since this one read it. Separate PutItems (or a BatchWriteItem, which "
        "is not atomic either) can leave events that no head counts, or a head whose "
        "sequence covers events that were never written, whenever a Lambda times out or "
        "crashes between the writes; and the version check would need a conditional head "
        "write of its own first, a second round trip on every turn that still leaves a half "
        "turn behind on a crash. One `TransactWriteItems` gives atomicity and the optimistic "
        "lock in a single round trip. Its price is the 2x on every item, and a head item "
        f"({final.head_bytes} bytes: {head} WCU alone, {TRANSACTION_FACTOR * head} in the "
        "transaction) rewritten on every turn because it carries the lock, the status, the "
        "sequence and the expiry."
    )


def _idle(results: Results) -> str:
    idle = results.idle
    later = [s for s in idle if s.turn > 1]
    steady = [s for s in results.samples if 1 < s.turn <= len(idle)]
    last = idle[-1]
    floor_turn = write_units(last.user_bytes) + write_units(last.assistant_bytes)
    ratio = _median([s.priced_wcu for s in later]) / floor_turn
    return (
        "### Turns an hour apart\n\n"
        "The head is filed in the `by-expiry` index under the hour its TTL falls in, and a "
        "turn keeps that bucket while the sweep has not reached it (it is re-filed, a "
        "delete and a put of the index entry, only once the bucket came due while the "
        "conversation was in use). So turns spread over hours cost what back-to-back turns "
        f"cost. A conversation of {len(idle)} turns 3601 s apart:\n\n"
        "| | turns 2.. an hour apart | turns 2.. a second apart |\n"
        "| --- | ---: | ---: |\n"
        f"| WCU priced (min / median / max) | {_spread([s.priced_wcu for s in later])} | "
        f"{_spread([s.priced_wcu for s in steady])} |\n"
        f"| WCU reported (min / median / max) | {_spread([s.reported_wcu for s in later])} | "
        f"{_spread([s.reported_wcu for s in steady])} |\n\n"
        f"Turns an hour apart: {ratio:.1f}x the floor per turn."
    )


def _calibration(calibration: Sequence[Calibration]) -> str:
    lines = [
        "### DynamoDB Local's transaction accounting (calibration)",
        "",
        "One `TransactWriteItems` of N unconditional puts into the scratch table (no index). "
        "DynamoDB bills 2 x the write units of every item; DynamoDB Local reports 4 x the "
        "units of one item, whatever N is, so it over-reports one-item transactions and "
        "under-reports the three-item commit of a turn. Its `PutItem`, `GetItem` and `Query` "
        "figures follow DynamoDB's rules.",
        "",
        "| items | bytes each | reported by DynamoDB Local | DynamoDB price |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for c in calibration:
        lines.append(f"| {c.items} | {c.item_bytes} | {_num(c.reported)} | {c.priced} |")
    return "\n".join(lines)


def _parallel(run: ParallelRun, single: Sequence[TurnSample]) -> str:
    first = [s for s in run.samples if s.turn == 1]
    later = [s for s in run.samples if s.turn > 1]
    single_later = [s for s in single if 1 < s.turn <= run.turns]
    total = run.conversations * run.turns
    return "\n".join(
        [
            "### Parallel conversations",
            "",
            f"{run.conversations} conversations x {run.turns} turns, one thread each, started "
            f"together on a barrier so their turns interleave: {total} turns in "
            f"{run.seconds:.1f} s ({total / run.seconds:.0f} turns/s on this machine).",
            "",
            "| | parallel | single conversation |",
            "| --- | ---: | ---: |",
            f"| conflicts (`conversation_busy`) | {run.conflicts} | - |",
            f"| transcripts intact (exactly their own {run.turns} turns, in order) | "
            f"{run.intact} / {run.conversations} | - |",
            f"| WCU priced, turn 1 (median) | {_num(_median([s.priced_wcu for s in first]))} | "
            f"{_num(single[0].priced_wcu)} |",
            f"| WCU priced, turns 2..{run.turns} (min / median / max) | "
            f"{_spread([s.priced_wcu for s in later])} | "
            f"{_spread([s.priced_wcu for s in single_later])} |",
            f"| WCU reported, turns 2..{run.turns} (min / median / max) | "
            f"{_spread([s.reported_wcu for s in later])} | "
            f"{_spread([s.reported_wcu for s in single_later])} |",
            f"| read / write calls per turn (max) | {max(s.read_calls for s in run.samples)} / "
            f"{max(s.write_calls for s in run.samples)} | "
            f"{max(s.read_calls for s in single_later)} / "
            f"{max(s.write_calls for s in single_later)} |",
            f"| storage ms per turn (median) | "
            f"{_median([s.storage_ms for s in run.samples]):.1f} | "
            f"{_median([s.storage_ms for s in single if s.turn <= run.turns]):.1f} |",
            "",
            "Each conversation is its own partition and each commit conditions only on its "
            "own head, so parallel conversations do not conflict and pay the same per turn. "
            "The storage times are not comparable beyond that: the client threads and "
            "DynamoDB Local share this machine's CPUs.",
        ]
    )
