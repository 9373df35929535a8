"""The local runner: the template's routes over HTTP, through the functions' own handlers.

Routes, authorizer exemptions, timeouts and memory sizes come from
``template.yaml``, and each route calls the ``lambda_handler`` of
``functions/<name>/app.py`` with the event API Gateway would send, so a local
run and a deployment cannot drift apart::

    with LocalRunner(LocalConfig(port=0)) as runner:
        httpx.post(f"{runner.url}/v1/conversations/c1/turns", ...)

Like Lambda, each execution environment handles one event at a time and
concurrent requests run in separate environments: worker processes, one pool
per function (``workers.py``). The front (this module) parses HTTP, matches
routes, authenticates and builds the events on its threads; it never runs a
handler itself. Workers share storage through its endpoints (the embedded moto
server is an HTTP server) and demo provider state through ``DEMO_STATE_DIR``.
An invocation that outruns its function's ``Timeout`` (or
``LocalConfig.function_timeout_seconds``) has its environment killed, as Lambda
does, and the client gets API Gateway's answer to it (:class:`FunctionTimedOut`).

Local-only routes: ``POST /_local/sweep`` invokes the scheduled function on
demand (it needs a local token like every API route), ``POST
/_local/provider/forget`` drops the ``demo-stateful`` provider's state (a token
too), ``POST /_local/echo`` is a stand-in tool endpoint that answers what it was sent,
and ``/_local/notifications`` takes the functions' notifications (``POST``, from this
machine) and lists the last ones of the caller's tenant (``GET``, a local token too),
and ``POST /_local/job`` with ``GET /_local/jobs`` is a sample job server for deferred
tools (:mod:`.jobs`). Lambda's Invoke API
(``POST /2015-03-31/functions/<name>/invocations``, loopback only) starts the turn
worker for long turns, as Lambda does deployed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import boto3
from turnledger.api.live import wants_stream
from turnledger.core.config import Settings
from turnledger.core.strict_json import BodyError, parse_object

from .embedded import EmbeddedStorage, StorageNames, provision, provision_keys
from .gateway import (
    MAX_BODY_BYTES,
    GatewayError,
    HttpRequest,
    HttpResponse,
    RouteTable,
    authenticate,
    build_event,
    scheduled_event,
    to_http,
)
from .jobs import JOB_PATH, JOBS_PATH, SampleJobs
from .template import (
    TEMPLATE_PATH,
    FunctionSpec,
    functions,
    load_template,
    routes,
    scheduled_function,
    streaming_function,
)
from .workers import (
    Boot,
    FunctionBoot,
    FunctionPool,
    InvocationFailed,
    InvocationTimedOut,
    WorkerError,
    Zygote,
)

# Not named after the package: Powertools' Logger(service="turnledger") filters out, at the
# root handlers, every record of a logger whose name contains "turnledger".
logger = logging.getLogger("local_runner")

#: The long turns' stream route, which the runner streams live as server-sent events.
LIVE_STREAM_SUFFIX = "/turns/{turn}/stream"
#: Each long poll the live stream makes (the route's own limit).
LIVE_POLL_WAIT_SECONDS = 20
#: The ``retry`` a live stream tells clients (milliseconds before reconnecting).
LIVE_RETRY_MS = 1000
#: The template's long-turn worker (invoked asynchronously through ``_LAMBDA_INVOKE``).
TURN_WORKER = "TurnWorkerFunction"
#: What a function the Lambda Web Adapter runs (``Handler: run.sh``) serves.
ADAPTED_HANDLER = "app.lambda_handler"
#: Lambda's Invoke API path, served for the template's functions.
_LAMBDA_INVOKE = re.compile(r"/2015-03-31/functions/(?P<name>[^/]+)/invocations")
#: A local stand-in tool endpoint (see ``_echo``).
ECHO_PATH = "/_local/echo"
#: Where the functions send approval notifications locally (POST), and where the last
#: :data:`NOTIFICATIONS_KEPT` of them are read (GET); see turnledger/ops/notifications.py.
NOTIFICATIONS_PATH = "/_local/notifications"
NOTIFICATIONS_KEPT = 100
SWEEP_PATH = "/_local/sweep"
#: Drops the ``demo-stateful`` provider's stored responses, so the next turn falls back.
FORGET_PATH = "/_local/provider/forget"
_LOCAL_PREFIX = "/_local/"
#: Every local-only route, as ``METHOD path`` (the docs' route lists name exactly these).
LOCAL_ROUTES = (
    f"POST {SWEEP_PATH}",
    f"POST {FORGET_PATH}",
    f"POST {ECHO_PATH}",
    f"GET {NOTIFICATIONS_PATH}",
    f"POST {NOTIFICATIONS_PATH}",
    f"POST {JOB_PATH}",
    f"GET {JOBS_PATH}",
)
#: In a tools file, stands for the runner's own base URL (``http://127.0.0.1:<port>``).
LOCAL_URL_PLACEHOLDER = "${LOCAL_URL}"
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

    ``None`` for a setting leaves the functions' own default (see ``turnledger/core/config.py``).
    """

    host: str = "127.0.0.1"
    #: ``0`` picks a free port (tests).
    port: int = 3000
    template_path: Path = TEMPLATE_PATH
    #: Where ``CodeUri`` paths start; default: the template's folder.
    project_root: Path | None = None
    ttl_seconds: int | None = None
    #: A tool registry; ``${LOCAL_URL}`` in it stands for this runner's base URL.
    tools_file: Path | None = None
    provider: str | None = None
    model: str | None = None
    #: External endpoints; each one left ``None`` is served by the embedded storage.
    dynamodb_endpoint: str | None = None
    s3_endpoint: str | None = None
    table: str = "turnledger"
    bucket: str = "turnledger-artifacts"
    tenant_claim: str = "tenant_id"
    region: str = "us-east-1"
    log_level: str = "WARNING"
    #: Print each invocation's CloudWatch metrics (EMF JSON) on standard output.
    print_metrics: bool = False
    #: False: start no storage and create nothing (runs whose handlers need none).
    provision_storage: bool = True
    #: Keep conversations in this folder (SQLite and payload files), surviving restarts;
    #: ``None``: in the DynamoDB table and bucket (embedded: gone when the runner stops).
    #: Idempotency records live with the conversations either way (the store's records).
    data_dir: Path | None = None
    #: The master key of ``data_dir``'s content (``None``: outside the folder, in the
    #: user's state folder; see :func:`turnledger.store.local_folder.local_master_key_file`).
    master_key_file: Path | None = None
    #: Execution environments (worker processes) per function; more requests queue.
    max_workers: int = 8
    #: Every function's timeout in seconds instead of its template ``Timeout`` (tests:
    #: a timeout met in seconds, not minutes); ``None``: each function's own.
    function_timeout_seconds: float | None = None
    #: Local-only, for tests: the functions read the current time from this file
    #: (``clock.ClockFile`` writes it).
    clock_file: Path | None = None
    #: Local-only, for tests: ``module:function`` called once before any environment
    #: starts (fault injection; see ``workers.py``).
    worker_hook: str | None = None
    #: Seconds the runner waits for each read of a request (its line, headers, a piece of
    #: its body) before it answers ``408`` and closes; also how long an idle connection
    #: is kept open between requests.
    read_timeout_seconds: float = 10.0
    #: Extra environment variables for the functions, applied last.
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """The folder ``CodeUri`` paths are relative to."""
        return self.project_root or self.template_path.resolve().parent


def _is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in {"127.0.0.1", "localhost", "::1"}


def _handler_source(root: Path, spec: FunctionSpec) -> tuple[Path, str]:
    handler = spec.handler
    if handler.endswith(".sh"):
        # The Lambda Web Adapter runs a script, whose server serves this handler
        # (turnledger/api/stream_server.py): the runner invokes the handler itself.
        handler = ADAPTED_HANDLER
    module_path, _, attribute = handler.rpartition(".")
    return root / spec.code_uri / (module_path.replace(".", "/") + ".py"), attribute


class LocalRunner:
    """Serves a template's HTTP API routes on a local port.

    ``start()`` prepares storage, starts the process the functions' environments
    are forked from and starts serving; ``stop()`` undoes all of it. Also a
    context manager. The runner never changes its own process's environment:
    :attr:`environment` is what the functions see.
    """

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._template = load_template(self.config.template_path)
        self._functions = functions(self._template)
        self._routes = RouteTable(routes(self._template))
        self._sweep = scheduled_function(self._template)
        self._streaming = streaming_function(self._template)
        self._storage: EmbeddedStorage | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._zygote: Zygote | None = None
        self._pools: dict[str, FunctionPool] = {}
        self._scratch: Path | None = None
        self._notifications: deque[Any] = deque(maxlen=NOTIFICATIONS_KEPT)
        self._jobs = SampleJobs()
        self.endpoints: dict[str, str] = {}
        #: The functions' environment variables (complete once started).
        self.environment: dict[str, str] = {}

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
        """Prepare storage, start the functions' process, start serving; returns the base URL.

        The handlers load in the background: the first request waits for them.

        Raises:
            OSError: the port is taken.
            botocore.exceptions.BotoCoreError: a storage endpoint cannot be reached.
            botocore.exceptions.ClientError: storage could not be provisioned.
            FileNotFoundError: a function's handler file is missing.
        """
        if self._server is not None:
            return self.url
        try:
            boots = self._function_boots()
            self._scratch = Path(tempfile.mkdtemp(prefix="turnledger-local-"))
            self.environment = self._base_environment()
            if self.config.provision_storage:
                self._start_storage()
            server = _Server((self.config.host, self.config.port), _RequestHandler)
            server.runner = self
            self._server = server
            self.environment.update(self._local_files())
            self.environment["NOTIFICATIONS_LOCAL_URL"] = self.url + NOTIFICATIONS_PATH
            self.environment.update(self.config.env)
            if self.config.data_dir is not None:
                # Opened here first, by this process alone (the key file's journal mode).
                from turnledger.store.local_folder import prepare_local_store

                prepare_local_store(Settings.from_env(self.environment))
            self._start_workers(boots)
            self._serve(server)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop serving, stop the functions' processes and embedded storage, remove scratch."""
        self._jobs.stop()
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
        if self._server is not None:
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None
        for pool in self._pools.values():
            pool.close()
        self._pools = {}
        if self._zygote is not None:
            self._zygote.stop()
            self._zygote = None
        if self._storage is not None:
            self._storage.stop()
            self._storage = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self.endpoints = {}

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

    def _function_boots(self) -> list[FunctionBoot]:
        wanted = {route.function for route in routes(self._template)}
        if self._sweep is not None:
            wanted.add(self._sweep.name)
        if TURN_WORKER in self._functions:
            wanted.add(TURN_WORKER)  # invoked through the Lambda Invoke API path below
        if self._streaming is not None:
            wanted.add(self._streaming.name)  # streamed answers (:meth:`streamed`)
        boots: list[FunctionBoot] = []
        for name in sorted(wanted):
            spec = self._functions[name]
            source, attribute = _handler_source(self.config.root, spec)
            if not source.is_file():
                raise FileNotFoundError(f"{name}: no handler file {source}")
            boots.append(
                FunctionBoot(
                    name=name,
                    source=str(source),
                    attribute=attribute,
                    memory_mb=spec.memory_mb,
                    timeout_seconds=self.timeout_of(name),
                    region=self.config.region,
                )
            )
        return boots

    def _base_environment(self) -> dict[str, str]:
        cfg = self.config
        env = dict(os.environ)
        env.update(
            {
                "TABLE_NAME": cfg.table,
                "BUCKET_NAME": cfg.bucket,
                "TENANT_CLAIM": cfg.tenant_claim,
                "POWERTOOLS_SERVICE_NAME": "turnledger",
                "POWERTOOLS_METRICS_NAMESPACE": "turnledger",
                "POWERTOOLS_TRACE_DISABLED": "true",
                "POWERTOOLS_METRICS_DISABLED": "false" if cfg.print_metrics else "true",
                "POWERTOOLS_LOG_LEVEL": cfg.log_level,
                "LOG_LEVEL": cfg.log_level,
                "AWS_DEFAULT_REGION": cfg.region,
                "AWS_REGION": cfg.region,
            }
        )
        optional = {
            "TTL_SECONDS": None if cfg.ttl_seconds is None else str(cfg.ttl_seconds),
            "PROVIDER": cfg.provider,
            "MODEL": cfg.model,
            "TOOLS_FILE": None if cfg.tools_file is None else str(cfg.tools_file.resolve()),
            "STORE": None if cfg.data_dir is None else "sqlite",
            "DATA_DIR": None if cfg.data_dir is None else str(cfg.data_dir.resolve()),
            "MASTER_KEY_FILE": None
            if cfg.master_key_file is None
            else str(cfg.master_key_file.expanduser().resolve()),
        }
        env.update({name: value for name, value in optional.items() if value is not None})
        return env

    def _local_files(self) -> dict[str, str]:
        """Scratch the runner owns: demo provider state, the tools file with its own URL."""
        assert self._scratch is not None
        state = self._scratch / "demo-state"
        state.mkdir()
        files = {"DEMO_STATE_DIR": str(state), **self._callback_settings()}
        if TURN_WORKER in self._functions:
            # Long turns: the functions start the worker through Lambda's Invoke API,
            # which this runner serves (``_lambda_invoke``), as Lambda would run it.
            files["TURN_WORKER_FUNCTION"] = TURN_WORKER
            # Its own variable: Lambda tools keep whatever Lambda endpoint they are given.
            files["TURN_WORKER_ENDPOINT"] = self.url
        tools = self.config.tools_file
        if tools is not None and tools.is_file():
            text = tools.read_text(encoding="utf-8")
            if LOCAL_URL_PLACEHOLDER in text:
                resolved = self._scratch / "tools.json"
                resolved.write_text(text.replace(LOCAL_URL_PLACEHOLDER, self.url), "utf-8")
                files["TOOLS_FILE"] = str(resolved)
        return files

    def _callback_settings(self) -> dict[str, str]:
        """The callback signing key and public base URL of deferred tools' callback_url.

        With ``--data-dir`` the key is kept in ``callback.key`` there (callbacks of
        jobs still running survive a restart); otherwise a new one per run. Either
        can be overridden through the process environment or ``env``.
        """
        settings = {"PUBLIC_BASE_URL": os.environ.get("PUBLIC_BASE_URL") or self.url}
        if os.environ.get("CALLBACK_KEY") or "CALLBACK_KEY" in self.config.env:
            return settings
        key = secrets.token_hex(32)
        if self.config.data_dir is not None:
            path = self.config.data_dir / "callback.key"
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_file():
                key = path.read_text(encoding="ascii").strip()
            else:
                # Written whole and readable by the owner only: it signs credentials.
                handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(handle, "w", encoding="ascii") as out:
                    out.write(key)
        return {**settings, "CALLBACK_KEY": key}

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
            self.environment.update(_FAKE_CREDENTIALS)
        self.endpoints = {"dynamodb": dynamodb, "s3": s3}
        self.environment.update(
            {
                "DYNAMODB_ENDPOINT": dynamodb,
                "S3_ENDPOINT": s3,
                # So that clients the functions do not build themselves reach the same storage.
                "AWS_ENDPOINT_URL_DYNAMODB": dynamodb,
                "AWS_ENDPOINT_URL_S3": s3,
            }
        )
        created = provision(
            self._template,
            StorageNames(cfg.table, cfg.bucket),
            dynamodb_endpoint=dynamodb,
            s3_endpoint=s3,
            region=cfg.region,
            credentials=self._credentials(),
        )
        if created:
            logger.info("created %s", ", ".join(created))
        if all_embedded:
            # Content sealed as deployed: wrapped keys in their own table, tenant keys from
            # moto's KMS on the same server (the SQLite store keeps a key file instead).
            keys_table = f"{cfg.table}-keys"
            key_id = provision_keys(
                self._template,
                keys_table,
                endpoint=dynamodb,
                region=cfg.region,
                credentials=self._credentials(),
            )
            self.environment.update(
                {
                    "KEYS_TABLE_NAME": keys_table,
                    "CONTENT_KMS_KEY_ID": key_id,
                    "KMS_ENDPOINT": dynamodb,
                }
            )

    def _credentials(self) -> dict[str, str] | None:
        env = self.environment
        if "AWS_ACCESS_KEY_ID" not in env or "AWS_SECRET_ACCESS_KEY" not in env:
            return None
        credentials = {
            "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        }
        if env.get("AWS_SESSION_TOKEN"):
            credentials["aws_session_token"] = env["AWS_SESSION_TOKEN"]
        return credentials

    def _start_workers(self, boots: list[FunctionBoot]) -> None:
        cfg = self.config
        package_root = str(Path(__file__).resolve().parents[2])
        environment = dict(self.environment)
        # The functions' process imports turnledger from where this process does.
        environment["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [environment.get("PYTHONPATH")])]
        )
        boot = Boot(
            functions=tuple(boots),
            sys_path=tuple(entry for entry in sys.path if entry),
            log_level=cfg.log_level,
            clock_file=None if cfg.clock_file is None else str(cfg.clock_file.resolve()),
            hook=cfg.worker_hook,
        )
        self._zygote = Zygote(boot, environment)
        self._zygote.start()
        self._pools = {
            item.name: FunctionPool(item.name, self._zygote, cfg.max_workers) for item in boots
        }

    def _serve(self, server: _Server) -> None:
        # A short poll keeps stop() quick; shutdown waits for the loop's next poll.
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="turnledger-local",
            daemon=True,
        )
        thread.start()
        # Only a running loop may be shut down: shutdown() waits for the loop to answer.
        self._thread = thread

    def timeout_of(self, function: str) -> float:
        """Seconds an invocation of ``function`` may run before it is stopped: its
        template ``Timeout``, or :attr:`LocalConfig.function_timeout_seconds`."""
        override = self.config.function_timeout_seconds
        return self._functions[function].timeout_seconds if override is None else override

    def pool_sizes(self) -> dict[str, int]:
        """How many execution environments each function has now."""
        return {name: pool.size for name, pool in self._pools.items()}

    # -- requests --------------------------------------------------------------------

    def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one request the way the deployed API would.

        Never raises: a failing function is a ``500 internal_error``.
        """
        try:
            if request.raw_path.startswith(_LOCAL_PREFIX):
                return self._local(request)
            invoked = _LAMBDA_INVOKE.fullmatch(request.raw_path)
            if invoked is not None and request.method.upper() == "POST":
                return self._lambda_invoke(unquote(invoked["name"]), request)
            route, path_parameters = self._routes.resolve(request.method, request.raw_path)
            claims = (
                authenticate(
                    request.header("authorization"), self.config.tenant_claim, self._approver()
                )
                if route.authorized
                else None
            )
            event = build_event(request, route, path_parameters, claims)
            return to_http(self._invoke(route.function, event))
        except GatewayError as exc:
            return exc.to_response(request.raw_path)

    def _approver(self) -> tuple[str, str] | None:
        """The claim and value the functions require to decide approvals (``None``: none),
        which the local identity carries (:func:`.gateway.authenticate`)."""
        defaults = Settings()
        scope = self.environment.get("APPROVER_SCOPE", defaults.approver_scope).strip()
        claim = self.environment.get("APPROVER_CLAIM") or defaults.approver_claim
        return (claim, scope) if scope else None

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        """Run ``event`` in an environment of ``function``, stopped at its timeout.

        Raises:
            FunctionTimedOut: the invocation outran its timeout (its environment is gone).
            GatewayError: ``500 internal_error`` for a handler that raised or died.
        """
        pool = self._pools.get(function)
        if pool is None:
            raise GatewayError(500, "internal_error", "the runner is stopped")
        try:
            return pool.invoke(event, self.timeout_of(function))
        except InvocationFailed as exc:
            raise GatewayError(
                500, "internal_error", f"{function} failed: {exc.error_type}"
            ) from exc
        except InvocationTimedOut as exc:
            logger.error("%s", exc)
            raise FunctionTimedOut(exc.timeout_seconds) from exc
        except WorkerError as exc:
            logger.error("%s: %s", function, exc)
            raise GatewayError(500, "internal_error", f"{function} failed: {exc}") from exc

    def live_events(self, request: HttpRequest) -> HttpResponse | Iterator[bytes] | None:
        """Server-sent events of a long turn, written as the turn goes (``None``: not one).

        Deployed, API Gateway's HTTP API buffers a response whole, so the stream route's
        own SSE answer arrives when it ends. Here the runner plays a front door that
        passes streams through: for ``GET .../turns/{n}/stream`` with ``Accept:
        text/event-stream`` it long-polls the route's JSON form through the function
        (as any client could) and writes each chunk as an event at once, until the
        turn ends or the client goes away. ``Last-Event-ID`` (or ``after``) says where
        to start. An error answer of the first poll is returned as it is.
        """
        if request.method.upper() != "GET" or "text/event-stream" not in (
            request.header("accept") or ""
        ):
            return None
        try:
            route, path_parameters = self._routes.resolve(request.method, request.raw_path)
        except GatewayError:
            return None
        if not route.path.endswith(LIVE_STREAM_SUFFIX):
            return None
        try:
            claims = authenticate(
                request.header("authorization"), self.config.tenant_claim, self._approver()
            )
        except GatewayError as exc:
            return exc.to_response()
        query = dict(parse_qsl(request.raw_query))
        last_event_id = request.header("last-event-id")
        after = last_event_id if last_event_id is not None else query.get("after", "0")

        def poll(after: str) -> HttpResponse:
            kept = [
                (name, value)
                for name, value in request.headers
                if name.lower() not in {"accept", "last-event-id"}
            ]
            headers = (*kept, ("accept", "application/json"))
            polled = replace(
                request,
                headers=headers,
                raw_query=urlencode({"after": after, "wait": LIVE_POLL_WAIT_SECONDS}),
            )
            event = build_event(polled, route, path_parameters, claims)
            return to_http(self._invoke(route.function, event))

        try:
            first = poll(after)
        except GatewayError as exc:
            return exc.to_response()
        if first.status != 200:
            return first

        def events() -> Iterator[bytes]:
            # ``retry`` rides on the first event: a block of its own would reach some
            # clients as an empty message.
            retry = f"retry: {LIVE_RETRY_MS}\n"
            page = first
            while True:
                body = json.loads(page.body)
                for chunk in body["chunks"]:
                    data = json.dumps({"seq": chunk["seq"], "text": chunk["text"]})
                    yield f"{retry}id: {chunk['seq']}\nevent: chunk\ndata: {data}\n\n".encode()
                    retry = ""
                if body["done"]:
                    end = json.dumps({k: body[k] for k in ("status", "reason", "result")})
                    yield f"{retry}id: {body['next_after']}\nevent: done\ndata: {end}\n\n".encode()
                    return
                try:
                    page = poll(str(body["next_after"]))
                except GatewayError:
                    return  # the function failed or the runner stops: the client reconnects
                if page.status != 200:
                    return  # the conversation went away meanwhile: the client reconnects

        return events()

    def streamed(self, request: HttpRequest) -> HttpResponse | Streamed | None:
        """A streamed answer, written as the streaming function writes it (``None``: the
        request is not one it answers, :func:`turnledger.api.live.wants_stream`).

        Deployed, a client sends these requests to the streaming function's URL, in
        ``RESPONSE_STREAM`` mode; here they come to the same port and paths as the rest of
        the API, are routed and authenticated as the API's route of the same path is, and
        the event goes to the template's streaming function instead of that route's.
        """
        if self._streaming is None:
            return None
        headers = {name.lower(): value for name, value in request.headers}
        if not wants_stream(request.method, request.raw_path, headers, request.body):
            return None
        try:
            route, path_parameters = self._routes.resolve(request.method, request.raw_path)
            claims = (
                authenticate(
                    request.header("authorization"), self.config.tenant_claim, self._approver()
                )
                if route.authorized
                else None
            )
            event = build_event(request, route, path_parameters, claims)
            pool = self._pools.get(self._streaming.name)
            if pool is None:
                raise GatewayError(500, "internal_error", "the runner is stopped")
            pieces = pool.invoke_stream(event, self.timeout_of(self._streaming.name))
            head = next(pieces)
        except GatewayError as exc:
            return exc.to_response(request.raw_path)
        except (WorkerError, InvocationFailed, StopIteration) as exc:
            logger.error("%s: %s", self._streaming.name, exc)
            error = GatewayError(500, "internal_error", f"{self._streaming.name} failed")
            return error.to_response(request.raw_path)
        if not isinstance(head, dict):
            raise TypeError("a streamed answer starts with its head")
        status = int(head.get("statusCode") or 500)
        answer_headers = [(str(k), str(v)) for k, v in (head.get("headers") or {}).items()]
        return Streamed(status, answer_headers, _body_of(pieces, self._streaming.name))

    def _lambda_invoke(self, name: str, request: HttpRequest) -> HttpResponse:
        """Lambda's Invoke API for the template's own functions (the turn worker).

        ``X-Amz-Invocation-Type: Event`` answers ``202`` at once and runs the function
        in the background, in its own execution environment, as Lambda's event queue
        would (without its retries); otherwise the function's result is the answer.
        Either way the invocation is stopped at the function's timeout, as Lambda would.
        Only loopback clients may call it: an event names its tenant itself.
        """
        if request.source_ip not in {"127.0.0.1", "::1"}:
            # The functions call it from this machine; an event names any tenant, so no
            # other host may send one (the runner may listen on 0.0.0.0).
            error = {"Type": "User", "message": "Lambda's Invoke API is served to loopback only"}
            return HttpResponse.json(
                403, error, headers={"x-amzn-errortype": "AccessDeniedException"}
            )
        function = name.rsplit(":", 1)[-1]
        if function not in self._pools:
            error = {"Type": "User", "message": f"Function not found: {name}"}
            return HttpResponse.json(
                404, error, headers={"x-amzn-errortype": "ResourceNotFoundException"}
            )
        event = _json_object(request.body or b"{}")
        if (request.header("x-amz-invocation-type") or "RequestResponse") == "Event":
            thread = threading.Thread(
                target=self._invoke_in_background,
                args=(function, event),
                name=f"invoke-{function}",
                daemon=True,
            )
            thread.start()
            return HttpResponse(status=202)
        try:
            result = self._invoke(function, event)
        except GatewayError as exc:
            return HttpResponse.json(
                200,
                {"errorType": exc.code, "errorMessage": exc.message},
                headers={"x-amz-function-error": "Unhandled"},
            )
        return HttpResponse.json(200, result)

    def _invoke_in_background(self, function: str, event: dict[str, Any]) -> None:
        try:
            self._invoke(function, event)
        except GatewayError as exc:
            logger.error("%s (asynchronous invocation) failed: %s", function, exc.message)

    def _local(self, request: HttpRequest) -> HttpResponse:
        if request.raw_path == ECHO_PATH and request.method.upper() == "POST":
            return self._echo(request)
        if request.raw_path == NOTIFICATIONS_PATH and request.method.upper() in {"GET", "POST"}:
            return self._notifications_route(request)
        if request.raw_path in {JOB_PATH, JOBS_PATH}:
            return self._jobs.handle(request)
        known = {SWEEP_PATH, FORGET_PATH} if self._sweep is not None else {FORGET_PATH}
        if request.raw_path not in known:
            raise GatewayError(404, "not_found", f"no route for {request.raw_path}")
        if request.method.upper() != "POST":
            error = GatewayError(
                405,
                "method_not_allowed",
                f"{request.method.upper()} is not allowed on {request.raw_path}",
                details={"allowed": ["POST"]},
            )
            error.headers["allow"] = "POST"
            raise error
        claims = authenticate(
            request.header("authorization"), self.config.tenant_claim, self._approver()
        )
        if request.raw_path == FORGET_PATH:
            return self._forget()
        assert self._sweep is not None
        event = self._sweep_event(request.body, claims[self.config.tenant_claim])
        result = self._invoke(self._sweep.name, event)
        try:
            return HttpResponse.json(200, result)
        except (TypeError, ValueError) as exc:
            raise GatewayError(500, "internal_error", f"the sweep returned no JSON: {exc}") from exc

    def _forget(self) -> HttpResponse:
        """Drop every response ``demo-stateful`` keeps (shared by all workers through
        ``DEMO_STATE_DIR``): the next turn that expected one answers ``fallback``."""
        from turnledger.providers.demo_stateful import demo_state_store

        state = demo_state_store(self.environment.get("DEMO_STATE_DIR"))
        return HttpResponse.json(200, {"forgotten": state.clear()})

    def _notifications_route(self, request: HttpRequest) -> HttpResponse:
        """Keep (and print) one notification the functions sent, or list the caller's
        tenant's kept ones, newest last: the local stand-in for the deployment's
        EventBridge bus. Listing needs a local token, as ``/_local/sweep`` does; only
        this machine (where the functions run) may send one."""
        if request.method.upper() == "GET":
            claims = authenticate(
                request.header("authorization"), self.config.tenant_claim, self._approver()
            )
            tenant = claims[self.config.tenant_claim]
            kept = [note for note in self._notifications if _tenant_of(note) == tenant]
            return HttpResponse.json(200, {"notifications": kept})
        if request.source_ip not in {"127.0.0.1", "::1"}:
            raise GatewayError(
                403, "forbidden", "notifications are taken from this machine's functions only"
            )
        note = _json_object(request.body or b"{}")
        self._notifications.append(note)
        raw = note.get("detail")
        detail: dict[str, Any] = raw if isinstance(raw, dict) else {}
        print(
            f"notification {note.get('detail-type')}: {detail.get('tenant')}/"
            f"{detail.get('conversation_id')} {detail.get('call_id')} {detail.get('tool')}",
            flush=True,
        )
        return HttpResponse.json(202, {"kept": len(self._notifications)})

    @staticmethod
    def _echo(request: HttpRequest) -> HttpResponse:
        """A stand-in ``http`` tool for local tries: answers what it was asked.

        ``events/local-tools.json`` points its tools here, so approvals can be tried
        without a tool server of one's own.
        """
        payload = _json_object(request.body or b"{}")
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
        payload = _json_object(body) if body.strip() else {}
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


@dataclass(frozen=True)
class Streamed:
    """An answer whose body is written as it comes."""

    status: int
    headers: list[tuple[str, str]]
    body: Generator[bytes]


def _body_of(pieces: Generator[dict[str, Any] | bytes], function: str) -> Generator[bytes]:
    """The body pieces of a streaming invocation; a failure mid-answer ends it (the
    client sees the stream end early and resumes from the draft)."""
    try:
        for piece in pieces:
            if isinstance(piece, bytes):
                yield piece
    except (WorkerError, InvocationFailed) as exc:
        logger.error("%s failed mid-answer: %s", function, exc)
    finally:
        pieces.close()  # a client gone early: the invocation still runs to its end


class FunctionTimedOut(GatewayError):
    """An invocation outran its function's timeout and was stopped.

    Over HTTP it is what an HTTP API answers when its Lambda integration times out:
    ``500`` with ``{"message": "Internal Server Error"}`` (not the contract's error
    shape: API Gateway, not the function, answers). Through Lambda's Invoke API it is
    the function error Lambda reports, ``Sandbox.Timedout``.
    """

    def __init__(self, timeout_seconds: float) -> None:
        super().__init__(
            500, "Sandbox.Timedout", f"Task timed out after {timeout_seconds:.2f} seconds"
        )

    def to_response(self, path: str = "") -> HttpResponse:
        """API Gateway's own answer to a Lambda integration that timed out (on any path)."""
        return HttpResponse.json(500, {"message": "Internal Server Error"})


def _tenant_of(note: dict[str, Any]) -> str | None:
    """The tenant a kept notification is about (``detail.tenant``)."""
    detail = note.get("detail")
    tenant = detail.get("tenant") if isinstance(detail, dict) else None
    return tenant if isinstance(tenant, str) else None


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        return parse_object(body)
    except BodyError as exc:
        raise GatewayError(400, "invalid_request", str(exc), details=exc.details) from exc


#: Connections the kernel holds before they are accepted (``listen``'s backlog; the
#: standard library's default is 5, and a burst of clients beyond it is reset). Linux caps
#: it at ``net.core.somaxconn`` (4096 by default). Accepted requests wait for an execution
#: environment in their function's queue (``FunctionPool``), which has no bound.
LISTEN_BACKLOG = 1024


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    runner: LocalRunner

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (before its answer was written, or mid-request) is one
        log line; anything else keeps the standard library's traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            host, port = client_address[:2]
            logger.warning(
                "%s:%s hung up before its answer was written (%s)",
                host,
                port,
                type(error).__name__,
            )
            return
        super().handle_error(request, client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "turnledger-local"

    def setup(self) -> None:
        super().setup()
        # Bounds every read of the connection: a client that stops sending holds its
        # thread no longer than this (``handle_one_request`` closes an idle one).
        self.connection.settimeout(self.server.runner.config.read_timeout_seconds)

    def __getattr__(self, name: str) -> Any:
        # Every method reaches the route table (``do_GET``, ``do_TRACE``, ``do_BREW``...): a
        # known path answers 405 with ``Allow`` for a method it lacks, as JSON, never the
        # standard library's HTML 501.
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a request line or headers it cannot parse,
        such as a raw space in a path) in the API's JSON error shape, not its HTML page."""
        self.close_connection = True
        error = GatewayError(code, *_MALFORMED.get(code, _MALFORMED[400]))
        self._write(error.to_response())

    def _dispatch(self) -> None:
        try:
            request = self._read_request()
        except GatewayError as exc:
            self._write(exc.to_response(urlsplit(self.path).path))
            return
        streamed = self.server.runner.streamed(request)
        if isinstance(streamed, Streamed):
            self._write_streamed(streamed)
            return
        if streamed is not None:
            self._write(streamed)
            return
        live = self.server.runner.live_events(request)
        if isinstance(live, HttpResponse):
            self._write(live)
        elif live is not None:
            self._write_live(live)
        else:
            self._write(self.server.runner.handle(request))

    def _write_streamed(self, answer: Streamed) -> None:
        """Write each piece as the function writes it; the connection ends with the answer."""
        self.close_connection = True
        self.send_response(answer.status)
        for name, value in answer.headers:
            if name.lower() not in {"content-length", "connection", "transfer-encoding"}:
                self.send_header(name, value)
        self.send_header("connection", "close")
        self.end_headers()
        body = answer.body
        try:
            for piece in body:
                self.wfile.write(piece)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away: the turn runs on (it resumes with Last-Event-ID);
            # closing the body lets the function finish before its environment is reused.
            pass
        finally:
            body.close()

    def _write_live(self, events: Iterator[bytes]) -> None:
        """Write server-sent events as they come; the connection ends with the stream."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        try:
            for piece in events:
                self.wfile.write(piece)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away: it resumes with Last-Event-ID

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
        try:
            return self._framed_body()
        except TimeoutError:
            self.close_connection = True
            seconds = self.server.runner.config.read_timeout_seconds
            raise GatewayError(
                408,
                "request_timeout",
                f"the request body stalled: nothing arrived for {seconds:g} seconds",
                details={"read_timeout_seconds": seconds},
            ) from None

    def _framed_body(self) -> bytes:
        """The body as its one ``Content-Length`` or ``Transfer-Encoding: chunked`` frames it.

        Two lengths, or a length and a coding, would let a proxy in front and this server
        split the stream differently (request smuggling): refused, and the connection
        closed, as is every refusal after which the rest of the stream cannot be trusted.
        """
        lengths = self.headers.get_all("content-length") or []
        codings = self.headers.get_all("transfer-encoding") or []
        if len(lengths) + len(codings) > 1:
            self.close_connection = True
            raise GatewayError(
                400,
                "invalid_request",
                "the body's length is given more than once (Content-Length, Transfer-Encoding)",
            )
        if codings:
            if codings[0].strip().lower() != "chunked":
                self.close_connection = True
                raise GatewayError(
                    400, "invalid_request", "the only Transfer-Encoding taken is chunked"
                )
            return self._read_chunked()
        raw_length = lengths[0].strip() if lengths else "0"
        if not raw_length.isascii() or not raw_length.isdigit():
            self.close_connection = True
            raise GatewayError(400, "invalid_request", "bad Content-Length")
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            self._discard(length)
            raise _too_large()
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        try:
            return self._chunks()
        except GatewayError:
            # Where the refused body ends is unknown (or not worth reading to): what
            # follows on the connection cannot be taken for a next request.
            self.close_connection = True
            raise

    def _chunks(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise GatewayError(400, "invalid_request", "bad chunked body") from None
            if size < 0:
                raise GatewayError(400, "invalid_request", "bad chunked body")
            if size == 0:
                while self.rfile.readline(1024) not in {b"\r\n", b"\n", b""}:
                    pass  # trailers
                break
            total += size
            if total > _DRAIN_LIMIT_BYTES:
                raise _too_large()
            if total > MAX_BODY_BYTES:
                # Read and dropped, so that the client, still sending, gets the answer.
                self._discard(size)
                chunks.clear()
            else:
                chunks.append(self.rfile.read(size))
            if self.rfile.readline(1024) not in {b"\r\n", b"\n"}:
                raise GatewayError(
                    400, "invalid_request", "bad chunked body: a chunk is longer than its size"
                )
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


#: The code and message of each refusal ``http.server`` makes before a request is routed.
_MALFORMED = {
    400: (
        "invalid_request",
        "the request line or a header is malformed (a path must not hold a raw space: "
        "send it as %20)",
    ),
    414: ("request_line_too_long", "the request line is too long"),
    431: ("headers_too_large", "the request's headers are too many or too long"),
    505: ("http_version_not_supported", "the HTTP version is not supported (HTTP/1.0 or 1.1)"),
}


def _too_large() -> GatewayError:
    return GatewayError(
        413,
        "payload_too_large",
        f"the request body is over API Gateway's {MAX_BODY_BYTES} bytes",
        details={"limit_bytes": MAX_BODY_BYTES},
    )
