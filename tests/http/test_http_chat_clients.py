"""The Chat Completions face driven by the clients that speak it, against the local runner:
LangChain's ``ChatOpenAI`` (``invoke`` over a history, a ``bind_tools`` loop) and the Vercel
AI SDK's ``generateText`` and ``streamText`` on ``openai.chat(...)`` (Node, from the npm
registry: ``make test`` installs it into ``.tools/ai-sdk``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import httpx
import pytest
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from turnledger_local.runner import LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.http.conftest import all_events

#: Where ``make .tools/ai-sdk/node_modules/ai/package.json`` installs the AI SDK.
AI_SDK_MODULES = PROJECT_ROOT / ".tools" / "ai-sdk" / "node_modules"
AI_SDK_SCRIPT = PROJECT_ROOT / "tests" / "support" / "ai_sdk_chat.mjs"


@pytest.fixture
def llm(served: LocalRunner) -> ChatOpenAI:
    return ChatOpenAI(
        model="demo-1",
        base_url=f"{served.url}/openai/v1",
        api_key="local:acme:ann",  # type: ignore[arg-type]
        max_retries=0,
    )


def conversation_of(message: BaseMessage) -> str:
    """The conversation a LangChain answer came from (the completion's id names it)."""
    completion_id = str(message.response_metadata["id"])
    return completion_id.split("_", 1)[1]


def test_langchain_invoke_over_a_history(llm: ChatOpenAI, http: httpx.Client) -> None:
    history: list[BaseMessage] = [HumanMessage("My name is Ada.")]
    history.append(llm.invoke(history))
    history.append(HumanMessage("I like tea."))
    history.append(llm.invoke(history))
    history.append(HumanMessage("What is my name?"))
    answer = llm.invoke(history)
    assert answer.content == "Your name is Ada."
    assert {conversation_of(m) for m in (*history[1::2], answer)} == {conversation_of(answer)}
    kinds = [e["kind"] for e in all_events(http, conversation_of(answer))]
    assert kinds == ["user_message", "assistant_message"] * 3


def test_langchain_bind_tools_loop(llm: ChatOpenAI, http: httpx.Client) -> None:
    @tool
    def lookup_order(id: str) -> str:
        """An order's status."""
        return f"order {id}: shipped"

    agent = llm.bind_tools([lookup_order])
    history: list[BaseMessage] = [HumanMessage('/tool lookup_order {"id": "A1"}')]
    steps = 0
    while (reply := agent.invoke(history)).tool_calls:  # type: ignore[attr-defined]
        steps += 1
        history.append(reply)
        for call in reply.tool_calls:  # type: ignore[attr-defined]
            history.append(ToolMessage(lookup_order.invoke(call["args"]), tool_call_id=call["id"]))
    assert steps == 1
    assert reply.content == "Tool results: lookup_order: order A1: shipped"
    events = all_events(http, conversation_of(reply))
    kinds = [e["kind"] for e in events]
    assert kinds.count("user_message") == 1 and kinds.count("tool_result") == 1


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
def test_vercel_ai_sdk_generate_and_stream(served: LocalRunner, http: httpx.Client) -> None:
    if not (AI_SDK_MODULES / "ai" / "package.json").exists():
        pytest.fail("the AI SDK is missing: make .tools/ai-sdk/node_modules/ai/package.json")
    ran = subprocess.run(
        ["node", str(AI_SDK_SCRIPT), f"{served.url}/openai/v1", "local:acme:ann"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AI_SDK_MODULES": str(AI_SDK_MODULES)},
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    got: dict[str, Any] = json.loads(ran.stdout)
    assert got["first"] == "Noted (1 user messages so far)."
    assert got["history"] == "Your name is Ada."
    assert got["loop"]["calls"] == [{"id": "A1"}]
    assert got["loop"]["steps"] == 2
    assert got["loop"]["text"] == "Tool results: lookup_order: shipped"
    stream = got["stream"]
    assert stream["text"] == "Noted (1 user messages so far)." == "".join(stream["deltas"])
    assert stream["finish"] == "stop"
    assert stream["usage"]["outputTokens"] == 6


def test_langchain_stream_with_usage(llm: ChatOpenAI) -> None:
    """``stream`` with ``stream_usage`` (``stream_options.include_usage``): the text in
    pieces, the usage on the last."""
    pieces = list(llm.stream([HumanMessage("My name is Ada.")], stream_usage=True))
    assert "".join(str(p.content) for p in pieces) == "Noted (1 user messages so far)."
    usage = [p.usage_metadata for p in pieces if p.usage_metadata]
    assert usage and usage[-1]["output_tokens"] == 6
