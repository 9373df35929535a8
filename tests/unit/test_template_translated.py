"""``template.yaml`` after the SAM transform (``tests/support/sam.py``): what CloudFormation
deploys, which neither ``sam validate --lint`` nor checkov looks at (issue 47).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from turnledger_local.template import NO_VALUE, parameter_values, resolve

from tests.support.sam import (
    REQUIRED_PARAMETERS,
    of_type,
    packaged,
    published_versions,
    translate,
)

#: The functions whose routes call alias ``live`` (tests/unit/test_template_snapstart.py).
ALIASED_FUNCTIONS = {"TurnFunction", "ApproveFunction", "ReadFunction", "ClearFunction"}
LAYER = "TurnledgerLayer"


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    return translate()


def test_every_function_behind_an_alias_is_found(translated: dict[str, Any]) -> None:
    assert set(published_versions(translated)) == ALIASED_FUNCTIONS


def test_a_release_that_changes_only_the_layer_publishes_every_aliased_function_again() -> None:
    """Issue 47, point 1: the functions' own code is a stub that never changes; a new layer
    must still give each alias a new version, or the API keeps the old library."""
    before = published_versions(translate(packaged(content_keys={LAYER: "layer-0a1b2c"})))
    after = published_versions(translate(packaged(content_keys={LAYER: "layer-9f8e7d"})))
    assert set(before) == set(after) == ALIASED_FUNCTIONS
    unchanged = {name for name in ALIASED_FUNCTIONS if before[name] == after[name]}
    assert not unchanged, f"{sorted(unchanged)} keep their version: {before} -> {after}"


def test_a_release_that_changes_nothing_publishes_nothing() -> None:
    """The other side: the version follows the content, not the deploy (no new snapshot,
    no alias move, when nothing changed)."""
    keys = {LAYER: "layer-0a1b2c"}
    assert published_versions(translate(packaged(content_keys=keys))) == published_versions(
        translate(packaged(content_keys=keys))
    )


#: AWS's Lambda Web Adapter, which only the streaming function runs (docs/DEPLOY.md).
WEB_ADAPTER = "753240598075:layer:LambdaAdapterLayerArm64:"


def test_the_layer_is_the_one_every_function_runs(translated: dict[str, Any]) -> None:
    (layer,) = of_type(translated, "AWS::Lambda::LayerVersion")
    for name, function in of_type(translated, "AWS::Lambda::Function").items():
        # Ours first, then the ADOT layer (only with Observability on); the streaming
        # function also runs the Lambda Web Adapter.
        ours, telemetry, *others = function["Properties"]["Layers"]
        assert ours == {"Ref": layer}, name
        assert telemetry["Fn::If"][0] == "TelemetryOn", name
        if name.startswith("StreamFunction"):
            (adapter,) = others
            assert WEB_ADAPTER in json.dumps(adapter), name
        else:
            assert others == [], name


def _alarms_on(translated: dict[str, Any], queue: str) -> list[dict[str, Any]]:
    """The alarms on a metric of the queue ``queue`` (its ``QueueName`` dimension)."""
    names = ({"Fn::GetAtt": [queue, "QueueName"]}, {"Fn::GetAtt": f"{queue}.QueueName"})
    return [
        alarm["Properties"]
        for alarm in of_type(translated, "AWS::CloudWatch::Alarm").values()
        if any(
            dimension == {"Name": "QueueName", "Value": name}
            for dimension in alarm["Properties"].get("Dimensions", [])
            for name in names
        )
    ]


def test_a_message_in_the_sweeps_dead_letter_queue_raises_an_alarm(
    translated: dict[str, Any],
) -> None:
    """Issue 47, point 13: a failed TTL stream batch leaves a conversation's events and
    objects behind, and its keys are readable from the stream for 24 hours only."""
    (alarm,) = _alarms_on(translated, "SweepDeadLetterQueue")
    assert alarm["Namespace"] == "AWS/SQS"
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 0)
    # Within the day: one evaluation of 5 minutes.
    assert alarm["EvaluationPeriods"] * alarm["Period"] <= 3600
    assert "OPERATIONS.md" in alarm["AlarmDescription"]


@pytest.mark.parametrize(
    ("topic", "actions"),
    [
        ("", NO_VALUE),
        ("arn:aws:sns:us-east-1:123456789012:ops", ["arn:aws:sns:us-east-1:123456789012:ops"]),
    ],
)
def test_the_alarm_notifies_the_topic_when_one_is_given(topic: str, actions: Any) -> None:
    translated = translate(parameters={"AlarmTopicArn": topic})
    (alarm,) = _alarms_on(translated, "SweepDeadLetterQueue")
    values = parameter_values(translated, {"AlarmTopicArn": topic, **REQUIRED_PARAMETERS})
    assert resolve(translated, alarm["AlarmActions"], values) == actions
