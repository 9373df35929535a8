"""A cold handler import (Lambda's init phase) loads and builds what a request needs; the
first request then imports nothing heavy.

Each check runs in a fresh interpreter, as Lambda's init phase does: the handler's
folder first on ``sys.path``, then ``import app``. What every request needs (the
resolver, pydantic, boto3, the service) is in ``sys.modules`` and the runtime is built
after the import alone, so under SnapStart it is in the snapshot and without it no
caller's first request pays for it (``make bench`` measures both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from turnledger.api.functions import EVERY_ROUTE, ROUTES
from turnledger_local.template import PROJECT_ROOT, functions, load_template, routes

#: Modules a handler's import loads and its first request must not (each also covers its
#: submodules).
HEAVY = (
    "boto3",
    "botocore",
    "pydantic",
    "aws_lambda_powertools",
    "httpx",
    "fastjsonschema",
    "turnledger.api.app",
    "turnledger.api.openai",
    "turnledger.runtime",
    "turnledger.turn.pipeline",
    "turnledger.turn.execution",
    "turnledger.ops.sweep",
    "turnledger.store.tenancy",
    "turnledger.providers",
    "turnledger.tools.executors",
    "turnledger.tools.registry",
    "turnledger.store",
    "turnledger.core.models",
    "turnledger.api.schemas",
)

_PROBE = """
import gc, json, sys
sys.path.insert(0, sys.argv[1])
import app
assert callable(app.lambda_handler)
collector = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
import turnledger.runtime
built = turnledger.runtime._runtime is not None
loaded = sorted(sys.modules)
answer = None
if len(sys.argv) > 2:
    class Context:
        function_name = "test"
        function_version = "$LATEST"
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:test"
        memory_limit_in_mb = 512
        aws_request_id = "r1"
        def get_remaining_time_in_millis(self):
            return 30000
    answer = app.lambda_handler(json.loads(sys.argv[2]), Context())
after = sorted(sys.modules)
result = {
    "after_import": loaded,
    "built": built,
    "answer": answer,
    "after_request": after,
    "collector": collector,
}
print(json.dumps(result))
"""


def _folders() -> dict[str, Path]:
    return {
        Path(spec.code_uri).name: PROJECT_ROOT / spec.code_uri
        for spec in functions(load_template()).values()
    }


def _probe(
    folder: Path, env: dict[str, str], event: dict[str, Any] | None = None
) -> dict[str, Any]:
    args = [str(folder)] if event is None else [str(folder), json.dumps(event)]
    result: dict[str, Any] = _run(_PROBE, args, {**_base_env(), **env})
    return result


def _run(script: str, args: list[str], env: dict[str, str]) -> Any:
    """Run ``script`` with ``args`` in a fresh interpreter under ``env``: the JSON of the
    last line it printed."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _base_env() -> dict[str, str]:
    """A Lambda-like environment: fake credentials, no tracing, this checkout's code."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_NAME": "test",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_DISABLED": "true",
        # The code under test (a worktree's), not whatever the interpreter has installed.
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }


def _of(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The ``modules`` that are one of ``packages`` or in one of them."""
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def _heavy(modules: list[str]) -> list[str]:
    return _of(modules, HEAVY)


def test_every_function_of_the_template_is_checked() -> None:
    assert set(_folders()) == {"turn", "read", "clear", "approve", "sweep", "worker", "stream"}


#: What every function's init loads, whatever it serves.
EVERY_INIT = (
    "botocore",
    "pydantic",
    "aws_lambda_powertools",
    "turnledger.runtime",
    "turnledger.store",
)


@pytest.mark.parametrize("name", ["turn", "read", "clear", "approve", "sweep", "worker", "stream"])
def test_a_cold_import_builds_the_runtime(name: str, tmp_path: Path) -> None:
    found = _probe(_folders()[name], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)})
    assert found["built"] is True
    heavy = _heavy(found["after_import"])
    assert all(module in heavy for module in EVERY_INIT)
    # The init ran with the collector paused (turnledger.core.initphase): it is on again,
    # and what the init built (tens of thousands of objects; with the SQLite store, which
    # builds no DynamoDB client, about 90,000) is frozen, out of its reach (0 otherwise).
    assert found["collector"]["enabled"] is True
    assert found["collector"]["frozen"] > 50_000


_ROUTED = """
import json, re, sys
sys.path.insert(0, sys.argv[1])
import app
from turnledger.api.resolver import methods_of
found = {path: methods_of(path) for path in json.loads(sys.argv[2])}
print(json.dumps({"methods": found, "modules": sorted(sys.modules)}))
"""

#: A value for each path parameter of the template's routes.
_SAMPLES = {"{id}": "c-1", "{turn}": "1", "{item}": "msg_1", "{token}": "t"}


def _sample(path: str) -> str:
    for parameter, value in _SAMPLES.items():
        path = path.replace(parameter, value)
    return path


@pytest.mark.parametrize("name", ["turn", "read", "clear", "approve"])
def test_an_api_function_registers_every_route_the_template_gives_it(
    name: str, tmp_path: Path
) -> None:
    given = [
        r
        for r in routes(load_template())
        if Path(r.code_uri).name == name and "{proxy+}" not in r.path  # proxy: not-found
    ]
    assert given
    paths = sorted({_sample(r.path) for r in given})
    env = {**_base_env(), "STORE": "sqlite", "DATA_DIR": str(tmp_path)}
    found = _run(_ROUTED, [str(_folders()[name]), json.dumps(paths)], env)
    missing = [r.route_key for r in given if r.method not in found["methods"][_sample(r.path)]]
    assert missing == []
    loaded = set(found["modules"])
    for module in ROUTES[name]:
        assert f"turnledger.api.{module}" in loaded


def test_the_openapi_document_lists_the_routes_of_every_function(tmp_path: Path) -> None:
    """Whichever function serves it, the document covers every function's routes (here the
    approve function's, which loads no memory route of its own)."""
    event = json.loads((PROJECT_ROOT / "events" / "get-conversation.json").read_text())
    event = {
        **event,
        "routeKey": "GET /v1/openapi.json",
        "rawPath": "/v1/openapi.json",
        "pathParameters": {},
    }
    found = _probe(_folders()["approve"], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)}, event)
    assert found["answer"]["statusCode"] == 200
    paths = json.loads(found["answer"]["body"])["paths"]
    assert {"/v1/memories", "/v1/conversations/{conversation_id}/turns/{turn}"} <= set(paths)


@pytest.mark.parametrize("name", ["turn", "read", "clear", "approve"])
def test_an_api_function_loads_no_other_functions_route_modules(name: str, tmp_path: Path) -> None:
    # The entry point checks an open callback's token (callback_gate) without the route
    # module that serves it: the approve function's ``waits``.
    found = _probe(_folders()[name], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)})
    loaded = {m.removeprefix("turnledger.api.") for m in found["after_import"]}
    assert {m for m in EVERY_ROUTE if m in loaded} == set(ROUTES[name])


def test_the_first_request_answers_and_imports_nothing_heavy(tmp_path: Path) -> None:
    found = _probe(
        _folders()["read"],
        {"STORE": "sqlite", "DATA_DIR": str(tmp_path)},
        json.loads((PROJECT_ROOT / "events" / "get-conversation.json").read_text()),
    )
    assert found["answer"]["statusCode"] == 404
    assert json.loads(found["answer"]["body"])["error"]["code"] == "conversation_not_found"
    imported = sorted(set(found["after_request"]) - set(found["after_import"]))
    assert _heavy(imported) == []


_ROUTE_MODELS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import app
from turnledger.api.app import app as resolver
routes = [*resolver._static_routes, *resolver._dynamic_routes]
built = [r for r in routes if r._dependant is not None]
print(json.dumps({"routes": len(routes), "built": len(built)}))
"""


@pytest.mark.parametrize(
    ("initialization", "expected"), [("snap-start", "all"), ("on-demand", "none")]
)
def test_a_snapshot_init_builds_every_routes_models(
    tmp_path: Path, initialization: str, expected: str
) -> None:
    """Under SnapStart every route's request models are in the snapshot; an on-demand
    init leaves each to its route's first request (0.2 s for all would be waited for)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "STORE": "sqlite",
        "DATA_DIR": str(tmp_path),
        "AWS_LAMBDA_INITIALIZATION_TYPE": initialization,
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    found = _run(_ROUTE_MODELS, [str(_folders()["read"])], env)
    assert found["routes"] > 20
    assert found["built"] == (found["routes"] if expected == "all" else 0)


#: What the read and clear functions' init must not load: the model providers (but for
#: :mod:`turnledger.providers.base`, the message types the context assembly is written in),
#: the tools and their HTTP client, and the turn pipeline. A clear that must forget a
#: provider's stored responses loads that provider then.
WRITE_SIDE = (
    "httpx",
    "turnledger.tools.executors",
    "turnledger.tools.registry",
    "turnledger.providers.factory",
    "turnledger.providers.embeddings",
    "turnledger.providers.openai_http",
    "turnledger.providers.bedrock_converse",
    "turnledger.turn.pipeline",
    "turnledger.turn.execution",
    "turnledger.ops.notifications",
)


@pytest.mark.parametrize("name", ["read", "clear"])
def test_the_read_and_clear_functions_load_no_provider_tool_or_pipeline(
    name: str, tmp_path: Path
) -> None:
    found = _probe(_folders()[name], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)})
    assert found["built"] is True
    assert _of(found["after_import"], WRITE_SIDE) == []


#: What only the routes that run a turn (``api/turn_routes.py``) or follow one
#: (``api/streaming_routes.py``) load: long turns and their drafts, the 202 answer, the
#: idempotency layer.
TURN_RUNNING = (
    "turnledger.turn.longturns",
    "turnledger.turn.drafts",
    "turnledger.api.streaming",
    "turnledger.api.idempotency",
)


def test_the_clear_functions_init_loads_nothing_that_runs_or_follows_a_turn(
    tmp_path: Path,
) -> None:
    found = _probe(_folders()["clear"], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)})
    assert found["built"] is True
    assert _of(found["after_import"], TURN_RUNNING) == []


#: The code that runs a turn (its service, steps, drafts' writer, the worker and the 202):
#: reading turns (:mod:`turnledger.turn.turn_reads`) needs none of it.
RUN_SIDE = (
    "turnledger.turn.pipeline",
    "turnledger.turn.longturns",
    "turnledger.turn.drafts",
    "turnledger.turn.execution",
    "turnledger.turn.approval_edits",
)


def test_the_read_functions_init_loads_no_run_code(tmp_path: Path) -> None:
    found = _probe(_folders()["read"], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)})
    assert found["built"] is True
    assert "turnledger.turn.turn_reads" in found["after_import"]
    assert _of(found["after_import"], RUN_SIDE) == []


#: What only an ``http`` tool call or a webhook loads (turnledger.tools.http).
HTTP_SIDE = ("httpx", "httpcore", "turnledger.tools.http")


@pytest.mark.parametrize("name", ["turn", "approve", "worker"])
def test_a_function_whose_deployment_has_no_http_tool_loads_no_httpx(
    name: str, tmp_path: Path
) -> None:
    # The template's defaults: the demo model, no tool registry.
    found = _probe(_folders()[name], {"STORE": "sqlite", "DATA_DIR": str(tmp_path)})
    assert found["built"] is True
    assert _of(found["after_import"], HTTP_SIDE) == []


_BODY_MODELS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import app
import pydantic
from turnledger.api import schemas
models = [
    m for m in vars(schemas).values()
    if isinstance(m, type) and issubclass(m, pydantic.BaseModel)
    and m.__module__ == schemas.__name__
]
from turnledger.core.models import PAYLOAD_MODELS
payloads = list(PAYLOAD_MODELS.values())
print(json.dumps({
    "models": len(models),
    "built": sum(m.__pydantic_complete__ for m in models),
    "payloads": len(payloads),
    "payloads_built": sum(m.__pydantic_complete__ for m in payloads),
}))
"""


@pytest.mark.parametrize(
    ("initialization", "expected"), [("snap-start", "all"), ("on-demand", "none")]
)
def test_api_bodies_and_event_payloads_are_built_on_first_use_unless_init_runs_ahead(
    tmp_path: Path, initialization: str, expected: str
) -> None:
    """The HTTP API's request and response models (``turnledger.api.schemas``) and the
    events' payload models are deferred: an on-demand init builds none of them (each
    route's first request builds its own, each kind's first event its payload's, about
    1 ms a model), a SnapStart init builds them all into the snapshot."""
    env = {
        **_base_env(),
        "STORE": "sqlite",
        "DATA_DIR": str(tmp_path),
        "AWS_LAMBDA_INITIALIZATION_TYPE": initialization,
    }
    found = _run(_BODY_MODELS, [str(_folders()["read"])], env)
    assert found["models"] > 30
    assert found["built"] == (found["models"] if expected == "all" else 0)
    assert found["payloads"] > 10
    assert found["payloads_built"] == (found["payloads"] if expected == "all" else 0)


_CLIENTS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import app
import turnledger.runtime
runtime = turnledger.runtime._runtime
print(json.dumps(sorted(c.meta.service_model.service_name for c in runtime.clients)))
"""


@pytest.mark.parametrize(("name", "s3"), [("clear", True), ("read", False)])
def test_the_clear_functions_init_builds_s3s_client(name: str, s3: bool) -> None:
    """Every clear lists the conversation's blobs: the clear function's init builds S3's
    client (its model parsed for the tenants' clients too); the read function, whose
    requests seldom touch a blob, leaves it to the first that does."""
    env = {**_base_env(), "TABLE_NAME": "t", "BUCKET_NAME": "b"}
    services = _run(_CLIENTS, [str(_folders()[name])], env)
    assert "dynamodb" in services
    assert ("s3" in services) is s3


_IDEMPOTENCY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import app
print(json.dumps("aws_lambda_powertools.utilities.idempotency" in sys.modules))
"""


@pytest.mark.parametrize(
    ("name", "initialization", "loaded"),
    [
        ("turn", "snap-start", True),
        ("approve", "snap-start", True),
        ("read", "snap-start", False),
        ("turn", "on-demand", False),
        ("approve", "on-demand", False),
    ],
)
def test_a_snapshot_init_of_a_keyed_function_loads_the_idempotency_module(
    tmp_path: Path, name: str, initialization: str, loaded: bool
) -> None:
    """A turn or an approval with an ``Idempotency-Key`` loads Powertools' idempotency
    (which imports boto3, about 35 ms): under SnapStart the turn and approve functions'
    snapshot holds it; an on-demand init leaves it to the first keyed request."""
    env = {
        **_base_env(),
        "STORE": "sqlite",
        "DATA_DIR": str(tmp_path),
        "AWS_LAMBDA_INITIALIZATION_TYPE": initialization,
    }
    assert _run(_IDEMPOTENCY, [str(_folders()[name])], env) is loaded


#: What no function loads, at init or on its first request: boto3 (its import loads
#: s3transfer's transfer manager, a fifth of a cold start; the clients are botocore's).
BOTO3 = ("boto3", "s3transfer")

_NO_BOTO3 = """
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {names!r})
assert not loaded, f"loaded {{loaded[:8]}}"
"""


@pytest.fixture(scope="module")
def bench_backend() -> Iterator[dict[str, str]]:
    """The bench's backend (DynamoDB Local; S3, STS and KMS on moto's server): the
    template's default configuration, with content sealed and a tenant role."""
    from bench.coldstart import _backend

    with ExitStack() as stack:
        backend, _ = _backend(stack)
        yield backend


@pytest.mark.parametrize(
    ("name", "idempotency_key"),
    [
        ("turn", False),
        pytest.param(
            "turn",
            True,
            marks=pytest.mark.xfail(
                strict=True,
                reason="Powertools' idempotency package imports its DynamoDB layer, boto3",
            ),
        ),
        ("read", False),
        ("clear", False),
        ("approve", False),
        ("sweep", False),
    ],
)
def test_no_function_imports_boto3_at_init_or_on_its_first_request(
    name: str, idempotency_key: bool, bench_backend: dict[str, str]
) -> None:
    """Each function's init and first request (its sample event, as ``make bench`` sends
    it; a turn with and without its ``Idempotency-Key``) in a fresh interpreter holding
    only what the layer holds."""
    from bench.coldstart import (
        _CONTEXT,
        _handler_steps,
        _request_step,
        handler_environment,
        handlers,
        probe,
        sample_event,
    )

    handler = handlers()[name]
    init, _, _ = _handler_steps(handler, -4)
    event = sample_event(handler, f"no-boto3-{name}-{idempotency_key}")
    if not idempotency_key:
        event["headers"] = {
            k: v for k, v in (event.get("headers") or {}).items() if k != "idempotency-key"
        }
    spent, _ = probe(
        [init, _CONTEXT + _request_step(event), _NO_BOTO3.format(names=set(BOTO3))],
        handler_environment(handler, bench_backend),
    )
    assert len(spent) == 3


_PLUGIN_SCAN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import app
from pydantic.plugin import _loader
print(json.dumps({"scanned": _loader._plugins is not None}))
"""


@pytest.mark.parametrize("name", ["read", "turn", "sweep"])
def test_no_function_scans_the_installed_distributions_for_pydantic_plugins(
    name: str, tmp_path: Path
) -> None:
    # pydantic looks for plugins in every distribution's entry points when it builds its
    # first model (a few ms of every cold start) unless the environment turns them off:
    # every function's init does (turnledger.core.initphase), and none is deployed.
    env = {**_base_env(), "STORE": "sqlite", "DATA_DIR": str(tmp_path)}
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    found = _run(_PLUGIN_SCAN, [str(_folders()[name])], env)
    assert found == {"scanned": False}
    # The check can fail: an environment that asks for plugins (empty: every one) scans.
    env["PYDANTIC_DISABLE_PLUGINS"] = ""
    assert _run(_PLUGIN_SCAN, [str(_folders()[name])], env) == {"scanned": True}


@pytest.mark.parametrize("name", ["turn", "approve", "worker"])
def test_telemetry_off_imports_nothing_of_opentelemetry(name: str, tmp_path: Path) -> None:
    """Telemetry is a port that does nothing until an endpoint is given: a function
    without it imports neither the adapter nor OpenTelemetry, at init or on a request."""
    env = {"STORE": "sqlite", "DATA_DIR": str(tmp_path)}
    found = _probe(_folders()[name], env)
    telemetry = ("opentelemetry", "turnledger.core.otel")
    assert [m for m in found["after_import"] if m.startswith(telemetry)] == []
    # The check can fail: the same init with telemetry asked for loads the adapter.
    on = _probe(_folders()[name], {**env, "TURNLEDGER_TELEMETRY": "otel"})
    assert {"turnledger.core.otel", "opentelemetry.trace"} <= set(on["after_import"])
    endpoint = {**env, "TURNLEDGER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    on = _probe(_folders()[name], endpoint)
    assert {"turnledger.core.otel", "opentelemetry.trace"} <= set(on["after_import"])
