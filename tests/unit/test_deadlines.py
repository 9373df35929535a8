"""The template's timeouts fit: a request that waits for its model and its tool to the
limits the deployment sets still answers before the function's own timeout.

For the functions that call the model and run tools (turns and approvals), with the
settings they get from ``template.yaml`` (parameters at their defaults, the code's
defaults for what the template leaves unset)::

    provider timeout x (retries + 1) + backoff between attempts + tool timeout + margin
        <= function Timeout

The margin covers the storage calls and a cold start. Turns that take several tool
steps are bounded by the remaining-time deadline, not by this sum.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from turnledger.core.config import Settings
from turnledger.providers.openai_http import OpenAIStyleProvider
from turnledger_local.template import functions, load_template

#: Seconds kept for loading and committing the conversation, and a cold start.
MARGIN_SECONDS = 3
#: The longest wait between two provider attempts (a server's ``Retry-After`` is capped too).
MAX_BACKOFF_SECONDS: float = (
    inspect.signature(OpenAIStyleProvider.__init__).parameters["max_backoff_seconds"].default
)


def _resolve(value: Any, parameters: dict[str, Any]) -> str:
    if isinstance(value, dict) and "Ref" in value:
        return str(parameters[value["Ref"]].get("Default", ""))
    assert isinstance(value, str | int | float), f"unexpected setting {value!r}"
    return str(value)


def _environment(template: dict[str, Any], function: str) -> dict[str, str]:
    """The function's environment as deployed with the parameters' defaults."""
    parameters = template.get("Parameters", {})
    variables = {
        **template["Globals"]["Function"].get("Environment", {}).get("Variables", {}),
        **template["Resources"][function]["Properties"].get("Environment", {}).get("Variables", {}),
    }
    # Resources' names and other intrinsics are not timeouts: left out.
    return {
        name: _resolve(value, parameters)
        for name, value in variables.items()
        if not isinstance(value, dict) or value.get("Ref") in parameters
    }


@pytest.mark.parametrize("function", ["TurnFunction", "ApproveFunction"])
def test_a_model_call_with_its_retries_and_a_tool_fit_in_the_function_timeout(
    function: str,
) -> None:
    template = load_template()
    settings = Settings.from_env(_environment(template, function))
    timeout = functions(template)[function].timeout_seconds
    attempts = settings.provider_max_retries + 1
    worst = (
        settings.provider_timeout_seconds * attempts
        + MAX_BACKOFF_SECONDS * settings.provider_max_retries
        + settings.tool_timeout_seconds
        + MARGIN_SECONDS
    )
    assert worst <= timeout, (
        f"{function}: {settings.provider_timeout_seconds} s x {attempts} attempts"
        f" + {MAX_BACKOFF_SECONDS} s x {settings.provider_max_retries} backoffs"
        f" + tool {settings.tool_timeout_seconds} s + margin {MARGIN_SECONDS} s"
        f" = {worst} s > Timeout {timeout} s"
    )
