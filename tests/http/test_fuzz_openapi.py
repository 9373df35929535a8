"""Fuzz every route of the served OpenAPI document through the local runner (schemathesis).

Whatever the generated request (valid, boundary or malformed ids, bodies and
queries), the API must answer in its error shape and never with a server error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from turnledger.local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(LocalConfig(port=0, table="fuzz", bucket="fuzz")) as served:
        yield served


def test_no_request_makes_a_server_error(runner: LocalRunner) -> None:
    """Every answer is below 500 and, when it is an error, has the contract's shape.

    Hypothesis drives each operation's strategy directly (schemathesis' pytest
    plugin does not support this pytest yet).
    """
    schema = schemathesis.openapi.from_url(f"{runner.url}/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6

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
            case.validate_response(response, checks=[not_a_server_error])
            if response.status_code >= 400:
                body = json.loads(response.content)
                assert set(body) == {"error"}, (case.method, case.path, body)
                assert {"code", "message", "details"} <= set(body["error"])

        check()
