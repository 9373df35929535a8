"""The cold-start bench measures what Lambda would run: only what the layer holds.

The project venv also holds the tests' distributions (``click`` and ``rich`` among them,
which ``import httpx`` loads when it finds them); the bench's fresh interpreters must not
see them, or every handler's init pays for a command line that Lambda never loads.
"""

from __future__ import annotations

import pytest

from bench.coldstart import (
    ProbeFailed,
    lambda_environment,
    layer_distributions,
    not_in_layer,
    probe,
)


def test_the_layer_holds_its_requirements_and_what_they_require() -> None:
    layer = layer_distributions()
    # Named in requirements.txt; required by boto3; the [tracer] extra of Powertools.
    assert {"boto3", "httpx", "botocore", "s3transfer", "aws-xray-sdk"} <= layer
    assert not {"click", "rich", "moto", "pytest"} & layer


def test_what_the_layer_does_not_hold_is_not_importable_in_a_probe() -> None:
    assert {"click", "rich", "moto"} <= set(not_in_layer())
    env = lambda_environment(None)
    spent, _ = probe(["import httpx, sys\nassert sys.modules.get('httpx._main') is None"], env)
    assert len(spent) == 1
    with pytest.raises(ProbeFailed, match="click"):
        probe(["import click"], env)
