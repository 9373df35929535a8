"""``turnledger quota``: the account concurrency quota a deployment's parameters need::

    turnledger quota ReservedConcurrency=on TurnReservedConcurrency=60

Arguments are ``sam deploy --parameter-overrides``' ``Name=Value`` pairs; the template's
defaults fill the rest. Lambda refuses a reservation that would leave fewer than 100 of
the account's concurrent executions unreserved, so a stack whose functions reserve *R*
needs a quota of at least *R* + 100 (new accounts start far lower: Service Quotas,
"Concurrent executions"). With ``ReservedConcurrency=off`` (the default) nothing is
reserved and any quota deploys.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .template import (
    NO_VALUE,
    TEMPLATE_PATH,
    ParameterError,
    function_property,
    functions,
    load_template,
    parameter_values,
)

#: What Lambda keeps unreserved in every account that reserves any concurrency.
UNRESERVED_MINIMUM = 100


@dataclass(frozen=True)
class Quota:
    """What a configuration reserves, by function, and the quota it needs."""

    reserved: dict[str, int]

    @property
    def total(self) -> int:
        """Concurrent executions reserved by the stack's functions together."""
        return sum(self.reserved.values())

    @property
    def minimum_account_quota(self) -> int:
        """The least account concurrency quota the stack deploys in (0: any)."""
        return self.total + UNRESERVED_MINIMUM if self.total else 0


def quota(template: dict[str, Any], overrides: dict[str, str]) -> Quota:
    """What ``template`` reserves with parameter ``overrides`` (:class:`ParameterError`
    for a value CloudFormation would refuse)."""
    values = parameter_values(template, overrides)
    reserved: dict[str, int] = {}
    for name in functions(template):
        value = function_property(template, name, "ReservedConcurrentExecutions", values)
        if value is NO_VALUE:
            continue
        try:
            reserved[name] = int(value)
        except (TypeError, ValueError):
            raise ParameterError(f"{name} reserves {value!r}, not a number") from None
    return Quota(reserved=reserved)


def render(found: Quota) -> str:
    """The report ``turnledger quota`` prints."""
    if not found.reserved:
        return (
            "no function reserves concurrency (ReservedConcurrency=off)\n"
            "minimum account quota: 0 (any quota deploys; the functions share the account's)\n"
        )
    width = max(len(name) for name in found.reserved)
    lines = [f"{name:<{width}}  {count:>5}" for name, count in sorted(found.reserved.items())]
    lines.append(f"{'reserved':<{width}}  {found.total:>5}")
    lines.append(
        f"minimum account quota: {found.minimum_account_quota} ({found.total} reserved + the "
        f"{UNRESERVED_MINIMUM} Lambda keeps unreserved)"
    )
    return "\n".join(lines) + "\n"


def _override(raw: str) -> tuple[str, str]:
    name, equals, value = raw.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"not Name=Value: {raw!r}")
    return name, value


def add_command(commands: Any) -> None:
    """Add the ``quota`` sub-command to ``commands`` (argparse subparsers)."""
    summary = "print the account concurrency quota a deployment's parameters need"
    command = commands.add_parser("quota", help=summary, description=summary)
    command.add_argument(
        "overrides",
        nargs="*",
        type=_override,
        metavar="Name=Value",
        help="template parameters, as sam deploy --parameter-overrides takes them",
    )
    command.add_argument(
        "--template", type=Path, default=TEMPLATE_PATH, help="the SAM template (%(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``turnledger quota``; returns the exit status."""
    from .store_cli import fail

    try:
        found = quota(load_template(args.template), dict(args.overrides))
    except ParameterError as exc:
        return fail("quota", "invalid_parameter", str(exc), 2)
    print(render(found), end="")
    return 0
