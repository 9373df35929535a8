"""Headers that choose whose data is used (``X-Memory-User``) are honoured or refused on
every route of both faces, never dropped, through the local runner.

The walk takes its routes from the template (the HTTP API's own table, which the local
gateway serves), so a new route is walked without touching this test. A caller without
``MEMORY_USER_SCOPE`` is refused on each (``403 memory_user_not_allowed``, OpenAI's error
shape under ``/openai/v1``); a caller holding it is never refused for the header, and
the routes that use a user's data use the one it names: two end users of one backend on
the OpenAI face keep their memories apart.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import Route, load_template, routes

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.test_tool_turns import tool_line

pytestmark = pytest.mark.http

MEMORY_SCOPE = "turnledger/memory"
#: A trusted backend acting for its end users (and deciding approvals, so that the routes
#: that need that scope answer it too); the walk's own tenant, which it may erase.
BACKEND = f"Bearer local:walk:svc;scope={MEMORY_SCOPE} turnledger/approve"
#: A member of the same tenant without the memory-user scope.
EVE = "Bearer local:walk:eve;scope=turnledger/approve"
#: The backend of the end users' scenario, in a tenant the walk never erases.
FACES = f"Bearer local:faces:svc;scope={MEMORY_SCOPE}"


@pytest.fixture(scope="module")
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/job", Reply(status=202, body={"task_id": "job-1"}))
        yield server


@pytest.fixture(scope="module")
def api(sink: HttpSink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A runner with memory on and a memory-user scope, and a deferred tool (for a
    genuine callback URL)."""
    folder = tmp_path_factory.mktemp("memory-user")
    tools = folder / "tools.json"
    job = {"name": "run_job", "parameters": {"type": "object"}}
    tools.write_text(
        json.dumps(
            {
                "tools": [
                    {**job, "executor": {"type": "http", "url": sink.url("/job"), "deferred": True}}
                ]
            }
        ),
        encoding="utf-8",
    )
    config = LocalConfig(
        port=0,
        ttl_seconds=3600,
        data_dir=folder / "data",
        tools_file=tools,
        env={"MEMORY_ENABLED": "true", "MEMORY_USER_SCOPE": MEMORY_SCOPE},
    )
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as client:
        yield client


def face_text(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    [message] = [i for i in answer.json()["output"] if i["type"] == "message"]
    text: str = message["content"][0]["text"]
    return text


def test_end_users_of_one_backend_keep_their_memories_apart_on_the_openai_face(
    api: httpx.Client,
) -> None:
    """carol is not told alice's name: the face uses the user X-Memory-User names."""

    def ask(user: str, text: str) -> str:
        headers = {"Authorization": FACES, "X-Memory-User": user}
        return face_text(api.post("/openai/v1/responses", json={"input": text}, headers=headers))

    ask("alice", "Hi! My name is Alice.")
    assert ask("carol", "what is my name?") == "I don't know your name yet."
    assert ask("alice", "what is my name?") == "Your name is Alice."
    listed = api.get(
        "/v1/memories", headers={"Authorization": FACES, "X-Memory-User": "alice"}
    ).json()["items"]
    assert [m["text"] for m in listed] == ["My name is Alice."]
    own = api.get("/v1/memories", headers={"Authorization": FACES}).json()["items"]
    assert own == []  # the backend's own sub keeps nothing of its users


def _every_route() -> list[Route]:
    return routes(load_template())


def _path(route: Route, values: dict[str, str]) -> str:
    """The route's path with its parameters filled from ``values`` (by name)."""
    return re.sub(r"\{(\w+)\+?\}", lambda m: values[m.group(1)], route.path)


@pytest.fixture
def values(api: httpx.Client, sink: HttpSink) -> dict[str, str]:
    """Path parameters that name real things: a conversation with a complete turn, and the
    callback token of a deferred call in another."""
    done, waiting = (f"walk-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for conversation, text in ((done, "Hello"), (waiting, tool_line("run_job"))):
        answer = api.post(
            f"/v1/conversations/{conversation}/turns",
            json={"input": text},
            headers={"Authorization": BACKEND},
        )
        assert answer.status_code == 200, answer.text
    [request] = [r for r in sink.requests_for("/job") if r.json()["conversation_id"] == waiting]
    token = str(request.json()["callback_url"]).rpartition("/")[2]
    return {
        "id": done,
        "turn": "1",
        "item": "msg_1",
        "replay_id": "rp_1",
        "token": token,
        "proxy": "models",
        "pin_id": "pin_0123456789abcdef",
    }


def _send(api: httpx.Client, route: Route, path: str, authorization: str | None) -> httpx.Response:
    headers = {"X-Memory-User": "alice"}
    if authorization is not None:
        headers["Authorization"] = authorization
    body: Any = {} if route.method in {"POST", "PUT", "PATCH"} else None
    if path.endswith("/import"):
        return api.request(route.method, path, content=b"", headers=headers)
    return api.request(route.method, path, json=body, headers=headers)


def _code(answer: httpx.Response) -> str | None:
    try:
        error = answer.json().get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


@pytest.mark.parametrize("route", _every_route(), ids=lambda r: r.route_key)
def test_every_route_honours_or_refuses_x_memory_user(
    api: httpx.Client, values: dict[str, str], route: Route
) -> None:
    path = _path(route, values)
    # Routes with no handler of their own (the face's catch-all) answer 404 for any header.
    handled = "{proxy+}" not in route.path
    # An open route has no caller the gateway vouches for: nobody there holds the scope.
    for who in (EVE,) if route.authorized else (None, BACKEND):
        refused = _send(api, route, path, who)
        if not handled:
            assert refused.status_code == 404, refused.text
            continue
        assert refused.status_code == 403, (who, refused.text)
        assert _code(refused) == "memory_user_not_allowed"
        if route.path.startswith("/openai/"):
            assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    if route.authorized and handled:
        honoured = _send(api, route, path, BACKEND)
        assert honoured.status_code < 500, honoured.text
        assert _code(honoured) != "memory_user_not_allowed", honoured.text
