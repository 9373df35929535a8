"""Export and import through the local runner, and the ``turnledger export`` / ``import`` commands
against the runner's table and bucket."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import httpx
from turnledger_local.runner import LocalRunner

from tests.http.conftest import ANN, BOB

BIG = "z" * 600_000


def error_of(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


def talk(http: httpx.Client, conversation: str, text: str, headers: Mapping[str, str]) -> str:
    response = http.post(
        f"/v1/conversations/{conversation}/turns", json={"input": text}, headers=headers
    )
    assert response.status_code == 200, response.text
    answer: str = response.json()["output_text"]
    return answer


def test_export_then_import_under_another_tenant(ddb_http: httpx.Client) -> None:
    """NDJSON out (a 600 KB message inline), in under another tenant: the same events, and the
    conversation answers the same; the id taken is 409; nothing else leaks across tenants."""
    http = ddb_http
    talk(http, "orig", BIG, ANN)
    talk(http, "orig", "My name is Ada.", ANN)
    exported = http.get("/v1/conversations/orig/export", headers=ANN)
    assert exported.status_code == 200
    assert exported.headers["content-type"] == "application/x-ndjson"
    assert BIG in exported.text
    assert http.get("/v1/conversations/orig/export", headers=BOB).status_code == 404

    imported = http.post(
        "/v1/conversations/copy/import",
        content=exported.content,
        headers={**BOB, "Content-Type": "application/x-ndjson"},
    )
    assert imported.status_code == 201, imported.text
    assert imported.json()["turns"] == 2 and imported.json()["events"] == 5
    events = [
        http.get(f"/v1/conversations/{c}/events", headers=who).json()["events"]
        for c, who in (("orig", ANN), ("copy", BOB))
    ]
    opening, *copied = events[1]
    assert opening["kind"] == "conversation_imported" and opening["actor"] == "bob"
    assert [e["imported"]["claimed_actor"] for e in copied] == [e["actor"] for e in events[0]]
    assert {e["actor"] for e in copied} == {"import"}
    assert [(e["kind"], e["payload"]["content"]) for e in events[0]] == [
        (e["kind"], e["payload"]["content"]) for e in copied
    ]
    assert talk(http, "copy", "What is my name?", BOB) == "Your name is Ada."

    again = http.post("/v1/conversations/copy/import", content=exported.content, headers=BOB)
    assert again.status_code == 409 and error_of(again)["code"] == "conversation_exists"


def test_an_invalid_import_answers_its_error_and_leaves_nothing(http: httpx.Client) -> None:
    talk(http, "src", "Hello.", ANN)
    text = http.get("/v1/conversations/src/export", headers=ANN).text
    head, first, second = text.splitlines()
    cases = {
        "not json\n": (400, "invalid_request"),
        f"{head}\n{second}\n": (422, "validation_error"),  # a gap
        f"{head}\n{first}\n": (422, "validation_error"),  # the head counts two
    }
    for body, (status, code) in cases.items():
        answer = http.post("/v1/conversations/dst/import", content=body, headers=ANN)
        assert (answer.status_code, error_of(answer)["code"]) == (status, code), answer.text
        assert http.get("/v1/conversations/dst", headers=ANN).status_code == 404
    assert http.post("/v1/conversations/dst/import", content=text).status_code == 401
    assert http.get("/v1/conversations/nothing/export", headers=ANN).status_code == 404


def test_the_cli_exports_and_imports_against_a_table(
    served: LocalRunner, http: httpx.Client
) -> None:
    """``turnledger export`` > file, ``turnledger import`` < file, on the runner's storage."""
    talk(http, "cli", "My name is Ada.", ANN)
    env = {**os.environ, **served.environment}

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "turnledger_local.cli", *args, "--tenant", "acme"]
        return subprocess.run(
            command, input=stdin, capture_output=True, text=True, env=env, timeout=60
        )

    exported = cli("export", "cli")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout == http.get("/v1/conversations/cli/export", headers=ANN).text
    # The runner's functions live on a fake clock (in 2099): a TTL from today's clock would
    # have expired there, so this conversation never expires.
    imported = cli("import", "cli-restored", "--ttl-seconds", "0", stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert "1 turns, 3 events" in imported.stderr
    assert talk(http, "cli-restored", "What is my name?", ANN) == "Your name is Ada."
    taken = cli("import", "cli-restored", stdin=exported.stdout)
    assert taken.returncode == 1 and "conversation_exists" in taken.stderr


#: Characters ``str.splitlines`` splits on that JSON leaves raw: line and paragraph separators
#: and NEXT LINE (U+0085), in ordinary text (pasted from a word processor, a PDF, EBCDIC).
SEPARATORS = "Ada\u2028Lovelace\u2029wrote\u0085this."


def test_line_and_paragraph_separators_round_trip_through_the_api_and_the_cli(
    served: LocalRunner, http: httpx.Client
) -> None:
    """U+2028, U+2029 and U+0085 in a message: export -> import is exact through the API and
    through ``turnledger export`` / ``import`` (lines are split on ``\\n`` only)."""
    talk(http, "sep-src", SEPARATORS, ANN)
    exported = http.get("/v1/conversations/sep-src/export", headers=ANN)
    assert SEPARATORS in exported.text  # written raw, as JSON allows
    imported = http.post("/v1/conversations/sep-api/import", content=exported.content, headers=ANN)
    assert imported.status_code == 201, imported.text
    env = {**os.environ, **served.environment}

    def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "turnledger_local.cli", *args, "--tenant", "acme"]
        return subprocess.run(command, input=stdin, capture_output=True, env=env, timeout=60)

    out = cli("export", "sep-src")
    assert out.returncode == 0, out.stderr
    assert SEPARATORS.encode() in out.stdout
    restored = cli("import", "sep-cli", "--ttl-seconds", "0", stdin=out.stdout)
    assert restored.returncode == 0, restored.stderr
    for copy in ("sep-api", "sep-cli"):
        events = http.get(f"/v1/conversations/{copy}/events", headers=ANN).json()["events"]
        inputs = [e["payload"]["content"] for e in events if e["kind"] == "user_message"]
        assert inputs == [SEPARATORS], copy


def test_an_export_larger_than_lambda_carries_is_fetched_through_its_url(
    served: LocalRunner, http: httpx.Client
) -> None:
    """Two 3 MB messages make a 6 MB export, more than a Lambda response carries: the route
    answers 303 with a presigned Location (and the same in its body); the URL, with no other
    credentials, gives the export byte for byte as the CLI writes it; the CLI imports it."""
    big = "w" * 3_000_000
    talk(http, "huge", big, ANN)
    talk(http, "huge", big, ANN)
    answer = http.get("/v1/conversations/huge/export", headers=ANN)
    assert answer.status_code == 303, answer.text[:300]
    link = answer.json()
    assert answer.headers["location"] == link["export_url"]
    assert link["bytes"] > 6_000_000 and link["expires_at"]
    fetched = httpx.get(link["export_url"], timeout=60, trust_env=False)
    assert fetched.status_code == 200
    assert len(fetched.content) == link["bytes"]
    assert fetched.content.count(big.encode()) == 2
    env = {**os.environ, **served.environment}
    command = [sys.executable, "-m", "turnledger_local.cli", "export", "huge", "--tenant", "acme"]
    written = subprocess.run(command, capture_output=True, env=env, timeout=120)
    assert written.returncode == 0, written.stderr
    assert written.stdout == fetched.content
    restore = [sys.executable, "-m", "turnledger_local.cli", "import", "huge-copy"]
    restored = subprocess.run(
        [*restore, "--tenant", "acme", "--ttl-seconds", "0"],
        input=fetched.content,
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert restored.returncode == 0, restored.stderr
    copy = http.get("/v1/conversations/huge-copy", headers=ANN).json()
    assert copy["turns"] == 2
    # Through the API, such a body is over MAX_INPUT_BYTES: 413 before the service.
    refused = http.post("/v1/conversations/huge-api/import", content=fetched.content, headers=ANN)
    assert refused.status_code == 413 and error_of(refused)["code"] == "payload_too_large"
