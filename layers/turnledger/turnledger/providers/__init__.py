"""Model providers: the interface, the demo models, OpenAI-style HTTP APIs and Bedrock.

Names are imported from their modules on first use (PEP 562): a handler that
imports the interface does not pay for every provider's client library at cold
start; :func:`build_provider` imports only the provider it builds.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "Message": "base",
    "ModelReply": "base",
    "ModelRequest": "base",
    "Provider": "base",
    "ToolSpec": "base",
    "BedrockConverseProvider": "bedrock_converse",
    "DemoProvider": "demo",
    "DemoStatefulProvider": "demo_stateful",
    "PROVIDERS": "factory",
    "build_provider": "factory",
    "build_strict_history": "history",
    "check_strict_history": "history",
    "OpenAIChatProvider": "openai_chat",
    "OpenAIResponsesProvider": "openai_responses",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
