"""What a streamed turn costs beside a synchronous one, on DynamoDB Local (issue 43).

DynamoDB Local reports consumed capacity (the store's meter). The same 100-word answer,
the demo model writing it word by word, runs as ``POST .../turns`` runs it
(:func:`longturns.run_synchronously`: its draft begun after ``SYNC_DRAFT_AFTER_MS``) and as
a streamed turn runs it (:func:`longturns.run_drafted` with a live listener, its draft begun
at once and keeping the response). The live listener holds no store: what it receives it
receives from the run, so the streamed turn reads no more than the synchronous one, and its
draft writes are bounded by the flush interval, not by the deltas.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from turnledger.api import views
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.providers.demo import DemoProvider
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.turn import drafts, longturns
from turnledger.turn.live import Delta
from turnledger.turn.pipeline import Conversations

from bench.conversation import BenchClock

pytestmark = pytest.mark.integration

WORDS = " ".join(f"word{i}" for i in range(100))


class Recorder:
    """A live listener that keeps what it is given (and has no store to read)."""

    def __init__(self) -> None:
        self.turns: list[int] = []
        self.deltas: list[Delta] = []

    def started(self, turn: int) -> None:
        self.turns.append(turn)

    def delta(self, delta: Delta) -> None:
        self.deltas.append(delta)


def _service(store: DynamoDBConversationStore) -> Conversations:
    settings = replace(Settings(), table_name=store.table_name)
    return Conversations(
        store=store,
        provider=DemoProvider(token_delay_ms=20),
        settings=settings,
        clock=BenchClock(),
    )


def test_a_streamed_turn_costs_at_most_twice_the_wcu_and_reads_no_more(
    ddb_local_store: DynamoDBConversationStore,
) -> None:
    store = ddb_local_store
    service = _service(store)
    request = TurnRequest(input=f"echo: {WORDS}")

    before = store.meter.snapshot()
    sync = longturns.run_synchronously(
        service,
        ConversationKey(tenant="t", conversation_id="sync"),
        "ann",
        views.turn_command(request, None, None),
    )
    sync_cost = store.meter.since(before)
    assert sync.output_text == WORDS

    live = Recorder()
    key = ConversationKey(tenant="t", conversation_id="streamed")
    before = store.meter.snapshot()
    streamed, _ = longturns.run_drafted(
        service,
        key,
        "ann",
        views.turn_command(request, None, None),
        answer=lambda result: views.turn_response(result).model_dump(mode="json"),
        read_back=False,
        listener=live,
    )
    streamed_cost = store.meter.since(before)

    assert streamed.output_text == WORDS
    assert live.turns == [1]
    assert "".join(d.text for d in live.deltas) == WORDS
    assert len(live.deltas) == 100
    # Batched: far fewer chunks than deltas, so far fewer writes.
    stored = drafts.read(store, key, 1)
    assert stored.state is not None and stored.state.status == "done"
    assert "".join(c.text for c in stored.chunks) == WORDS
    assert len(stored.chunks) < len(live.deltas) / 4
    assert streamed_cost.write_units <= 2 * sync_cost.write_units, (streamed_cost, sync_cost)
    # The live client read nothing: the streamed turn reads what the synchronous one does
    # (its draft's cancel checks, one per chunk, as the synchronous draft's).
    assert streamed_cost.read_units <= sync_cost.read_units + len(stored.chunks), (
        streamed_cost,
        sync_cost,
    )
