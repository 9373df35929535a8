"""The data policy's pure parts: class order, detectors, routing, tokens."""

from __future__ import annotations

import hashlib

import pytest
from turnledger.context.policy import (
    NO_FALLBACKS,
    NOT_ALLOWED,
    NOT_ENABLED,
    DataPolicy,
    Target,
    allowed_models,
    detectors_of,
    route,
)
from turnledger.context.tokens import mapping, protect, reveal, token_secret
from turnledger.core.exceptions import ContentUnreadable, InternalError
from turnledger.core.models import ConversationKey
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.turn.callbacks import signing_key

POLICY = DataPolicy.model_validate(
    {
        "version": "v1",
        "classes": [
            {"name": "public"},
            {"name": "pii", "models": ["small", "bedrock:haiku"], "tools": ["crm"]},
            {"name": "secret", "models": ["local"], "allow_fallbacks": False},
        ],
        "detectors": [{"class": "pii", "name": "card", "pattern": "\\b4[0-9]{15}\\b"}],
    }
)
CARD = "4111111111111111"


def enabled_all(target: Target) -> bool:
    return True


def test_a_class_only_rises_and_an_unknown_one_stays_on_top() -> None:
    assert POLICY.highest(None, "pii", "public") == "pii"
    assert POLICY.highest("secret", "pii") == "secret"
    assert POLICY.highest("gone", "secret") == "gone"
    assert POLICY.effective("gone") == POLICY.classes[-1]
    assert POLICY.highest(None, None) is None


def test_an_invalid_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="names no class"):
        DataPolicy.parse(
            '{"version": "x", "classes": [{"name": "a"}], '
            '"detectors": [{"class": "b", "name": "d", "pattern": "x"}]}',
            "test",
        )
    with pytest.raises(ValueError, match="unique"):
        DataPolicy.parse('{"version": "x", "classes": [{"name": "a"}, {"name": "a"}]}', "test")
    with pytest.raises(ValueError, match="backtracks"):
        DataPolicy.parse(
            '{"version": "x", "classes": [{"name": "a"}], '
            '"detectors": [{"class": "a", "name": "d", "pattern": "(a|aa)+$"}]}',
            "test",
        )


def test_routing_keeps_an_allowed_model_falls_back_in_order_and_refuses() -> None:
    kept = route(POLICY, "pii", Target("small"), "openai", enabled_all)
    assert (kept.chosen, kept.rejected) == (Target("small"), [])
    fallback = route(POLICY, "pii", Target("big"), "openai", lambda t: t.model != "small")
    assert fallback.chosen == Target(model="haiku", provider="bedrock")
    assert [(r.model, r.reason) for r in fallback.rejected] == [
        ("big", NOT_ALLOWED),
        ("small", NOT_ENABLED),
    ]
    refused = route(POLICY, "secret", Target("big"), "openai", enabled_all)
    assert refused.chosen is None
    assert [(r.model, r.reason) for r in refused.rejected] == [
        ("big", NOT_ALLOWED),
        ("local", NO_FALLBACKS),
    ]
    assert route(POLICY, "public", Target("big"), "openai", enabled_all).chosen == Target("big")


def test_allowed_models_names_what_the_state_route_may_send() -> None:
    assert allowed_models(POLICY, "public", enabled_all) == ["*"]
    assert allowed_models(POLICY, None, enabled_all) == ["*"]
    assert allowed_models(POLICY, "pii", lambda t: t.provider != "bedrock") == ["small"]


def test_tokens_are_stable_per_conversation_and_revealed_only_to_their_classes() -> None:
    key = ConversationKey(tenant="acme", conversation_id="c1")
    other = ConversationKey(tenant="acme", conversation_id="c2")
    keyring = Keyring(LocalMasterKey(), MemoryKeyItems())
    secret = token_secret(keyring, key, "g1", create=True, deployment=lambda: None)
    text = f"card {CARD} and again {CARD}"
    protected = protect(text, POLICY, secret)
    assert CARD not in protected
    token = protected.split()[1]
    assert protected == f"card {token} and again {token}"
    assert (
        protect(
            text, POLICY, token_secret(keyring, other, "g1", create=True, deployment=lambda: None)
        )
        != protected
    )
    assert protect(text, POLICY, secret, frozenset({"pii"})) == text
    known = mapping([text], POLICY, secret)
    assert reveal({"card": token}, known, frozenset({"pii"})) == {"card": CARD}
    assert reveal({"card": token}, known, frozenset()) == {"card": token}
    assert [f.value for f in detectors_of(POLICY).find(text)] == [CARD, CARD]


def _from_ids(key: ConversationKey) -> bytes:
    """The token key as it was once derived: from the ids alone (anyone could recompute it)."""
    return hashlib.sha256(
        b"turnledger-token\x00" + key.tenant.encode() + b"\x00" + key.conversation_id.encode()
    ).digest()


def test_a_token_key_comes_from_the_data_key_and_dies_with_it() -> None:
    """Sealed content: the token key is the life's data key's; the ids alone do not make
    it, and once the data key is destroyed (an erasure) nothing does."""
    key = ConversationKey(tenant="acme", conversation_id="c1")
    keyring = Keyring(LocalMasterKey(), MemoryKeyItems(), cache_seconds=0)
    secret = token_secret(keyring, key, "g1", create=True, deployment=lambda: None)
    assert token_secret(keyring, key, "g1", create=False, deployment=lambda: None) == secret
    assert protect(CARD, POLICY, secret) != protect(CARD, POLICY, _from_ids(key))
    keyring.destroy_conversation("acme", "c1", ["g1"])
    with pytest.raises(ContentUnreadable):
        token_secret(keyring, key, "g1", create=False, deployment=lambda: None)


def test_without_a_keyring_the_token_key_needs_the_deployment_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The secret is the callback signing key (``CALLBACK_KEY``), as the reads ask it."""
    key = ConversationKey(tenant="acme", conversation_id="c1")
    monkeypatch.delenv("CALLBACK_SECRET_ARN", raising=False)
    monkeypatch.delenv("CALLBACK_KEY", raising=False)
    with pytest.raises(InternalError):
        token_secret(None, key, "g1", create=True, deployment=signing_key)
    monkeypatch.setenv("CALLBACK_KEY", "11" * 32)
    first = token_secret(None, key, "g1", create=True, deployment=signing_key)
    assert first not in (_from_ids(key), b"")
    monkeypatch.setenv("CALLBACK_KEY", "22" * 32)
    assert token_secret(None, key, "g1", create=True, deployment=signing_key) != first
