"""Redaction: versioned regex rules applied to what a model would see.

A rule set is JSON::

    {"version": "2026-12-01", "rules": [
        {"name": "card", "pattern": "\\\\b\\\\d{16}\\\\b", "replacement": "[card]"}
    ]}

Rules run in order over every text of the working context (messages, tool
call arguments, tool outputs) and over the inputs of a summary, while the
context is assembled (:mod:`turnledger.context.assembly`). The transcript keeps the
original; the rule set's ``version`` is recorded on each answer's run record,
so an answer can be explained later. A rule set that does not parse, or a
pattern that does not compile, fails loudly when it is loaded.

Patterns run on the ``regex`` engine (the syntax of Python's ``re``), which can stop a
match: a pattern is refused at load when it takes over :data:`PROBE_SECONDS` on one of
a few short probes (catastrophic backtracking, such as ``(a|aa)+$``), and a rule that
still runs over :data:`RULE_SECONDS` on a text replaces the whole text (fails closed:
nothing unredacted reaches a model).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..core.config import Settings
from ..core.observability import logger

if TYPE_CHECKING:
    import regex

#: Seconds a rule set read from SSM is cached (a changed set is picked up within this).
RULES_MAX_AGE_SECONDS = 300

#: The longest one rule may run on one text before the text is replaced whole.
RULE_SECONDS = 0.1
#: The longest a pattern may run on a probe at load before it is refused.
PROBE_SECONDS = 0.05
#: Short texts that make a backtracking pattern explode: runs of one kind of character
#: with a character at the end that fails the match.
PROBES = tuple(
    run * (40 // len(run)) + end for run in ("a", "1", " ", "a ", "a1", "-.") for end in ("!", "\n")
)


class RedactionRule(BaseModel):
    """One pattern and what replaces its matches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    pattern: str = Field(min_length=1)
    replacement: str = "[redacted]"

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        # Imported here: only a deployment with rules pays for the engine.
        import regex

        try:
            compiled = regex.compile(value)
        except regex.error as exc:
            raise ValueError(f"pattern does not compile: {exc}") from None
        for probe in PROBES:
            try:
                compiled.sub("", probe, timeout=PROBE_SECONDS)
            except TimeoutError:
                raise ValueError(
                    f"pattern backtracks catastrophically: over {PROBE_SECONDS} s on "
                    f"{len(probe)} characters"
                ) from None
        return value


class Redactor(BaseModel):
    """A versioned rule set; :meth:`text` and :meth:`value` apply it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(min_length=1)
    rules: list[RedactionRule] = Field(default_factory=list)

    @cached_property
    def _compiled(self) -> list[tuple[regex.Pattern[str], RedactionRule]]:
        import regex

        return [(regex.compile(rule.pattern), rule) for rule in self.rules]

    def text(self, text: str) -> str:
        """``text`` with every rule applied, in order; a rule that runs over
        :data:`RULE_SECONDS` on it makes the whole text its replacement."""
        for pattern, rule in self._compiled:
            try:
                text = pattern.sub(rule.replacement, text, timeout=RULE_SECONDS)
            except TimeoutError:
                # The text's content stays out of the log: only its size and the rule.
                logger.warning(
                    "redaction rule timed out: the whole text is replaced",
                    extra={"rule": rule.name, "version": self.version, "chars": len(text)},
                )
                return rule.replacement
        return text

    def value(self, value: Any) -> Any:
        """A JSON value with every string in it (keys excepted) redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        return value

    @classmethod
    def parse(cls, raw: str | bytes, source: str) -> Redactor:
        """The rule set in ``raw`` (JSON).

        Raises:
            ValueError: it is not a valid rule set; the message names ``source``.
        """
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise ValueError(f"redaction rules in {source} are invalid: {exc}") from None


def load_redactor(settings: Settings) -> Redactor | None:
    """The deployment's rule set: ``REDACTION_FILE``, else ``REDACTION_PARAMETER`` (SSM,
    through Powertools Parameters, cached), else ``None`` (no redaction).

    Raises:
        ValueError: the rule set is invalid.
    """
    if settings.redaction_file:
        with open(settings.redaction_file, "rb") as handle:
            return Redactor.parse(handle.read(), settings.redaction_file)
    if settings.redaction_parameter:
        from aws_lambda_powertools.utilities import parameters

        raw = parameters.get_parameter(settings.redaction_parameter, max_age=RULES_MAX_AGE_SECONDS)
        return Redactor.parse(raw, settings.redaction_parameter)
    return None
