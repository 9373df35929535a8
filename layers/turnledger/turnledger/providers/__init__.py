"""Model providers: the interface, the demo models, OpenAI-style HTTP APIs and Bedrock."""

from .base import Message, ModelReply, ModelRequest, Provider, ToolSpec
from .bedrock_converse import BedrockConverseProvider
from .demo import DemoProvider
from .demo_stateful import DemoStatefulProvider
from .factory import PROVIDERS, build_provider
from .history import build_strict_history, check_strict_history
from .openai_chat import OpenAIChatProvider
from .openai_responses import OpenAIResponsesProvider

__all__ = [
    "PROVIDERS",
    "BedrockConverseProvider",
    "DemoProvider",
    "DemoStatefulProvider",
    "Message",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatProvider",
    "OpenAIResponsesProvider",
    "Provider",
    "ToolSpec",
    "build_provider",
    "build_strict_history",
    "check_strict_history",
]
