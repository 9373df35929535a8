"""The local runner: the template's routes over HTTP, through the functions' own handlers.

Routes, authorizer exemptions, timeouts and memory sizes come from
``template.yaml``, and each route calls the ``lambda_handler`` of
``functions/<name>/app.py`` with the event API Gateway would send, so a local
run and a deployment cannot drift apart::

    with LocalRunner(LocalConfig(port=0)) as runner:
        httpx.post(f"{runner.url}/v1/conversations/c1/turns", ...)

Requests are served concurrently (one thread each), like concurrent Lambda
invocations. ``POST /_local/sweep`` invokes the scheduled function on demand.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import boto3

from .embedded import EmbeddedStorage, StorageNames, provision
from .gateway import (
    MAX_BODY_BYTES,
    GatewayError,
    HttpRequest,
    HttpResponse,
    LambdaContext,
    RouteTable,
    authenticate,
    build_event,
    scheduled_event,
    to_http,
)
from .template import (
    TEMPLATE_PATH,
    FunctionSpec,
    functions,
    load_template,
    routes,
    scheduled_function,
)

# Not named after the package: Powertools' Logger(service="turnledger") filters out, at the
# root handlers, every record of a logger whose name contains "turnledger".
logger = logging.getLogger("local_runner")

Handler = Callable[[dict[str, Any], Any], Any]

#: A local stand-in tool endpoint (see ``_echo``).
ECHO_PATH = "/_local/echo"
SWEEP_PATH = "/_local/sweep"
_LOCAL_PREFIX = "/_local/"
#: Over-limit bodies up to this size are read and dropped; larger ones close the connection.
_DRAIN_LIMIT_BYTES = 8 * MAX_BODY_BYTES
_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


@dataclass(frozen=True)
class LocalConfig:
    """How to run locally. Every field has the default ``turnledger local`` uses.

    ``None`` for a setting leaves the functions' own default (see ``config.py``).
    """

    host: str = "127.0.0.1"
    #: ``0`` picks a free port (tests).
    port: int = 3000
    template_path: Path = TEMPLATE_PATH
    #: Where ``CodeUri`` paths start; default: the template's folder.
    project_root: Path | None = None
    ttl_seconds: int | None = None
    tools_file: Path | None = None
    provider: str | None = None
    model: str | None = None
    #: External endpoints; each one left ``None`` is served by the embedded storage.
    dynamodb_endpoint: str | None = None
    s3_endpoint: str | None = None
    table: str = "turnledger"
    bucket: str = "turnledger-artifacts"
    idempotency_table: str = "turnledger-idempotency"
    tenant_claim: str = "tenant_id"
    region: str = "us-east-1"
    log_level: str = "INFO"
    #: False: start no storage and create nothing (runs whose handlers need none).
    provision_storage: bool = True
    #: Keep conversations in this folder (SQLite and payload files), surviving restarts;
    #: ``None``: in the DynamoDB table and bucket (embedded: gone when the runner stops).
    #: Idempotency records stay in the DynamoDB idempotency table either way.
    data_dir: Path | None = None
    #: Extra environment variables for the functions, applied last.
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """The folder ``CodeUri`` paths are relative to."""
        return self.project_root or self.template_path.resolve().parent


class _Environment:
    """Sets process environment variables and puts the previous values back."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def apply(self, values: Mapping[str, str]) -> None:
        for name, value in values.items():
            self._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def restore(self) -> None:
        for name, previous in self._saved.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous
        self._saved.clear()


def _is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in {"127.0.0.1", "localhost", "::1"}


def _forget_runtime() -> None:
    # The handlers build their clients and settings once per process and keep them;
    # a runner's environment (tables, endpoints) must not meet another runner's clients.
    from ..runtime import set_runtime

    set_runtime(None)


def _load_handler(root: Path, spec: FunctionSpec, module_name: str) -> Handler:
    module_path, _, attribute = spec.handler.rpartition(".")
    source = root / spec.code_uri / (module_path.replace(".", "/") + ".py")
    loader_spec = importlib.util.spec_from_file_location(module_name, source)
    if loader_spec is None or loader_spec.loader is None:
        raise FileNotFoundError(f"{spec.name}: cannot load {source}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise AttributeError(f"{spec.name}: {source} has no callable {attribute!r}")
    return handler  # type: ignore[no-any-return]


class LocalRunner:
    """Serves a template's HTTP API routes on a local port.

    ``start()`` prepares storage, sets the functions' environment, loads their
    handlers and starts serving; ``stop()`` undoes all of it, the environment
    included. Also a context manager.

    Both drop the process's cached :mod:`turnledger.runtime`, so the handlers
    build theirs from this runner's environment: a test that installs its own
    runtime (``set_runtime``) does so after ``start()``.
    """

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._template = load_template(self.config.template_path)
        self._functions = functions(self._template)
        self._routes = RouteTable(routes(self._template))
        self._sweep = scheduled_function(self._template)
        self._handlers: dict[str, Handler] = {}
        self._modules: list[str] = []
        self._environment = _Environment()
        self._storage: EmbeddedStorage | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoints: dict[str, str] = {}

    # -- lifecycle -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL being served.

        Raises:
            RuntimeError: the runner is not started.
        """
        if self._server is None:
            raise RuntimeError("the runner is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        """Prepare storage and handlers, start serving; returns the base URL.

        Raises:
            OSError: the port is taken.
            botocore.exceptions.BotoCoreError: a storage endpoint cannot be reached.
            botocore.exceptions.ClientError: storage could not be provisioned.
            FileNotFoundError: a function's handler file is missing.
        """
        if self._server is not None:
            return self.url
        try:
            self._environment.apply(self._base_environment())
            if self.config.provision_storage:
                self._start_storage()
            self._load_handlers()
            self._serve()
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop serving, stop embedded storage, unload handlers, restore the environment."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None
        if self._storage is not None:
            self._storage.stop()
            self._storage = None
        for name in self._modules:
            sys.modules.pop(name, None)
        self._modules.clear()
        self._handlers.clear()
        self.endpoints = {}
        self._environment.restore()
        _forget_runtime()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _base_environment(self) -> dict[str, str]:
        cfg = self.config
        env = {
            "TABLE_NAME": cfg.table,
            "BUCKET_NAME": cfg.bucket,
            "IDEMPOTENCY_TABLE_NAME": cfg.idempotency_table,
            "TENANT_CLAIM": cfg.tenant_claim,
            "POWERTOOLS_SERVICE_NAME": "turnledger",
            "POWERTOOLS_METRICS_NAMESPACE": "turnledger",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "LOG_LEVEL": cfg.log_level,
            "AWS_DEFAULT_REGION": cfg.region,
            "AWS_REGION": cfg.region,
        }
        optional = {
            "TTL_SECONDS": None if cfg.ttl_seconds is None else str(cfg.ttl_seconds),
            "PROVIDER": cfg.provider,
            "MODEL": cfg.model,
            "TOOLS_FILE": None if cfg.tools_file is None else str(cfg.tools_file.resolve()),
            "STORE": None if cfg.data_dir is None else "sqlite",
            "DATA_DIR": None if cfg.data_dir is None else str(cfg.data_dir.resolve()),
        }
        env.update({name: value for name, value in optional.items() if value is not None})
        return env

    def _start_storage(self) -> None:
        cfg = self.config
        dynamodb, s3 = cfg.dynamodb_endpoint, cfg.s3_endpoint
        if dynamodb is None or s3 is None:
            self._storage = EmbeddedStorage()
            embedded = self._storage.start()
            dynamodb, s3 = dynamodb or embedded, s3 or embedded
        # moto and DynamoDB Local accept any signature, but boto3 signs nothing without
        # credentials. Embedded storage must never see real ones; real endpoints keep the
        # caller's own, and loopback ones get fake ones only when there are none.
        all_embedded = cfg.dynamodb_endpoint is None and cfg.s3_endpoint is None
        # Short-circuits: the credential chain may probe instance metadata over the network.
        if all_embedded or (
            all(_is_loopback(url) for url in (dynamodb, s3))
            and boto3.Session().get_credentials() is None
        ):
            self._environment.apply(_FAKE_CREDENTIALS)
        self.endpoints = {"dynamodb": dynamodb, "s3": s3}
        self._environment.apply(
            {
                "DYNAMODB_ENDPOINT": dynamodb,
                "S3_ENDPOINT": s3,
                # So that clients the functions do not build themselves (Powertools'
                # idempotency layer) reach the same storage.
                "AWS_ENDPOINT_URL_DYNAMODB": dynamodb,
                "AWS_ENDPOINT_URL_S3": s3,
            }
        )
        created = provision(
            self._template,
            StorageNames(cfg.table, cfg.idempotency_table, cfg.bucket),
            dynamodb_endpoint=dynamodb,
            s3_endpoint=s3,
            region=cfg.region,
            conversations=cfg.data_dir is None,
        )
        if created:
            logger.info("created %s", ", ".join(created))

    def _load_handlers(self) -> None:
        # Settings are read from the environment when a handler first runs, so the
        # environment is complete before any module is loaded.
        self._environment.apply(dict(self.config.env))
        _forget_runtime()
        wanted = {route.function for route in routes(self._template)}
        if self._sweep is not None:
            wanted.add(self._sweep.name)
        for name in sorted(wanted):
            module_name = f"_turnledger_local_{name}_{id(self):x}"
            self._handlers[name] = _load_handler(
                self.config.root, self._functions[name], module_name
            )
            self._modules.append(module_name)

    def _serve(self) -> None:
        server = _Server((self.config.host, self.config.port), _RequestHandler)
        server.runner = self
        # A short poll keeps stop() quick; shutdown waits for the loop's next poll.
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="turnledger-local",
            daemon=True,
        )
        try:
            thread.start()
        except BaseException:
            server.server_close()
            raise
        # Only a running loop may be shut down: shutdown() waits for the loop to answer.
        self._server, self._thread = server, thread

    # -- requests --------------------------------------------------------------------

    def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one request the way the deployed API would.

        Never raises: a failing function is a ``500 internal_error``.
        """
        try:
            if request.raw_path.startswith(_LOCAL_PREFIX):
                return self._local(request)
            route, path_parameters = self._routes.resolve(request.method, request.raw_path)
            claims = (
                authenticate(request.header("authorization"), self.config.tenant_claim)
                if route.authorized
                else None
            )
            event = build_event(request, route, path_parameters, claims)
            return to_http(self._invoke(route.function, event))
        except GatewayError as exc:
            return exc.to_response()

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        spec = self._functions[function]
        context = LambdaContext(
            function_name=spec.name,
            memory_limit_in_mb=spec.memory_mb,
            timeout_seconds=spec.timeout_seconds,
            region=self.config.region,
        )
        started = time.monotonic()
        try:
            return self._handlers[function](event, context)
        except Exception as exc:
            logger.exception("%s failed", function)
            raise GatewayError(
                500, "internal_error", f"{function} failed: {type(exc).__name__}"
            ) from exc
        finally:
            elapsed = time.monotonic() - started
            if elapsed > spec.timeout_seconds:
                logger.warning(
                    "%s ran %.1f s; Lambda would have stopped it at %d s",
                    function,
                    elapsed,
                    spec.timeout_seconds,
                )

    def _local(self, request: HttpRequest) -> HttpResponse:
        if request.raw_path == ECHO_PATH and request.method.upper() == "POST":
            return self._echo(request)
        if request.raw_path != SWEEP_PATH or self._sweep is None:
            raise GatewayError(404, "not_found", f"no route for {request.raw_path}")
        if request.method.upper() != "POST":
            error = GatewayError(
                405,
                "method_not_allowed",
                f"{request.method.upper()} is not allowed on {SWEEP_PATH}",
                details={"allowed": ["POST"]},
            )
            error.headers["allow"] = "POST"
            raise error
        claims = authenticate(request.header("authorization"), self.config.tenant_claim)
        event = self._sweep_event(request.body, claims[self.config.tenant_claim])
        result = self._invoke(self._sweep.name, event)
        try:
            return HttpResponse.json(200, result)
        except (TypeError, ValueError) as exc:
            raise GatewayError(500, "internal_error", f"the sweep returned no JSON: {exc}") from exc

    @staticmethod
    def _echo(request: HttpRequest) -> HttpResponse:
        """A stand-in ``http`` tool for local tries: answers what it was asked.

        ``examples/tools.json`` points its tools here, so approvals can be tried
        without a tool server of one's own.
        """
        try:
            payload = json.loads(request.body or b"{}")
        except (UnicodeDecodeError, ValueError) as exc:
            raise GatewayError(400, "invalid_request", "the body is not JSON") from exc
        if not isinstance(payload, dict):
            raise GatewayError(400, "invalid_request", "the body is not a JSON object")
        return HttpResponse.json(
            200,
            {
                "tool": payload.get("tool"),
                "arguments": payload.get("arguments"),
                "idempotency_key": request.header("idempotency-key"),
            },
        )

    def _sweep_event(self, body: bytes, tenant: str) -> dict[str, Any]:
        """A scheduled event, or the on-demand form when the body names conversations."""
        if not body.strip():
            payload: Any = {}
        else:
            try:
                payload = json.loads(body)
            except (UnicodeDecodeError, ValueError) as exc:
                raise GatewayError(400, "invalid_request", "the body is not JSON") from exc
        if not isinstance(payload, dict):
            raise GatewayError(400, "invalid_request", "the body is not a JSON object")
        ids = payload.get("conversation_ids")
        if ids is None:
            assert self._sweep is not None
            return scheduled_event(f"local-{self._sweep.name}", region=self.config.region)
        if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
            raise GatewayError(
                422,
                "validation_error",
                "conversation_ids must be a list of strings",
                details={"field": "conversation_ids"},
            )
        return {"conversation_ids": ids, "tenant": tenant}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    runner: LocalRunner


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "turnledger-local"

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = do_GET

    def _dispatch(self) -> None:
        try:
            request = self._read_request()
        except GatewayError as exc:
            self._write(exc.to_response())
            return
        self._write(self.server.runner.handle(request))

    def _read_request(self) -> HttpRequest:
        target = urlsplit(self.path)
        body = self._read_body()
        return HttpRequest(
            method=self.command,
            raw_path=target.path,
            raw_query=target.query,
            headers=tuple((name, value) for name, value in self.headers.items()),
            body=body,
            source_ip=self.client_address[0],
            protocol=self.request_version,
        )

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked()
        raw_length = self.headers.get("content-length", "0") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise GatewayError(400, "invalid_request", "bad Content-Length") from None
        if length < 0:
            self.close_connection = True
            raise GatewayError(400, "invalid_request", "bad Content-Length")
        if length > MAX_BODY_BYTES:
            self._discard(length)
            raise _too_large()
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise GatewayError(400, "invalid_request", "bad chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in {b"\r\n", b"\n", b""}:
                    pass  # trailers
                break
            total += size
            if total > _DRAIN_LIMIT_BYTES:
                self.close_connection = True
                raise _too_large()
            if total > MAX_BODY_BYTES:
                self._discard(size)
                chunks.clear()
            else:
                chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)
        if total > MAX_BODY_BYTES:
            raise _too_large()
        return b"".join(chunks)

    def _discard(self, length: int) -> None:
        # Reading the body keeps the connection usable and lets the client, still
        # sending, receive the answer instead of a reset. Past a sane size the
        # connection is dropped instead.
        if length > _DRAIN_LIMIT_BYTES:
            self.close_connection = True
            return
        remaining = length
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                break
            remaining -= len(chunk)

    def _write(self, response: HttpResponse) -> None:
        self.send_response(response.status)
        for name, value in response.headers:
            if name.lower() not in {"content-length", "connection", "transfer-encoding"}:
                self.send_header(name, value)
        self.send_header("content-length", str(len(response.body)))
        if self.close_connection:
            self.send_header("connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.info("%s %s", self.address_string(), format % args)


def _too_large() -> GatewayError:
    return GatewayError(
        413,
        "payload_too_large",
        f"the request body is over API Gateway's {MAX_BODY_BYTES} bytes",
        details={"limit_bytes": MAX_BODY_BYTES},
    )
