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
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..core.config import Settings

#: Seconds a rule set read from SSM is cached (a changed set is picked up within this).
RULES_MAX_AGE_SECONDS = 300


class RedactionRule(BaseModel):
    """One pattern and what replaces its matches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    pattern: str = Field(min_length=1)
    replacement: str = "[redacted]"

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"pattern does not compile: {exc}") from None
        return value


class Redactor(BaseModel):
    """A versioned rule set; :meth:`text` and :meth:`value` apply it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(min_length=1)
    rules: list[RedactionRule] = Field(default_factory=list)

    @cached_property
    def _compiled(self) -> list[tuple[re.Pattern[str], str]]:
        return [(re.compile(rule.pattern), rule.replacement) for rule in self.rules]

    def text(self, text: str) -> str:
        """``text`` with every rule applied, in order."""
        for pattern, replacement in self._compiled:
            text = pattern.sub(replacement, text)
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
