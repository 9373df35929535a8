"""SnapStart in ``template.yaml``: the API functions publish versions behind an alias that
their routes call, SnapStart applies to those versions, and a parameter turns it off.

``sam validate --lint`` checks the template's form; these tests check the choices, and
that no function combines SnapStart with what Lambda refuses beside it (provisioned
concurrency, EFS, more than 512 MB of ephemeral storage).
"""

from __future__ import annotations

from typing import Any

import pytest
from turnledger_local.template import load_template, routes

#: The functions behind the HTTP API: a caller waits for their cold start.
API_FUNCTIONS = ("TurnFunction", "ApproveFunction", "ReadFunction", "ClearFunction")
ALIAS = "live"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def _properties(template: dict[str, Any], name: str) -> dict[str, Any]:
    properties: dict[str, Any] = template["Resources"][name]["Properties"]
    return properties


@pytest.mark.parametrize("name", API_FUNCTIONS)
def test_an_api_function_publishes_versions_behind_an_alias(
    template: dict[str, Any], name: str
) -> None:
    assert _properties(template, name)["AutoPublishAlias"] == ALIAS


@pytest.mark.parametrize("name", API_FUNCTIONS)
def test_an_api_function_applies_snapstart_as_the_parameter_says(
    template: dict[str, Any], name: str
) -> None:
    assert _properties(template, name)["SnapStart"] == {
        "ApplyOn": {"Fn::If": ["SnapStarts", "PublishedVersions", "None"]}
    }


def test_the_parameter_turns_snapstart_on_where_offered_by_default(
    template: dict[str, Any],
) -> None:
    """Auto (the default) - where the Region offers it; PublishedVersions and None force it
    on and off (issue 47, point 11: tests/unit/test_template_first_deploy.py deploys it)."""
    parameter = template["Parameters"]["SnapStart"]
    assert parameter["Default"] == "Auto"
    assert set(parameter["AllowedValues"]) == {"Auto", "PublishedVersions", "None"}


def test_every_route_is_served_by_a_function_behind_the_alias(template: dict[str, Any]) -> None:
    # SAM points an HttpApi event of a function with AutoPublishAlias at the alias, so
    # every route reaches the published (snapshotted) version, never $LATEST.
    served = {route.function for route in routes(template)}
    assert served == set(API_FUNCTIONS)
    assert all(_properties(template, name).get("AutoPublishAlias") == ALIAS for name in served)


def test_no_function_combines_snapstart_with_what_lambda_refuses_beside_it(
    template: dict[str, Any],
) -> None:
    defaults = (template.get("Globals") or {}).get("Function") or {}
    snapstarted = [
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
        and "SnapStart" in {**defaults, **resource["Properties"]}
    ]
    # Only the API functions: the worker is invoked by name ($LATEST, never a snapshot)
    # and the sweep runs on a schedule, with nobody waiting.
    assert set(snapstarted) == set(API_FUNCTIONS)
    for name in snapstarted:
        properties = {**defaults, **_properties(template, name)}
        assert "ProvisionedConcurrencyConfig" not in properties, name
        assert "FileSystemConfigs" not in properties, name
        assert int((properties.get("EphemeralStorage") or {}).get("Size", 512)) <= 512, name
        # SnapStart applies to published versions only: an alias must publish them.
        assert properties.get("AutoPublishAlias"), name
