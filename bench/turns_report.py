"""What the turn storage benchmark found, and its markdown for ``bench/RESULTS.md``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from turnledger.core.config import Settings
from turnledger.store.base import FIRST_PAGE
from turnledger.store.sealed import deflate
from turnledger_local.template import PROJECT_ROOT

from bench.conversation import REPLY_CHARS, USER_CHARS, WORDS, TurnSample, text_of
from bench.pricing import TRANSACTION_FACTOR, US_EAST_1, write_units
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


#: The layouts run side by side: the one before issue 21 (the baseline) and the current one.
LAYOUT_NAMES = ("legacy", "current")
#: Issue 21's targets.
FLOOR_TARGET = 1.0
COMPACTING_TARGET = 2.0
RCU_TARGET = 3.0
LATENCY_TARGET = 0.6
#: The turns whose storage time and reads are "steady state" (issue 21: 101-300).
STEADY = (101, 300)
#: Conversation length of the monthly cost figure.
COST_TURNS = 50
#: What DynamoDB adds to every item's size for storage billing.
STORAGE_OVERHEAD_BYTES = 100


@dataclass
class LayoutRun:
    """One layout's conversations: the long one, the idle one, and the pair run through
    ``Conversations.turn`` and through the HTTP route's path (drafts)."""

    layout: str
    samples: list[TurnSample] = field(default_factory=list)
    seconds: float = 0.0
    idle: list[TurnSample] = field(default_factory=list)
    plain: list[TurnSample] = field(default_factory=list)
    http: list[TurnSample] = field(default_factory=list)
    #: The HTTP path with its draft begun as the turn starts (``SYNC_DRAFT_AFTER_MS=0``).
    http_eager: list[TurnSample] = field(default_factory=list)


@dataclass
class Results:
    """Everything the section reports (``samples``, ``idle``: the current layout's)."""

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
    layouts: dict[str, LayoutRun] = field(default_factory=dict)
    #: The floor of every turn run (``floor`` stops at ``CUMULATIVE_AT``).
    floor_all: Floor | None = None


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
        *_layout_sections(results),
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
        f"{last} turns on each layout (below), each turn a {USER_CHARS}-character user "
        f"message and a {REPLY_CHARS}-character reply from a deterministic offline provider, "
        "through `Conversations.turn`; the current layout's "
        f"{last} turns took {results.seconds:.0f} s of the run. "
        "Context budget in effect: `ContextMaxTokens` = "
        f"{settings.context_budget(settings.model)} tokens for the model `{settings.model}` "
        "(by the "
        "provider's characters-based estimate): older turns are summarized (by the same "
        "offline provider) into `context_compacted` events, and a turn reads only the "
        "events after the newest summary. Every answer carries its run record "
        "(`run`, about 200 bytes), which takes a 700-character reply's event item (legacy "
        "layout) over 1 KiB: 2 WCU, 4 in its transaction (answers under about 800 "
        "characters stay at 1). "
        "See *Working context* for the read cost of a long conversation.\n\n"
        "**Priced** = what DynamoDB bills for every request sent (priced on the wire by "
        "`bench/metered.py`, whichever store method sent it), from the byte size "
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
    lines = [
        "### Earlier targets (current layout)",
        "",
        "| target | measured | verdict |",
        "| --- | --- | --- |",
    ]

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
        "### Per turn (current layout)",
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
        "### Storage time per turn (current layout)",
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


def _legacy_samples(results: Results) -> list[TurnSample]:
    """The legacy layout's samples (one item per event), when the run had them."""
    legacy = results.layouts.get("legacy")
    return legacy.samples if legacy is not None else results.samples


#: Prose to compare the bench's texts with: the paragraphs of a document of this repository.
PROSE = PROJECT_ROOT / "docs" / "DESIGN.md"
#: Characters of one turn's text (a message and its reply).
TURN_CHARS = USER_CHARS + REPLY_CHARS


def _deflated(text: str) -> int:
    packed = deflate(text.encode())
    return len(text.encode()) if packed is None else len(packed)


def deflated_sizes() -> tuple[int, int]:
    """Bytes that :data:`TURN_CHARS` characters take deflated as the store deflates content
    (:func:`turnledger.store.sealed.deflate`): of the bench's own text, and of English prose
    (windows of :data:`PROSE`'s paragraphs, median)."""
    bench = _deflated(text_of("reply:bench", TURN_CHARS))
    paragraphs = [
        line.strip()
        for line in PROSE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "|", "`", "-", "*", ">"))
    ]
    prose = " ".join(paragraphs)
    windows = [prose[i : i + TURN_CHARS] for i in range(0, len(prose) - TURN_CHARS, TURN_CHARS)]
    return bench, round(statistics.median(_deflated(w) for w in windows))


def _text_note(item_bytes: int) -> str:
    bench, prose = deflated_sizes()
    estimate = item_bytes + prose - bench
    return (
        "Content of 128 bytes or more is stored deflated (docs/STORAGE.md, *Compression*). "
        f"The bench's texts are drawn from a {len(WORDS)}-word vocabulary: deflated, "
        f"{TURN_CHARS} of their characters take {bench} bytes; {TURN_CHARS} characters of "
        f"English prose (the paragraphs of `docs/DESIGN.md`, median) take {prose}. With such "
        f"text a plain turn's item would be about {estimate} bytes: {write_units(estimate)} "
        "WCU (an estimate from these sizes, not a measured run). This run's stores hold "
        "content in clear; sealed, the deployed default, every content value is 35 bytes "
        "longer (*Content encryption*, `bench.crypto`, measures both)."
    )


def _item_sizes(results: Results) -> str:
    samples = _legacy_samples(results)
    current = [s.transcript_bytes for s in results.samples if not s.compacted]
    user = round(_median([s.user_bytes for s in samples]))
    assistant = round(_median([s.assistant_bytes for s in samples]))
    lines = [
        "### Item sizes (legacy layout: one item per event)",
        "",
        "The current layout's transcript items written by a plain turn: "
        f"{round(_median(current))} bytes in all, median.",
        "",
        _text_note(round(_median(current))),
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
    legacy = _legacy_samples(results)
    first, final = legacy[0], legacy[-1]
    turns = min(CUMULATIVE_AT, final.turn)
    upto = legacy[:turns]
    user = write_units(final.user_bytes)
    assistant = write_units(final.assistant_bytes)
    head = write_units(final.head_bytes)
    per_turn = TRANSACTION_FACTOR * (user + assistant + head)
    floor_turn = user + assistant
    index_first = first.priced_index_wcu
    cumulative = sum(s.priced_wcu for s in upto)
    return (
        "### What the legacy commit costs, and why it was a transaction\n\n"
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


# --- the layouts side by side (issue 21) ----------------------------------------------------


def _in(samples: Sequence[TurnSample], low: int, high: int) -> list[TurnSample]:
    return [s for s in samples if low <= s.turn <= high]


def _cumulative_ratio(samples: Sequence[TurnSample], turns: int, floor: Floor) -> float:
    return sum(s.priced_wcu for s in samples[:turns]) / floor.put_item_wcu


def _plain_and_compacting(samples: Sequence[TurnSample]) -> tuple[float, float]:
    """Median priced WCU of the plain turns and of the compacting ones (turn 1 apart)."""
    later = [s for s in samples if s.turn > 1]
    plain = [s.priced_wcu for s in later if not s.compacted]
    compacting = [s.priced_wcu for s in later if s.compacted]
    return _median(plain), _median(compacting)


def _one_read_share(samples: Sequence[TurnSample]) -> float:
    later = [s for s in samples if s.turn > 1]
    return sum(s.read_calls <= 1 for s in later) / len(later) if later else float("nan")


def _layout_sections(results: Results) -> list[str]:
    if set(results.layouts) != set(LAYOUT_NAMES):
        return []
    return [
        _issue_targets(results),
        _side_by_side(results),
        _monthly_cost(results),
        _through_http(results),
    ]


def _issue_targets(results: Results) -> str:
    legacy, current = results.layouts["legacy"], results.layouts["current"]
    last = current.samples[-1].turn
    low, high = STEADY[0], min(STEADY[1], last)
    lines = [
        "### Targets of issue 21 (legacy layout beside the current one)",
        "",
        "Both layouts run in this same run, turn by turn alternately, on the same DynamoDB "
        "Local: **legacy** is the layout before issue 21, frozen in "
        "`tests/support/legacy_layout.py` (one item per event, the whole head on every "
        "commit, one `TransactWriteItems`); **current** is `DynamoDBConversationStore` as "
        "built. The verdict is the current layout's; the approval and decision targets are "
        "judged in *Approval inbox*.",
        "",
        "| target | legacy | current | verdict |",
        "| --- | ---: | ---: | --- |",
    ]
    turns = min(CUMULATIVE_AT, last)
    old = _cumulative_ratio(legacy.samples, turns, results.floor)
    new = _cumulative_ratio(current.samples, turns, results.floor)
    lines.append(
        f"| cumulative WCU over {turns} turns <= {FLOOR_TARGET:g} x the floor (one PutItem "
        f"per message, {_num(results.floor.put_item_wcu)} WCU) | {old:.3f} | {new:.3f} | "
        f"{_verdict(new <= FLOOR_TARGET)} |"
    )
    old_plain, old_compacting = _plain_and_compacting(legacy.samples)
    new_plain, new_compacting = _plain_and_compacting(current.samples)
    if new_compacting == new_compacting:  # a run too short to compact has no compacting turn
        lines.append(
            f"| a compacting turn <= {COMPACTING_TARGET:g} x a plain one (median WCU) | "
            f"{_num(old_compacting)} / {_num(old_plain)} = {old_compacting / old_plain:.2f} | "
            f"{_num(new_compacting)} / {_num(new_plain)} = {new_compacting / new_plain:.2f} | "
            f"{_verdict(new_compacting <= COMPACTING_TARGET * new_plain)} |"
        )
    steady_old = _in(legacy.samples, low, high)
    steady_new = _in(current.samples, low, high)
    if steady_new:
        rcu_old = _median([s.priced_rcu for s in steady_old])
        rcu_new = _median([s.priced_rcu for s in steady_new])
        budget = results.settings.context_budget(results.settings.model)
        lines.append(
            f"| <= {RCU_TARGET:g} RCU per turn at steady state, {budget}-token budget "
            f"(median, turns {low}..{high}) | {_num(rcu_old)} | {_num(rcu_new)} | "
            f"{_verdict(rcu_new <= RCU_TARGET)} |"
        )
    share_old, share_new = _one_read_share(legacy.samples), _one_read_share(current.samples)
    lines.append(
        f"| one read round trip on most turns (share of turns 2..{last} with one read "
        f"request) | {share_old:.0%} | {share_new:.0%} | {_verdict(share_new > 0.5)} |"
    )
    if steady_new:
        ms_old = _median([s.storage_ms for s in steady_old])
        ms_new = _median([s.storage_ms for s in steady_new])
        lines.append(
            f"| storage ms per plain turn (load + commit, median turns {low}..{high}) <= "
            f"{LATENCY_TARGET:g} x legacy | {ms_old:.1f} | {ms_new:.1f} "
            f"({ms_new / ms_old:.2f} x) | {_verdict(ms_new <= LATENCY_TARGET * ms_old)} |"
        )
    return "\n".join(lines)


def _side_by_side(results: Results) -> str:
    legacy, current = results.layouts["legacy"], results.layouts["current"]
    old_by = {s.turn: s for s in legacy.samples}
    new_by = {s.turn: s for s in current.samples}
    last = current.samples[-1].turn
    lines = [
        "### Per turn, both layouts",
        "",
        "Priced WCU and RCU (DynamoDB's billing rules applied to every request sent, as "
        "below), requests sent, and storage time (the store's public calls, as below).",
        "",
        "| turn | WCU legacy | WCU current | RCU legacy | RCU current | read / write "
        "requests legacy | read / write requests current | ms legacy | ms current |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for number in (t for t in MARKED_TURNS if t in new_by):
        o, n = old_by[number], new_by[number]
        lines.append(
            f"| {number} | {_num(o.priced_wcu)} | {_num(n.priced_wcu)} | {_num(o.priced_rcu)} "
            f"| {_num(n.priced_rcu)} | {o.read_calls} / {o.write_calls} | "
            f"{n.read_calls} / {n.write_calls} | {o.storage_ms:.1f} | {n.storage_ms:.1f} |"
        )
    lines += [
        "",
        "| cumulative | WCU legacy | WCU current | x floor legacy | x floor current | "
        "RCU legacy | RCU current | current / legacy ms (median) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    floors = [(min(CUMULATIVE_AT, last), results.floor)]
    if results.floor_all is not None and last > CUMULATIVE_AT:
        floors.append((last, results.floor_all))
    for turns, floor in floors:
        o, n = legacy.samples[:turns], current.samples[:turns]
        ms = _median([s.storage_ms for s in n]) / _median([s.storage_ms for s in o])
        lines.append(
            f"| turns 1..{turns} (floor {_num(floor.put_item_wcu)} WCU) | "
            f"{_num(sum(s.priced_wcu for s in o))} | {_num(sum(s.priced_wcu for s in n))} | "
            f"{_cumulative_ratio(o, turns, floor):.3f} | {_cumulative_ratio(n, turns, floor):.3f} "
            f"| {_num(sum(s.priced_rcu for s in o))} | {_num(sum(s.priced_rcu for s in n))} | "
            f"{ms:.2f} |"
        )
    heads = [sum(s.head_written for s in r.samples) for r in (legacy, current)]
    lines += [
        "",
        f"Head rewritten on {heads[0]} of {last} turns (legacy) and {heads[1]} of {last} "
        "(current). The floor is the legacy run's event items, each put alone "
        "(`PutItem`) into a scratch table: the same messages, the cheapest one-item-per-"
        "message write.",
    ]
    return "\n".join(lines)


def _monthly_cost(results: Results) -> str:
    prices = US_EAST_1
    lines = [
        f"### DynamoDB cost per million turns ({COST_TURNS}-turn conversations)",
        "",
        f"A conversation of {COST_TURNS} turns is the first {COST_TURNS} turns of the long "
        f"one: per turn, the mean priced WCU and RCU of turns 1..{COST_TURNS} (the first "
        "turn's index entries and any compaction included). On-demand prices of "
        f"{prices.region}, {prices.table_class} table class, as of {prices.as_of}: "
        f"${prices.write_per_million} per million write request units, "
        f"${prices.read_per_million} per million read request units, "
        f"${prices.storage_per_gb_month} per GB-month. Storage: the items a million turns "
        f"leave (+{STORAGE_OVERHEAD_BYTES} bytes each, DynamoDB's per-item overhead), kept a "
        "whole month (the default TTL is 7 days: an upper bound); index entries left out.",
        "",
        "| layout | WCU / turn | RCU / turn | requests per million turns | storage per million "
        "turns-month | total per month, 1 M turns |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for layout in LAYOUT_NAMES:
        run = results.layouts[layout]
        first = run.samples[:COST_TURNS]
        if not first:
            continue
        wcu = sum(s.priced_wcu for s in first) / len(first)
        rcu = sum(s.priced_rcu for s in first) / len(first)
        requests = prices.request_cost(wcu * 1e6, rcu * 1e6)
        items = sum(
            s.transcript_bytes + STORAGE_OVERHEAD_BYTES * _items_put(s) for s in first
        ) / len(first)
        storage = prices.storage_cost(items * 1e6)
        lines.append(
            f"| {layout} | {wcu:.2f} | {rcu:.2f} | ${requests:.2f} | ${storage:.2f} | "
            f"**${requests + storage:.2f}** |"
        )
    return "\n".join(lines)


def _items_put(sample: TurnSample) -> int:
    # A legacy turn puts one item per event (2 on a plain turn); a transcript item holds more.
    return 2 if sample.user_bytes or sample.assistant_bytes else 1


def _through_http(results: Results) -> str:
    lines = [
        "### A plain turn through HTTP (synchronous-turn drafts)",
        "",
        "`POST .../turns` without an idempotency key runs "
        "`longturns.run_synchronously`: with `SYNC_TURN_DRAFTS` on (the default) a turn "
        "that runs longer than `SYNC_DRAFT_AFTER_MS` (1000 ms) also writes its draft (side "
        "items `S#...`, and the run flag `HEAD#run` first, followed by `GET .../turns/{n}`); "
        "these turns end sooner (the bench's model answers at once), so they write none. Its "
        "reads: the turn's own load, whose one query reads the run flag with the head, so the "
        "busy check reads the draft's state only when the flag names the turn (docs/STORAGE.md, "
        "*Synchronous HTTP turns and drafts*). Three conversations per layout, the "
        "same messages: through `Conversations.turn`, through that path, and through it "
        "with `SYNC_DRAFT_AFTER_MS=0` (the draft begun as the turn starts); medians of turns "
        "2..N, priced. The legacy store's load reads no run flag: its busy check reads the "
        "draft's state on every turn.",
        "",
        "| layout | path | WCU | RCU | read / write requests | storage ms |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for layout in LAYOUT_NAMES:
        run = results.layouts[layout]
        for path, samples in (
            ("Conversations.turn", run.plain),
            ("POST .../turns", run.http),
            ("POST .../turns, `SYNC_DRAFT_AFTER_MS=0`", run.http_eager),
        ):
            later = [s for s in samples if s.turn > 1]
            if not later:
                continue
            lines.append(
                f"| {layout} | {path} (turns 2..{later[-1].turn}) | "
                f"{_num(_median([s.priced_wcu for s in later]))} | "
                f"{_num(_median([s.priced_rcu for s in later]))} | "
                f"{_num(_median([s.read_calls for s in later]))} / "
                f"{_num(_median([s.write_calls for s in later]))} | "
                f"{_median([s.storage_ms for s in later]):.1f} |"
            )
    later = [s for s in results.layouts["current"].http if s.turn > 1]
    if later:
        rcu = _median([s.priced_rcu for s in later])
        share = _one_read_share(later)
        lines += [
            "",
            "| target (current layout, `POST .../turns`, the default path) | measured | verdict |",
            "| --- | ---: | --- |",
            f"| <= {RCU_TARGET:g} RCU per turn at steady state (median, turns "
            f"2..{later[-1].turn}) | {_num(rcu)} (max {_num(max(s.priced_rcu for s in later))}) "
            f"| {_verdict(rcu <= RCU_TARGET)} |",
            f"| one read round trip on most turns (share of turns 2..{later[-1].turn} with one "
            f"read request) | {share:.0%} | {_verdict(share > 0.5)} |",
        ]
    return "\n".join(lines)
