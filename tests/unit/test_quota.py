"""``turnledger quota`` (turnledger_local/quota.py): the account concurrency quota a
deployment's parameters need, read from ``template.yaml`` (issue 47, point 2)."""

from __future__ import annotations

import pytest
from turnledger_local.cli import main
from turnledger_local.quota import UNRESERVED_MINIMUM, quota
from turnledger_local.template import ParameterError, load_template

#: Every reservation parameter at its MinValue.
SMALLEST = {
    f"{function}ReservedConcurrency": "1"
    for function in ("Turn", "Approve", "Read", "Clear", "TurnWorker", "Sweep", "Stream")
}


def test_with_reservations_off_nothing_is_reserved_and_any_quota_deploys() -> None:
    found = quota(load_template(), {})
    assert found.reserved == {}
    assert found.minimum_account_quota == 0


def test_with_reservations_on_the_defaults_need_220() -> None:
    found = quota(load_template(), {"ReservedConcurrency": "on"})
    assert found.reserved == {
        "TurnFunction": 40,
        "ApproveFunction": 20,
        "ReadFunction": 20,
        "ClearFunction": 5,
        "TurnWorkerFunction": 20,
        "SweepFunction": 5,
        "StreamFunction": 10,
    }
    assert found.minimum_account_quota == 120 + UNRESERVED_MINIMUM


def test_the_smallest_reservations_still_need_the_unreserved_hundred() -> None:
    found = quota(load_template(), {"ReservedConcurrency": "on", **SMALLEST})
    assert found.total == 7
    assert found.minimum_account_quota == 107


def test_the_command_prints_the_quota(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quota", "ReservedConcurrency=on", "TurnReservedConcurrency=60"]) == 0
    out = capsys.readouterr().out
    assert "TurnFunction" in out and "60" in out
    assert out.splitlines()[-1].startswith("minimum account quota: 240 ")
    assert main(["quota"]) == 0
    assert "minimum account quota: 0 " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ReservedConcurrency=yes", "is not one of"),
        ("TurnReservedConcurrency=0", "below its MinValue"),
        ("TurnReservedConcurrency=many", "is not a number"),
        ("NoSuchParameter=1", "has no parameter"),
    ],
)
def test_a_value_cloudformation_would_refuse_is_a_clear_error(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quota", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnledger quota: invalid_parameter: ") and message in err


def test_an_argument_that_is_not_a_pair_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["quota", "ReservedConcurrency"])
    assert exited.value.code == 2
    assert "not Name=Value" in capsys.readouterr().err


def test_the_parameter_checks_are_cloudformations() -> None:
    with pytest.raises(ParameterError, match="does not match"):
        quota(load_template(), {"ToolsParameterName": "no-leading-slash"})
