"""Edges over HTTP: concurrency across tenants, hostile bytes, encoded ids, odd tenants,
idempotency records after erasure, and the sample tools on any port.

Each test drives the local runner (worker processes, as Lambda's execution
environments) with httpx; what a test asserts is what a deployed client sees.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from boto3.dynamodb.conditions import Key
from turnledger.core.models import ConversationKey
from turnledger.core.strict_json import MAX_DEPTH
from turnledger.store import keys
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.http.conftest import ANN

Turn = Callable[..., httpx.Response]

TENANTS = [f"tenant-{index}" for index in range(8)]


def bearer(tenant: str, user: str = "u") -> dict[str, str]:
    return {"Authorization": f"Bearer local:{tenant}:{user}"}


@pytest.fixture(scope="module")
def shared() -> Iterator[httpx.Client]:
    """One runner for the tests that only read or are refused (each uses its own ids)."""
    suffix = uuid.uuid4().hex[:8]
    config = LocalConfig(port=0, table=f"edges-{suffix}", bucket=f"edges-{suffix}")
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    error: dict[str, Any] = body["error"]
    return error


# --- tenants under concurrency ---------------------------------------------------------------


def test_concurrent_reads_of_many_tenants_each_get_their_own(ddb_http: httpx.Client) -> None:
    """8 tenants, one conversation id each holds differently: 480 GETs at once from 16
    clients. Every answer is the caller's own conversation; no 5xx.

    The runner used to serve every request on a thread through one Powertools
    resolver, which keeps the current event on itself: answers crossed tenants.
    """
    for index, tenant in enumerate(TENANTS):
        for turn in range(index + 1):
            response = ddb_http.post(
                "/v1/conversations/shared/turns",
                json={"input": f"I am {tenant}, turn {turn}."},
                headers=bearer(tenant),
            )
            assert response.status_code == 200, response.text

    def read(request: int) -> tuple[str, int, dict[str, Any]]:
        tenant = TENANTS[request % len(TENANTS)]
        route = "/v1/conversations/shared" + ("/events?limit=1" if request % 2 else "")
        response = ddb_http.get(route, headers=bearer(tenant))
        return tenant, response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(read, range(480)))

    assert [status for _, status, _ in answers if status != 200] == []
    for tenant, _, body in answers:
        index = TENANTS.index(tenant)
        if "next_after" in body:
            assert body["events"][0]["payload"]["content"] == f"I am {tenant}, turn 0."
        else:
            assert body["turns"] == index + 1, (tenant, body)


# --- bytes that are no JSON object within the limits -------------------------------------------


def nested(depth: int) -> bytes:
    """``{"input": [[...]]}`` with ``depth`` levels of nesting in all (the object counts)."""
    return b'{"input": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


HOSTILE_BODIES = {
    "invalid-utf8": b'{"input": "\xff\xfe caf\xe9"}',
    "utf16-with-bom": '{"input": "hi"}'.encode("utf-16"),
    "utf16-le": '{"input": "hi"}'.encode("utf-16-le"),
    "lone-surrogate": b'{"input": "\\ud800"}',
    "lone-surrogate-key": b'{"\\udfff": 1, "input": "hi"}',
    "nested-10000": nested(10_000),
    "nested-over-limit": nested(MAX_DEPTH + 1),
    "digits-5000": b'{"input": "hi", "n": ' + b"9" * 5000 + b"}",
    "float-out-of-range": b'{"input": "hi", "n": 1e400}',
    "nan": b'{"input": "hi", "n": NaN}',
    "not-json": b"{input: hi}",
    "nul-bytes": b'{"input": "hi"}\x00',
}


@pytest.mark.parametrize("route", ["turns", "approvals"])
@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
def test_hostile_bodies_are_400_invalid_request(
    shared: httpx.Client, route: str, body: bytes
) -> None:
    """Any bytes: a clear 400, never a 500, and nothing stored."""
    response = shared.post(
        f"/v1/conversations/c/{route}",
        content=body,
        headers={**ANN, "content-type": "application/json"},
    )
    error = error_of(response, 400)
    assert error["code"] == "invalid_request"
    assert "Traceback" not in error["message"]
    assert shared.get("/v1/conversations/c", headers=ANN).status_code == 404


def test_the_nesting_limit_is_documented_and_exact(shared: httpx.Client) -> None:
    """At the limit the body is parsed (here it then fails the schema: 422); one deeper is 400
    with the limit in ``details``."""
    at_limit = shared.post("/v1/conversations/c/turns", content=nested(MAX_DEPTH), headers=ANN)
    assert error_of(at_limit, 422)["code"] == "validation_error"
    over = shared.post("/v1/conversations/c/turns", content=nested(MAX_DEPTH + 1), headers=ANN)
    assert error_of(over, 400)["details"] == {"limit": MAX_DEPTH}


def test_a_valid_surrogate_pair_is_text(http: httpx.Client) -> None:
    """An escaped pair is one character (U+1F600), stored and answered as such."""
    response = http.post(
        "/v1/conversations/emoji/turns", content=b'{"input": "\\ud83d\\ude00"}', headers=ANN
    )
    assert response.status_code == 200, response.text
    events = http.get("/v1/conversations/emoji/events", headers=ANN).json()["events"]
    assert events[0]["payload"]["content"] == "\U0001f600"


def test_huge_query_numbers_are_422(shared: httpx.Client) -> None:
    response = shared.get("/v1/conversations/c/events?after=" + "9" * 5000, headers=ANN)
    assert error_of(response, 422)["code"] == "validation_error"


# --- percent-encoded ids -----------------------------------------------------------------------


def test_percent_encoded_ids_are_the_decoded_id(http: httpx.Client) -> None:
    """``a%3Ab`` names the conversation ``a:b`` on every route, as API Gateway decodes it."""
    first = http.post(
        "/v1/conversations/a%3Ab/turns", json={"input": "My name is Ann."}, headers=ANN
    )
    assert first.status_code == 200, first.text
    assert first.json()["conversation_id"] == "a:b"
    second = http.post(
        "/v1/conversations/a:b/turns", json={"input": "What is my name?"}, headers=ANN
    )
    assert second.json()["output_text"] == "Your name is Ann."
    head = http.get("/v1/conversations/a%3ab", headers=ANN).json()
    assert (head["conversation_id"], head["turns"]) == ("a:b", 2)
    assert http.get("/v1/conversations/%61%3Ab/events", headers=ANN).status_code == 200
    assert http.delete("/v1/conversations/a%3Ab", headers=ANN).status_code == 204
    assert http.get("/v1/conversations/a:b", headers=ANN).status_code == 404


@pytest.mark.parametrize("encoded", ["a%2Fb", "a%23b", "a%20b", "%2Da"])
def test_percent_encoded_ids_that_break_the_rule_are_still_400(
    shared: httpx.Client, encoded: str
) -> None:
    response = shared.get(f"/v1/conversations/{encoded}", headers=ANN)
    assert error_of(response, 400)["code"] == "invalid_conversation_id"


# --- tenants that cannot be used ---------------------------------------------------------------


@pytest.mark.parametrize(
    "tenant", ["t" * 2000, "t" * 129, "a/b", "a#b", "tab\there", "caf\u00e9", "a b"], ids=repr
)
def test_unusable_tenant_claims_are_401_without_library_text(
    shared: httpx.Client, tenant: str
) -> None:
    for method, path, body in [
        ("POST", "/v1/conversations/c/turns", {"input": "hi"}),
        ("GET", "/v1/conversations/c", None),
        ("DELETE", "/v1/conversations", None),
    ]:
        response = shared.request(
            method, path, json=body, headers={"Authorization": f"Bearer local:{tenant}".encode()}
        )
        error = error_of(response, 401)
        assert error["code"] == "unauthorized"
        assert "1-128" in error["message"]
        assert "botocore" not in response.text and "ValidationException" not in response.text


def test_the_longest_usable_tenant_works(http: httpx.Client) -> None:
    tenant = "t" * 128
    response = http.post("/v1/conversations/c/turns", json={"input": "hi"}, headers=bearer(tenant))
    assert response.status_code == 200, response.text


# --- idempotency records go with the conversation ----------------------------------------------


def records(runner: LocalRunner, conversation_id: str) -> list[dict[str, Any]]:
    """The idempotency records stored in the conversation's partition."""
    table = boto3.resource(
        "dynamodb", endpoint_url=runner.endpoints["dynamodb"], region_name="us-east-1"
    ).Table(runner.config.table)
    pk = keys.partition_key(ConversationKey(tenant="acme", conversation_id=conversation_id))
    found = table.query(
        KeyConditionExpression=Key("pk").eq(pk) & Key("sk").begins_with(keys.RECORD_PREFIX)
    )
    items: list[dict[str, Any]] = found["Items"]
    return items


def test_a_key_after_delete_runs_anew(served: LocalRunner, http: httpx.Client) -> None:
    """Turn with a key, DELETE, the same request again: a new turn 1, not the old answer."""
    url, key = "/v1/conversations/kept/turns", {**ANN, "Idempotency-Key": "k"}
    first = http.post(url, json={"input": "My name is Ann."}, headers=key)
    assert first.json()["turn"] == 1
    assert http.post(url, json={"input": "My name is Ann."}, headers=key).json() == first.json()
    assert len(records(served, "kept")) == 1

    assert http.delete("/v1/conversations/kept", headers=ANN).status_code == 204
    assert records(served, "kept") == []
    again = http.post(url, json={"input": "My name is Ann."}, headers=key)
    assert again.status_code == 200, again.text
    assert again.json()["turn"] == 1
    head = http.get("/v1/conversations/kept", headers=ANN).json()
    assert (head["turns"], head["events"]) == (1, 2)


def test_a_key_after_tenant_erasure_runs_anew(served: LocalRunner, http: httpx.Client) -> None:
    url, key = "/v1/conversations/erased/turns", {**ANN, "Idempotency-Key": "k"}
    assert http.post(url, json={"input": "one"}, headers=key).json()["turn"] == 1
    assert (
        http.post("/v1/conversations/erased/turns", json={"input": "two"}, headers=ANN).json()[
            "turn"
        ]
        == 2
    )
    report = http.delete("/v1/conversations", headers=ANN).json()
    assert report["complete"] is True and report["conversations_removed"] == 1
    assert records(served, "erased") == []
    again = http.post(url, json={"input": "one"}, headers=key)
    assert again.json()["turn"] == 1
    assert http.get("/v1/conversations/erased", headers=ANN).json()["turns"] == 1


def test_keys_are_per_conversation(http: httpx.Client) -> None:
    """The same key on two conversations is two requests."""
    key = {**ANN, "Idempotency-Key": "same"}
    for conversation in ["left", "right"]:
        response = http.post(
            f"/v1/conversations/{conversation}/turns", json={"input": "hi"}, headers=key
        )
        assert response.json()["conversation_id"] == conversation


# --- the sample tools on any port --------------------------------------------------------------


@pytest.fixture
def sample_tools(runner_config: LocalConfig) -> Iterator[httpx.Client]:
    """``make run ARGS='--tools events/local-tools.json'``, on a port picked at random."""
    config = dataclasses.replace(runner_config, tools_file=PROJECT_ROOT / "events/local-tools.json")
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as client:
        yield client


def test_sample_tools_work_on_any_port(sample_tools: httpx.Client) -> None:
    """The approval session of docs/GUIDE.md answers the echo, not "unreachable"."""
    paused = sample_tools.post(
        "/v1/conversations/c1/turns",
        json={"input": '/tool send_email {"to": "bob@example.com"}'},
        headers=ANN,
    )
    assert paused.json()["status"] == "awaiting_approval", paused.text
    done = sample_tools.post(
        "/v1/conversations/c1/approvals", json={"approve": ["call_1"]}, headers=ANN
    ).json()
    assert done["status"] == "complete"
    assert "unreachable" not in done["output_text"]
    assert "bob@example.com" in done["output_text"]


def test_an_unreachable_tool_is_logged_without_its_arguments(
    runner_config: LocalConfig, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The approval answers "unreachable" to the model, and the console has a warning naming
    the tool and the error type; the arguments never reach a log line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    tools = tmp_path / "tools.json"
    tools.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "send_email",
                        "parameters": {"type": "object"},
                        "require_approval": True,
                        "executor": {
                            "type": "http",
                            "url": f"http://127.0.0.1:{closed_port}/email",
                        },
                    }
                ]
            }
        )
    )
    config = dataclasses.replace(runner_config, tools_file=tools)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as client:
        client.post(
            "/v1/conversations/c/turns",
            json={"input": '/tool send_email {"to": "secret@example.com"}'},
            headers=ANN,
        )
        done = client.post(
            "/v1/conversations/c/approvals", json={"approve": ["call_1"]}, headers=ANN
        )
        assert "tool send_email is unreachable" in done.json()["output_text"]
    out = capfd.readouterr().out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    [warning] = [line for line in lines if line.get("message") == "a tool could not be reached"]
    assert (warning["level"], warning["tool"], warning["error_type"]) == (
        "WARNING",
        "send_email",
        "ConnectError",
    )
    assert warning["tenant"] == "acme" and warning["conversation_id"] == "c"
    assert "secret@example.com" not in out
