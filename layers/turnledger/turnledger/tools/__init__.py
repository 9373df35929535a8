"""Tools: the registry, approval rules, and the executors that run server-side calls."""

from .approval import arguments_sha256, requirement
from .executors import ToolInvocation, ToolOutcome, ToolRunner, idempotency_key
from .registry import InvalidToolRegistry, ToolDefinition, ToolRegistry

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
