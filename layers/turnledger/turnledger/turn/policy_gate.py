"""The data policy in a turn's path: the class a conversation rises to, and the model
every call may be sent (``turnledger.context.policy`` decides; this applies it).

* **The class only rises.** A turn's ``data_class``, the detectors over what a turn
  brings in (messages, outputs) and a tool's ``result_class`` raise it; each rise is a
  ``data_class_raised`` event, and a rise to a class that allows no provider state drops
  the conversation's cursor and deletes the responses the provider keeps.
* **Routing before sending.** Every model call of a conversation with a class is
  routed (:func:`decide`): the chosen model is named by a ``policy_decision`` event;
  no allowed model is ``422 data_policy_unsatisfied``, before anything is sent. A turn
  is checked before anything of it is stored (:func:`check_turn`).

A conversation with no class (or a deployment with no policy) takes none of this path:
its turns write and read exactly what they did before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..context.policy import DataPolicy, Routing, Target, detectors_of, enabled, route
from ..context.tokens import mapping, protect, reveal, tool_classes
from ..core.config import Settings
from ..core.exceptions import DataPolicyUnsatisfied, UnknownDataClass
from ..core.models import DataClassRaised, PolicyDecision, RejectedModel
from ..providers.base import Provider
from .commands import TurnCommand
from .session import Session


@dataclass(frozen=True)
class Rise:
    """The class a conversation rises to, and what raised it."""

    to: str
    source: str


def named_class(policy: DataPolicy | None, name: str | None) -> None:
    """Refuse a class a request names that the policy lacks (or any, with no policy).

    Raises:
        UnknownDataClass: with the policy's classes.
    """
    if name is None:
        return
    classes = [c.name for c in policy.classes] if policy is not None else []
    if name not in classes:
        raise UnknownDataClass(
            f"data class {name!r} is not in the data policy",
            details={"class": name, "classes": classes},
        )


def rise(
    policy: DataPolicy,
    current: str | None,
    *,
    named: str | None = None,
    texts: Iterable[str] = (),
    source: str = "turn",
) -> Rise | None:
    """The class ``current`` rises to with a class ``named`` and what the detectors find
    in ``texts`` (``None``: it stays). A lower name never lowers it."""
    candidates: list[tuple[str, str]] = []
    if named is not None:
        candidates.append((named, source))
    detectors = detectors_of(policy)
    for text in texts:
        candidates.extend(
            (finding.data_class, f"detector:{finding.detector}") for finding in detectors.find(text)
        )
    best: Rise | None = None
    level = current
    for name, why in candidates:
        higher = policy.highest(level, name)
        if higher != level:
            level = higher
            best = Rise(to=name, source=why)
    return best


def apply_rise(
    session: Session, policy: DataPolicy, raised: Rise, *, actor: str
) -> list[tuple[str, str]]:
    """Stage ``raised`` on ``session``; returns the provider responses (provider, id) to
    delete when the new class allows no provider state (the cursor is dropped with
    them: it is never reused after the rise)."""
    previous = session.data_class
    session.data_class = raised.to
    session.add(
        DataClassRaised(
            previous=previous, to=raised.to, source=raised.source, policy_version=policy.version
        ),
        actor=actor,
    )
    data_class = policy.effective(raised.to)
    cursor = session.provider_cursor
    if data_class is None or data_class.provider_state or cursor is None:
        return []
    session.provider_cursor = None
    return [(cursor.provider, cursor.response_id)]


def retention_seconds(policy: DataPolicy | None, class_name: str) -> int | None:
    """How long the class a conversation of ``class_name`` is held to keeps its content
    (``None``: as long as the conversation, or no policy)."""
    held = policy.effective(class_name) if policy is not None else None
    return held.retention_seconds if held is not None else None


def decide(
    policy: DataPolicy,
    class_name: str,
    *,
    model: str,
    provider: str,
    settings: Settings,
) -> Routing:
    """Route a call of ``model`` on ``provider`` for content of ``class_name``.

    Raises:
        DataPolicyUnsatisfied: no model the class allows may answer; nothing was sent.
    """
    routing = route(policy, class_name, Target(model=model), provider, enabled(settings, provider))
    if routing.chosen is None:
        raise DataPolicyUnsatisfied(
            f"no model allowed for data class {class_name!r} may answer",
            details={
                "class": class_name,
                "policy_version": policy.version,
                "rejected": [r.model_dump() for r in routing.rejected],
            },
        )
    return routing


def check_turn(
    policy: DataPolicy | None,
    session: Session,
    command: TurnCommand,
    settings: Settings,
    provider_of: Callable[[str | None], Provider],
) -> Rise | None:
    """The class ``command``'s turn raises the conversation to (``None``: it stays), once
    a model its class allows is known to answer: refused before anything of the turn is
    stored or sent.

    Raises:
        UnknownDataClass: the command names a class the policy lacks.
        DataPolicyUnsatisfied: no model the class allows may answer.
    """
    named_class(policy, command.data_class)
    if policy is None:
        return None
    raised = rise(
        policy,
        session.data_class,
        named=command.data_class,
        texts=[*command.messages, *(o.output for o in command.outputs)],
    )
    held = raised.to if raised is not None else session.data_class
    if held is None:
        return raised
    # Outputs alone continue the turn with its stored options; new messages bring theirs.
    options = session.options if not command.messages else None
    model = command.model or (options.model if options else None) or settings.model
    provider = provider_of(command.provider or (options.provider if options else None))
    decide(policy, held, model=model, provider=provider.name, settings=settings)
    return raised


def tool_arguments(
    policy: DataPolicy, session: Session, secret: bytes, tool: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """What ``tool`` is sent of ``arguments`` (as the model wrote them, with tokens): the
    values of the classes that name ``tool`` in their ``tools``, read back from the
    conversation's events, and tokens for every other protected value (made under
    ``secret``, the conversation's token key)."""
    allowed = tool_classes(policy, tool)
    known = mapping(_texts(e.payload for e in session.events), policy, secret)
    revealed: dict[str, Any] = protect(reveal(arguments, known, allowed), policy, secret, allowed)
    return revealed


def _texts(values: Iterable[Any]) -> Iterator[str]:
    """Every string in ``values`` (JSON), keys excepted."""
    for value in values:
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from _texts(value)
        elif isinstance(value, dict):
            yield from _texts(value.values())


def check_exact(
    policy: DataPolicy | None,
    class_name: str | None,
    *,
    model: str,
    provider: str,
    settings: Settings,
) -> None:
    """Refuse a call that must use ``model`` (a replay's candidate) when the class does
    not allow it: no fallback takes its place.

    Raises:
        DataPolicyUnsatisfied: the class does not allow ``model`` on ``provider``.
    """
    if policy is None or class_name is None:
        return
    routing = decide(policy, class_name, model=model, provider=provider, settings=settings)
    if routing.rejected:
        raise DataPolicyUnsatisfied(
            f"data class {class_name!r} does not allow {model!r}",
            details={
                "class": class_name,
                "policy_version": policy.version,
                "rejected": [routing.rejected[0].model_dump()],
            },
        )


def decision_event(
    policy: DataPolicy, routing: Routing, *, provider: str, purpose: str
) -> PolicyDecision:
    """The ``policy_decision`` event of ``routing`` (its chosen model on ``provider``)."""
    assert routing.chosen is not None
    return PolicyDecision(
        data_class=routing.data_class,
        policy_version=policy.version,
        chosen=routing.chosen.model,
        provider=provider,
        rejected=[RejectedModel(model=r.model, reason=r.reason) for r in routing.rejected],
        purpose=purpose,
    )
