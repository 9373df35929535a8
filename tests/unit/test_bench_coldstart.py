"""The cold-start bench measures what Lambda would run: only what the layer holds.

The project venv also holds the tests' distributions (``rich`` among them, which ``import
httpx`` loads with ``click`` when it finds both; ``click`` is in the layer since the ``mcp``
package's server side requires it); the bench's fresh interpreters must not see them, or
every handler's init pays for a command line that Lambda never loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.coldstart import (
    ProbeFailed,
    Timing,
    handlers,
    lambda_environment,
    layer_distributions,
    not_in_layer,
    paired_ratio,
    probe,
    stdlib_bytecode,
    traced,
    uncompiled,
)


def test_the_layer_holds_its_requirements_and_what_they_require() -> None:
    layer = layer_distributions()
    # Named in requirements.txt; required by boto3; the [tracer] extra of Powertools.
    assert {"boto3", "httpx", "botocore", "s3transfer", "aws-xray-sdk"} <= layer
    assert not {"rich", "moto", "pytest"} & layer


def test_what_the_layer_does_not_hold_is_not_importable_in_a_probe() -> None:
    assert {"rich", "moto"} <= set(not_in_layer())
    env = lambda_environment(None)
    spent, _ = probe(["import httpx, sys\nassert sys.modules.get('httpx._main') is None"], env)
    assert len(spent) == 1
    with pytest.raises(ProbeFailed, match="rich"):
        probe(["import rich"], env)


def test_the_bench_measures_the_templates_default_tracing() -> None:
    """At the template's default (``Tracing=Invocations``) no function creates the X-Ray SDK;
    the bench's ``Tracing=Calls`` variant does."""
    found = handlers()
    for handler in found.values():
        assert handler.environment["POWERTOOLS_TRACE_DISABLED"] == "true"
    assert traced(found["read"]).environment["POWERTOOLS_TRACE_DISABLED"] == "false"


def test_the_paired_ratio_divides_each_sample_by_the_minimal_handlers_before_it() -> None:
    """A round slowed by load slows both of its pair: the paired ratio stays put where the
    ratio of the medians would not."""
    timing = Timing(
        "read",
        import_ms=[190.0, 380.0, 950.0],
        first_ms=[10.0, 20.0, 50.0],
        paired_ms=[100.0, 400.0, 500.0],
    )
    assert paired_ratio(timing) == 2.0  # 200/100, 400/400, 1000/500
    assert paired_ratio(Timing("read", import_ms=[1.0], first_ms=[1.0])) is None


def test_the_turn_handler_answers_its_sample_on_the_benchs_backend() -> None:
    """The bench's backend holds every resource the template's default configuration
    reads: with content sealed (``KEYS_TABLE_NAME``, ``CONTENT_KMS_KEY_ID``), a turn
    reads and writes its keys, so the keys table and the KMS key must exist there."""
    from contextlib import ExitStack

    from bench.coldstart import _backend, _handler_steps, handler_environment

    turn = handlers()["turn"]
    with ExitStack() as stack:
        backend, _ = _backend(stack)
        spent, _ = probe(_handler_steps(turn, -3)[:2], handler_environment(turn, backend))
    assert len(spent) == 2


def test_both_minimal_handlers_answer_their_sample_on_the_benchs_backend() -> None:
    """The minimal handler and its validated twin (``bench/minimal/validated.py``) each
    answer the read sample (a missing conversation: 404); only the twin loads pydantic."""
    from contextlib import ExitStack

    from bench.coldstart import (
        _backend,
        _handler_steps,
        handler_environment,
        minimal_handler,
        validated_minimal,
    )

    with ExitStack() as stack:
        backend, _ = _backend(stack)
        for handler, validates in ((minimal_handler(), False), (validated_minimal(), True)):
            init, first, _ = _handler_steps(handler, -4)
            check = (
                "assert answer['statusCode'] == 404, answer\n"
                f"assert ('pydantic' in sys.modules) is {validates}"
            )
            spent, _ = probe([init, f"{first}\n{check}"], handler_environment(handler, backend))
            assert len(spent) == 2


def test_the_no_bytecode_variant_compiles_the_layer_and_keeps_the_stdlibs(
    tmp_path: Path,
) -> None:
    # What the variant stands for: the layer's modules compiled at import, nothing written,
    # the standard library's bytecode read as Lambda's runtime reads it.
    variant = uncompiled(handlers()["read"], stdlib_bytecode(tmp_path / "stdlib"))
    assert variant.label == "read, no bytecode"
    check = (
        "import importlib.util, json, os, sys\n"
        "import turnledger.core.config as layer, json.decoder as std\n"
        "cached = lambda m: os.path.exists(importlib.util.cache_from_source(m.__file__))\n"
        "print(json.dumps([sys.dont_write_bytecode, cached(layer), cached(std)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        env=lambda_environment(variant),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [True, False, True]
