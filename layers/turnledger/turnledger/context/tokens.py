"""Tokens instead of values: what a model, a tool or a reader sees of a protected value.

A value a data policy's detectors find (``turnledger.context.policy``) is replaced by a
token ``[<class>:<detector>:<10 hex>]``, stable per value per conversation: the hex
is an HMAC of the value under the conversation's token key (:func:`token_secret`), so
the same card number is the same token in every turn, and another conversation's token
for it differs. The token key is derived from a secret, never from ids alone (whoever
knows the ids could otherwise test guesses of a value against its token): from the
conversation life's data key where content is sealed (``turnledger.store.keyring``: an
erasure destroys it, and with it every way to recompute a token), else from the
deployment's callback signing key (``turnledger.turn.callbacks``). The transcript keeps
the values (sealed under the conversation's key where content is sealed); the mapping
back is never stored on its own: it is read from the transcript (:func:`mapping`), so
erasing the conversation erases it.

* **The model** sees tokens for every value of a class (:class:`TokenizingRedactor`,
  the redaction rule set's interface: the context assembly applies it).
* **A tool** the value's class names in ``tools`` receives the value in its
  arguments (:func:`reveal`); any other tool receives the token.
* **A reader** whose claims hold the class's ``read_scope`` sees values in answers,
  events and exports; any other reader sees tokens (:func:`protect`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pydantic import PrivateAttr

from ..core.exceptions import InternalError
from ..core.models import ConversationKey
from .policy import DataPolicy, Detectors, Finding, detectors_of
from .redaction import Redactor

if TYPE_CHECKING:
    from ..store.keyring import Keyring

#: A token, as :func:`token_of` writes it.
TOKEN = re.compile(r"\[([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+):([0-9a-f]{10})\]")


#: What a token key is derived for (HMAC's message under the secret it comes from).
_TOKEN_LABEL = b"turnledger-token\x00"


def token_secret(
    keyring: Keyring | None,
    key: ConversationKey,
    gen: str,
    *,
    create: bool,
    deployment: Callable[[], bytes | None],
) -> bytes:
    """The key the tokens of ``key``'s life ``gen`` are made with.

    With a keyring: derived from the life's data key (``create``: made when there is none
    yet, as a turn's write would). Without one: from ``deployment``'s secret (the callback
    signing key: ``turnledger.turn.callbacks.signing_key``, asked only then) and the ids.

    Raises:
        ContentUnreadable: the life's data key is gone (erased) and ``create`` is false.
        InternalError: no keyring and no callback signing key: no secret to make
            tokens with (a deployment with a data policy's detectors needs one of them).
    """
    if keyring is not None:
        data_key = keyring.data_key(key.tenant, key.conversation_id, gen, create=create)
        return hmac.new(data_key.material, _TOKEN_LABEL, hashlib.sha256).digest()
    secret = deployment()
    if secret is None:
        raise InternalError(
            "tokens of a data policy need a secret: configure encryption at rest "
            "or a callback signing key (CALLBACK_KEY or CALLBACK_SECRET_ARN)",
            details={"conversation_id": key.conversation_id},
        )
    ids = key.tenant.encode() + b"\x00" + key.conversation_id.encode()
    return hmac.new(secret, _TOKEN_LABEL + ids, hashlib.sha256).digest()


def token_of(secret: bytes, finding: Finding) -> str:
    """The token of ``finding``'s value in the conversation of ``secret``."""
    digest = hmac.new(secret, finding.value.encode(), hashlib.sha256).hexdigest()[:10]
    return f"[{finding.data_class}:{finding.detector}:{digest}]"


def tokenize(text: str, detectors: Detectors, secret: bytes, keep: frozenset[str]) -> str:
    """``text`` with every value found replaced by its token, but values of ``keep``."""
    findings = [f for f in detectors.find(text) if f.data_class not in keep]
    if not findings:
        return text
    parts: list[str] = []
    at = 0
    for finding in findings:
        parts.append(text[at : finding.start])
        parts.append(token_of(secret, finding))
        at = finding.end
    parts.append(text[at:])
    return "".join(parts)


def protect(
    value: Any, policy: DataPolicy, secret: bytes, keep: frozenset[str] = frozenset()
) -> Any:
    """A JSON value with every string in it (keys excepted) tokenized, but values of the
    classes in ``keep`` (those the reader or the tool may see)."""
    detectors = detectors_of(policy)
    if not policy.detectors:
        return value

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return tokenize(item, detectors, secret, keep)
        if isinstance(item, list):
            return [walk(x) for x in item]
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        return item

    return walk(value)


def readable_classes(policy: DataPolicy, claims: Iterable[str]) -> frozenset[str]:
    """The classes whose raw values a reader holding ``claims`` may read."""
    held = set(claims)
    return frozenset(c.name for c in policy.classes if c.read_scope is None or c.read_scope in held)


def tool_classes(policy: DataPolicy, tool: str) -> frozenset[str]:
    """The classes whose raw values ``tool`` may receive."""
    return frozenset(c.name for c in policy.classes if tool in c.tools)


def mapping(texts: Iterable[str], policy: DataPolicy, secret: bytes) -> dict[str, Finding]:
    """Token -> the value it stands for, over every value ``texts`` hold."""
    detectors = detectors_of(policy)
    found: dict[str, Finding] = {}
    for text in texts:
        for finding in detectors.find(text):
            found.setdefault(token_of(secret, finding), finding)
    return found


def reveal(value: Any, known: dict[str, Finding], classes: frozenset[str]) -> Any:
    """A JSON value with each token of ``known`` whose class is in ``classes`` replaced by
    its value; other tokens stay."""
    if not classes or not known:
        return value

    def swap(match: re.Match[str]) -> str:
        finding = known.get(match.group(0))
        return (
            finding.value
            if finding is not None and finding.data_class in classes
            else match.group(0)
        )

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return TOKEN.sub(swap, item)
        if isinstance(item, list):
            return [walk(x) for x in item]
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        return item

    return walk(value)


class TokenizingRedactor(Redactor):
    """A redaction rule set that first replaces every protected value by its token: what
    the context assembly applies for a conversation with a data class."""

    _detectors: Detectors = PrivateAttr()
    _secret: bytes = PrivateAttr()

    @classmethod
    def of(
        cls, policy: DataPolicy, secret: bytes, rules: Redactor | None = None
    ) -> TokenizingRedactor:
        """Tokens of ``policy``'s detectors, then ``rules`` (if any); its ``version``
        names both, so a stored provider response made without them is not reused."""
        version = f"policy:{policy.version}"
        if rules is not None:
            version = f"{rules.version}+{version}"
        made = cls(version=version, rules=list(rules.rules) if rules is not None else [])
        made._detectors = detectors_of(policy)
        made._secret = secret
        return made

    def text(self, text: str) -> str:
        return super().text(tokenize(text, self._detectors, self._secret, frozenset()))
