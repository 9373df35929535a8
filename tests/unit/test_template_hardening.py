"""What ``template.yaml`` holds against floods and scanners (issue 22, findings 5 and 7):
throttling on the HTTP API, reserved concurrency on every function, the callback
route's own limits."""

from __future__ import annotations

from typing import Any

import pytest
from turnledger.api.waits import CALLBACK_ROUTE
from turnledger.turn import callbacks
from turnledger_local.template import functions, load_template

#: The functions behind the HTTP API's routes.
API_FUNCTIONS = ("TurnFunction", "ApproveFunction", "ReadFunction", "ClearFunction")
#: What an account has unless raised, and what Lambda keeps unreserved in it.
ACCOUNT_CONCURRENCY, UNRESERVED_MINIMUM = 1000, 100


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def parameter_default(template: dict[str, Any], value: Any) -> int:
    """The number ``value`` is, or the default of the parameter it names."""
    if isinstance(value, dict):
        return int(template["Parameters"][value["Ref"]]["Default"])
    return int(value)


def test_every_api_function_reserves_concurrency_from_a_parameter(
    template: dict[str, Any],
) -> None:
    for name in API_FUNCTIONS:
        reserved = template["Resources"][name]["Properties"]["ReservedConcurrentExecutions"]
        assert set(reserved) == {"Ref"}, name
        parameter = template["Parameters"][reserved["Ref"]]
        assert parameter["Type"] == "Number" and parameter["MinValue"] >= 1, name


def test_reservations_leave_the_account_its_unreserved_share(template: dict[str, Any]) -> None:
    """Every function reserves some, and the defaults together fit a default account."""
    total = 0
    for name in functions(template):
        value = template["Resources"][name]["Properties"].get("ReservedConcurrentExecutions")
        assert value is not None, f"{name} reserves no concurrency"
        total += parameter_default(template, value)
    assert total <= ACCOUNT_CONCURRENCY - UNRESERVED_MINIMUM


def test_the_http_api_throttles_and_the_callback_route_more(template: dict[str, Any]) -> None:
    api = template["Resources"]["HttpApi"]["Properties"]
    default = api["DefaultRouteSettings"]
    rate = parameter_default(template, default["ThrottlingRateLimit"])
    burst = parameter_default(template, default["ThrottlingBurstLimit"])
    assert rate >= 1 and burst >= rate
    callback = api["RouteSettings"][CALLBACK_ROUTE]
    assert 1 <= parameter_default(template, callback["ThrottlingRateLimit"]) < rate
    assert 1 <= parameter_default(template, callback["ThrottlingBurstLimit"]) < burst


def test_the_callback_function_gets_the_callback_body_limit(template: dict[str, Any]) -> None:
    variables = template["Resources"]["ApproveFunction"]["Properties"]["Environment"]["Variables"]
    limit = parameter_default(template, variables["CALLBACK_MAX_INPUT_BYTES"])
    assert limit == callbacks.DEFAULT_MAX_INPUT_BYTES
