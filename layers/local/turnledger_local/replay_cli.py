"""``turnledger replay``: replays (:mod:`turnledger.turn.replays`) over many conversations of
a tenant, straight against a table and bucket (or a ``--data-dir``), with the aggregate::

    turnledger replay --data-dir .data --tenant acme --provider openai-chat --model gpt-4o \\
        --sample 50 --concurrency 4 --json replay.json --csv replay.csv

Each conversation's replay is stored as ``POST .../replays`` stores it (its record can be
read with ``GET .../replays/{id}``) and runs here, in this process, a few at a time
(``--concurrency``), with a progress bar on stderr. The table of every conversation and
the total goes to stdout; ``--json`` and ``--csv`` write the same rows.

``--expect FILE`` judges each replay (the ``expect`` object of ``POST .../replays``,
:mod:`turnledger.turn.judging`): each row says whether the conversation passed and how
many of its turns did, and the candidate's pass rate over the conversations closes the
output (``pass rate of PROVIDER/MODEL: P of N conversations (R %), T of J turns``).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The service and rich are imported when the command runs: ``turnledger local`` builds
# this parser too and should not pay for them.
if TYPE_CHECKING:
    from rich.table import Table
    from turnledger.core.config import Settings
    from turnledger.turn.pipeline import Conversations
    from turnledger.turn.replay_records import ReplaySpec, ReplaySummary, Totals

#: The columns of the table, the CSV and each JSON row, in order.
COLUMNS = (
    "conversation_id",
    "replay_id",
    "status",
    "calls",
    "tool_calls",
    "identical_tool_call_share",
    "text_similarity",
    "failed_calls",
    "context_mismatches",
    "passed",
    "turns_judged",
    "turns_passed",
    "original_tokens",
    "candidate_tokens",
    "original_cost_usd",
    "candidate_cost_usd",
    "original_latency_ms",
    "candidate_latency_ms",
    "error",
)
#: The ``conversation_id`` of the total row.
TOTAL = "TOTAL"


@dataclass
class Row:
    """One conversation's replay, as the table shows it."""

    conversation_id: str
    replay_id: str | None = None
    status: str = "error"
    summary: ReplaySummary | None = None
    error: str | None = None
    #: With ``--expect``: whether every judged turn passed (``None``: not judged).
    passed: bool | None = None

    def cells(self) -> dict[str, Any]:
        """The row's values by :data:`COLUMNS`."""
        s = self.summary
        return {
            "conversation_id": self.conversation_id,
            "replay_id": self.replay_id,
            "status": self.status,
            "calls": s.calls if s else None,
            "tool_calls": s.tool_calls if s else None,
            "identical_tool_call_share": s.identical_tool_call_share if s else None,
            "text_similarity": s.text_similarity if s else None,
            "failed_calls": s.failed_calls if s else None,
            "context_mismatches": s.context_mismatches if s else None,
            "passed": self.passed,
            "turns_judged": s.turns_judged if s else None,
            "turns_passed": s.turns_passed if s else None,
            "original_tokens": _tokens(s.original) if s else None,
            "candidate_tokens": _tokens(s.candidate) if s else None,
            "original_cost_usd": s.original.cost_usd if s else None,
            "candidate_cost_usd": s.candidate.cost_usd if s else None,
            "original_latency_ms": s.original.latency_ms if s else None,
            "candidate_latency_ms": s.candidate.latency_ms if s else None,
            "error": self.error,
        }


def _tokens(totals: Totals) -> int:
    return totals.input_tokens + totals.output_tokens


def add_command(commands: Any) -> None:
    """Add the ``replay`` sub-command to ``commands`` (argparse subparsers)."""
    from .store_cli import add_store_arguments

    summary = "replay many conversations of a tenant against another model"
    command = commands.add_parser("replay", help=summary, description=summary)
    command.add_argument(
        "conversation_ids",
        metavar="ID",
        nargs="*",
        help="the conversations (default: every conversation of the tenant, or --sample)",
    )
    command.add_argument("--tenant", required=True, help="the conversations' tenant")
    command.add_argument("--provider", required=True, help="the candidate's provider")
    command.add_argument("--model", required=True, help="the candidate's model")
    command.add_argument("--mode", choices=("pointwise", "rollout"), default="pointwise")
    command.add_argument("--from-turn", type=int, default=None, metavar="N")
    command.add_argument("--to-turn", type=int, default=None, metavar="N")
    command.add_argument(
        "--system-prompt", default=None, help="sent instead of the deployment's system prompt"
    )
    command.add_argument(
        "--expect",
        metavar="FILE",
        default=None,
        help="judge each replay by this JSON expect object (trajectory, constraints)",
    )
    command.add_argument(
        "--sample", type=int, default=None, metavar="N", help="N conversations drawn at random"
    )
    command.add_argument("--seed", type=int, default=None, help="the --sample draw's seed")
    command.add_argument(
        "--concurrency", type=int, default=4, metavar="N", help="replays at once (default: 4)"
    )
    command.add_argument("--json", metavar="FILE", help="write the rows and the total as JSON")
    command.add_argument("--csv", metavar="FILE", help="write the rows and the total as CSV")
    add_store_arguments(command)


def run_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``turnledger replay`` over the store ``settings`` name; returns the exit status
    (1 when any conversation's replay failed)."""
    from rich.console import Console
    from turnledger.core.models import validate_conversation_id
    from turnledger.runtime import Runtime
    from turnledger.turn.judging import Expect
    from turnledger.turn.replay_records import ReplaySpec

    if args.concurrency < 1 or (args.sample is not None and args.sample < 1):
        raise ValueError("--concurrency and --sample must be at least 1")
    # The operator reaches the store itself: any provider the build knows, any model.
    allowed = replace(
        settings,
        providers=(*settings.providers, args.provider),
        allowed_models=("*",),
        turn_worker_function=None,
    )
    service = Runtime.from_settings(allowed).conversations_for(args.tenant)
    spec = ReplaySpec(
        provider=args.provider,
        model=args.model,
        mode=args.mode,
        from_turn=args.from_turn,
        to_turn=args.to_turn,
        system_prompt=args.system_prompt,
        expect=Expect.model_validate_json(Path(args.expect).read_text(encoding="utf-8"))
        if args.expect
        else None,
    )
    named = [validate_conversation_id(c) for c in args.conversation_ids]
    ids = named or _tenant_ids(service, args.tenant)
    if args.sample is not None and args.sample < len(ids):
        ids = sorted(random.Random(args.seed).sample(ids, args.sample))
    rows = replay_all(service, args.tenant, ids, spec, args.concurrency, skip_missing=not named)
    total = total_row(rows)
    console = Console()
    if not console.is_terminal:
        # Piped or redirected: the whole table, not one folded to 80 columns.
        console = Console(width=240)
    console.print(table(rows, total, spec))
    rate = pass_rate(rows, spec)
    if rate is not None:
        console.print(rate)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "tenant": args.tenant,
                    "replay": spec.model_dump(mode="json"),
                    "conversations": [row.cells() for row in rows],
                    "total": total.cells(),
                    "pass_rate": pass_rate(rows, spec),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, fieldnames=COLUMNS)
            writer.writeheader()
            for row in [*rows, total]:
                writer.writerow(row.cells())
    return 1 if any(row.status != "complete" for row in rows) else 0


def _tenant_ids(service: Conversations, tenant: str) -> list[str]:
    return sorted({key.conversation_id for key in service.store.of_tenant(tenant)})


def replay_all(
    service: Conversations,
    tenant: str,
    ids: Iterable[str],
    spec: ReplaySpec,
    concurrency: int,
    *,
    skip_missing: bool = False,
) -> list[Row]:
    """Replay each conversation of ``ids``, ``concurrency`` at a time, with a progress bar
    on stderr; the rows in the order of ``ids``. ``skip_missing``: leave out conversations
    that are no longer visible (the tenant index also lists cleared and expired ones)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from turnledger.core.exceptions import ConversationNotFound

    wanted = list(ids)
    rows: dict[str, Row] = {}
    progress = Progress(
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress, ThreadPoolExecutor(max_workers=concurrency) as pool:
        task = progress.add_task("replay", total=len(wanted))
        futures = {pool.submit(replay_one, service, tenant, cid, spec): cid for cid in wanted}
        for future in as_completed(futures):
            row = future.result()
            rows[futures[future]] = row
            progress.advance(task)
    return [
        rows[cid]
        for cid in wanted
        if not (skip_missing and rows[cid].error == ConversationNotFound.code)
    ]


def replay_one(service: Conversations, tenant: str, conversation_id: str, spec: ReplaySpec) -> Row:
    """Start and run one conversation's replay; a failure is the row's ``error``."""
    from turnledger.core.exceptions import TurnledgerError
    from turnledger.core.models import ConversationKey
    from turnledger.turn.replays import run, start

    key = ConversationKey(tenant=tenant, conversation_id=conversation_id)
    try:
        record = run(service, key, start(service, key, spec).id)
    except TurnledgerError as exc:
        return Row(conversation_id=conversation_id, error=exc.code)
    return Row(
        conversation_id=conversation_id,
        replay_id=record.id,
        status=record.status,
        summary=record.summary,
        error=record.error.code if record.error is not None else None,
        passed=record.passed,
    )


def pass_rate(rows: list[Row], spec: ReplaySpec) -> str | None:
    """The candidate's pass rate over ``rows`` (``None``: nothing judged): conversations
    whose every turn passed, and turns that passed. A failed replay counts as not passed."""
    if spec.expect is None:
        return None
    passed = sum(1 for row in rows if row.passed)
    judged = sum(row.summary.turns_judged or 0 for row in rows if row.summary is not None)
    turns = sum(row.summary.turns_passed or 0 for row in rows if row.summary is not None)
    share = round(100 * passed / len(rows), 1) if rows else 0.0
    return (
        f"pass rate of {spec.provider}/{spec.model}: {passed} of {len(rows)} conversations "
        f"({share} %), {turns} of {judged} turns"
    )


def total_row(rows: list[Row]) -> Row:
    """The aggregate of ``rows``: sums, and shares and similarity over every call."""
    from turnledger.turn.replay_records import ReplaySummary, Totals

    summaries = [row.summary for row in rows if row.summary is not None]
    original, candidate = Totals(), Totals()
    for s in summaries:
        for mine, theirs in ((original, s.original), (candidate, s.candidate)):
            mine.calls += theirs.calls
            mine.input_tokens += theirs.input_tokens
            mine.output_tokens += theirs.output_tokens
            mine.cost_usd = round(mine.cost_usd + theirs.cost_usd, 8)
            mine.latency_ms += theirs.latency_ms
    tool_calls = sum(s.tool_calls for s in summaries)
    identical = sum(s.identical_tool_calls for s in summaries)
    weighted = [(s.text_similarity, s.calls) for s in summaries if s.text_similarity is not None]
    weight = sum(calls for _, calls in weighted)
    return Row(
        conversation_id=TOTAL,
        status="complete" if all(r.status == "complete" for r in rows) else "partial",
        summary=ReplaySummary(
            calls=sum(s.calls for s in summaries),
            tool_calls=tool_calls,
            identical_tool_calls=identical,
            identical_tool_call_share=round(identical / tool_calls, 4) if tool_calls else None,
            text_similarity=round(sum(v * c for v, c in weighted) / weight, 4) if weight else None,
            failed_calls=sum(s.failed_calls for s in summaries),
            context_mismatches=sum(s.context_mismatches for s in summaries),
            original=original,
            candidate=candidate,
            turns_judged=_sum_judged([s.turns_judged for s in summaries]),
            turns_passed=_sum_judged([s.turns_passed for s in summaries]),
        ),
        passed=all(r.passed for r in rows) if any(r.passed is not None for r in rows) else None,
        error=f"{sum(1 for r in rows if r.status != 'complete')} failed" if rows else None,
    )


def _sum_judged(values: list[int | None]) -> int | None:
    counted = [value for value in values if value is not None]
    return sum(counted) if counted else None


def table(rows: list[Row], total: Row, spec: ReplaySpec) -> Table:
    """The rows and the total as a terminal table."""
    from rich.table import Table

    shown = [c for c in COLUMNS if c != "replay_id"]
    grid = Table(title=f"replay against {spec.provider}/{spec.model} ({spec.mode})")
    for column in shown:
        grid.add_column(column, no_wrap=column == "conversation_id", overflow="fold")
    for row in [*rows, total]:
        cells = row.cells()
        grid.add_row(*("" if cells[c] is None else str(cells[c]) for c in shown))
    return grid
