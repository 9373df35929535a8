"""Permissions from the code: every AWS call each function makes, allowed by its role.

One scenario drives every function through the local runner as deployed with every
optional setting that adds a policy: tenant sessions assumed through STS with their
session policy, the tool registry and the redaction rules in SSM parameters, the
OpenAI key, the callback key and the notify key in Secrets Manager, approval
notifications on an EventBridge bus, a Bedrock model reached through a cross-Region
inference profile, content sealed under KMS, payloads offloaded to S3 and an export
answered with a presigned link. The runner's worker hook (:mod:`tests.support.aws_calls`)
records each call its functions make.

Each recorded call is then evaluated by ``@cloud-copilot/iam-simulate``
(:mod:`tests.support.iam_policies`) against its function's role in the template as
``aws-sam-translator`` translates it, intersected with the tenant's session policy where
it ran as a tenant, under every combination of the optional parameters. A call its
role would deny fails the test; the test prints, per function, each action its code
uses and the statement that allows it. ``test_a_removed_statement_is_found`` shows the
evaluation fails when a statement its code needs is taken away.

``TURNLEDGER_AWS_CALLS=<file>`` keeps the record in that file (and reads it from there
when it exists: ``pytest -k permissions`` on a record of a wider run).
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.embedded import provision_keys
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT, load_template

from tests.functional.fake_bedrock import FakeBedrock, converse_reply
from tests.functional.fake_openai import FakeOpenAI
from tests.http.conftest import ANN
from tests.support import iam_policies
from tests.support.aws_calls import RECORD_FILE, Call, read
from tests.support.wire_demo import responses_demo

pytestmark = pytest.mark.http

#: A Bedrock model reached through the US cross-Region inference profile.
PROFILE_MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
TOOLS = PROJECT_ROOT / "events" / "local-tools.json"
REDACTION = {
    "version": "r1",
    "rules": [{"name": "card", "pattern": r"\b\d{16}\b", "replacement": "[card]"}],
}
ACME_ANN = ANN
APPROVER = {"Authorization": "Bearer local:acme:ann:turnledger/approve"}


def _tools(url: str) -> str:
    """The sample registry, its approval-gated tool notifying a webhook."""
    registry = json.loads(TOOLS.read_text(encoding="utf-8").replace("${LOCAL_URL}", url))
    for tool in registry["tools"]:
        if tool["name"] == "send_email":
            tool["notify"] = f"{url}/_local/echo"
    return json.dumps(registry)


def _client(service: str, endpoint: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _ok(response: httpx.Response, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200,)), response.text
    return response.json() if response.content else {}


def _scenario(http: httpx.Client, clock: ClockFile) -> None:
    """Every route of every function, the worker and the sweep."""
    turns = "/v1/conversations/{}/turns"
    # Turn: a payload over the offload threshold (S3), a redacted input, a tool call that
    # waits for approval (inbox entry, notification, webhook).
    _ok(http.post(turns.format("a"), json={"input": "My name is Ann. " + "x" * 3000}, headers=ANN))
    _ok(http.post(turns.format("a"), json={"input": "card 4111111111111111"}, headers=ANN))
    # A streamed turn, in the streaming function (its URL deployed).
    streamed = http.post(
        turns.format("s"),
        json={"input": "My name is Ann. " + "x" * 3000},
        headers={**ANN, "Accept": "text/event-stream"},
    )
    assert streamed.status_code == 200 and "event: done" in streamed.text, streamed.text
    waiting = _ok(
        http.post(
            turns.format("w"),
            json={"input": '/tool send_email {"to": "bob@example.com"}'},
            headers=ANN,
        )
    )
    assert waiting["status"] == "awaiting_approval"
    # Bedrock through an inference profile.
    _ok(
        http.post(
            turns.format("b"),
            json={"input": "Hello.", "provider": "bedrock-converse", "model": PROFILE_MODEL},
            headers=ANN,
        )
    )
    # A long turn: the worker.
    accepted = http.post(
        turns.format("long"),
        json={"input": "Hello there."},
        headers={**ANN, "Prefer": "respond-async"},
    )
    assert accepted.status_code == 202, accepted.text
    http.get("/v1/conversations/long/turns/1", params={"wait": 10}, headers=ANN)
    # Read: every GET route.
    for path in (
        "/v1/conversations/a",
        "/v1/conversations/a/events",
        "/v1/conversations/a/forks",
        "/v1/conversations/a/turns",
        "/v1/conversations/a/turns/1",
        "/v1/conversations/a/turns/1/context",
        "/v1/approvals",
        "/v1/memories",
    ):
        _ok(http.get(path, headers=APPROVER))
    exported = http.get("/v1/conversations/a/export", headers=ANN, follow_redirects=False)
    assert exported.status_code in (200, 303), exported.text
    # Turn function's other routes: import, fork, compact, replay, memories, OpenAI face.
    export = http.get("/v1/conversations/a/export", headers=ANN, follow_redirects=True)
    assert export.status_code == 200, export.text
    imported = http.post(
        "/v1/conversations/copy/import",
        content=export.content,
        headers={**ANN, "Content-Type": "application/x-ndjson"},
    )
    assert imported.status_code in (200, 201), imported.text
    _ok(
        http.post("/v1/conversations/a/fork", json={"to": "a-fork", "after_turn": 1}, headers=ANN),
        200,
        201,
    )
    _ok(http.post("/v1/conversations/a/compact", json={}, headers=ANN), 200, 202, 409)
    _ok(
        http.post(
            "/v1/conversations/a/replays",
            json={"provider": "openai-responses", "model": "gpt-test"},
            headers=ANN,
        ),
        200,
        201,
        202,
    )
    memory = _ok(http.post("/v1/memories", json={"text": "Ann likes tea."}, headers=ANN), 200, 201)
    _ok(http.patch(f"/v1/memories/{memory['id']}", json={"text": "Ann likes coffee."}, headers=ANN))
    created = _ok(http.post("/openai/v1/conversations", json={}, headers=ANN), 200, 201)
    _ok(
        http.post(
            "/openai/v1/responses",
            json={"model": "gpt-test", "input": "Hi.", "conversation": created["id"]},
            headers=ANN,
        )
    )
    _ok(
        http.post(
            "/openai/v1/chat/completions",
            json={"model": "gpt-test", "messages": [{"role": "user", "content": "Hi."}]},
            headers=ANN,
        )
    )
    # Approve: decide the waiting call, cancel, a callback (its key is read to check it).
    [pending] = waiting["pending_tool_calls"]
    _ok(
        http.post(
            "/v1/conversations/w/approvals",
            json={"approve": [pending["id"]]},
            headers=APPROVER,
        )
    )
    _ok(http.post("/v1/conversations/a/cancel", json={}, headers=ANN), 200, 409)
    assert http.post("/v1/callbacks/not-a-token", json={}).status_code in (401, 404, 410)
    # Clear: a conversation (its stored provider responses too), memories, the tenant.
    _ok(http.delete("/v1/conversations/copy", headers=ANN), 204)
    _ok(http.delete(f"/v1/memories/{memory['id']}", headers=ANN), 204)
    _ok(http.delete(f"/openai/v1/conversations/{created['id']}", headers=ANN))
    # Sweep: an approval whose window closed (webhook), conversations whose TTL passed.
    other = {"Authorization": "Bearer local:globex:bob"}
    _ok(
        http.post(
            turns.format("g"),
            json={"input": '/tool send_email {"to": "eve@example.com"}'},
            headers=other,
        )
    )
    _ok(http.post(turns.format("h"), json={"input": "Remember me."}, headers=other))
    # The approval's window (APPROVAL_TTL_SECONDS) closes before the conversations' TTL.
    clock.advance(1200)
    _ok(http.post("/_local/sweep", headers=other))
    clock.advance(7200)
    _ok(http.post("/_local/sweep", headers=other))
    _ok(http.delete("/v1/conversations", headers=ANN))


def _record_to(path: Path, clock: ClockFile, moto: str) -> None:
    """Run the scenario once, recording its calls in ``path``."""
    suffix = uuid.uuid4().hex[:8]
    names = {
        "table": f"perm-{suffix}",
        "bucket": f"permb-{suffix}",
        "keys": f"perm-{suffix}-keys",
        "tools": f"/perm-{suffix}/tools",
        "redaction": f"/perm-{suffix}/redaction",
        "openai": f"perm-{suffix}-openai",
        "callback": f"perm-{suffix}-callback",
        "notify": f"perm-{suffix}-notify",
        "bus": f"perm-{suffix}-approvals",
    }
    secrets = _client("secretsmanager", moto)
    for secret in ("openai", "callback", "notify"):
        secrets.create_secret(Name=names[secret], SecretString=uuid.uuid4().hex * 2)
    _client("events", moto).create_event_bus(Name=names["bus"])
    ssm = _client("ssm", moto)
    ssm.put_parameter(Name=names["redaction"], Value=json.dumps(REDACTION), Type="String")
    key = provision_keys(
        load_template(),
        names["keys"],
        endpoint=moto,
        region="us-east-1",
        credentials={"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
    )
    with FakeOpenAI() as fake, FakeBedrock(default=converse_reply("Hi from Bedrock.")) as bedrock:
        fake.default = responses_demo(fake)
        env = {
            RECORD_FILE: str(path),
            "TENANT_ROLE_ARN": iam_policies.TEST_TENANT_ROLE,
            "AWS_ENDPOINT_URL_STS": moto,
            "AWS_ENDPOINT_URL_SSM": moto,
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": moto,
            "AWS_ENDPOINT_URL_EVENTBRIDGE": moto,
            "KMS_ENDPOINT": moto,
            "KEYS_TABLE_NAME": names["keys"],
            "CONTENT_KMS_KEY_ID": key,
            "TOOLS_PARAMETER": names["tools"],
            "REDACTION_PARAMETER": names["redaction"],
            "OPENAI_API_KEY_SECRET": names["openai"],
            "OPENAI_BASE_URL": fake.base_url,
            "PROVIDER_MAX_RETRIES": "0",
            "PROVIDERS": "bedrock-converse",
            "ALLOWED_MODELS": "*",
            "BEDROCK_ENDPOINT": bedrock.url,
            "CALLBACK_SECRET_ARN": names["callback"],
            "CALLBACK_KEY": "",
            "NOTIFY_SECRET_ARN": names["notify"],
            "NOTIFICATIONS_BUS": names["bus"],
            "APPROVAL_TTL_SECONDS": "600",
            "OFFLOAD_THRESHOLD_BYTES": "1024",
            "EXPORT_INLINE_MAX_BYTES": "1024",
            "APPROVER_SCOPE": "turnledger/approve",
        }
        config = LocalConfig(
            port=0,
            ttl_seconds=3600,
            table=names["table"],
            bucket=names["bucket"],
            provider="openai-responses",
            model="gpt-test",
            dynamodb_endpoint=moto,
            s3_endpoint=moto,
            clock_file=clock.path,
            worker_hook="tests.support.aws_calls:record",
            env=env,
        )
        with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=60) as http:
            ssm.put_parameter(Name=names["tools"], Value=_tools(runner.url), Type="String")
            _scenario(http, clock)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, moto_server_endpoint: str) -> list[Call]:
    """The calls of the scenario (or of the record ``TURNLEDGER_AWS_CALLS`` names)."""
    kept = os.environ.get("TURNLEDGER_AWS_CALLS")
    if kept and Path(kept).is_file() and Path(kept).stat().st_size:
        return read(kept)
    tmp = tmp_path_factory.mktemp("permissions")
    path = Path(kept) if kept else tmp / "calls.jsonl"
    clock = ClockFile(tmp / "clock", iam_policies.START)
    _record_to(path, clock, moto_server_endpoint)
    return read(path)


def _requests(
    recorded: list[Call], template: dict[str, Any], values: dict[str, Any]
) -> tuple[list[iam_policies.Request], iam_policies.Deployment]:
    deployment = iam_policies.deployed(values, template)
    requests = sorted(
        {r for call in recorded for r in iam_policies.requests_of(call, deployment, template)},
        key=lambda r: (r.function, r.tenant, r.action, r.resource, repr(r.context)),
    )
    return iam_policies.sample(requests), deployment


def _denials(
    recorded: list[Call], template: dict[str, Any], combinations: list[dict[str, Any]]
) -> tuple[list[str], dict[str, dict[str, set[str]]]]:
    """What the roles of ``template`` deny of ``recorded`` under each of ``combinations``,
    and per function each action allowed with the statements that allow it."""
    batches = [_requests(recorded, template, values) for values in combinations]
    denied: list[str] = []
    uses: dict[str, dict[str, set[str]]] = {}
    answers = iam_policies.simulate(batches)
    for values, (requests, deployment), batch in zip(combinations, batches, answers, strict=True):
        for request, answer in zip(requests, batch, strict=True):
            who = f"{request.function}{' as tenant' if request.tenant else ''}"
            if answer["result"] != "Allowed":
                denied.append(
                    f"[{iam_policies.label(values)}] {who}: {request.action} on "
                    f"{request.resource} {dict(request.context)} -> {answer['result']} "
                    f"{answer['errors'] or ''}"
                )
                continue
            names = {
                iam_policies.statement_name(deployment, request, allowed)
                for allowed in answer["allowedBy"]
            }
            uses.setdefault(who, {}).setdefault(request.action, set()).update(names)
    return denied, uses


def test_every_call_of_every_function_is_allowed_by_its_role(recorded: list[Call]) -> None:
    functions = {call["function"] for call in recorded}
    # Every function ran: the record covers them all.
    assert functions >= {
        "TurnFunction",
        "ApproveFunction",
        "ReadFunction",
        "ClearFunction",
        "SweepFunction",
        "TurnWorkerFunction",
        "StreamFunction",
    }, functions
    denied, uses = _denials(recorded, load_template(), iam_policies.combinations())
    print("\nPermissions from the code (every combination of the optional parameters):")
    for who in sorted(uses):
        print(f"  {who}")
        for action in sorted(uses[who]):
            print(f"    {action:42} {', '.join(sorted(uses[who][action]))}")
    assert not denied, "\n".join(sorted(set(denied))[:80])


def test_a_removed_statement_is_found(recorded: list[Call]) -> None:
    """The evaluation can fail: without the tenant role's ConversationObjects statement,
    every offloaded payload a tenant's request reads or writes is denied."""
    template = copy.deepcopy(load_template())
    role = template["Resources"]["TenantAccessRole"]["Properties"]
    [policy] = role["Policies"]
    statements = policy["PolicyDocument"]["Statement"]
    policy["PolicyDocument"]["Statement"] = [
        s for s in statements if s.get("Sid") != "ConversationObjects"
    ]
    assert len(policy["PolicyDocument"]["Statement"]) == len(statements) - 1
    [none] = [v for v in iam_policies.combinations() if iam_policies.label(v) == "none"]
    denied, _ = _denials(recorded, template, [none])
    refused = {line.split(" on ")[0] for line in denied}
    # Only what the statement allowed is refused, and a tenant's payloads both ways.
    assert all(" as tenant: s3:" in line and "Object" in line for line in refused), refused
    assert "[none] TurnFunction as tenant: s3:PutObject" in refused
    assert "[none] ReadFunction as tenant: s3:GetObject" in refused
