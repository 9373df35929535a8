"""The data policy: classes of data, what each allows, and the routing that obeys them.

A policy is JSON (``turnledger local --data-policy FILE``, ``DATA_POLICY_FILE`` or
``DATA_POLICY_PARAMETER`` deployed, a tenant's own through ``PUT /v1/data-policy``)::

    {"version": "2026-12-06",
     "classes": [
       {"name": "public"},
       {"name": "pii", "models": ["gpt-4o-mini"], "allow_fallbacks": true,
        "provider_state": false, "tools": ["crm_lookup"], "read_scope": "turnledger/pii",
        "retention_seconds": 2592000}],
     "detectors": [{"class": "pii", "name": "card", "pattern": "\\\\b4[0-9]{15}\\\\b"}]}

``classes`` go from least to most sensitive: a conversation's class only rises
(:meth:`DataPolicy.highest`). Detectors sit behind a small port (:class:`Detectors`): the
pattern adapter here (:class:`PatternDetectors`, on the redaction's ``regex`` engine and
its load-time probe) is one; a real PII detector is another.

Routing is a pure function (:func:`route`): a class, the requested model and the models
the deployment enables in, a chosen model or the rejected candidates with their reasons
out. :func:`allowed_models` says which models a class may be sent to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import TYPE_CHECKING, Protocol

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from ..core.config import Settings
from ..core.models import Deferred
from .redaction import RULE_SECONDS, RULES_MAX_AGE_SECONDS, RedactionRule

if TYPE_CHECKING:
    import regex

#: Any model at all, in a class's ``models``.
ANY_MODEL = "*"


class DataClass(Deferred):
    """One class of data and what it allows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    #: Models that may receive it, in order of preference: names, ``provider:model``, or
    #: ``*``; ``None``: any.
    models: list[str] | None = None
    #: Another allowed model answers when the requested one is not allowed.
    allow_fallbacks: bool = True
    #: Whether a provider may keep state (a stored response, a cursor) of it.
    provider_state: bool = True
    #: Tools that receive its raw values; every other tool receives tokens.
    tools: list[str] = Field(default_factory=list)
    #: The claim value a reader needs to read its raw values (``None``: anyone).
    read_scope: str | None = None
    #: How long its content lives (``None``: as long as the conversation).
    retention_seconds: int | None = Field(default=None, ge=1)


class DetectorRule(Deferred):
    """A pattern whose matches are values of ``class``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    data_class: str = Field(alias="class", min_length=1)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    pattern: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        # The redaction rule's checks: it compiles, and does not backtrack on the probes.
        RedactionRule(name="detector", pattern=value)
        return value


class DataPolicy(Deferred):
    """A versioned policy: ordered classes and the detectors that raise a text to one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(min_length=1, max_length=128)
    classes: list[DataClass] = Field(min_length=1)
    detectors: list[DetectorRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> DataPolicy:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("class names must be unique")
        for detector in self.detectors:
            if detector.data_class not in names:
                raise ValueError(
                    f"detector {detector.name!r} names no class of the policy: "
                    f"{detector.data_class!r}"
                )
        return self

    def get(self, name: str) -> DataClass:
        """The class named ``name``.

        Raises:
            KeyError: the policy has no such class.
        """
        for data_class in self.classes:
            if data_class.name == name:
                return data_class
        raise KeyError(name)

    def rank(self, name: str) -> int:
        """How sensitive ``name`` is: its place in :attr:`classes` (``KeyError``: none)."""
        return self.classes.index(self.get(name))

    def highest(self, *names: str | None) -> str | None:
        """The most sensitive of ``names`` the policy knows (``None``: none given).

        A name the policy no longer has (a class removed by a newer version) is kept
        above every known one: a class never falls because the policy changed.
        """
        known = [n for n in names if n is not None]
        if not known:
            return None
        unknown = [n for n in known if n not in self._ranks]
        if unknown:
            return unknown[0]
        return max(known, key=self._ranks.__getitem__)

    @cached_property
    def _ranks(self) -> dict[str, int]:
        return {c.name: i for i, c in enumerate(self.classes)}

    def effective(self, name: str | None) -> DataClass | None:
        """The class a conversation of ``name`` is held to: ``None`` for no class; a
        name this policy lacks is held to the most sensitive class it has."""
        if name is None:
            return None
        if name in self._ranks:
            return self.get(name)
        return self.classes[-1]

    @classmethod
    def parse(cls, raw: str | bytes, source: str) -> DataPolicy:
        """The policy in ``raw`` (JSON).

        Raises:
            ValueError: it is not a valid policy; the message names ``source``.
        """
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise ValueError(f"data policy in {source} is invalid: {exc}") from None


# --- detectors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A value a detector found in a text, and its class."""

    data_class: str
    detector: str
    value: str
    start: int
    end: int


class Detectors(Protocol):
    """The port: every value of a protected class in a text, in order, not overlapping."""

    def find(self, text: str) -> list[Finding]: ...


class PatternDetectors:
    """The port over a policy's pattern detectors (the ``regex`` engine, with a time limit:
    a pattern that runs too long on a text makes the whole text one finding of its class,
    so nothing unprotected goes out)."""

    def __init__(self, rules: list[DetectorRule]) -> None:
        self._rules = rules

    @cached_property
    def _compiled(self) -> list[tuple[regex.Pattern[str], DetectorRule]]:
        import regex

        return [(regex.compile(rule.pattern), rule) for rule in self._rules]

    def find(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        for pattern, rule in self._compiled:
            try:
                matches = list(pattern.finditer(text, timeout=RULE_SECONDS))
            except TimeoutError:
                return [Finding(rule.data_class, rule.name, text, 0, len(text))]
            found.extend(
                Finding(rule.data_class, rule.name, m.group(0), m.start(), m.end())
                for m in matches
                if m.end() > m.start()
            )
        # The first of overlapping findings wins: each character is one value's at most.
        found.sort(key=lambda f: (f.start, -f.end))
        kept: list[Finding] = []
        for finding in found:
            if not kept or finding.start >= kept[-1].end:
                kept.append(finding)
        return kept


def detectors_of(policy: DataPolicy) -> Detectors:
    """The detectors of ``policy`` (its patterns)."""
    return PatternDetectors(policy.detectors)


# --- routing ---------------------------------------------------------------------------------


class Rejection(Deferred):
    """A model the routing did not choose, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    reason: str


@dataclass(frozen=True)
class Target:
    """A model to call, and the provider it names (``None``: the turn's own)."""

    model: str
    provider: str | None = None

    @classmethod
    def of(cls, entry: str) -> Target:
        provider, sep, model = entry.partition(":")
        return cls(model=model, provider=provider) if sep and model else cls(model=entry)

    def matches(self, entry: str, provider: str) -> bool:
        """Whether the class entry ``entry`` names this model (on ``provider``)."""
        if entry == ANY_MODEL:
            return True
        other = Target.of(entry)
        if other.model != self.model:
            return False
        return other.provider is None or other.provider == (self.provider or provider)

    def label(self) -> str:
        return f"{self.provider}:{self.model}" if self.provider else self.model


@dataclass(frozen=True)
class Routing:
    """What :func:`route` decided: ``chosen`` (``None``: no model may be sent the class)."""

    data_class: str
    chosen: Target | None
    rejected: list[Rejection]


#: Why a candidate was rejected.
NOT_ALLOWED = "the class does not allow this model"
NOT_ENABLED = "the deployment does not enable this model"
NO_FALLBACKS = "the class allows no fallback"


class Enabled(Protocol):
    """What the deployment lets a turn name: a model, a provider."""

    def __call__(self, target: Target) -> bool: ...


def enabled(settings: Settings, default_provider: str) -> Enabled:
    """Whether the deployment lets a turn name a target: a model it allows, on a provider
    it allows (``default_provider``: the turn's, for a target that names none)."""

    def check(target: Target) -> bool:
        models = settings.models_allowed
        if models is not None and target.model not in models:
            return False
        return (target.provider or default_provider) in settings.allowed_providers

    return check


def allowed_models(policy: DataPolicy, class_name: str | None, enabled: Enabled) -> list[str]:
    """The models (``provider:model`` or names, in the class's order) that content of
    ``class_name`` may be sent to and the deployment enables; ``["*"]``: any enabled one."""
    data_class = policy.effective(class_name)
    if data_class is None or data_class.models is None or ANY_MODEL in data_class.models:
        return [ANY_MODEL]
    return [entry for entry in data_class.models if enabled(Target.of(entry))]


def route(
    policy: DataPolicy,
    class_name: str,
    requested: Target,
    provider: str,
    enabled: Enabled,
) -> Routing:
    """Choose the model content of ``class_name`` is sent to: ``requested`` (on
    ``provider``, the turn's) if the class allows it, else the class's models in order
    when it allows fallbacks; each model passed over is named with its reason."""
    data_class = policy.effective(class_name)
    assert data_class is not None
    models = data_class.models
    if models is None or any(requested.matches(entry, provider) for entry in models):
        return Routing(class_name, requested, [])
    rejected = [Rejection(model=requested.label(), reason=NOT_ALLOWED)]
    for entry in models:
        if entry == ANY_MODEL:
            continue
        target = Target.of(entry)
        if not data_class.allow_fallbacks:
            rejected.append(Rejection(model=entry, reason=NO_FALLBACKS))
        elif not enabled(target):
            rejected.append(Rejection(model=entry, reason=NOT_ENABLED))
        else:
            return Routing(class_name, target, rejected)
    return Routing(class_name, None, rejected)


# --- where a deployment's policy comes from ----------------------------------------------------


def policy_source(settings: Settings) -> DataPolicy | Callable[[], DataPolicy | None] | None:
    """What gives the deployment's policy: the file's, loaded now; a parameter's, read when
    asked (Powertools caches it); ``None``: no policy.

    Raises:
        ValueError: the policy file is invalid.
    """
    if settings.data_policy_file:
        return load_policy(settings)
    if settings.data_policy_parameter:
        return partial(load_policy, settings)
    return None


def load_policy(settings: Settings) -> DataPolicy | None:
    """The deployment's policy: ``DATA_POLICY_FILE``, else ``DATA_POLICY_PARAMETER`` (SSM,
    through Powertools Parameters, cached), else ``None`` (no policy: no class, no routing).

    Raises:
        ValueError: the policy is invalid.
    """
    if settings.data_policy_file:
        with open(settings.data_policy_file, "rb") as handle:
            return DataPolicy.parse(handle.read(), settings.data_policy_file)
    if settings.data_policy_parameter:
        from aws_lambda_powertools.utilities import parameters

        raw = parameters.get_parameter(
            settings.data_policy_parameter, max_age=RULES_MAX_AGE_SECONDS
        )
        return DataPolicy.parse(raw, settings.data_policy_parameter)
    return None
