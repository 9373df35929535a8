"""A burst of concurrent connections to the local runner: every one is accepted and answered."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN
from tests.support.concurrency import all_at_once

pytestmark = pytest.mark.http

BURST = 200


@pytest.fixture
def data_dir_runner(runner_config: LocalConfig, tmp_path: Path) -> Iterator[LocalRunner]:
    """The runner as ``make run`` starts it: conversations in a data folder."""
    with LocalRunner(dataclasses.replace(runner_config, data_dir=tmp_path / "data")) as runner:
        yield runner


def test_two_hundred_concurrent_connections_are_all_answered(
    data_dir_runner: LocalRunner,
) -> None:
    """200 clients, each on its own connection, send a turn at the same moment: none is
    reset or refused (the listen backlog holds them) and each gets its turn's answer
    (the functions' queue holds what the environments cannot take at once)."""

    def turn(number: int) -> tuple[int, int]:
        with httpx.Client(base_url=data_dir_runner.url, timeout=120) as client:
            answer = client.post(
                f"/v1/conversations/burst-{number}/turns",
                json={"input": f"My name is Ada {number}."},
                headers=ANN,
            )
        assert answer.status_code == 200, answer.text
        return number, answer.json()["turn"]

    assert all_at_once(BURST, turn) == [(number, 1) for number in range(BURST)]
