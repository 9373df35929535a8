"""``demo-stateful`` through the local runner: continued turns, and the fallback that
``POST /_local/provider/forget`` makes happen on demand."""

from __future__ import annotations

import dataclasses

import httpx
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.http.conftest import ANN, start


def test_forgetting_the_provider_state_makes_the_next_turn_fall_back(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    config = dataclasses.replace(runner_config, provider="demo-stateful")
    for http in start(config, runner_clock):
        path = "/v1/conversations/s1/turns"
        first = http.post(path, json={"input": "My name is Ann."}, headers=ANN).json()
        second = http.post(path, json={"input": "I like tea."}, headers=ANN).json()
        assert (first["context"]["provider_state"], second["context"]["provider_state"]) == (
            "fresh",
            "continued",
        )
        # Continued: only the new user message was sent.
        assert second["context"]["messages_sent"] == 1

        assert http.post("/_local/provider/forget").status_code == 401
        forgot = http.post("/_local/provider/forget", headers=ANN)
        assert forgot.status_code == 200 and forgot.json()["forgotten"] == 2
        assert http.get("/_local/provider/forget", headers=ANN).status_code == 405

        third = http.post(path, json={"input": "What is my name?"}, headers=ANN).json()
        assert third["context"]["provider_state"] == "fallback"
        assert third["output_text"] == "Your name is Ann."
        fourth = http.post(path, json={"input": "What is my name?"}, headers=ANN).json()
        assert fourth["context"]["provider_state"] == "continued"
        events = http.get("/v1/conversations/s1/events", headers=ANN).json()["events"]
        runs = [e["payload"]["run"] for e in events if e["kind"] == "assistant_message"]
        assert [r["provider_state"] for r in runs] == [
            "fresh",
            "continued",
            "fallback",
            "continued",
        ]
        assert all(r["response_id"].startswith("resp_") for r in runs)


def test_the_forget_route_is_local_only_and_unknown_local_routes_are_404(
    runner_config: LocalConfig,
) -> None:
    for http in start(runner_config, None):
        assert isinstance(http, httpx.Client)
        assert http.post("/_local/nothing", headers=ANN).status_code == 404
