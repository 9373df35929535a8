"""DynamoDB throttling, failures and transaction conflicts answer cleanly, and store nothing half.

The scenario, through the API's ``lambda_handler`` as Lambda invokes it: a turn
whose model asks for ``send_email`` (approval required) pauses; an approval runs
it against a real HTTP endpoint and completes the turn. A clean run counts the
scenario's DynamoDB calls and the transcript's length after each commit. Then,
for every call *k* and every fault, a fresh conversation runs the scenario with
that fault injected at call *k* (a botocore event hook on the functions' client):

* ``throttle``: ``ProvisionedThroughputExceededException`` instead of the call
  (what botocore raises once its own retries are spent);
* ``conflict``: on writes, the transaction was cancelled for a
  ``TransactionConflict`` (``TransactWriteItems``) or ``TransactionConflictException``;
* ``lost``: on writes, the call lands but its answer is an ``InternalServerError``.

Each failed request answers ``503 service_unavailable`` or ``409
conversation_busy``, both with ``Retry-After`` equal to
``details.retry_after_seconds``, never a 500. Afterwards the transcript is a
prefix of the clean run's at a commit boundary (the state before the request,
or one of its commits whole), the head agrees with it, the tool ran at most
once, and when nothing landed the same request, retried, finishes the scenario.
On moto and on DynamoDB Local; ``tests/http`` repeats one case through the runner.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from turnledger.api import lambda_handler
from turnledger.runtime import get_runtime, set_runtime
from turnledger_local.gateway import LambdaContext

from tests.functional.http_sink import HttpSink, Reply
from tests.support.aws import aws_clients, create_bucket, create_conversations_table

EVENTS_DIR = Path(__file__).resolve().parent.parent.parent / "events"
Fault = Literal["throttle", "conflict", "lost"]
FAULTS: list[Fault] = ["throttle", "conflict", "lost"]
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}
TURN_BODY = {"input": '/tool send_email {"to": "bob@example.com"}'}
APPROVAL_BODY = {"approve": ["call_1"]}


def fault_error(fault: Fault, operation: str) -> ClientError:
    """The ``ClientError`` botocore raises for ``fault`` on ``operation``."""
    if fault == "throttle":
        code, extra = "ProvisionedThroughputExceededException", {}
    elif fault == "lost":
        code, extra = "InternalServerError", {}
    elif operation == "TransactWriteItems":
        code = "TransactionCanceledException"
        extra = {"CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}]}
    else:
        code, extra = "TransactionConflictException", {}
    return ClientError(
        {"Error": {"Code": code, "Message": f"injected {fault}"}, **extra}, operation
    )


@dataclass
class Injector:
    """Counts the DynamoDB calls; fails call ``at`` (1-based) with ``fault``."""

    at: int = 0
    fault: Fault = "throttle"
    calls: list[str] = field(default_factory=list)
    #: The transcript length each committed transaction leaves (clean run).
    commits: list[int] = field(default_factory=list)
    fired: bool = False
    last_params: dict[str, Any] = field(default_factory=dict)

    def before(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        self.calls.append(model.name)
        if len(self.calls) != self.at:
            return
        if self.fault != "lost" and (self.fault == "throttle" or model.name in WRITES):
            self.fired = True
            raise fault_error(self.fault, model.name)

    def parameters(self, params: dict[str, Any], **_: Any) -> None:
        self.last_params = params

    def after(self, model: Any, **_: Any) -> None:
        params = self.last_params
        if model.name == "TransactWriteItems":
            # Events are in "E#<first sequence>" items of ``n`` events (one when absent): the
            # highest last sequence is the transcript's length after it.
            sequences = [
                int(sk.removeprefix("E#")) + int(put["Item"].get("n", {"N": "1"})["N"]) - 1
                for item in params["TransactItems"]
                # Deletes (a decided call's inbox entry) and checks carry no event.
                if (put := item.get("Put")) and (sk := put["Item"]["sk"]["S"]).startswith("E#")
            ]
            self.commits.append(max(sequences, default=self.commits[-1] if self.commits else 0))
        if len(self.calls) == self.at and self.fault == "lost" and model.name in WRITES:
            self.fired = True
            raise fault_error("lost", model.name)


Invoke = Callable[[str, str, dict[str, Any] | None], dict[str, Any]]


def _event(
    template: str, method_path: str, conversation: str, body: Any, *, keyed: bool
) -> dict[str, Any]:
    event = copy.deepcopy(json.loads((EVENTS_DIR / f"{template}.json").read_text("utf-8")))
    event["headers"].pop("idempotency-key", None)
    if keyed and body is not None:
        # One key per conversation and route: a retry of the same request sends it again.
        event["headers"]["idempotency-key"] = f"{conversation}-{template}"
    event["headers"].pop("content-length", None)
    path = method_path.format(id=conversation)
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["pathParameters"] = {"id": conversation}
    event["requestContext"]["requestId"] = f"req-{conversation}-{template}"
    event["body"] = None if body is None else json.dumps(body)
    return event


@dataclass
class Service:
    """The API handler on one backend, with the injector on its DynamoDB client."""

    injector: Injector
    sink: HttpSink
    #: Whether turns and approvals carry an ``Idempotency-Key`` (Powertools' records).
    keyed: bool

    def call(self, route: str, conversation: str, body: Any = None) -> dict[str, Any]:
        template, path = {
            "turn": ("turn", "/v1/conversations/{id}/turns"),
            "approve": ("approve", "/v1/conversations/{id}/approvals"),
            "events": ("get-events", "/v1/conversations/{id}/events"),
            "head": ("get-conversation", "/v1/conversations/{id}"),
        }[route]
        context = LambdaContext(
            function_name="TurnFunction", memory_limit_in_mb=512, timeout_seconds=29
        )
        result: dict[str, Any] = lambda_handler(
            _event(template, path, conversation, body, keyed=self.keyed), context
        )
        return result

    def transcript(self, conversation: str) -> list[tuple[str, str]]:
        """The conversation's events, without ids and times (faults off)."""
        answer = self.call("events", conversation)
        if answer["statusCode"] == 404:
            return []
        assert answer["statusCode"] == 200, answer
        events = json.loads(answer["body"])["events"]
        return [(e["kind"], json.dumps(_content(e), sort_keys=True)) for e in events]


def _content(event: dict[str, Any]) -> dict[str, Any]:
    # Ids, times, run records (latencies) and the calls' idempotency keys differ between runs.
    kept = {
        k: v for k, v in event.items() if k not in {"event_id", "conversation_id", "occurred_at"}
    }
    volatile = {"idempotency_key", "expires_at", "run"}
    kept["payload"] = {k: v for k, v in event["payload"].items() if k not in volatile}
    return kept


@pytest.fixture(params=[False, True], ids=["no-key", "idempotency-key"])
def keyed(request: pytest.FixtureRequest) -> bool:
    """Whether the scenario's requests carry an ``Idempotency-Key``."""
    return bool(request.param)


@pytest.fixture(params=["moto", pytest.param("dynamodb-local", marks=pytest.mark.integration)])
def service(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keyed: bool
) -> Iterator[Service]:
    with HttpSink() as sink, mock_aws() if request.param == "moto" else _nothing():
        sink.respond("/email", Reply(body={"sent": True}))
        tools = tmp_path / "tools.json"
        tools.write_text(
            json.dumps(
                {
                    "tools": [
                        {
                            "name": "send_email",
                            "parameters": {"type": "object"},
                            "require_approval": True,
                            "executor": {"type": "http", "url": sink.url("/email")},
                        }
                    ]
                }
            )
        )
        if request.param == "moto":
            clients = aws_clients()
        else:
            ddb = request.getfixturevalue("ddb_local_endpoint")
            s3 = request.getfixturevalue("moto_server_endpoint")
            clients = aws_clients(ddb, s3_endpoint=s3)
            monkeypatch.setenv("DYNAMODB_ENDPOINT", ddb)
            monkeypatch.setenv("S3_ENDPOINT", s3)
        monkeypatch.setenv("TABLE_NAME", create_conversations_table(clients.dynamodb))
        monkeypatch.setenv("BUCKET_NAME", create_bucket(clients.s3))
        monkeypatch.setenv("TOOLS_FILE", str(tools))
        set_runtime(None)
        injector = Injector()
        events = get_runtime().dynamodb.meta.events
        events.register("before-parameter-build.dynamodb", injector.parameters)
        events.register("before-call.dynamodb", injector.before)
        events.register("after-call.dynamodb", injector.after)
        yield Service(injector, sink, keyed)
        set_runtime(None)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def _scenario(service: Service, conversation: str) -> list[dict[str, Any]]:
    """The turn, then the approval; the answers of both (the second only if the first paused)."""
    first = service.call("turn", conversation, TURN_BODY)
    if first["statusCode"] != 200:
        return [first]
    return [first, service.call("approve", conversation, APPROVAL_BODY)]


def _assert_clean_refusal(answer: dict[str, Any]) -> None:
    body = json.loads(answer["body"])
    assert (answer["statusCode"], body["error"]["code"]) in {
        (503, "service_unavailable"),
        (409, "conversation_busy"),
    }, answer
    headers = {k.lower(): v for k, v in (answer.get("headers") or {}).items()}
    retry_after = int(headers["retry-after"])
    assert retry_after >= 1
    assert body["error"]["details"]["retry_after_seconds"] == retry_after


def test_every_dynamodb_call_of_a_turn_and_an_approval_fails_cleanly(service: Service) -> None:
    injector = service.injector
    answers = _scenario(service, "clean")
    assert [a["statusCode"] for a in answers] == [200, 200], answers
    assert json.loads(answers[0]["body"])["status"] == "awaiting_approval"
    scenario_calls = len(injector.calls)
    boundaries = [0, *injector.commits]
    final = service.transcript("clean")
    assert len(final) == boundaries[-1]
    assert len(service.sink.requests_for("/email")) == 1
    assert scenario_calls >= 4

    refusals = 0
    outcomes: Counter[tuple[str, str, int]] = Counter()
    for at in range(1, scenario_calls + 1):
        for fault in FAULTS:
            conversation = f"c-{fault}-{at}"
            sent_before = len(service.sink.requests_for("/email"))
            injector.calls.clear()
            injector.at, injector.fault, injector.fired = at, fault, False
            answers = _scenario(service, conversation)
            injector.at = 0
            if not injector.fired:
                continue  # this call of this run is not a write (or the path took fewer calls)
            failed = [a for a in answers if a["statusCode"] != 200]
            outcomes[
                (fault, injector.calls[at - 1], failed[0]["statusCode"] if failed else 200)
            ] += 1
            for answer in failed:
                _assert_clean_refusal(answer)
                refusals += 1
            transcript = service.transcript(conversation)
            where = f"{fault} at call {at} ({injector.calls[at - 1]})"
            assert len(transcript) in boundaries, where
            assert transcript == final[: len(transcript)], where
            if transcript:
                head = json.loads(service.call("head", conversation)["body"])
                assert head["events"] == len(transcript), where
            ran = len(service.sink.requests_for("/email")) - sent_before
            assert ran <= 1, where
            # A lost answer to an idempotency record's write leaves the record "in
            # progress": a retry under the same key is busy until the record expires.
            if failed and len(transcript) in {0, boundaries[1]} and ran == 0 and not service.keyed:
                # Nothing of the failed request landed: retried, it finishes the scenario.
                if len(transcript) == 0:
                    assert [a["statusCode"] for a in _scenario(service, conversation)] == [200, 200]
                else:
                    again = service.call("approve", conversation, APPROVAL_BODY)
                    assert again["statusCode"] == 200, (where, again)
                assert service.transcript(conversation) == final, where
    print(f"scenario calls: {injector.calls and scenario_calls}", dict(outcomes))
    # Throttling any call refuses the request: at least one refusal per call of the scenario.
    assert refusals >= scenario_calls, outcomes
