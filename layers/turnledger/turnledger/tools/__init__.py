"""Tools: the registry, approval rules, and the executors that run server-side calls.

Names are imported from their modules on first use (PEP 562): a module that needs the
approval rules alone (:mod:`.approval`) does not load the executors' HTTP client or the
registry, so the functions that only read or clear load neither at init.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .approval import arguments_sha256
    from .executors import ToolInvocation, ToolOutcome, ToolRunner, idempotency_key
    from .registry import InvalidToolRegistry, ToolDefinition, ToolRegistry, requirement

_WHERE = {
    "arguments_sha256": "approval",
    "requirement": "registry",
    "ToolInvocation": "executors",
    "ToolOutcome": "executors",
    "ToolRunner": "executors",
    "idempotency_key": "executors",
    "InvalidToolRegistry": "registry",
    "ToolDefinition": "registry",
    "ToolRegistry": "registry",
}

__all__ = [
    "InvalidToolRegistry",
    "ToolDefinition",
    "ToolInvocation",
    "ToolOutcome",
    "ToolRegistry",
    "ToolRunner",
    "arguments_sha256",
    "idempotency_key",
    "requirement",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
