"""Model providers: the interface, the demo model, and OpenAI-compatible chat."""

from .base import Message, ModelReply, ModelRequest, Provider, ToolSpec
from .demo import DemoProvider
from .factory import build_provider
from .history import check_strict_history
from .openai_chat import OpenAIChatProvider

__all__ = [
    "DemoProvider",
    "Message",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatProvider",
    "Provider",
    "ToolSpec",
    "build_provider",
    "check_strict_history",
]
