"""A plain turn of a conversation with no class costs what it did before tokens had a key.

Tokens are made under a key derived from the conversation's data key (issue 41); a turn
of a conversation without a data class never derives it: under a policy with detectors
its turn reads and writes the table and the key store exactly as a turn of a deployment
without a policy does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from moto import mock_aws
from turnledger.api.schemas import TurnRequest
from turnledger.context.policy import DataPolicy
from turnledger.core.config import Settings
from turnledger.store.blobs import S3BlobStore
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.aws import aws_clients, create_bucket, create_conversations_table
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
POLICY = DataPolicy.model_validate(
    {
        "version": "v1",
        "classes": [{"name": "public"}, {"name": "pii", "provider_state": False}],
        "detectors": [{"class": "pii", "name": "card", "pattern": "\\b4[0-9]{15}\\b"}],
    }
)


class CountingKeyItems(MemoryKeyItems):
    """Wrapped keys in memory, counting the reads of them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, name: str) -> bytes | None:
        self.reads += 1
        return super().get(name)


@pytest.fixture
def aws() -> Iterator[Any]:
    with mock_aws():
        yield aws_clients()


def _plain_turns(aws: Any, policy: DataPolicy | None) -> tuple[float, float, int, int]:
    """Two plain turns of a conversation with no class: (WCU, RCU, calls, key reads)."""
    items = CountingKeyItems()
    store = DynamoDBConversationStore(
        aws.dynamodb,
        create_conversations_table(aws.dynamodb),
        S3BlobStore(aws.s3, create_bucket(aws.s3)),
        keyring=Keyring(LocalMasterKey(), items, cache_seconds=0),
    )
    svc = Conversations(
        store=store,
        provider=Recording(),
        settings=replace(Settings()),
        clock=FakeClock().now,
        data_policy=policy,
    )
    edge.turn(svc, ANN, "plain", TurnRequest(input="hello"))
    start, reads = store.meter.snapshot(), items.reads
    edge.turn(svc, ANN, "plain", TurnRequest(input="and again"))
    spent = store.meter.since(start)
    calls = spent.read_calls + spent.write_calls
    return spent.write_units, spent.read_units, calls, items.reads - reads


def test_a_plain_turn_costs_the_same_under_a_policy_with_detectors(aws: Any) -> None:
    assert _plain_turns(aws, POLICY) == _plain_turns(aws, None)
