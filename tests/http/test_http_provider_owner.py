"""Provider state is deleted only by its owner (issue 39): a purge deletes the stored
responses its own turns created, never those a fork inherited or an import carried in
from another conversation (another tenant's included)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import httpx
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.http.conftest import ANN, BOB, start


def turn(http: httpx.Client, conversation: str, text: str, who: Mapping[str, str] = ANN) -> Any:
    answer = http.post(f"/v1/conversations/{conversation}/turns", json={"input": text}, headers=who)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_deleting_a_fork_or_an_import_keeps_the_owners_provider_state(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    """A fork that ran no turn, and an import into another tenant, are deleted: each
    reports no provider state deleted, and the owner's next turn still continues from its
    stored response; the owner's own delete still deletes it."""
    config = dataclasses.replace(runner_config, provider="demo-stateful")
    for http in start(config, runner_clock):
        turn(http, "owner", "My name is Ann.")
        assert turn(http, "owner", "I like tea.")["context"]["provider_state"] == "continued"

        forked = http.post("/v1/conversations/owner/fork", json={"to": "branch"}, headers=ANN)
        assert forked.status_code in (200, 201), forked.text
        deleted = http.delete("/v1/conversations/branch", headers=ANN)
        assert deleted.status_code in (200, 204), deleted.text
        after_fork = turn(http, "owner", "What is my name?")
        assert after_fork["context"]["provider_state"] == "continued"

        exported = http.get("/v1/conversations/owner/export", headers=ANN)
        assert exported.status_code == 200, exported.text
        imported = http.post("/v1/conversations/copy/import", content=exported.content, headers=BOB)
        assert imported.status_code == 201, imported.text
        assert http.delete("/v1/conversations/copy", headers=BOB).status_code in (200, 204)
        after_import = turn(http, "owner", "What do I like?")
        assert after_import["context"]["provider_state"] == "continued"

        # A fork that ran its own turn deletes that turn's response, not the parent's.
        http.post("/v1/conversations/owner/fork", json={"to": "branch-2"}, headers=ANN)
        own = turn(http, "branch-2", "I like coffee now.")
        assert own["context"]["provider_state"] == "continued"
        assert http.delete("/v1/conversations/branch-2", headers=ANN).status_code in (200, 204)
        assert turn(http, "owner", "Still there?")["context"]["provider_state"] == "continued"

        # The owner's own delete removes what its turns stored: the forget route finds none.
        assert http.delete("/v1/conversations/owner", headers=ANN).status_code in (200, 204)
        forgot = http.post("/_local/provider/forget", headers=ANN)
        assert forgot.status_code == 200 and forgot.json()["forgotten"] == 0
