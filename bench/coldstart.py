"""Cold start: each Lambda handler's init and first request, against a minimal handler of
the same stack, in fresh interpreters.

Lambda imports the handler module once per execution environment (the init phase),
before the first request, and without SnapStart the caller waits for both. This
benchmark does the same in a fresh subprocess per sample (median of ``--runs``): the
handler's folder first on ``sys.path``, the environment the template gives the
function (parameters at their defaults, resources as placeholder names) plus what
the Lambda runtime sets, and only the modules the layer holds importable
(:func:`not_in_layer`). Then, in the same interpreter, the handler answers its first
request (its sample event from ``events/``) and a second one, against DynamoDB Local
(S3, STS and KMS on moto's server). Before each handler's sample, the same round samples
the minimal handler (``bench/minimal/app.py``: Powertools' HTTP resolver and one
``GetItem`` through a boto3 DynamoDB resource) the same way, so the two alternate.

The targets (issue 27): init + first request at most :data:`COLD_TARGET` times the
minimal handler's; the first request at most :data:`FIRST_TARGET` times a warm one.
For comparison it times a few heavy imports alone, and it lists the ten largest
cumulative imports of the turn handler's init and first request (``python -X
importtime``).

Writes the section ``## Cold start`` of ``bench/RESULTS.md``.
Run from the repository root: ``.venv/bin/python -m bench.coldstart``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path
from typing import Any

import boto3
from moto.server import ThreadedMotoServer
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from turnledger.api.functions import ROUTES
from turnledger_local.template import PROJECT_ROOT, functions, load_template

from bench.results import command_line, machine_line, publish
from tests.support.aws import (
    aws_clients,
    create_bucket,
    create_conversations_table,
    create_keys_table,
)
from tests.support.dynamodb_local import DynamoDBLocal, DynamoDBLocalError, find_jar, free_port

SECTION = "Cold start"
#: What ``sam build`` installs into the layer (``layers/turnledger/requirements.txt``).
LAYER_REQUIREMENTS = PROJECT_ROOT / "layers" / "turnledger" / "requirements.txt"
HANDLERS = ("turn", "read", "clear", "approve", "sweep")
REGION = "us-east-1"
#: Issue 27: a handler's init + first request at most this many times the minimal handler's.
COLD_TARGET = 1.5
#: Issue 27: a handler's first request at most this many times a warm one.
FIRST_TARGET = 2.0
#: The minimal handler's folder name (``bench/minimal``).
MINIMAL = "minimal"
#: Each handler's first and second request: its sample event from ``events/``.
SAMPLE_EVENTS = {
    "turn": "turn.json",
    "read": "get-conversation.json",
    "clear": "clear.json",
    "approve": "approve.json",
    "sweep": "sweep-schedule.json",
    MINIMAL: "get-conversation.json",
}

#: Runs in the fresh interpreter: executes each step (Python source given as an
#: argument) in one namespace and prints the milliseconds of each as JSON. Nothing
#: is imported before the first step that the steps could need (``json`` comes after).
_PROBE = """
import os, sys, time
for name in os.environ.get("BENCH_NOT_IN_LAYER", "").split(","):
    if name and name not in sys.modules:
        sys.modules[name] = None  # ImportError, as in the layer, which does not hold it
sys.stderr.write("### steps begin\\n")
spent = []
scope = {"sys": sys}
for step in sys.argv[1:]:
    started = time.perf_counter()
    try:
        exec(step, scope)
    except BaseException as exc:
        sys.stderr.write(f"### failed: {type(exc).__name__}: {exc}\\n")
        raise SystemExit(3)
    spent.append((time.perf_counter() - started) * 1000)
    sys.stderr.write("### step done\\n")
import json
print(json.dumps(spent))
"""

#: Top-level modules the layer provides itself (not a distribution installed in the venv).
_LAYER_PACKAGES = frozenset({"turnledger"})


def layer_distributions(requirements: Path = LAYER_REQUIREMENTS) -> frozenset[str]:
    """The distributions ``sam build`` installs into the layer from ``requirements``: each
    requirement with its extras, and what they require in turn (by the installed versions'
    metadata), as canonical names."""
    found: set[str] = set()
    todo = [
        Requirement(line)
        for line in requirements.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        try:
            requires = distribution(requirement.name).requires or []
        except PackageNotFoundError:
            continue
        extras = requirement.extras or {""}
        for line in requires:
            needed = Requirement(line)
            if needed.marker is None or any(
                needed.marker.evaluate({"extra": extra}) for extra in extras
            ):
                todo.append(needed)
    return frozenset(found)


@cache
def _not_in_layer() -> tuple[str, ...]:
    return not_in_layer()


def not_in_layer() -> tuple[str, ...]:
    """Top-level modules installed in this venv by distributions the layer does not hold
    (``click`` and ``rich``, which schemathesis needs, for one): the probes make them
    unimportable, so an optional import (httpx loads its command line when ``click`` is
    there) costs here what it costs on Lambda."""
    layer = layer_distributions()
    return tuple(
        sorted(
            module
            for module, owners in packages_distributions().items()
            if module.isidentifier()
            and module not in _LAYER_PACKAGES
            and not any(canonicalize_name(owner) in layer for owner in owners)
        )
    )


#: Imports timed alone, for comparison with the handlers.
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("`import boto3`", "import boto3"),
    (
        "`boto3` DynamoDB + S3 clients (import and create)",
        "import boto3\nsession = boto3.session.Session()\n"
        "session.client('dynamodb')\nsession.client('s3')",
    ),
    (
        "botocore DynamoDB + S3 clients (import and create; no boto3, botocore's own loader)",
        "import botocore.session\nsession = botocore.session.Session()\n"
        "session.create_client('dynamodb')\nsession.create_client('s3')",
    ),
    (
        "the layer's DynamoDB + S3 clients (import and create: `turnledger.core.aws`, its "
        "`ModelLoader`)",
        "from turnledger.core.aws import AwsSession\nsession = AwsSession()\n"
        "session.client('dynamodb')\nsession.client('s3')",
    ),
    (
        "Powertools `Tracer()` (import and create; X-Ray SDK, patches boto3 and httpx)",
        "from aws_lambda_powertools import Tracer\nTracer()",
    ),
    (
        "Powertools idempotency (`aws_lambda_powertools.utilities.idempotency`)",
        "import aws_lambda_powertools.utilities.idempotency",
    ),
    ("`import pydantic`", "import pydantic"),
)


class ProbeFailed(RuntimeError):
    """A step raised in the subprocess (the handler is not importable yet, for one)."""


@dataclass(frozen=True)
class Handler:
    """One function of the template: where its code is and what Lambda imports."""

    name: str
    logical_id: str
    folder: Path
    module: str
    environment: dict[str, str]
    #: The name in the tables (``name`` when empty).
    label: str = ""


def _default(name: str, parameters: Mapping[str, Any]) -> str:
    default = parameters[name].get("Default", "")
    return ",".join(map(str, default)) if isinstance(default, list) else str(default)


def _holds(condition: Any, template: Mapping[str, Any]) -> bool | None:
    """A template condition with every parameter at its default (``None``: one this bench
    cannot evaluate, such as a ``Fn::Join``)."""
    parameters = template.get("Parameters", {})
    if isinstance(condition, str):
        return _holds((template.get("Conditions") or {}).get(condition), template)
    if not isinstance(condition, dict) or len(condition) != 1:
        return None
    ((function, arguments),) = condition.items()
    if function == "Condition":
        return _holds(str(arguments), template)
    if function == "Fn::Not":
        inner = _holds(arguments[0], template)
        return None if inner is None else not inner
    if function in {"Fn::And", "Fn::Or"}:
        found = [_holds(argument, template) for argument in arguments]
        if None in found:
            return None
        return all(found) if function == "Fn::And" else any(found)
    if function == "Fn::Equals":
        sides = [
            _default(str(side["Ref"]), parameters)
            if isinstance(side, dict) and set(side) == {"Ref"} and side["Ref"] in parameters
            else side
            for side in arguments
        ]
        return None if any(isinstance(side, dict) for side in sides) else sides[0] == sides[1]
    return None


#: What :func:`resolve` gives for ``AWS::NoValue``: the variable is left out.
NO_VALUE = "\x00no value"


def resolve(value: Any, template: Mapping[str, Any], stack: str) -> str:
    """A template environment value as a string: ``Ref`` to a parameter is its default, and
    ``Fn::If`` the branch its condition takes at the parameters' defaults."""
    parameters = template.get("Parameters", {})
    if isinstance(value, dict) and set(value) == {"Ref"}:
        name = str(value["Ref"])
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in parameters:
            return _default(name, parameters)
        return f"{stack}-{name}"  # a resource: a placeholder physical name
    if isinstance(value, dict) and set(value) == {"Fn::If"}:
        condition, when_true, when_false = value["Fn::If"]
        holds = _holds(str(condition), template)
        if holds is not None:
            return resolve(when_true if holds else when_false, template, stack)
    if isinstance(value, dict):
        return f"{stack}-unresolved"  # another intrinsic; no function reads these at import
    return str(value)


def handlers(stack: str = "bench", template: dict[str, Any] | None = None) -> dict[str, Handler]:
    """Every function of ``template`` (``template.yaml``'s when ``None``) by its folder name,
    with its Lambda environment at the parameters' defaults."""
    template = load_template() if template is None else template
    shared = ((template.get("Globals") or {}).get("Function") or {}).get("Environment") or {}
    found: dict[str, Handler] = {}
    for logical_id, spec in functions(template).items():
        props = template["Resources"][logical_id]["Properties"]
        variables = {
            **shared.get("Variables", {}),
            **(props.get("Environment") or {}).get("Variables", {}),
        }
        environment = {
            k: resolved
            for k, v in variables.items()
            if (resolved := resolve(v, template, stack)) != NO_VALUE
        }
        folder = PROJECT_ROOT / spec.code_uri
        found[folder.name] = Handler(
            name=folder.name,
            logical_id=logical_id,
            folder=folder,
            module=spec.handler.rsplit(".", 1)[0],
            environment=environment,
        )
    return found


def minimal_handler() -> Handler:
    """The minimal handler of the same stack (``bench/minimal/app.py``); its table and
    endpoint come from the benchmark's backend."""
    return Handler(
        name=MINIMAL,
        logical_id="MinimalFunction",
        folder=PROJECT_ROOT / "bench" / MINIMAL,
        module="app",
        environment={},
    )


def validated_minimal() -> Handler:
    """The minimal handler with the resolver's validation on and a pydantic answer
    (``bench/minimal/validated.py``): what the stack the handlers share costs by itself.
    A comparison, sampled as a handler; the verdicts stay against :func:`minimal_handler`."""
    return replace(minimal_handler(), module="validated", label=f"{MINIMAL}, with validation")


def traced(handler: Handler) -> Handler:
    """``handler`` deployed with ``Tracing=Calls`` (``POWERTOOLS_TRACE_DISABLED=false``: the
    X-Ray SDK created at init, patching botocore and httpx): what the SDK costs."""
    return replace(
        handler,
        label=f"{handler.name}, Tracing=Calls",
        environment={**handler.environment, "POWERTOOLS_TRACE_DISABLED": "false"},
    )


def untenanted(handler: Handler) -> Handler:
    """``handler`` without ``TENANT_ROLE_ARN``: its requests on the process's own clients, so
    a first request assumes no role and builds no client (what a tenant's first costs)."""
    return replace(
        handler,
        label=f"{handler.name}, no tenant role",
        environment={k: v for k, v in handler.environment.items() if k != "TENANT_ROLE_ARN"},
    )


#: What ``stdlib_bytecode`` leaves out: other packages, and what no handler imports.
_NOT_STDLIB = r"/(site-packages|test|idlelib|tkinter|turtledemo)/"


def stdlib_bytecode(prefix: Path) -> Path:
    """The standard library's bytecode alone, compiled under ``prefix`` (a
    ``PYTHONPYCACHEPREFIX``): Lambda's runtime ships it, a layer built without bytecode
    does not."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", _NOT_STDLIB, str(stdlib)],
        env={**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)},
        capture_output=True,
        check=False,  # a test module that does not compile is no module a handler imports
    )
    return prefix


def uncompiled(handler: Handler, stdlib_cache: Path) -> Handler:
    """``handler`` on a layer without bytecode, as ``BuildMethod: python3.13`` built it: each
    module of the layer compiled at every cold start (Lambda's ``/opt`` is read-only, so
    nothing is kept), the standard library's bytecode there (``stdlib_bytecode``)."""
    return replace(
        handler,
        label=f"{handler.name}, no bytecode",
        environment={
            **handler.environment,
            "PYTHONPYCACHEPREFIX": str(stdlib_cache),
            "PYTHONDONTWRITEBYTECODE": "1",
        },
    )


def imported_modules(handler: Handler) -> tuple[str, ...]:
    """The modules the handler's source imports at its top level, and the route modules its
    ``serve("<function>")`` call registers (``turnledger.api.functions.ROUTES``), sorted."""
    tree = ast.parse((handler.folder / f"{handler.module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    for call in ast.walk(tree):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "serve"
            and call.args
            and isinstance(call.args[0], ast.Constant)
        ):
            found.update(f"turnledger.api.{m}" for m in ROUTES.get(str(call.args[0].value), ()))
    return tuple(sorted(found - {"__future__"}))


def twins(chosen: Sequence[Handler]) -> list[tuple[list[str], tuple[str, ...]]]:
    """Groups of two or more handlers whose sources import exactly the same modules."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for handler in chosen:
        groups.setdefault(imported_modules(handler), []).append(handler.name)
    return [(names, modules) for modules, names in groups.items() if len(names) > 1]


def lambda_environment(handler: Handler | None) -> dict[str, str]:
    """What a fresh Lambda execution environment holds (fake credentials, no config files)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        # Never read the machine's own AWS configuration.
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.13",
        "PYTHONUNBUFFERED": "1",
        # The layer's code of this checkout, where Lambda has /opt/python.
        "PYTHONPATH": str(PROJECT_ROOT / "layers" / "turnledger"),
        # Nor what the venv holds beyond the layer's dependencies.
        "BENCH_NOT_IN_LAYER": ",".join(_not_in_layer()),
    }
    if handler is not None:
        env.update(handler.environment)
        env["AWS_LAMBDA_FUNCTION_NAME"] = f"bench-{handler.logical_id}"
        env["LAMBDA_TASK_ROOT"] = str(handler.folder)
        env["_HANDLER"] = f"{handler.module}.lambda_handler"
    else:
        env["AWS_LAMBDA_FUNCTION_NAME"] = "bench-comparison"
    return env


def probe(
    steps: Sequence[str], env: Mapping[str, str], *, importtime: bool = False
) -> tuple[list[float], str]:
    """Run ``steps`` in a fresh interpreter; the milliseconds of each, and its stderr.

    Raises:
        ProbeFailed: a step raised (the message says which exception).
    """
    flags = ["-X", "importtime"] if importtime else []
    done = subprocess.run(
        [sys.executable, *flags, "-c", _PROBE, *steps],
        env=dict(env),
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        failure = [line for line in done.stderr.splitlines() if line.startswith("### failed")]
        reason = failure[-1].removeprefix("### failed: ") if failure else done.stderr[-500:]
        raise ProbeFailed(reason)
    # The handlers' own log lines (Powertools logs and metrics go to stdout) come first.
    return [float(x) for x in json.loads(done.stdout.splitlines()[-1])], done.stderr


#: A stand-in for Lambda's context object: what the handlers and Powertools read of it.
_CONTEXT = """
class _Context:
    function_name = "bench"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    memory_limit_in_mb = 512
    aws_request_id = "bench-request"
    log_group_name = "/aws/lambda/bench"
    log_stream_name = "bench"

    def get_remaining_time_in_millis(self):
        return 29_000
"""


def sample_event(handler: Handler, conversation_id: str) -> dict[str, Any]:
    """The handler's sample event from ``events/``, on ``conversation_id`` (API routes)."""
    event: dict[str, Any] = json.loads(
        (PROJECT_ROOT / "events" / SAMPLE_EVENTS[handler.name]).read_text(encoding="utf-8")
    )
    if "rawPath" not in event:
        return event  # the sweep's scheduled event
    old = str(event["pathParameters"]["id"])
    event["rawPath"] = str(event["rawPath"]).replace(f"/{old}", f"/{conversation_id}", 1)
    event["pathParameters"] = {"id": conversation_id}
    headers = dict(event.get("headers") or {})
    if "idempotency-key" in headers:
        headers["idempotency-key"] = f"{conversation_id}-key"
    event["headers"] = headers
    return event


def _request_step(event: dict[str, Any]) -> str:
    # A status of 500 or more (or an exception) fails the sample: it measured an error path.
    return (
        f"answer = app.lambda_handler({event!r}, _Context())\n"
        "if isinstance(answer, dict) and answer.get('statusCode', 200) >= 500:\n"
        "    raise RuntimeError(f'answered {answer}')"
    )


def _handler_steps(handler: Handler, sample: int = 0) -> list[str]:
    """Import the handler, then its first request, then a second one (same kind)."""
    return [
        f"sys.path.insert(0, {str(handler.folder)!r})\nimport {handler.module} as app",
        _CONTEXT + _request_step(sample_event(handler, f"bench-{handler.name}-{sample}-first")),
        _request_step(sample_event(handler, f"bench-{handler.name}-{sample}-second")),
    ]


def _restore_steps(handler: Handler, sample: int) -> list[str]:
    """Init, then SnapStart's hooks as Lambda runs them around a snapshot, then the first
    request and a second one: the part of a restored environment's start that Python runs."""
    init, first, warm = _handler_steps(handler, sample)
    return [
        f"{init}\nimport turnledger.runtime as _runtime\n_runtime.before_snapshot()",
        "_runtime.after_restore()",
        first,
        warm,
    ]


@dataclass
class Timing:
    """Milliseconds over fresh interpreters, or why it could not be measured."""

    label: str
    import_ms: list[float] = field(default_factory=list)
    #: The first request, and the second (warm) one, in the same interpreter.
    first_ms: list[float] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    #: The minimal handler's init + first request sampled right before each sample (same
    #: round), when both were measured.
    paired_ms: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def setup_ms(self) -> list[float]:
        """The first request's extra set-up, sample by sample: first minus second."""
        return [a - b for a, b in zip(self.first_ms, self.warm_ms, strict=True)]


#: The tenant role the API functions assume (on moto's STS) where the template gives one.
BENCH_TENANT_ROLE = "arn:aws:iam::123456789012:role/bench-tenant"


def handler_environment(handler: Handler, backend: Mapping[str, str]) -> dict[str, str]:
    """The Lambda environment of ``handler`` with the local table, bucket, keys and STS."""
    env = {**lambda_environment(handler), **backend}
    if "TENANT_ROLE_ARN" in handler.environment:
        # Deployed, a tenant's first request assumes its role: measured too, on moto's STS.
        env["TENANT_ROLE_ARN"] = BENCH_TENANT_ROLE
    return env


def _sample_handler(
    handler: Handler, timing: Timing, backend: Mapping[str, str], sample: int
) -> None:
    env = handler_environment(handler, backend)
    try:
        spent, _ = probe(_handler_steps(handler, sample), env)
    except ProbeFailed as exc:
        timing.error = str(exc)
        return
    timing.import_ms.append(spent[0])
    timing.first_ms.append(spent[1])
    timing.warm_ms.append(spent[2])


def _sample_restore(
    handler: Handler, timing: Timing, backend: Mapping[str, str], sample: int
) -> None:
    # What Lambda sets in a SnapStart function's environment (its init then runs ahead).
    env = {**handler_environment(handler, backend), "AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"}
    try:
        spent, _ = probe(_restore_steps(handler, sample), env)
    except ProbeFailed as exc:
        timing.error = str(exc)
        return
    # ``import_ms`` holds the after-restore hook here: what replaces the init.
    timing.import_ms.append(spent[1])
    timing.first_ms.append(spent[2])
    timing.warm_ms.append(spent[3])


def _sample_snippet(code: str, timing: Timing) -> None:
    try:
        spent, _ = probe([code], lambda_environment(None))
    except ProbeFailed as exc:
        timing.error = str(exc)
        return
    timing.import_ms.append(spent[0])


def measure(
    chosen: Sequence[Handler],
    comparisons: Sequence[tuple[str, str]],
    runs: int,
    backend: Mapping[str, str],
    restored: Sequence[Handler] = (),
) -> tuple[list[Timing], Timing, list[Timing], list[Timing]]:
    """Time every handler, the minimal handler, each of ``restored`` after SnapStart's hooks
    and the comparisons ``runs`` times, one fresh interpreter each.

    The minimal handler is sampled right before each handler's sample, so the two
    alternate; the rounds go over all of them in turn, so a burst of load on the
    machine spreads over every figure instead of skewing one.
    """
    handler_timings = [Timing(h.label or h.name) for h in chosen]
    minimal, minimal_timing = minimal_handler(), Timing(MINIMAL)
    snippet_timings = [Timing(label) for label, _ in comparisons]
    restore_timings = [Timing(h.name) for h in restored]
    sample = 0
    for round_number in range(runs):
        print(f"  round {round_number + 1}/{runs}", flush=True)
        for handler, timing in zip(chosen, handler_timings, strict=True):
            sample += 1
            if minimal_timing.error is None:
                _sample_handler(minimal, minimal_timing, backend, sample)
            if timing.error is None:
                _sample_handler(handler, timing, backend, sample)
            if timing.error is None and minimal_timing.error is None and minimal_timing.import_ms:
                timing.paired_ms.append(minimal_timing.import_ms[-1] + minimal_timing.first_ms[-1])
        for handler, timing in zip(restored, restore_timings, strict=True):
            if timing.error is None:
                sample += 1
                _sample_restore(handler, timing, backend, sample)
        for (_, code), timing in zip(comparisons, snippet_timings, strict=True):
            if timing.error is None:
                _sample_snippet(code, timing)
    return handler_timings, minimal_timing, snippet_timings, restore_timings


@dataclass(frozen=True)
class ImportLine:
    """One line of ``-X importtime``."""

    module: str
    depth: int
    self_us: int
    cumulative_us: int


def import_tree(handler: Handler, backend: Mapping[str, str]) -> list[ImportLine]:
    """The imports of the handler's import and first request, from ``python -X importtime``.

    Raises:
        ProbeFailed: the handler does not import or its first request fails.
    """
    env = handler_environment(handler, backend)
    _, stderr = probe(_handler_steps(handler, -1)[:2], env, importtime=True)
    lines = stderr.splitlines()
    begin = lines.index("### steps begin")
    end = len(lines) - 1 - lines[::-1].index("### step done")
    found = []
    for line in lines[begin + 1 : end]:
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        stripped = name.lstrip()
        found.append(
            ImportLine(
                module=stripped.strip(),
                depth=(len(name) - len(stripped) - 1) // 2,
                self_us=int(self_us),
                cumulative_us=int(cumulative_us),
            )
        )
    return found


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


def _range(values: Sequence[float]) -> str:
    return f"{min(values):.0f}..{max(values):.0f}" if values else "-"


def _cold_ms(timing: Timing) -> float:
    """The median of init + first request, sample by sample."""
    return statistics.median(a + b for a, b in zip(timing.import_ms, timing.first_ms, strict=True))


def paired_ratio(timing: Timing) -> float | None:
    """The median, over ``timing``'s samples, of each one's init + first request divided by
    the minimal handler's sampled right before it (``None``: no pairs). A burst of load on
    the machine slows both of a pair, so this ratio moves less than the medians' ratio."""
    ratios = [
        (a + b) / m
        for a, b, m in zip(timing.import_ms, timing.first_ms, timing.paired_ms, strict=False)
        if m > 0
    ]
    return statistics.median(ratios) if ratios and len(timing.paired_ms) == len(ratios) else None


def _verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "**missed**"


def _verdicts(timings: Sequence[Timing], minimal: Timing) -> list[str]:
    """The targets' table: init + first request against the minimal handler's, and the
    first request against a warm one."""
    out = [
        f"| handler | init + first request ms / minimal handler's ms | ratio "
        f"| target <= {COLD_TARGET:g} | paired ratio | first request ms / warm request ms "
        f"| ratio | target <= {FIRST_TARGET:g} |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    base = _cold_ms(minimal) if minimal.error is None and minimal.import_ms else None
    for t in [minimal, *timings]:
        if t.error is not None or not t.import_ms:
            out.append(f"| `{t.label}` | not measured | | | | | | |")
            continue
        cold = _cold_ms(t)
        first, warm = statistics.median(t.first_ms), statistics.median(t.warm_ms)
        cold_cells = (
            f"{cold:.0f} / {base:.0f} | {cold / base:.2f} | {_verdict(cold / base, COLD_TARGET)}"
            if base
            else "minimal handler not measured | | "
        )
        paired = 1.0 if t is minimal else paired_ratio(t)
        paired_cell = "" if paired is None else f"{paired:.2f}"
        first_ratio = first / warm if warm > 0 else float("inf")
        out.append(
            f"| `{t.label}` | {cold_cells} | {paired_cell} | {first:.0f} / {warm:.0f} | "
            f"{first_ratio:.2f} | "
            f"{_verdict(first_ratio, FIRST_TARGET)} |"
        )
    return out


def _against_validated(timings: Sequence[Timing]) -> list[str]:
    """Each handler's cold start against the minimal handler with validation (same run):
    what is the handlers' own beyond the validated stack (a comparison, no target)."""
    by_label = {t.label: t for t in timings if t.error is None and t.import_ms}
    validated = by_label.pop(validated_minimal().label, None)
    if validated is None or not by_label:
        return []
    base = _cold_ms(validated)
    ratios = ", ".join(f"`{label}` {_cold_ms(t) / base:.2f}" for label, t in by_label.items())
    return [
        "",
        f"Against the minimal handler with validation ({base:.0f} ms: pydantic and the "
        f"resolver's validation, which every route of the API uses), init + first request is: "
        f"{ratios}.",
    ]


def _why(timings: Sequence[Timing], minimal: Timing) -> list[str]:
    """Where the read handler's cold start goes beyond the minimal handler's, from this run's
    medians: what the targets would need, in numbers."""
    by_label = {t.label: t for t in timings if t.error is None and t.import_ms}
    read = by_label.get("read")
    traced_read = by_label.get("read, Tracing=Calls")
    local = by_label.get("read, no tenant role")
    uncompiled_read = by_label.get("read, no bytecode")
    if read is None or minimal.error is not None or not minimal.import_ms:
        return []

    def med(values: Sequence[float]) -> float:
        return statistics.median(values)

    out = ["", "Where the read handler's time goes, from the medians above:", ""]
    out.append(
        f"- init: {med(read.import_ms):.0f} ms against the minimal handler's "
        f"{med(minimal.import_ms):.0f} ms (+{med(read.import_ms) - med(minimal.import_ms):.0f}): "
        "the layer's modules (pydantic and its first model class, the head's and the "
        "events' models; the store, its keyring and codec; the resolver, views and route "
        "modules) and two more AWS clients (STS for the tenants' roles, KMS for their "
        "keys); its clients are botocore's (`turnledger.core.aws`): no function imports "
        "boto3, whose import the minimal handler pays, and their models are read by the "
        "layer's `ModelLoader` (plain dicts, no walk over every service's folder; botocore's "
        "own loader, which the minimal handler uses, against it: see below). The read function "
        "loads no provider, tool, httpx or turn pipeline "
        "(`turnledger.runtime.prepare(service=False)`, `turnledger.turn.reads`) and builds "
        "no request or response body and no event payload model before its first use "
        "(`turnledger.core.models.Deferred`)."
    )
    if uncompiled_read is not None:
        out.append(
            f"- the layer's bytecode: init {med(uncompiled_read.import_ms):.0f} ms when the "
            f"layer ships none (+{med(uncompiled_read.import_ms) - med(read.import_ms):.0f}), "
            "as `BuildMethod: python3.13` built it: Lambda's `/opt` is read-only, so every "
            "cold start compiled each module it imported. `layers/turnledger/Makefile` "
            "ships every module compiled (`--invalidation-mode unchecked-hash`), which is "
            "what every other row measures."
        )
    if traced_read is not None:
        out.append(
            f"- the X-Ray SDK's Tracer (`Tracing=Calls`): init {med(traced_read.import_ms):.0f} "
            f"ms with it, {med(read.import_ms):.0f} ms at the template's default "
            "(`Tracing=Invocations`: Lambda traces the invocation, no SDK in the function)."
        )
    if local is not None:
        tenant = med(read.first_ms) - med(local.first_ms)
        out.append(
            f"- a tenant's first request in an environment: {med(read.first_ms):.0f} ms, of "
            f"which {tenant:.0f} ms are the tenant's own set-up (the first request without "
            f"a tenant role takes {med(local.first_ms):.0f} ms): its role assumed on STS, one "
            "round trip that init cannot make for a tenant it does not know, and its "
            "DynamoDB client (which sends over the process's connection pool)."
        )
    out.append(
        f"- the minimal handler's own first request is {med(minimal.first_ms):.0f} ms "
        f"against {med(minimal.warm_ms):.0f} ms warm: a warm request of a few milliseconds "
        "makes any first connection or first route count double."
    )
    return out


def _restore_section(restored: Sequence[Timing]) -> list[str]:
    """What Python runs of a SnapStart start: the after-restore hook and the first request."""
    if not restored:
        return []
    out = [
        "",
        "### After a SnapStart restore (the read and turn handlers, same run)",
        "",
        "The init as SnapStart runs it (`AWS_LAMBDA_INITIALIZATION_TYPE=snap-start`: "
        "every route's request models and every deferred model are built too, and the turn "
        "and approve functions load the idempotency module a keyed request uses), then the "
        "hooks "
        "as Lambda runs them "
        "around a snapshot "
        "(`turnledger.runtime.before_snapshot`, then `after_restore`: a new random seed, "
        "cached secrets dropped, the runtime rebuilt on a new AWS session), then the two "
        "requests. Restoring the snapshot itself is Lambda's and is not measured here; the "
        "hook and the first request are what a restored environment adds to it.",
        "",
        "| handler | after-restore hook ms | first request ms | warm request ms | "
        "hook + first request ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for timing in restored:
        if timing.error is not None or not timing.import_ms:
            out.append(f"| `{timing.label}` | failed: {timing.error} | | | |")
        else:
            out.append(
                f"| `{timing.label}` | {_ms(timing.import_ms)} | {_ms(timing.first_ms)} | "
                f"{_ms(timing.warm_ms)} | {_cold_ms(timing):.0f} |"
            )
    return out


def render(found: ColdStart, runs: int, command: str) -> str:
    """The markdown of the section (without its ``## `` heading)."""
    timings, comparisons, tree = found.handlers, found.comparisons, found.tree
    minimal = found.minimal
    out = [
        f"Command: {command}. Run: {machine_line()}.",
        "",
        f"Median of {runs} fresh interpreters each (`{Path(sys.executable).name}` of the "
        "project venv, every module's bytecode there, as the layer ships it: "
        "`layers/turnledger/Makefile`): the handler's folder "
        "first on `sys.path`, the template's environment (parameter defaults; resource "
        "names as placeholders, the table, bucket and keys table on "
        f"{found.backend}: content sealed as deployed) and what the Lambda runtime sets, "
        "with fake credentials. "
        "**init** is the handler module's import, Lambda's init phase: it builds the "
        "resolver, the settings, the clients and the service (`turnledger.runtime.prepare`; "
        "at the template's default `Tracing=Invocations` Lambda traces the invocation and "
        "no X-Ray SDK is loaded). Then the "
        "same interpreter answers the handler's sample event from `events/` twice (two "
        "conversations that do not exist yet, of one tenant: a first turn, a 404, a 204, a "
        "404, an empty sweep): **first request** includes what only a request can do (the "
        "tenant's role assumed on moto's STS and its clients, the first connections; a "
        "turn, the new conversation's keys, on moto's KMS); "
        "**warm request** is the second; **first request's extra set-up** is their "
        "difference. **cold start** = init + first request, what a caller waits for "
        "without SnapStart (with it, a restore replaces the init). The **minimal** handler "
        "(`bench/minimal/app.py`: Powertools' HTTP resolver and one `GetItem` through a "
        "boto3 DynamoDB resource, built at import) is sampled the same way right before "
        "each handler's sample, so the two alternate; **read, Tracing=Calls** is the read "
        "handler deployed with `Tracing=Calls` (`POWERTOOLS_TRACE_DISABLED=false`: the X-Ray "
        "SDK's Tracer created at init); **read, no tenant "
        "role** is the read handler without `TENANT_ROLE_ARN` (its first request assumes no "
        "role and builds no client: the difference is a tenant's first request's own "
        "set-up, once per tenant and environment); **read, no bytecode** is the read "
        "handler on a layer without bytecode, as `BuildMethod: python3.13` built it (each "
        "of the layer's modules compiled, the standard library's bytecode kept, as "
        "Lambda's runtime has it: `bench.coldstart.uncompiled`); **minimal, with "
        "validation** is the "
        "minimal handler with the resolver's validation on and a pydantic answer "
        "(`bench/minimal/validated.py`), as every route of the API has them: what the "
        "validated stack costs by itself (a comparison; the verdicts stay against the "
        "minimal handler). The handlers' init runs with the garbage collector paused "
        "(`turnledger.core.initphase`); the minimal handlers' as written. Interpreter start-up "
        "itself is not counted. Every interpreter sees only what the layer holds: the "
        "modules of the venv's other distributions (the tests' `click`, `rich`, `moto`...: "
        "`bench.coldstart.not_in_layer`) are made unimportable, so an optional import (httpx "
        "loads its command line when `click` is there) costs what it costs on Lambda. "
        "Measured on this machine, not on Lambda's arm64 CPUs.",
        "",
        "| handler | init ms (median) | range | first request ms | warm request ms | "
        "first request's extra set-up ms | cold start ms (init + first request) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in [minimal, *timings]:
        if t.error is not None:
            out.append(f"| `{t.label}` | failed: {t.error} | | | | | |")
            continue
        total = _cold_ms(t)
        out.append(
            f"| `{t.label}` | {_ms(t.import_ms)} | {_range(t.import_ms)} | "
            f"{_ms(t.first_ms)} | {_ms(t.warm_ms)} | {_ms(t.setup_ms)} | {total:.0f} |"
        )
    for names, modules in found.twins:
        out += [
            "",
            f"{', '.join(f'`{n}`' for n in names)} import exactly the same modules "
            f"({', '.join(f'`{m}`' for m in modules)}): their init differences are this "
            "machine's noise, not their code.",
        ]
    out += [
        "",
        f"### Targets: init + first request <= {COLD_TARGET:g} x the minimal handler's; "
        f"first request <= {FIRST_TARGET:g} x a warm one (same run)",
        "",
        "**paired ratio**: the median, over the samples, of each one's init + first request "
        "divided by the minimal handler's sampled right before it (`bench.coldstart."
        "paired_ratio`): load on the machine slows both of a pair, so it moves less than the "
        "ratio of the medians, on which the verdict stays.",
        "",
    ]
    out += _verdicts(timings, minimal)
    out += _against_validated(timings)
    out += _why(timings, minimal)
    out += _restore_section(found.restored)
    out += [
        "",
        "### For comparison (each alone in a fresh interpreter)",
        "",
        "| what | ms (median) | range |",
        "| --- | ---: | ---: |",
    ]
    for t in comparisons:
        if t.error is not None:
            out.append(f"| {t.label} | failed: {t.error} | |")
        else:
            out.append(f"| {t.label} | {_ms(t.import_ms)} | {_range(t.import_ms)} |")
    out += [
        "",
        "### Largest imports of the turn handler's init and first request "
        "(`python -X importtime`, one run)",
        "",
    ]
    if isinstance(tree, str):
        out.append(f"Not measured: {tree}")
    else:
        top = sorted(tree, key=lambda line: line.cumulative_us, reverse=True)
        imported = sum(line.self_us for line in tree) / 1000
        out += [
            f"{imported:.0f} ms of imports in all (self times added up, under `-X importtime`, "
            "which adds its own overhead); the ten largest (cumulative includes what each "
            "imports; depth 0 = imported by the handler module or by the request's code):",
            "",
            "| module | depth | cumulative ms | self ms |",
            "| --- | ---: | ---: | ---: |",
        ]
        for line in top[:10]:
            out.append(
                f"| `{line.module}` | {line.depth} | {line.cumulative_us / 1000:.1f} | "
                f"{line.self_us / 1000:.1f} |"
            )
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class ColdStart:
    """Everything the section reports."""

    handlers: list[Timing]
    #: The minimal handler of the same stack, sampled alternately with the handlers.
    minimal: Timing
    comparisons: list[Timing]
    #: The turn handler's imports, or why they could not be listed.
    tree: list[ImportLine] | str
    #: Handlers that import the same modules: their differences are noise.
    twins: list[tuple[list[str], tuple[str, ...]]]
    #: Where the requests' table and bucket were.
    backend: str = "DynamoDB Local"
    #: The read and turn handlers after SnapStart's hooks (``import_ms``: the after-restore
    #: hook).
    restored: list[Timing] = field(default_factory=list)


def _backend(stack: ExitStack) -> tuple[dict[str, str], str]:
    """Start DynamoDB Local and moto's S3 server; the handlers' environment for them."""
    jar = find_jar()
    s3_port = free_port()
    s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    s3_server.start()
    stack.callback(s3_server.stop)
    ddb = stack.enter_context(DynamoDBLocal(jar, shared_db=True))  # tenant credentials
    s3_endpoint = f"http://127.0.0.1:{s3_port}"
    clients = aws_clients(ddb.endpoint, s3_endpoint=s3_endpoint)
    kms = boto3.client(
        "kms",
        endpoint_url=s3_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    env = {
        "DYNAMODB_ENDPOINT": ddb.endpoint,
        "S3_ENDPOINT": s3_endpoint,
        # botocore's per-service endpoint variable: the tenant role is assumed on moto.
        "AWS_ENDPOINT_URL_STS": s3_endpoint,
        "TABLE_NAME": create_conversations_table(clients.dynamodb),
        "BUCKET_NAME": create_bucket(clients.s3),
        # Content sealed as the template deploys it: wrapped keys beside the table, the
        # key that wraps them on moto's KMS.
        "KEYS_TABLE_NAME": create_keys_table(clients.dynamodb),
        "CONTENT_KMS_KEY_ID": kms.create_key(Description="bench")["KeyMetadata"]["KeyId"],
        "KMS_ENDPOINT": s3_endpoint,
    }
    return env, "DynamoDB Local (in memory, loopback), S3, STS and KMS on moto's server"


def run(names: Sequence[str], runs: int) -> ColdStart:
    """Time the handlers and the comparisons; take the turn handler's import tree.

    Raises:
        DynamoDBLocalError: DynamoDB Local is not installed (``make bench`` installs it).
    """
    found = handlers()
    chosen = [found[n] for n in names if n in found]
    absent = "no such function in template.yaml"
    missing = [Timing(n, error=absent) for n in names if n not in found]
    with ExitStack() as stack:
        backend, where = _backend(stack)
        if "sweep" in found:
            # The sweep's very first run walks back a week of expiry buckets (its cursor's
            # start): work, not set-up. One unmeasured run leaves the cursor at this hour.
            with contextlib.suppress(ProbeFailed):
                probe(
                    _handler_steps(found["sweep"], -2)[:2],
                    handler_environment(found["sweep"], backend),
                )
        variants = []
        if "read" in names and "read" in found:
            # The standard library compiled once for the run (a few seconds), only when a
            # variant of the read handler uses it.
            stdlib_cache = stdlib_bytecode(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            variants = [
                traced(found["read"]),
                untenanted(found["read"]),
                uncompiled(found["read"], stdlib_cache),
            ]
        variants.append(validated_minimal())
        timings, minimal, comparisons, restored = measure(
            [*chosen, *variants],
            COMPARISONS,
            runs,
            backend,
            [found[n] for n in ("read", "turn") if n in names and n in found],
        )
        tree: list[ImportLine] | str
        try:
            tree = import_tree(found["turn"], backend) if "turn" in found else "no turn function"
        except ProbeFailed as exc:
            tree = str(exc)
    return ColdStart(
        [*timings, *missing], minimal, comparisons, tree, twins(chosen), where, restored
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per figure")
    parser.add_argument(
        "--handlers", nargs="+", default=list(HANDLERS), help="function folders to time"
    )
    parser.add_argument(
        "--print-only", action="store_true", help="print the section, leave RESULTS.md alone"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(f"cold start benchmark: {args.runs} runs each", flush=True)
    try:
        found = run(args.handlers, args.runs)
    except DynamoDBLocalError as exc:
        print(exc, file=sys.stderr)
        return 2
    command = command_line("bench.coldstart", sys.argv[1:] if argv is None else argv)
    markdown = render(found, args.runs, command)
    publish(SECTION, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
