"""Provider settings and the factory: every provider by name, built without any I/O."""

from __future__ import annotations

from pathlib import Path

import pytest
from turnledger.core.config import Settings
from turnledger.providers.bedrock_converse import BedrockConverseProvider
from turnledger.providers.demo import DemoProvider
from turnledger.providers.demo_stateful import (
    DemoStatefulProvider,
    DirectoryDemoState,
    MemoryDemoState,
)
from turnledger.providers.factory import PROVIDERS, build_provider
from turnledger.providers.openai_chat import OpenAIChatProvider
from turnledger.providers.openai_responses import OpenAIResponsesProvider


def test_provider_settings_have_defaults() -> None:
    settings = Settings.from_env({})

    assert settings.openai_responses_store is True
    assert settings.provider_state_retention_seconds == 30 * 24 * 3600
    assert (settings.bedrock_region, settings.bedrock_endpoint) == (None, None)
    assert (settings.bedrock_max_tokens, settings.bedrock_json_mode) == (0, "tool")
    assert settings.demo_state_dir is None


def test_provider_settings_are_read_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "OPENAI_RESPONSES_STORE": "false",
            "PROVIDER_STATE_RETENTION_SECONDS": "3600",
            "BEDROCK_REGION": "eu-west-3",
            "BEDROCK_ENDPOINT": "http://127.0.0.1:9",
            "BEDROCK_MAX_TOKENS": "1024",
            "BEDROCK_JSON_MODE": "native",
            "DEMO_STATE_DIR": "/tmp/demo-state",
        }
    )

    assert settings.openai_responses_store is False
    assert settings.provider_state_retention_seconds == 3600
    assert (settings.bedrock_region, settings.bedrock_endpoint) == (
        "eu-west-3",
        "http://127.0.0.1:9",
    )
    assert (settings.bedrock_max_tokens, settings.bedrock_json_mode) == (1024, "native")
    assert settings.demo_state_dir == "/tmp/demo-state"


@pytest.mark.parametrize(
    ("name", "value"),
    [("OPENAI_RESPONSES_STORE", "maybe"), ("BEDROCK_JSON_MODE", "prompt")],
)
def test_unusable_provider_settings_are_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        Settings.from_env({name: value})


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("demo", DemoProvider),
        ("demo-stateful", DemoStatefulProvider),
        ("openai-chat", OpenAIChatProvider),
        ("openai-responses", OpenAIResponsesProvider),
        ("bedrock-converse", BedrockConverseProvider),
    ],
)
def test_every_provider_is_built_by_name(name: str, kind: type) -> None:
    # Unreachable endpoints: building must not touch them.
    settings = Settings(
        openai_base_url="http://127.0.0.1:9/v1", bedrock_endpoint="http://127.0.0.1:9"
    )

    provider = build_provider(settings, name)

    assert isinstance(provider, kind)
    assert provider.name == name
    assert name in PROVIDERS


def test_the_default_is_the_deployment_s_provider() -> None:
    assert isinstance(build_provider(Settings(provider="demo-stateful")), DemoStatefulProvider)


def test_stateful_providers_say_so() -> None:
    stateful = {name for name in PROVIDERS if build_provider(Settings(), name).stateful}

    assert stateful == {"demo-stateful", "openai-responses"}


def test_openai_responses_store_setting_reaches_the_provider() -> None:
    provider = build_provider(Settings(openai_responses_store=False), "openai-responses")

    assert isinstance(provider, OpenAIResponsesProvider)
    assert provider.store is False


def test_demo_state_dir_selects_the_directory_store(tmp_path: Path) -> None:
    in_dir = build_provider(Settings(demo_state_dir=str(tmp_path)), "demo-stateful")
    in_memory = build_provider(Settings(), "demo-stateful")

    assert isinstance(in_dir, DemoStatefulProvider)
    assert isinstance(in_dir.state, DirectoryDemoState)
    assert in_dir.state.directory == tmp_path
    assert isinstance(in_memory, DemoStatefulProvider)
    assert isinstance(in_memory.state, MemoryDemoState)


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match="valid providers: demo, demo-stateful"):
        build_provider(Settings(), "gpt-direct")
