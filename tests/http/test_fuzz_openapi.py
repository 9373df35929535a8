"""Fuzz every route of the served OpenAPI document through the local runner (schemathesis).

Whatever the generated request (valid, boundary or malformed ids, bodies and
queries), the API must answer in its error shape, never with a server error,
and pass every schemathesis check: statuses, content types, headers and
bodies conform to the document, invalid data is rejected, valid data is
accepted, and requests without credentials are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.specs.openapi.checks import positive_data_acceptance
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN

#: 422 codes of requests that fit the schema but not the conversation's state, the
#: tool registry or the deployment's allowed providers and models (API.md's error table):
#: schema-valid data may get them, never ``validation_error``.
SEMANTIC_422 = {
    "unknown_tool_call",
    "unknown_tool",
    "unknown_provider",
    "unknown_model",
    "idempotency_key_reused",
    "unknown_data_class",
    "data_policy_unsatisfied",
    "pin_budget_exceeded",
}


def cross_field_rule(error: dict[str, Any]) -> bool:
    """A 422 of a rule JSON Schema cannot state (a call id in both ``approve`` and
    ``reject``): raised by a model validator, so located at the whole body."""
    errors = error["details"].get("errors") or []
    return bool(errors) and all(e["loc"] == ["body"] and e["type"] == "value_error" for e in errors)


def pattern_rule(error: dict[str, Any]) -> bool:
    """A 422 of a pattern that does not compile (a data policy's detector): any string
    fits the schema; only the regular expression engine can tell."""
    errors = error["details"].get("errors") or []
    return bool(errors) and all(
        e["loc"][-1] == "pattern" and "pattern does not compile" in e["msg"] for e in errors
    )


def positive_data_acceptance_but_state(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' ``positive_data_acceptance``, except for the contract's state errors
    and rules across fields that the schema cannot state."""
    # A callback token fits the schema as any string; only its signature makes it valid.
    if (
        response.status_code == 410
        and json.loads(response.content)["error"]["code"] == "callback_invalid"
    ):
        return None
    if response.status_code == 422:
        error = json.loads(response.content)["error"]
        if error["code"] in SEMANTIC_422 or (
            error["code"] == "validation_error" and (cross_field_rule(error) or pattern_rule(error))
        ):
            return None
        if error["code"] == "validation_error" and "line" in error.get("details", {}):
            return None  # an import's NDJSON lines: rules of the export format, not the schema
    if (
        response.status_code == 400
        and json.loads(response.content)["error"]["code"] == "invalid_cursor"
    ):
        return None  # an opaque cursor the API never handed out: no schema can say which
    result: bool | None = positive_data_acceptance(ctx, response, case)
    return result


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(LocalConfig(port=0, table="fuzz", bucket="fuzz", max_workers=2)) as served:
        yield served


def test_no_request_makes_a_server_error(runner: LocalRunner) -> None:
    """Every answer is below 500 and, when it is an error, has the contract's shape.

    Hypothesis drives each operation's strategy directly (schemathesis' pytest
    plugin does not support this pytest yet).
    """
    schema = schemathesis.openapi.from_url(f"{runner.url}/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    load_all_checks()
    checks = [check for check in CHECKS.get_all() if check is not positive_data_acceptance]
    checks.append(positive_data_acceptance_but_state)
    assert len(checks) >= 10

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(case: Any) -> None:
            response = case.call(base_url=runner.url, headers=ANN)
            case.validate_response(response, checks=checks, headers=ANN)
            if response.status_code >= 400:
                body = json.loads(response.content)
                assert set(body) == {"error"}, (case.method, case.path, body)
                assert {"code", "message", "details"} <= set(body["error"])

        check()
