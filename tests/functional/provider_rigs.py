"""Every provider behind one harness: the demo models in process, the others over real HTTP.

A :class:`Rig` is one deployment's view of the providers: its
:class:`~turnledger.core.config.Settings` name a default provider and allow every
other one, the OpenAI-style providers point at a :class:`FakeOpenAI` and
Bedrock at a :class:`FakeBedrock`, and both fakes answer with the demo model
speaking their wire format (:mod:`tests.support.wire_demo`). Providers are
built by the deployment's own factory (:func:`build_provider`), once per rig,
so ``demo-stateful`` keeps its state across the services of one test::

    with Rig.open("openai-responses") as rig:
        svc = rig.service(store, clock)
        ...
        rig.validate_requests()   # every body against its provider's own schema
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from turnledger.context.redaction import Redactor
from turnledger.core.config import Settings
from turnledger.providers.base import Provider
from turnledger.providers.factory import PROVIDERS, build_provider
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.fake_bedrock import FakeBedrock, model_id
from tests.functional.fake_openai import (
    CHAT_PATH,
    RESPONSES_PATH,
    FakeOpenAI,
    RecordedRequest,
    Scripted,
)
from tests.support.factories import FakeClock
from tests.support.provider_schemas import (
    validate_chat_request,
    validate_converse_request,
    validate_responses_request,
)
from tests.support.wire_demo import chat_demo, converse_demo, responses_demo

#: The providers that keep state (``continued`` is possible).
STATEFUL = frozenset({"demo-stateful", "openai-responses"})
#: The model each provider's turns use by default.
MODELS = {
    "demo": "demo-1",
    "demo-stateful": "demo-1",
    "openai-chat": "gpt-test",
    "openai-responses": "gpt-test",
    "bedrock-converse": "anthropic.claude-3-5-haiku-20241022-v1:0",
}
#: Keys only one vendor's requests hold: any of them in another's body is a leftover.
VENDOR_KEYS = {
    "openai-chat": {"tool_calls", "tool_call_id", "messages"},
    "openai-responses": {"function_call_output", "previous_response_id", "call_id", "input"},
    "bedrock-converse": {"toolUse", "toolResult", "toolUseId", "toolConfig", "modelId"},
}


def keys_in(value: Any) -> set[str]:
    """Every mapping key and every ``"type"`` value anywhere in ``value``."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            found.add(key)
            if key == "type" and isinstance(item, str):
                found.add(item)
            found |= keys_in(item)
    elif isinstance(value, list):
        for item in value:
            found |= keys_in(item)
    return found


def bedrock_params(request: RecordedRequest) -> dict[str, Any]:
    """The ``converse`` parameters of a request the fake Bedrock received."""
    return {"modelId": model_id(request), **request.json()}


@dataclass
class Rig:
    """One deployment's providers, with fakes of the remote ones."""

    name: str
    openai: FakeOpenAI
    bedrock: FakeBedrock
    settings: Settings
    _built: dict[str, Provider] = field(default_factory=dict)

    @classmethod
    @contextmanager
    def open(cls, name: str, **settings: Any) -> Iterator[Rig]:
        """A rig whose default provider is ``name``; ``settings`` override the rest."""
        assert name in PROVIDERS, name
        with FakeOpenAI() as openai, FakeBedrock(default=converse_demo()) as bedrock:
            responses, chat = responses_demo(openai), chat_demo()

            def answer(request: RecordedRequest) -> Scripted:
                return responses(request) if request.path == RESPONSES_PATH else chat(request)

            openai.default = answer
            base = Settings(
                provider=name,
                providers=tuple(p for p in PROVIDERS if p != name),
                model=MODELS[name],
                # A deployment of several providers allows each one's model (ALLOWED_MODELS).
                allowed_models=tuple(MODELS.values()),
                openai_base_url=openai.base_url,
                bedrock_endpoint=bedrock.url,
                bedrock_region="us-east-1",
                provider_max_retries=0,
                provider_timeout_seconds=10,
            )
            yield cls(name=name, openai=openai, bedrock=bedrock, settings=replace(base, **settings))

    @property
    def stateful(self) -> bool:
        """Whether the default provider keeps state."""
        return self.name in STATEFUL

    def build(self, name: str) -> Provider:
        """The provider ``name``, built once by the deployment's factory."""
        if name not in self._built:
            self._built[name] = build_provider(self.settings, name)
        return self._built[name]

    def provider(self) -> Provider:
        """The default provider."""
        return self.build(self.name)

    def service(
        self,
        store: ConversationStore,
        clock: FakeClock,
        *,
        tools: ToolRegistry | None = None,
        runner: ToolRunner | None = None,
        redactor: Redactor | Callable[[], Redactor | None] | None = None,
        **settings: Any,
    ) -> Conversations:
        """The service over ``store`` (a fresh "process"), the providers shared."""
        return Conversations(
            store=store,
            provider=self.provider(),
            settings=replace(self.settings, **settings),
            tools=tools,
            runner=runner,
            redactor=redactor,
            clock=clock.now,
            providers=self.build,
        )

    # --- what reached the providers -------------------------------------------------------

    def chat_bodies(self) -> list[dict[str, Any]]:
        """Bodies of ``POST /chat/completions``, oldest first."""
        return [r.json() for r in self.openai.requests if r.path == CHAT_PATH]

    def responses_bodies(self) -> list[dict[str, Any]]:
        """Bodies of ``POST /responses``, oldest first."""
        return [
            r.json()
            for r in self.openai.requests
            if r.method == "POST" and r.path == RESPONSES_PATH
        ]

    def converse_params(self) -> list[dict[str, Any]]:
        """Parameters of every ``converse`` call, oldest first."""
        return [bedrock_params(r) for r in self.bedrock.requests]

    def validate_requests(self) -> int:
        """Check every request any fake received against its provider's schema, and that
        none holds another vendor's keys; returns how many were checked."""
        checked = 0
        for body in self.chat_bodies():
            validate_chat_request(body)
            assert_no_leftovers("openai-chat", body)
            checked += 1
        for body in self.responses_bodies():
            validate_responses_request(body)
            assert_no_leftovers("openai-responses", body)
            checked += 1
        for params in self.converse_params():
            validate_converse_request(params)
            assert_no_leftovers("bedrock-converse", params)
            checked += 1
        return checked


def assert_no_leftovers(provider: str, body: dict[str, Any]) -> None:
    """Fail if ``body``, sent to ``provider``, holds a key only another vendor uses."""
    found = keys_in(body)
    for other, own in VENDOR_KEYS.items():
        if other == provider:
            continue
        foreign = (own - VENDOR_KEYS[provider]) & found
        # "messages" is Bedrock's key too; "input" is toolUse's key in Bedrock.
        foreign -= {"messages", "input"} if provider == "bedrock-converse" else set()
        assert not foreign, f"{provider} request holds {other} keys {sorted(foreign)}: {body}"
