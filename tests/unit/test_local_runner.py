"""The local runner plays API Gateway: routes, auth, limits and events as deployed.

Most tests serve a tiny template and fake functions written to ``tmp_path``, so
they test the runner alone; the last ones bring up the embedded storage from
the real ``template.yaml``.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from turnledger_local.cli import build_parser, config_from_args, main
from turnledger_local.embedded import EmbeddedStorage, StorageNames, provision
from turnledger_local.gateway import MAX_BODY_BYTES, HttpRequest
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import load_template, table_definition, ttl_attribute

from tests.support.cli import read_until

FAKE_TEMPLATE = """\
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Globals:
  Function:
    Runtime: python3.13
    Timeout: 7
    MemorySize: 256
  HttpApi:
    Auth:
      DefaultAuthorizer: Jwt
      Authorizers:
        Jwt: {IdentitySource: $request.header.Authorization}
Resources:
  EchoFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fns/echo/
      Handler: app.lambda_handler
      Events:
        GetThing:
          Type: HttpApi
          Properties: {Method: GET, Path: "/v1/things/{id}"}
        ListThings:
          Type: HttpApi
          Properties: {Method: GET, Path: /v1/things}
        PostPart:
          Type: HttpApi
          Properties: {Method: POST, Path: "/v1/things/{id}/parts"}
        Open:
          Type: HttpApi
          Properties:
            Method: GET
            Path: /v1/open
            Auth:
              Authorizer: NONE
  OddFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fns/odd/
      Handler: main.handle
      MemorySize: 1024
      Timeout: 3
      Events:
        Rendezvous:
          Type: HttpApi
          Properties: {Method: GET, Path: /v1/rendezvous}
        Boom:
          Type: HttpApi
          Properties: {Method: POST, Path: /v1/boom}
        Crash:
          Type: HttpApi
          Properties: {Method: POST, Path: /v1/crash}
        Slow:
          Type: HttpApi
          Properties: {Method: GET, Path: /v1/slow}
        Binary:
          Type: HttpApi
          Properties: {Method: GET, Path: /v1/binary}
        Plain:
          Type: HttpApi
          Properties: {Method: GET, Path: /v1/plain}
        Hang:
          Type: HttpApi
          Properties: {Method: GET, Path: /v1/hang}
  SweepFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fns/sweep/
      Handler: app.lambda_handler
      Events:
        Schedule:
          Type: Schedule
          Properties: {Schedule: rate(1 hour)}
"""

ECHO_APP = """\
import json, os

def lambda_handler(event, context):
    with open(os.environ["FAKE_CALL_LOG"], "a") as log:
        log.write(event["routeKey"] + "\\n")
    body = event.pop("body", None)
    answer = {
        "event": event,
        "body": body,
        "body_length": None if body is None else len(body),
        "context": {
            "function_name": context.function_name,
            "memory_limit_in_mb": context.memory_limit_in_mb,
            "invoked_function_arn": context.invoked_function_arn,
            "aws_request_id": context.aws_request_id,
            "remaining_ms": context.get_remaining_time_in_millis(),
        },
        "env": {name: os.environ.get(name) for name in (
            "TABLE_NAME", "BUCKET_NAME", "TTL_SECONDS", "PROVIDER",
            "MODEL", "TOOLS_FILE", "TENANT_CLAIM", "POWERTOOLS_SERVICE_NAME",
            "POWERTOOLS_TRACE_DISABLED", "POWERTOOLS_METRICS_DISABLED", "AWS_DEFAULT_REGION",
            "EXTRA")},
        "demo_state_dir": os.environ.get("DEMO_STATE_DIR"),
        "pid": os.getpid(),
    }
    return {
        "statusCode": 201 if event["requestContext"]["http"]["method"] == "POST" else 200,
        "headers": {"Content-Type": "application/json", "X-Echo": "yes"},
        "cookies": ["a=1; Path=/", "b=2"],
        "body": json.dumps(answer),
    }
"""

ODD_MAIN = """\
import base64, os, pathlib, time, uuid

#: Module state of this execution environment: how many events it has handled.
HANDLED = []

def handle(event, context):
    route = event["routeKey"]
    HANDLED.append(route)
    if route == "GET /v1/rendezvous":
        # Returns only when a second request reaches this point meanwhile (in any process).
        meeting = pathlib.Path(os.environ["RENDEZVOUS_DIR"])
        (meeting / uuid.uuid4().hex).touch()
        deadline = time.monotonic() + 20
        while len(list(meeting.iterdir())) < 2:
            if time.monotonic() > deadline:
                return {"statusCode": 504, "body": "alone"}
            time.sleep(0.01)
        return {"statusCode": 200, "body": "met"}
    if route == "GET /v1/slow":
        started = time.monotonic()
        time.sleep(0.3)
        return {"pid": os.getpid(), "handled": len(HANDLED),
                "started": started, "ended": time.monotonic()}
    if route == "POST /v1/boom":
        raise RuntimeError("boom")
    if route == "POST /v1/crash":
        os._exit(3)
    if route == "GET /v1/hang":
        # Says which process it is, then outruns any timeout.
        (pathlib.Path(os.environ["HANG_DIR"]) / str(os.getpid())).touch()
        time.sleep(60)
        return {"statusCode": 200, "body": "woke up"}
    if route == "GET /v1/binary":
        return {"statusCode": 200, "headers": {"content-type": "application/octet-stream"},
                "body": base64.b64encode(bytes([0, 255, 1])).decode(), "isBase64Encoded": True}
    return {"plain": True, "remaining_ms": context.get_remaining_time_in_millis(),
            "memory": context.memory_limit_in_mb, "pid": os.getpid()}
"""

SWEEP_APP = """\
def lambda_handler(event, context):
    return {"swept": 0, "event": event, "function": context.function_name}
"""

TENANT = {"Authorization": "Bearer local:acme:ada"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with the fake template and its three fake functions."""
    (tmp_path / "template.yaml").write_text(FAKE_TEMPLATE)
    for folder, filename, source in (
        ("echo", "app.py", ECHO_APP),
        ("odd", "main.py", ODD_MAIN),
        ("sweep", "app.py", SWEEP_APP),
    ):
        (tmp_path / "fns" / folder).mkdir(parents=True)
        (tmp_path / "fns" / folder / filename).write_text(textwrap.dedent(source))
    return tmp_path


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    """The file the echo function appends each invocation's route key to."""
    return tmp_path / "calls.log"


@pytest.fixture
def hang_dir(tmp_path: Path) -> Path:
    """Where ``GET /v1/hang`` leaves the pid of the environment it hangs in."""
    directory = tmp_path / "hangs"
    directory.mkdir()
    return directory


@pytest.fixture
def runner(project: Path, call_log: Path, tmp_path: Path, hang_dir: Path) -> Iterator[LocalRunner]:
    (tmp_path / "rendezvous").mkdir()
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        ttl_seconds=60,
        provider="demo",
        model="demo-2",
        tools_file=project / "tools.json",
        table="t-table",
        bucket="t-bucket",
        env={
            "FAKE_CALL_LOG": str(call_log),
            "EXTRA": "yes",
            "RENDEZVOUS_DIR": str(tmp_path / "rendezvous"),
            "HANG_DIR": str(hang_dir),
        },
    )
    with LocalRunner(config) as running:
        yield running


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, trust_env=False, timeout=30) as http:
        yield http


def echoed(response: httpx.Response) -> dict[str, Any]:
    answer: dict[str, Any] = response.json()
    return answer


def calls(call_log: Path) -> list[str]:
    return call_log.read_text().splitlines() if call_log.exists() else []


# --- routing -------------------------------------------------------------------------------


def test_path_parameters_are_matched_and_decoded(client: httpx.Client) -> None:
    response = client.get("/v1/things/a%20b:c", headers=TENANT)
    assert response.status_code == 200
    event = echoed(response)["event"]
    assert event["routeKey"] == "GET /v1/things/{id}"
    assert event["rawPath"] == "/v1/things/a%20b:c"
    assert event["pathParameters"] == {"id": "a b:c"}


def test_routes_without_path_parameters_have_none(client: httpx.Client) -> None:
    event = echoed(client.get("/v1/things", headers=TENANT))["event"]
    assert event["routeKey"] == "GET /v1/things"
    assert "pathParameters" not in event


def test_deeper_route_is_its_own_route(client: httpx.Client, call_log: Path) -> None:
    response = client.post("/v1/things/t1/parts", headers=TENANT, content=b'{"n": 1}')
    assert response.status_code == 201
    answer = echoed(response)
    assert answer["event"]["routeKey"] == "POST /v1/things/{id}/parts"
    assert answer["event"]["pathParameters"] == {"id": "t1"}
    assert answer["body"] == '{"n": 1}'
    assert calls(call_log) == ["POST /v1/things/{id}/parts"]


def test_query_string_is_passed_raw_and_parsed(client: httpx.Client) -> None:
    event = echoed(client.get("/v1/things/x?after=0&limit=50&tag=a&tag=b&empty=", headers=TENANT))[
        "event"
    ]
    assert event["rawQueryString"] == "after=0&limit=50&tag=a&tag=b&empty="
    assert event["queryStringParameters"] == {
        "after": "0",
        "limit": "50",
        "tag": "a,b",
        "empty": "",
    }


def test_unknown_path_is_404_not_found(client: httpx.Client, call_log: Path) -> None:
    response = client.get("/v1/nothing/here", headers=TENANT)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert set(response.json()["error"]) == {"code", "message", "details"}
    assert calls(call_log) == []


def test_trailing_slash_is_another_path(client: httpx.Client) -> None:
    assert client.get("/v1/things/x/", headers=TENANT).status_code == 404


def test_known_path_with_another_method_is_405(client: httpx.Client, call_log: Path) -> None:
    response = client.delete("/v1/things/x", headers=TENANT)
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert response.headers["allow"] == "GET"
    assert calls(call_log) == []


# --- auth ----------------------------------------------------------------------------------

#: The approver scope the local identity carries by default (``APPROVER_SCOPE``).
APPROVE = "turnledger/approve"


@pytest.mark.parametrize(
    ("authorization", "claims"),
    [
        ("Bearer local:acme", {"tenant_id": "acme", "sub": "local-user", "scope": APPROVE}),
        ("Bearer local:acme:ada", {"tenant_id": "acme", "sub": "ada", "scope": APPROVE}),
        (
            "bearer local:globex:u:with:colons",
            {"tenant_id": "globex", "sub": "u:with:colons", "scope": APPROVE},
        ),
        ("Bearer local:acme:eve;scope=read", {"tenant_id": "acme", "sub": "eve", "scope": "read"}),
    ],
)
def test_local_bearer_tokens_become_jwt_claims(
    client: httpx.Client, authorization: str, claims: dict[str, str]
) -> None:
    event = echoed(client.get("/v1/things/x", headers={"Authorization": authorization}))["event"]
    assert event["requestContext"]["authorizer"] == {"jwt": {"claims": claims, "scopes": None}}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic YWNtZTp4"},
        {"Authorization": "Bearer acme"},
        {"Authorization": "Bearer local:"},
        {"Authorization": "Bearer local:  :ada"},
        {"Authorization": "Bearer remote:acme"},
        {"Authorization": "Bearer"},
    ],
    ids=["missing", "basic", "no-prefix", "empty-tenant", "blank-tenant", "other-prefix", "bare"],
)
def test_bad_credentials_are_401_before_the_function(
    client: httpx.Client, call_log: Path, headers: dict[str, str]
) -> None:
    response = client.get("/v1/things/x", headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "unauthorized"
    assert error["message"]
    assert error["details"] == {}
    assert calls(call_log) == []


def test_route_without_authorizer_needs_no_credentials(client: httpx.Client) -> None:
    response = client.get("/v1/open")
    assert response.status_code == 200
    assert "authorizer" not in echoed(response)["event"]["requestContext"]


def test_route_without_authorizer_ignores_credentials(client: httpx.Client) -> None:
    response = client.get("/v1/open", headers={"Authorization": "Basic nonsense"})
    assert response.status_code == 200
    assert "authorizer" not in echoed(response)["event"]["requestContext"]


def test_tenant_claim_name_is_configurable(project: Path, call_log: Path) -> None:
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        tenant_claim="custom:org",
        env={"FAKE_CALL_LOG": str(call_log)},
    )
    with LocalRunner(config) as running:
        response = httpx.get(f"{running.url}/v1/things/x", headers=TENANT, trust_env=False)
    answer = echoed(response)
    assert answer["event"]["requestContext"]["authorizer"]["jwt"]["claims"] == {
        "custom:org": "acme",
        "sub": "ada",
        "scope": APPROVE,
    }
    assert answer["env"]["TENANT_CLAIM"] == "custom:org"


# --- the event and the context -------------------------------------------------------------


def test_event_has_the_http_api_v2_shape(client: httpx.Client, runner: LocalRunner) -> None:
    response = client.post(
        "/v1/things/t1/parts?x=1",
        headers={**TENANT, "X-Custom": "Value", "Cookie": "s=1; t=2", "User-Agent": "tests/1"},
        content='{"input": "héllo"}'.encode(),
    )
    answer = echoed(response)
    event = answer["event"]
    assert event["version"] == "2.0"
    assert event["routeKey"] == "POST /v1/things/{id}/parts"
    assert event["rawPath"] == "/v1/things/t1/parts"
    assert event["rawQueryString"] == "x=1"
    assert event["cookies"] == ["s=1", "t=2"]
    assert event["isBase64Encoded"] is False
    assert answer["body"] == '{"input": "héllo"}'
    headers = event["headers"]
    assert headers["x-custom"] == "Value"
    assert all(name == name.lower() for name in headers)
    assert "cookie" not in headers
    context = event["requestContext"]
    assert context["http"] == {
        "method": "POST",
        "path": "/v1/things/t1/parts",
        "protocol": "HTTP/1.1",
        "sourceIp": "127.0.0.1",
        "userAgent": "tests/1",
    }
    assert context["routeKey"] == event["routeKey"]
    assert context["stage"] == "$default"
    assert context["accountId"] and context["apiId"]
    assert context["domainName"] == runner.url.removeprefix("http://")
    assert isinstance(context["timeEpoch"], int) and context["timeEpoch"] > 1_700_000_000_000
    assert context["time"].endswith(" +0000")
    assert len(context["requestId"]) == 36


def test_each_request_gets_its_own_request_id(client: httpx.Client) -> None:
    first = echoed(client.get("/v1/things/x", headers=TENANT))
    second = echoed(client.get("/v1/things/x", headers=TENANT))
    assert (
        first["event"]["requestContext"]["requestId"]
        != (second["event"]["requestContext"]["requestId"])
    )
    assert first["context"]["aws_request_id"] != second["context"]["aws_request_id"]


def test_request_without_body_has_no_body(client: httpx.Client) -> None:
    answer = echoed(client.get("/v1/things/x", headers=TENANT))
    assert answer["body"] is None
    assert answer["event"]["isBase64Encoded"] is False


def test_binary_body_is_base64_encoded(client: httpx.Client) -> None:
    answer = echoed(client.post("/v1/things/x/parts", headers=TENANT, content=b"\xff\x00\xfe"))
    assert answer["event"]["isBase64Encoded"] is True
    assert base64.b64decode(answer["body"]) == b"\xff\x00\xfe"


def test_context_carries_the_functions_template_settings(client: httpx.Client) -> None:
    echo = echoed(client.get("/v1/things/x", headers=TENANT))["context"]
    assert echo["function_name"] == "EchoFunction"
    assert echo["memory_limit_in_mb"] == 256
    assert echo["invoked_function_arn"].endswith(":function:EchoFunction")
    assert 0 < echo["remaining_ms"] <= 7000
    odd = client.get("/v1/plain", headers=TENANT).json()
    assert odd["memory"] == 1024
    assert 0 < odd["remaining_ms"] <= 3000


def test_functions_see_the_configured_environment(client: httpx.Client, project: Path) -> None:
    env = echoed(client.get("/v1/things/x", headers=TENANT))["env"]
    assert env == {
        "TABLE_NAME": "t-table",
        "BUCKET_NAME": "t-bucket",
        "TTL_SECONDS": "60",
        "PROVIDER": "demo",
        "MODEL": "demo-2",
        "TOOLS_FILE": str((project / "tools.json").resolve()),
        "TENANT_CLAIM": "tenant_id",
        "POWERTOOLS_SERVICE_NAME": "turnledger",
        "POWERTOOLS_TRACE_DISABLED": "true",
        # Metrics are printed only with --print-metrics.
        "POWERTOOLS_METRICS_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        "EXTRA": "yes",
    }


def test_the_runner_never_changes_its_own_environment(project: Path, call_log: Path) -> None:
    before = dict(os.environ)
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        table="only-in-the-functions",
        env={"FAKE_CALL_LOG": str(call_log)},
    )
    with LocalRunner(config) as running:
        answer = echoed(httpx.get(f"{running.url}/v1/things/x", headers=TENANT, trust_env=False))
        assert answer["env"]["TABLE_NAME"] == "only-in-the-functions"
        assert running.environment["TABLE_NAME"] == "only-in-the-functions"
        assert dict(os.environ) == before
    assert dict(os.environ) == before


def test_demo_state_dir_is_the_runners_own_and_shared(runner: LocalRunner) -> None:
    """Every environment gets the same DEMO_STATE_DIR, a directory the runner owns."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(
            pool.map(
                lambda _: echoed(
                    httpx.get(f"{runner.url}/v1/things/x", headers=TENANT, trust_env=False)
                ),
                range(4),
            )
        )
    [state] = {answer["demo_state_dir"] for answer in answers}
    assert Path(state).is_dir()
    runner.stop()
    assert not Path(state).exists()


def test_tools_file_placeholder_is_the_runners_own_url(project: Path, call_log: Path) -> None:
    """``${LOCAL_URL}`` in the tools file stands for the address the runner serves on."""
    tools = project / "local-tools.json"
    tools.write_text('{"tools": [{"url": "${LOCAL_URL}/_local/echo"}]}')
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        tools_file=tools,
        env={"FAKE_CALL_LOG": str(call_log)},
    )
    with LocalRunner(config) as running:
        env = echoed(httpx.get(f"{running.url}/v1/things/x", headers=TENANT, trust_env=False))[
            "env"
        ]
        resolved = json.loads(Path(env["TOOLS_FILE"]).read_text())
        assert resolved == {"tools": [{"url": f"{running.url}/_local/echo"}]}
    assert "${LOCAL_URL}" in tools.read_text()


# --- responses -----------------------------------------------------------------------------


def test_response_status_headers_and_cookies_are_written_back(client: httpx.Client) -> None:
    response = client.get("/v1/things/x", headers=TENANT)
    assert response.status_code == 200
    assert response.headers["x-echo"] == "yes"
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2"]


def test_base64_response_is_decoded(client: httpx.Client) -> None:
    response = client.get("/v1/binary", headers=TENANT)
    assert response.content == bytes([0, 255, 1])
    assert response.headers["content-type"] == "application/octet-stream"


def test_result_without_status_code_is_200_json(client: httpx.Client) -> None:
    response = client.get("/v1/plain", headers=TENANT)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["plain"] is True


def test_failing_function_is_500_in_the_error_shape(client: httpx.Client) -> None:
    response = client.post("/v1/boom", headers=TENANT)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    # The server survives its functions' failures.
    assert client.get("/v1/plain", headers=TENANT).status_code == 200


# --- limits and concurrency ----------------------------------------------------------------


def test_body_over_the_api_gateway_ceiling_is_413_without_the_function(
    client: httpx.Client, call_log: Path
) -> None:
    response = client.post(
        "/v1/things/x/parts", headers=TENANT, content=b"x" * (MAX_BODY_BYTES + 1)
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert calls(call_log) == []
    # The connection and the server are still usable afterwards.
    assert client.get("/v1/things/x", headers=TENANT).status_code == 200


def test_body_at_the_ceiling_reaches_the_function(client: httpx.Client) -> None:
    response = client.post("/v1/things/x/parts", headers=TENANT, content=b"y" * MAX_BODY_BYTES)
    assert response.status_code == 201
    assert echoed(response)["body_length"] == MAX_BODY_BYTES


def test_chunked_body_over_the_ceiling_is_413(client: httpx.Client, call_log: Path) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(11):
            yield b"z" * (1024 * 1024)

    response = client.post("/v1/things/x/parts", headers=TENANT, content=chunks())
    assert response.status_code == 413
    assert calls(call_log) == []


def test_chunked_body_is_reassembled(client: httpx.Client) -> None:
    response = client.post("/v1/things/x/parts", headers=TENANT, content=iter([b'{"a":', b" 1}"]))
    assert echoed(response)["body"] == '{"a": 1}'


def raw_connection(runner: LocalRunner) -> socket.socket:
    """A plain socket to ``runner``: requests no client library would send."""
    host, port = runner.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def read_answer(connection: socket.socket) -> tuple[bytes, bytes, bool]:
    """One answer off ``connection``: its head, its body, and whether the server then closed
    the connection (``False``: it stayed open for another request)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-length: *(\d+)\r?$", head)
    assert match is not None, head
    while len(body) < int(match[1]):
        chunk = connection.recv(65536)
        assert chunk, "closed mid-answer"
        body += chunk
    connection.settimeout(2)
    try:
        closed = connection.recv(1) == b""
    except TimeoutError:
        closed = False
    return head, body, closed


def refused(answer: tuple[bytes, bytes, bool], status: int, code: str) -> None:
    head, body, closed = answer
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert json.loads(body)["error"]["code"] == code
    assert b"connection: close" in head.lower()
    assert closed, "the connection stayed open after a refused body"


POST_PART = b"POST /v1/things/x/parts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer local:acme\r\n"


@pytest.mark.parametrize(
    "lengths",
    [
        b"Content-Length: 2\r\nContent-Length: 12\r\n",
        b"Content-Length: 12\r\nContent-Length: 12\r\n",
        b"Content-Length: 2, 12\r\n",
        b"Content-Length: 12\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    ],
    ids=["conflicting", "repeated", "listed", "with-chunked", "other-coding", "chunked-twice"],
)
def test_ambiguous_body_framing_is_400_and_closes(
    runner: LocalRunner, call_log: Path, lengths: bytes
) -> None:
    """Two lengths, or a length and a coding, could frame the body two ways (request
    smuggling behind a proxy): refused, the function not run, the connection closed."""
    with raw_connection(runner) as connection:
        connection.sendall(POST_PART + lengths + b"\r\n" + b'{"a": 1}' + b"GET /v1/things/y")
        refused(read_answer(connection), 400, "invalid_request")
    assert calls(call_log) == []


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nab\r\n0\r\n\r\n",
        b"2\r\nabcd\r\n0\r\n\r\n",
        b"%x\r\n" % (MAX_BODY_BYTES + 1) + b"z" * (MAX_BODY_BYTES + 1) + b"\r\n0\r\n\r\n",
    ],
    ids=["bad-size", "longer-than-its-size", "over-the-ceiling"],
)
def test_a_refused_chunked_body_closes_the_connection(
    runner: LocalRunner, call_log: Path, body: bytes
) -> None:
    """Whatever the server read of a chunked body it refused, the rest cannot be told
    from a next request: the answer says ``connection: close``, and it closes."""
    status, code = (413, "payload_too_large") if len(body) > 100 else (400, "invalid_request")
    with raw_connection(runner) as connection:
        connection.sendall(POST_PART + b"Transfer-Encoding: chunked\r\n\r\n" + body)
        refused(read_answer(connection), status, code)
    assert calls(call_log) == []


def test_a_well_framed_connection_stays_open(runner: LocalRunner) -> None:
    """The refusals above are about framing: a good request keeps its connection."""
    with raw_connection(runner) as connection:
        connection.sendall(POST_PART + b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n")
        head, body, closed = read_answer(connection)
        assert head.startswith(b"HTTP/1.1 201 ") and json.loads(body)["body"] == "ab"
        assert not closed


def test_a_stalled_body_is_408_after_the_read_timeout(
    project: Path, call_log: Path, hang_dir: Path
) -> None:
    """A client that stops sending mid-body no longer holds its thread for ever: after
    ``read_timeout_seconds`` without a byte it gets ``408`` and the connection closes."""
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        read_timeout_seconds=0.5,
        env={"FAKE_CALL_LOG": str(call_log), "HANG_DIR": str(hang_dir)},
    )
    with LocalRunner(config) as running, raw_connection(running) as connection:
        connection.sendall(POST_PART + b'Content-Length: 10\r\n\r\n{"a"')
        began = time.monotonic()
        refused(read_answer(connection), 408, "request_timeout")
        assert time.monotonic() - began < 0.5 + 2
        # A slow client that keeps sending within the timeout is served.
        with raw_connection(running) as slow:
            slow.sendall(POST_PART + b"Content-Length: 8\r\n\r\n")
            for piece in (b'{"a"', b": 1}"):
                time.sleep(0.3)
                slow.sendall(piece)
            head, body, _ = read_answer(slow)
            assert head.startswith(b"HTTP/1.1 201 ") and json.loads(body)["body"] == '{"a": 1}'
    assert calls(call_log) == ["POST /v1/things/{id}/parts"]


def test_the_read_timeout_has_a_default_and_a_flag() -> None:
    assert LocalConfig().read_timeout_seconds == 10
    config = config_from_args(build_parser().parse_args(["local", "--read-timeout", "2.5"]))
    assert config.read_timeout_seconds == 2.5


def test_requests_are_served_concurrently(runner: LocalRunner) -> None:
    """Two requests meet inside the function: served one at a time, both would time out."""

    def get() -> httpx.Response:
        return httpx.get(f"{runner.url}/v1/rendezvous", headers=TENANT, timeout=60, trust_env=False)

    with ThreadPoolExecutor(max_workers=2) as pool:
        responses = list(pool.map(lambda _: get(), range(2)))
    assert [r.status_code for r in responses] == [200, 200]
    assert [r.text for r in responses] == ["met", "met"]
    assert runner.pool_sizes()["OddFunction"] == 2


def slow_calls(runner: LocalRunner, count: int) -> list[dict[str, Any]]:
    def get(_: int) -> dict[str, Any]:
        response = httpx.get(f"{runner.url}/v1/slow", headers=TENANT, timeout=60, trust_env=False)
        assert response.status_code == 200, response.text
        return echoed(response)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(get, range(count)))


def test_each_environment_handles_one_event_at_a_time(runner: LocalRunner) -> None:
    """Concurrent events run in separate processes; no two overlap in one process."""
    answers = slow_calls(runner, 4)
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for answer in answers:
        by_pid.setdefault(answer["pid"], []).append(answer)
    assert len(by_pid) >= 2
    for calls_of_one in by_pid.values():
        spans = sorted((c["started"], c["ended"]) for c in calls_of_one)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))


def test_a_warm_environment_is_reused_with_its_module_state(runner: LocalRunner) -> None:
    """One request after another reaches the same process, which keeps its module state."""
    first, second = slow_calls(runner, 1)[0], slow_calls(runner, 1)[0]
    assert first["pid"] == second["pid"]
    assert second["handled"] == first["handled"] + 1


def test_beyond_the_limit_requests_queue(project: Path, call_log: Path) -> None:
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        max_workers=1,
        env={"FAKE_CALL_LOG": str(call_log)},
    )
    with LocalRunner(config) as running:
        answers = slow_calls(running, 3)
        assert len({answer["pid"] for answer in answers}) == 1
        spans = sorted((a["started"], a["ended"]) for a in answers)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
        assert running.pool_sizes()["OddFunction"] == 1


def test_a_crashed_environment_is_500_and_replaced(client: httpx.Client) -> None:
    response = client.post("/v1/crash", headers=TENANT)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert client.get("/v1/plain", headers=TENANT).status_code == 200


def hung_pids(hang_dir: Path) -> list[int]:
    return sorted(int(path.name) for path in hang_dir.iterdir())


def gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` no longer exists (killed and reaped) within ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_an_invocation_past_its_timeout_is_killed_and_answered_as_api_gateway_does(
    client: httpx.Client, hang_dir: Path
) -> None:
    """OddFunction's Timeout is 3 s: its environment is killed then, the client gets what
    an HTTP API answers for a Lambda timeout, and the next event gets a new environment."""
    began = time.monotonic()
    response = client.get("/v1/hang", headers=TENANT)
    took = time.monotonic() - began
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"message": "Internal Server Error"}
    assert 3 <= took < 3 + 1.5
    [pid] = hung_pids(hang_dir)
    assert gone(pid, within=5)
    after = client.get("/v1/plain", headers=TENANT).json()
    assert after["pid"] != pid
    assert 0 < after["remaining_ms"] <= 3000


def function_timeout_runner(
    project: Path, call_log: Path, hang_dir: Path, seconds: float
) -> LocalRunner:
    return LocalRunner(
        LocalConfig(
            port=0,
            template_path=project / "template.yaml",
            provision_storage=False,
            function_timeout_seconds=seconds,
            env={"FAKE_CALL_LOG": str(call_log), "HANG_DIR": str(hang_dir)},
        )
    )


def test_function_timeout_overrides_every_functions_timeout(
    project: Path, call_log: Path, hang_dir: Path
) -> None:
    """The override stops invocations sooner, and the context reports it too."""
    with function_timeout_runner(project, call_log, hang_dir, 1.0) as running:
        url = running.url
        assert 0 < httpx.get(f"{url}/v1/plain", headers=TENANT).json()["remaining_ms"] <= 1000
        echo = httpx.get(f"{url}/v1/things/x", headers=TENANT).json()["context"]
        assert 0 < echo["remaining_ms"] <= 1000
        began = time.monotonic()
        response = httpx.get(f"{url}/v1/hang", headers=TENANT, timeout=30)
        took = time.monotonic() - began
        assert (response.status_code, response.json()) == (
            500,
            {"message": "Internal Server Error"},
        )
        assert 1 <= took < 1 + 1.5
        [pid] = hung_pids(hang_dir)
        assert gone(pid, within=5)


def test_lambda_invocations_are_stopped_at_the_timeout_too(
    project: Path, call_log: Path, hang_dir: Path
) -> None:
    """Through Lambda's Invoke API (what starts the turn worker): an asynchronous event's
    environment is killed at the timeout; a synchronous one reports Lambda's timeout error."""
    with function_timeout_runner(project, call_log, hang_dir, 1.0) as running:
        invoke = f"{running.url}/2015-03-31/functions/OddFunction/invocations"
        event = {"routeKey": "GET /v1/hang"}
        accepted = httpx.post(invoke, json=event, headers={"X-Amz-Invocation-Type": "Event"})
        assert accepted.status_code == 202
        deadline = time.monotonic() + 10
        while not hung_pids(hang_dir) and time.monotonic() < deadline:
            time.sleep(0.02)
        [pid] = hung_pids(hang_dir)
        assert gone(pid, within=1 + 1.5)

        answer = httpx.post(invoke, json=event, timeout=30)
        assert answer.status_code == 200
        assert answer.headers["x-amz-function-error"] == "Unhandled"
        assert answer.json() == {
            "errorType": "Sandbox.Timedout",
            "errorMessage": "Task timed out after 1.00 seconds",
        }


def test_first_request_latency_is_bounded(project: Path, call_log: Path) -> None:
    """start() returns at once (the handlers load in the background); the first request
    after it is answered within a few seconds, and a warm one in well under a second."""
    config = LocalConfig(
        port=0,
        template_path=project / "template.yaml",
        provision_storage=False,
        env={"FAKE_CALL_LOG": str(call_log)},
    )
    began = time.monotonic()
    with LocalRunner(config) as running:
        started = time.monotonic()
        assert httpx.get(f"{running.url}/v1/plain", headers=TENANT).status_code == 200
        first = time.monotonic()
        assert httpx.get(f"{running.url}/v1/plain", headers=TENANT).status_code == 200
        warm = time.monotonic()
    assert started - began < 2
    assert first - started < 10
    assert warm - first < 1


@pytest.mark.parametrize("method", ["TRACE", "BREW", "PROPFIND"])
def test_unknown_methods_are_json_405_with_allow(client: httpx.Client, method: str) -> None:
    response = client.request(method, "/v1/things/x", headers=TENANT)
    assert response.status_code == 405
    assert response.headers["content-type"] == "application/json"
    assert response.headers["allow"] == "GET"
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert client.request(method, "/v1/nowhere", headers=TENANT).status_code == 404


# --- the on-demand sweep -------------------------------------------------------------------


def test_local_sweep_sends_a_scheduled_event(client: httpx.Client) -> None:
    response = client.post("/_local/sweep", headers=TENANT)
    assert response.status_code == 200
    answer = response.json()
    assert answer["swept"] == 0
    assert answer["function"] == "SweepFunction"
    event = answer["event"]
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == "aws.events"
    assert event["detail"] == {}
    assert event["resources"][0].startswith("arn:aws:events:us-east-1:")


def test_local_sweep_of_named_conversations_carries_the_tenant(client: httpx.Client) -> None:
    response = client.post("/_local/sweep", headers=TENANT, json={"conversation_ids": ["c1", "c2"]})
    assert response.status_code == 200
    assert response.json()["event"] == {"conversation_ids": ["c1", "c2"], "tenant": "acme"}


def test_local_sweep_needs_credentials(client: httpx.Client) -> None:
    response = client.post("/_local/sweep")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_request"),
        (b"[1]", 400, "invalid_request"),
        (b'{"conversation_ids": "c1"}', 422, "validation_error"),
        (b'{"conversation_ids": [1]}', 422, "validation_error"),
    ],
)
def test_local_sweep_rejects_bad_bodies(
    client: httpx.Client, body: bytes, status: int, code: str
) -> None:
    response = client.post("/_local/sweep", headers=TENANT, content=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_local_sweep_is_post_only_and_other_local_paths_are_404(client: httpx.Client) -> None:
    assert client.get("/_local/sweep", headers=TENANT).status_code == 405
    assert client.post("/_local/other", headers=TENANT).status_code == 404


def notification(tenant: str, call_id: str) -> dict[str, Any]:
    """A notification as the functions send it (turnledger/ops/notifications.py)."""
    detail = {"tenant": tenant, "conversation_id": "c1", "call_id": call_id, "tool": "t"}
    return {"source": "turnledger", "detail-type": "approval.requested", "detail": detail}


def test_local_notifications_are_read_by_their_own_tenant_only(client: httpx.Client) -> None:
    """Like ``/_local/sweep``: a local token (else ``401``), and a tenant sees only the
    notifications of its own conversations."""
    for tenant, call_id in (("acme", "call_a"), ("globex", "call_g"), ("acme", "call_b")):
        sent = client.post("/_local/notifications", json=notification(tenant, call_id))
        assert sent.status_code == 202
    for headers in ({}, {"Authorization": "Bearer nope"}):
        refused = client.get("/_local/notifications", headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"
    listed = client.get("/_local/notifications", headers=TENANT).json()["notifications"]
    assert [n["detail"]["call_id"] for n in listed] == ["call_a", "call_b"]
    theirs = client.get("/_local/notifications", headers={"Authorization": "Bearer local:globex"})
    assert [n["detail"]["call_id"] for n in theirs.json()["notifications"]] == ["call_g"]


def test_local_notifications_are_taken_from_this_machine_only(runner: LocalRunner) -> None:
    """The functions send them from this machine; another host (a runner listening on
    0.0.0.0) could otherwise put words in any tenant's list."""
    body = json.dumps(notification("acme", "call_x")).encode()
    remote = HttpRequest("POST", "/_local/notifications", body=body, source_ip="10.0.0.9")
    answer = runner.handle(remote)
    assert answer.status == 403
    assert json.loads(answer.body)["error"]["code"] == "forbidden"
    local = runner.handle(replace(remote, source_ip="127.0.0.1"))
    assert local.status == 202


# --- lifecycle and command line ------------------------------------------------------------


def test_a_missing_handler_file_fails_start_and_leaves_nothing_behind(project: Path) -> None:
    (project / "fns" / "odd" / "main.py").unlink()
    before = dict(os.environ)
    runner = LocalRunner(
        LocalConfig(port=0, template_path=project / "template.yaml", provision_storage=False)
    )
    with pytest.raises(FileNotFoundError):
        runner.start()
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError):
        _ = runner.url


def test_cli_flags_map_onto_the_runner_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "local",
            "--host",
            "127.0.0.2",
            "--port",
            "3100",
            "--ttl-seconds",
            "0",
            "--tools",
            str(tmp_path / "tools.json"),
            "--provider",
            "openai-chat",
            "--model",
            "gpt-x",
            "--dynamodb-endpoint",
            "http://127.0.0.1:8000",
            "--s3-endpoint",
            "http://127.0.0.1:9000",
            "--table",
            "tbl",
            "--bucket",
            "bkt",
            "--log-level",
            "DEBUG",
            "--print-metrics",
            "--max-workers",
            "3",
            "--function-timeout",
            "2.5",
        ]
    )
    config = config_from_args(args)
    assert (config.host, config.port, config.ttl_seconds) == ("127.0.0.2", 3100, 0)
    assert config.tools_file == tmp_path / "tools.json"
    assert (config.provider, config.model) == ("openai-chat", "gpt-x")
    assert config.dynamodb_endpoint == "http://127.0.0.1:8000"
    assert config.s3_endpoint == "http://127.0.0.1:9000"
    assert (config.table, config.bucket) == ("tbl", "bkt")
    assert (config.log_level, config.print_metrics, config.max_workers) == ("DEBUG", True, 3)
    assert config.function_timeout_seconds == 2.5


def test_cli_defaults_are_the_contracts(tmp_path: Path) -> None:
    config = config_from_args(build_parser().parse_args(["local"]))
    assert (config.host, config.port) == ("127.0.0.1", 3000)
    assert config.dynamodb_endpoint is None and config.s3_endpoint is None
    # A quiet console: warnings only, no metrics blobs.
    assert (config.log_level, config.print_metrics) == ("WARNING", False)
    # Each function's own Timeout from the template.
    assert config.function_timeout_seconds is None


@pytest.mark.parametrize(
    "argv",
    [
        ["local", "--ttl-seconds", "-1"],
        ["local", "--port", "x"],
        ["local", "--max-workers", "0"],
        ["local", "--function-timeout", "0"],
        ["local", "--function-timeout", "-1"],
        ["local", "--function-timeout", "nan"],
        ["local", "--function-timeout", "soon"],
    ],
)
def test_cli_rejects_bad_numbers(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2


def test_cli_without_a_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "local" in capsys.readouterr().err


# --- embedded storage from the real template -----------------------------------------------


def test_embedded_storage_has_the_templates_tables_and_bucket() -> None:
    template = load_template()
    suffix = uuid.uuid4().hex[:8]
    names = StorageNames(f"conv-{suffix}", f"artifacts-{suffix}")
    storage = EmbeddedStorage()
    endpoint = storage.start()
    try:
        created = provision(
            template, names, dynamodb_endpoint=endpoint, s3_endpoint=endpoint, region="us-east-1"
        )
        assert created == [names.table, names.bucket]
        dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

        props = template["Resources"]["ConversationsTable"]["Properties"]
        table = dynamodb.describe_table(TableName=names.table)["Table"]
        assert table["KeySchema"] == props["KeySchema"]
        assert {
            (
                index["IndexName"],
                json.dumps(index["KeySchema"]),
                index["Projection"]["ProjectionType"],
            )
            for index in table.get("GlobalSecondaryIndexes", [])
        } == {
            (
                index["IndexName"],
                json.dumps(index["KeySchema"]),
                index["Projection"]["ProjectionType"],
            )
            # As deployed with the default parameters (an index may sit behind a condition).
            for index in table_definition(template, "ConversationsTable", names.table)[
                "GlobalSecondaryIndexes"
            ]
        }
        ttl = dynamodb.describe_time_to_live(TableName=names.table)["TimeToLiveDescription"]
        assert ttl["TimeToLiveStatus"] == "ENABLED"
        assert ttl["AttributeName"] == ttl_attribute(template, "ConversationsTable")

        s3.head_bucket(Bucket=names.bucket)
        # Provisioning again finds everything in place.
        assert (
            provision(
                template,
                names,
                dynamodb_endpoint=endpoint,
                s3_endpoint=endpoint,
                region="us-east-1",
            )
            == []
        )
    finally:
        storage.stop()


def test_cli_serves_until_interrupted() -> None:
    """``turnledger local`` prints where it serves, serves, and exits 0 on Ctrl-C."""
    process = subprocess.Popen(
        [sys.executable, "-m", "turnledger_local.cli", "local", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = read_until(process, "Ctrl-C stops.")
        url = re.search(r"serving (http://127\.0\.0\.1:\d+)", banner)
        assert url is not None, banner
        assert "curl -s -X POST" in banner and "Bearer local:" in banner
        response = httpx.get(f"{url.group(1)}/v1/openapi.json", trust_env=False, timeout=30)
        assert response.status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        assert process.stdout is not None
        assert b"stopping" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
