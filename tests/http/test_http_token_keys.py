"""Tokens made under the conversation's own key, through the local runner (issue 41).

The runner seals content (a keyring on moto's KMS), so a token's key is derived from the
conversation life's data key: two conversations holding the same card number show
different tokens, the ids alone do not recompute either, and ``DELETE`` destroys the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from pathlib import Path

import httpx
from turnledger.context.policy import DataPolicy
from turnledger.context.tokens import TOKEN, protect
from turnledger.core.models import ConversationKey
from turnledger.store.keyring import data_key_name
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN, store_of
from tests.http.test_http_data_policy import CARD, POLICY


def _from_ids(key: ConversationKey) -> bytes:
    """The token key as it was once derived: from the ids alone (anyone could recompute it)."""
    return hashlib.sha256(
        b"turnledger-token\x00" + key.tenant.encode() + b"\x00" + key.conversation_id.encode()
    ).digest()


def test_tokens_are_made_under_the_conversation_key_and_erased_with_it(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(POLICY))
    suffix = uuid.uuid4().hex[:8]
    config = LocalConfig(
        port=0,
        ttl_seconds=3600,
        table=f"tk-{suffix}",
        bucket=f"tk-{suffix}",
        model="demo-2",
        env={"DATA_POLICY_FILE": str(policy_file), "ALLOWED_MODELS": "demo-1,demo-2"},
    )
    config = dataclasses.replace(config, clock_file=runner_clock.path)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as http:
        tokens: dict[str, str] = {}
        for conversation in ("tk-1", "tk-2"):
            answered = http.post(
                f"/v1/conversations/{conversation}/turns",
                json={"input": f"my card is {CARD}"},
                headers=ANN,
            )
            assert answered.status_code == 200, answered.text
            events = http.get(f"/v1/conversations/{conversation}/events", headers=ANN)
            assert events.status_code == 200 and CARD not in events.text
            found = TOKEN.search(events.text)
            assert found is not None, events.text
            tokens[conversation] = found.group(0)
        assert tokens["tk-1"] != tokens["tk-2"]

        policy = DataPolicy.model_validate(POLICY)
        for conversation, token in tokens.items():
            key = ConversationKey(tenant="acme", conversation_id=conversation)
            assert protect(CARD, policy, _from_ids(key)) != token

        store = store_of(runner)
        keyring = store.sealer.keyring
        assert keyring is not None
        key = ConversationKey(tenant="acme", conversation_id="tk-1")
        head = store.get_head(key)
        assert head is not None
        name = data_key_name("acme", "tk-1", head.gen)
        assert keyring.items.get(name) is not None

        deleted = http.delete("/v1/conversations/tk-1", headers=ANN)
        assert deleted.status_code == 204, deleted.text
        assert keyring.items.get(name) is None
        # The other conversation's tokens are as they were.
        other = http.get("/v1/conversations/tk-2/events", headers=ANN)
        assert tokens["tk-2"] in other.text
