"""The first hour's rough edges, each through the local runner: empty and mistyped input,
malformed JSON, a raw space in a path, a client that hangs up mid-turn, one JSON spacing."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from typing import Any

import httpx
import pytest
from turnledger_local.runner import LocalRunner

from tests.http.conftest import ANN

pytestmark = pytest.mark.http

#: What pydantic's own messages and union labels look like: none may reach a client.
PYDANTIC_WORDS = ("tagged-union", "list[", "string_type", "list_type", "Input should be")


def error_of(answer: httpx.Response, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()["error"]
    return body


def test_an_empty_input_is_refused_and_stores_nothing(http: httpx.Client) -> None:
    """``"input": ""`` (or only white space) would store an empty user message and send it
    to the model: it is a 422 like every other input the turn cannot use."""
    for empty in ("", "  \n"):
        answer = http.post("/v1/conversations/edge-empty/turns", json={"input": empty}, headers=ANN)
        error = error_of(answer, 422)
        assert error["details"]["errors"] == [
            {"loc": ["body", "input"], "msg": "input must hold some text", "type": "empty_input"}
        ]
    assert http.get("/v1/conversations/edge-empty", headers=ANN).status_code == 404


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "input must hold at least one item"),
        (None, "input must be a string or a list of input items"),
        ({}, "input must be a string or a list of input items"),
        (7, "input must be a string or a list of input items"),
    ],
)
def test_mistyped_input_is_told_in_the_projects_words(
    http: httpx.Client, value: Any, message: str
) -> None:
    answer = http.post("/v1/conversations/edge-type/turns", json={"input": value}, headers=ANN)
    [error] = error_of(answer, 422)["details"]["errors"]
    assert error["loc"] == ["body", "input"] and error["msg"] == message
    assert not [word for word in PYDANTIC_WORDS if word in answer.text], answer.text


def test_malformed_json_says_where(http: httpx.Client) -> None:
    body = b'{"input": "hi",\n "model": }'
    answer = http.post(
        "/v1/conversations/edge-json/turns",
        content=body,
        headers={**ANN, "Content-Type": "application/json"},
    )
    error = error_of(answer, 400)
    assert error["code"] == "invalid_request"
    assert error["message"] == "the body is not JSON: expecting value at line 2, column 11"
    assert error["details"] == {"line": 2, "column": 11, "position": 26}


def raw_exchange(runner: LocalRunner, request: bytes) -> bytes:
    """Send ``request`` as it is (no client library would send it) and read the answer."""
    host, port = runner.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_a_raw_space_in_a_path_answers_the_json_error(served: LocalRunner) -> None:
    """Not ``http.server``'s HTML page: the contract's error shape, and the connection closes."""
    answer = raw_exchange(served, b"GET /v1/conversations/a b HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_request" and "%20" in error["message"]


def test_a_client_hanging_up_mid_turn_is_one_log_line(
    served: LocalRunner,
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The client resets its connection while its turn runs: the turn still commits, and the
    failed write of its answer is one warning, not a ``BrokenPipeError`` traceback."""
    caplog.set_level(logging.WARNING, logger="local_runner")
    body = b'{"input": "My name is Ada."}'
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=30)
    connection.sendall(
        b"POST /v1/conversations/edge-hangup/turns HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer local:acme:ann\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    # Linger 0: close sends a reset, so the server's write of the answer fails.
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()
    deadline = time.monotonic() + 30
    while not [r for r in caplog.records if "hung up" in r.getMessage()]:
        assert time.monotonic() < deadline, "the hang-up was never logged"
        time.sleep(0.05)
    [line] = [r.getMessage() for r in caplog.records if "hung up" in r.getMessage()]
    assert "before its answer was written" in line
    assert "Traceback" not in capsys.readouterr().err
    head = http.get("/v1/conversations/edge-hangup", headers=ANN)
    assert head.status_code == 200 and head.json()["turns"] == 1


def test_every_route_writes_json_the_same_way(http: httpx.Client) -> None:
    """Compact JSON (no space after ``:`` or ``,``) from every route: a turn, an async
    turn's ``GET .../turns/{n}``, the head, and errors of the functions and of the runner."""
    path = "/v1/conversations/edge-spacing"
    async_turn = {**ANN, "Prefer": "respond-async"}
    accepted = http.post(f"{path}/turns", json={"input": "Hello."}, headers=async_turn)
    assert accepted.status_code == 202, accepted.text
    location = accepted.headers["location"]
    for _ in range(40):  # the stream long-polls until the turn ends
        page = http.get(f"{location}/stream", params={"wait": 5}, headers=ANN).json()
        if page["done"]:
            break
    finished = http.get(location, headers=ANN)
    answers = [
        accepted,
        finished,
        http.post(f"{path}/turns", json={"input": "Again."}, headers=ANN),
        http.get(path, headers=ANN),
        http.get(f"{path}/turns/9", headers=ANN),  # the function's error
        http.get("/v1/conversations/edge-spacing", headers={"Authorization": "no"}),  # runner's
    ]
    assert finished.status_code == 200 and finished.json()["status"] == "complete"
    for answer in answers:
        compact = json.dumps(answer.json(), separators=(",", ":"), ensure_ascii=False)
        assert answer.text == compact, answer.text
