"""What a plain turn reads through the HTTP handler (issue 21, reads): ``POST .../turns``
as Lambda invokes it (API Gateway's event, ``lambda_handler``) on moto, over the
benchmark's metered store (``bench/metered.py``: every DynamoDB request priced on the wire
by ``bench/pricing.py``, whichever store method sent it). Counts requests and priced units,
never times. Issue 21's target: at most 3 RCU per turn at steady state, one read round trip
on most turns. Before, the route read 4 RCU in 4 requests (the head twice, the draft's
state for the busy check, the turn's load); it now reads the turn's load alone, whose one
query also reads the run flag (``HEAD#run``) that tells the busy check no draft runs."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto import mock_aws
from turnledger.api import lambda_handler
from turnledger.providers.demo import DemoProvider
from turnledger.runtime import Runtime, set_runtime
from turnledger.store.blobs import S3BlobStore
from turnledger.turn.pipeline import Conversations
from turnledger_local.gateway import LambdaContext

from bench.metered import MeteredStore, StorageWork
from bench.pricing import index_specs
from tests.support.aws import aws_clients, settings_on

#: The read target of issue 21 for a turn at steady state.
MAX_RCU = 3


@dataclass
class Api:
    """``post(text)``: one ``POST .../turns`` without an ``Idempotency-Key`` through the
    handler; ``store`` measures what each request sent."""

    store: MeteredStore
    post: Callable[[str], tuple[int, StorageWork]]


@pytest.fixture
def api(load_event: Callable[[str], dict[str, Any]]) -> Iterator[Api]:
    template = load_event("turn")
    with mock_aws():
        clients = aws_clients()
        settings = settings_on(clients)
        store = MeteredStore(
            clients.dynamodb,
            settings.table_name,
            S3BlobStore(clients.s3, settings.bucket_name),
            index_specs(),
        )
        service = Conversations(store=store, provider=DemoProvider(), settings=settings)
        set_runtime(
            Runtime(
                settings=settings, conversations=service, store=store, dynamodb=clients.dynamodb
            )
        )

        def post(text: str) -> tuple[int, StorageWork]:
            event = copy.deepcopy(template)
            event["headers"].pop("idempotency-key", None)
            event["body"] = json.dumps({"input": text})
            work = store.begin()
            context = LambdaContext(
                function_name="TurnFunction", memory_limit_in_mb=512, timeout_seconds=29
            )
            answer: dict[str, Any] = lambda_handler(event, context)
            return int(answer["statusCode"]), work

        try:
            yield Api(store, post)
        finally:
            set_runtime(None)


def test_a_second_plain_turn_through_http_reads_once(api: Api) -> None:
    """The second turn of a conversation (and the ones after it) through ``POST .../turns``:
    one read request (the turn's own load: its head numbers and checks the turn, its run
    flag clears the busy check), 1 RCU, and its one conditional write."""
    status, _ = api.post("hello 1")
    assert status == 200
    for n in (2, 3):
        status, work = api.post(f"hello {n}")
        assert status == 200
        assert work.read_requests == 1, f"turn {n}: {work.read_requests} read requests"
        assert work.priced_rcu == 1 <= MAX_RCU
        assert work.write_requests == 1 and work.priced_wcu <= 2
