"""DynamoDB throttling and transaction conflicts through the local runner (worker processes,
DynamoDB Local): the approval answers ``503 service_unavailable`` or ``409
conversation_busy`` with ``Retry-After``, stores nothing and runs no tool; retried, it
goes through. The in-process test of every call is tests/functional/test_store_faults.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.http_sink import HttpSink
from tests.http.conftest import ANN, start
from tests.http.test_http_tool_lease import registry
from tests.support.worker_hooks import FAULTS_DIR

pytestmark = [pytest.mark.http, pytest.mark.integration]


@pytest.fixture
def faults(tmp_path: Path) -> Path:
    directory = tmp_path / "faults"
    directory.mkdir()
    return directory


@pytest.fixture
def faulty_http(
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    ddb_local_endpoint: str,
    tmp_path: Path,
    faults: Path,
) -> Iterator[tuple[httpx.Client, HttpSink]]:
    with HttpSink() as sink:
        config = dataclasses.replace(
            runner_config,
            dynamodb_endpoint=ddb_local_endpoint,
            tools_file=registry(sink, tmp_path / "tools.json"),
            worker_hook="tests.support.worker_hooks:dynamodb_faults",
            env={FAULTS_DIR: str(faults)},
        )
        for client in start(config, runner_clock):
            yield client, sink


#: The injected error codes and the answers they get.
CASES = [
    ("ProvisionedThroughputExceededException", 503, "service_unavailable"),
    ("ThrottlingException", 503, "service_unavailable"),
    ("RequestLimitExceeded", 503, "service_unavailable"),
    ("InternalServerError", 503, "service_unavailable"),
    ("TransactionCanceledException", 409, "conversation_busy"),
]


def test_a_throttled_or_conflicting_approval_stores_nothing_and_runs_nothing(
    faulty_http: tuple[httpx.Client, HttpSink], faults: Path
) -> None:
    http, sink = faulty_http
    for code, status, error in CASES:
        base = f"/v1/conversations/faulty-{code}"
        paused = http.post(
            f"{base}/turns",
            json={"input": '/tool send_email {"to": "bob@example.com"}'},
            headers=ANN,
        )
        assert paused.json()["status"] == "awaiting_approval"
        before = http.get(f"{base}/events", headers=ANN).json()["events"]
        sent = len(sink.requests_for("/email"))

        (faults / f"TransactWriteItems.{code}").touch()
        refused = http.post(f"{base}/approvals", json={"approve": ["call_1"]}, headers=ANN)
        assert not list(faults.iterdir()), "the fault never fired"
        assert refused.status_code == status, (code, refused.text)
        body = refused.json()["error"]
        assert body["code"] == error
        assert int(refused.headers["retry-after"]) == body["details"]["retry_after_seconds"] == 1
        assert http.get(f"{base}/events", headers=ANN).json()["events"] == before
        assert http.get(base, headers=ANN).json()["status"] == "awaiting_approval"
        assert len(sink.requests_for("/email")) == sent

        again = http.post(f"{base}/approvals", json={"approve": ["call_1"]}, headers=ANN)
        assert again.status_code == 200, (code, again.text)
        assert len(sink.requests_for("/email")) == sent + 1
