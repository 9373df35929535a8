"""Execution environments for the local runner: one process per environment, like Lambda.

Lambda runs each invocation in an execution environment that handles one event
at a time; concurrent invocations run in separate environments. Module-level
state (Powertools' resolver keeps the current event on itself) is therefore
never shared by two events. The local runner keeps that model::

    front (the runner's HTTP threads)
      └─ FunctionPool per function ── Worker (a process: one event at a time)
                                          ▲ forked from
      Zygote: one process that imported every function's handler module (the INIT phase)

The zygote starts with the functions' environment, imports each handler once
and then only forks: a new environment costs a fork, not an interpreter start
and the imports. A pool hands an event to an idle worker of its function,
forks another one while fewer than its limit exist, and queues the event
beyond. Storage is shared through the endpoints in the environment (the
embedded moto server is an HTTP server), never through process memory.

The process side runs as ``python -m turnledger_local.workers FD``; its boot
message (handlers, ``sys.path``, optional clock file and hook) arrives on
standard input. POSIX only (fork and descriptor passing).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Generator, Mapping
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from .gateway import LambdaContext

# Not named after the package: Powertools' Logger(service="turnledger") filters out, at the
# root handlers, every record of a logger whose name contains "turnledger".
logger = logging.getLogger("local_runner")

Handler = Callable[[dict[str, Any], Any], Any]
#: What a streaming invocation yields: its head (``statusCode``, ``headers``), then pieces.
Answer = dict[str, Any] | bytes

#: How long the zygote may take to import the handlers before a request gives up on it.
BOOT_TIMEOUT_SECONDS = 120.0


class WorkerError(Exception):
    """An environment could not be started, or died while it handled an event."""


class InvocationTimedOut(WorkerError):
    """The event outran its function's timeout: the environment was killed, like Lambda's."""

    def __init__(self, function: str, timeout_seconds: float) -> None:
        super().__init__(f"{function}: task timed out after {timeout_seconds:.2f} seconds")
        self.timeout_seconds = timeout_seconds


class InvocationFailed(Exception):
    """The handler raised: Lambda reports an unhandled error (the runner answers 500)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type


@dataclass(frozen=True)
class FunctionBoot:
    """What an environment of one function needs to load and invoke its handler."""

    name: str
    #: The handler's source file and attribute (``functions/turn/app.py``, ``lambda_handler``).
    source: str
    attribute: str
    memory_mb: int
    #: What the Lambda context reports; the front stops an event after as long.
    timeout_seconds: float
    region: str


@dataclass(frozen=True)
class Boot:
    """The zygote's boot message."""

    functions: tuple[FunctionBoot, ...]
    #: The runner's ``sys.path``, so hooks and handlers import what the runner can.
    sys_path: tuple[str, ...]
    log_level: str = "WARNING"
    #: Local-only: the functions read the current time from this file (see ``clock.py``).
    clock_file: str | None = None
    #: ``module:function`` called once in the zygote after the handlers are loaded.
    hook: str | None = None

    def to_json(self) -> bytes:
        """The message as JSON."""
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Boot:
        """Parse :meth:`to_json`'s output."""
        data = json.loads(raw)
        return cls(
            functions=tuple(FunctionBoot(**item) for item in data["functions"]),
            sys_path=tuple(data["sys_path"]),
            log_level=data["log_level"],
            clock_file=data["clock_file"],
            hook=data["hook"],
        )


# --- the front: zygote client, workers and pools ---------------------------------------------


class Zygote:
    """The process every environment is forked from (started by :meth:`start`)."""

    def __init__(self, boot: Boot, environment: Mapping[str, str]) -> None:
        self._boot = boot
        self._environment = dict(environment)
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._replies: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._ready = False
        self._errors: dict[str, str] = {}
        self._pids: set[int] = set()

    def start(self) -> None:
        """Start the process; it imports the handlers while the caller goes on."""
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "turnledger_local.workers", str(theirs.fileno())],
                stdin=subprocess.PIPE,
                env=self._environment,
                pass_fds=[theirs.fileno()],
                close_fds=True,
                # Its own process group: Ctrl-C reaches the runner, which stops everything.
                process_group=0,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        assert self._process.stdin is not None
        self._process.stdin.write(self._boot.to_json())
        self._process.stdin.close()
        self._control = ours
        self._replies = ours.makefile("rb")

    def _wait_ready(self) -> None:
        if self._ready:
            return
        assert self._control is not None and self._replies is not None
        self._control.settimeout(BOOT_TIMEOUT_SECONDS)
        try:
            line = self._replies.readline()
        except OSError as exc:
            raise WorkerError(f"the functions did not load: {exc}") from exc
        finally:
            self._control.settimeout(None)
        if not line.startswith(b"ready "):
            raise WorkerError("the functions' process exited while loading them")
        self._errors = json.loads(line.removeprefix(b"ready "))
        self._ready = True

    def spawn(self, function: str) -> Worker:
        """Fork a new environment of ``function``.

        Raises:
            WorkerError: the zygote is gone, or ``function``'s handler did not load.
        """
        with self._lock:
            if self._control is None:
                raise WorkerError("the runner is stopped")
            self._wait_ready()
            if function in self._errors:
                raise WorkerError(f"{function} did not load: {self._errors[function]}")
            assert self._replies is not None
            ours, theirs = socket.socketpair()
            try:
                socket.send_fds(self._control, [function.encode() + b"\n"], [theirs.fileno()])
                reply = self._replies.readline()
            except OSError as exc:
                ours.close()
                raise WorkerError(f"cannot start an environment of {function}: {exc}") from exc
            finally:
                theirs.close()
            if not reply.startswith(b"pid "):
                ours.close()
                raise WorkerError(f"cannot start an environment of {function}: {reply!r}")
            pid = int(reply.removeprefix(b"pid "))
            self._pids.add(pid)
            return Worker(function, pid, Connection(ours.detach()))

    def stop(self) -> None:
        """Stop the zygote; it stops every environment it forked."""
        with self._lock:
            control, self._control = self._control, None
            if self._replies is not None:
                self._replies.close()
                self._replies = None
            if control is not None:
                control.close()  # the zygote reads EOF: it stops its children and exits
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


class Worker:
    """One execution environment of one function, seen from the front."""

    def __init__(self, function: str, pid: int, connection: Connection) -> None:
        self.function = function
        self.pid = pid
        self._connection = connection

    def invoke(self, event: dict[str, Any], timeout_seconds: float) -> Any:
        """Run the handler on ``event`` in this environment; returns its result.

        After ``timeout_seconds`` the environment is killed, as Lambda stops a function
        at its timeout (its context reports the same deadline).

        Raises:
            InvocationFailed: the handler raised.
            InvocationTimedOut: the event outran ``timeout_seconds`` (the environment is gone).
            WorkerError: the environment died (it cannot be used again).
        """
        deadline = time.monotonic() + timeout_seconds
        message = {"event": event, "deadline": deadline}
        try:
            self._connection.send_bytes(json.dumps(message).encode())
            if not self._connection.poll(max(0.0, deadline - time.monotonic())):
                self.kill()
                raise InvocationTimedOut(self.function, timeout_seconds)
            answer = json.loads(self._connection.recv_bytes())
        except (EOFError, OSError) as exc:
            raise WorkerError(f"the environment of {self.function} died") from exc
        if "error" in answer:
            raise InvocationFailed(answer["error"], answer.get("message", ""))
        return answer["result"]

    def invoke_stream(self, event: dict[str, Any], timeout_seconds: float) -> Generator[Answer]:
        """Run a streaming handler on ``event`` (:func:`turnledger.api.live.streaming`); yields
        its head (a dict: ``statusCode``, ``headers``) and then each piece of its body as the
        handler writes it. Stopped at ``timeout_seconds``, as :meth:`invoke` is.

        Raises:
            InvocationFailed: the handler raised.
            InvocationTimedOut: the event outran ``timeout_seconds`` (the environment is gone).
            WorkerError: the environment died (it cannot be used again).
        """
        deadline = time.monotonic() + timeout_seconds
        message = {"event": event, "deadline": deadline}
        try:
            self._connection.send_bytes(json.dumps(message).encode())
            while True:
                if not self._connection.poll(max(0.0, deadline - time.monotonic())):
                    self.kill()
                    raise InvocationTimedOut(self.function, timeout_seconds)
                raw = self._connection.recv_bytes()
                kind, payload = raw[:1], raw[1:]
                if kind == b"P":
                    yield payload
                elif kind == b"H":
                    yield json.loads(payload)
                else:
                    end = json.loads(payload)
                    if "error" in end:
                        raise InvocationFailed(end["error"], end.get("message", ""))
                    return
        except (EOFError, OSError) as exc:
            raise WorkerError(f"the environment of {self.function} died") from exc

    def kill(self) -> None:
        """Stop the environment at once, whatever it is doing (its zygote reaps it)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Close the channel; an idle environment exits at once."""
        self._connection.close()


class FunctionPool:
    """The environments of one function: an idle one per event, a new one while below
    ``limit``, a queue beyond."""

    def __init__(self, function: str, zygote: Zygote, limit: int) -> None:
        if limit < 1:
            raise ValueError("a pool needs room for at least one environment")
        self.function = function
        self._zygote = zygote
        self._limit = limit
        self._idle: list[Worker] = []
        self._count = 0
        self._closed = False
        self._available = threading.Condition()

    @property
    def size(self) -> int:
        """How many environments exist (idle or busy)."""
        return self._count

    def invoke(self, event: dict[str, Any], timeout_seconds: float) -> Any:
        """Run ``event`` in an environment of its own for the time it runs, at most
        ``timeout_seconds`` (then that environment is killed; the next event gets a new one).

        Raises:
            InvocationFailed: the handler raised.
            InvocationTimedOut: the event outran ``timeout_seconds``.
            WorkerError: no environment could be started, or it died.
        """
        worker = self._acquire()
        try:
            result = worker.invoke(event, timeout_seconds)
        except WorkerError:
            self._discard(worker)
            raise
        except BaseException:
            self._release(worker)
            raise
        self._release(worker)
        return result

    def invoke_stream(self, event: dict[str, Any], timeout_seconds: float) -> Generator[Answer]:
        """As :meth:`invoke`, for a streaming handler (:meth:`Worker.invoke_stream`): its head,
        then its body's pieces as they come. The environment is this event's until the
        stream ends; a caller that stops reading early still waits for that end.

        Raises:
            InvocationFailed, InvocationTimedOut, WorkerError: as :meth:`invoke`.
        """
        worker = self._acquire()
        pieces = worker.invoke_stream(event, timeout_seconds)
        try:
            yield from pieces
        except WorkerError:
            self._discard(worker)
            raise
        except GeneratorExit:
            # The caller stopped reading (its client hung up): the handler runs on; the
            # environment is free once its answer ended, as Lambda's would be.
            try:
                for _ in pieces:
                    pass
            except WorkerError:
                self._discard(worker)
                raise
            except InvocationFailed:
                pass
            self._release(worker)
            raise
        except BaseException:
            self._release(worker)
            raise
        self._release(worker)

    def _acquire(self) -> Worker:
        with self._available:
            while True:
                if self._closed:
                    raise WorkerError("the runner is stopped")
                if self._idle:
                    # Most recently used first: the warmest environment, like Lambda's.
                    return self._idle.pop()
                if self._count < self._limit:
                    self._count += 1
                    break
                self._available.wait()
        try:
            return self._zygote.spawn(self.function)
        except BaseException:
            with self._available:
                self._count -= 1
                self._available.notify()
            raise

    def _release(self, worker: Worker) -> None:
        with self._available:
            if self._closed:
                worker.close()
                return
            self._idle.append(worker)
            self._available.notify()

    def _discard(self, worker: Worker) -> None:
        worker.close()
        with self._available:
            self._count -= 1
            self._available.notify()

    def close(self) -> None:
        """Close every idle environment; busy ones close when their event is done."""
        with self._available:
            self._closed = True
            idle, self._idle = self._idle, []
            self._available.notify_all()
        for worker in idle:
            worker.close()


# --- the process side: zygote and worker -----------------------------------------------------


def _load_handler(function: FunctionBoot) -> Handler:
    module_name = f"_turnledger_local_{function.name}"
    spec = importlib.util.spec_from_file_location(module_name, function.source)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{function.name}: cannot load {function.source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    handler = getattr(module, function.attribute, None)
    if not callable(handler):
        raise AttributeError(f"{function.name}: {function.source} has no {function.attribute!r}")
    preload = getattr(handler, "load", None)
    if callable(preload):
        # A handler that imports its code on the first event: the zygote is the
        # snapshot every environment forks from, so load it here, once.
        preload()
    return handler  # type: ignore[no-any-return]


def _prepare_runtime(clock_file: str | None) -> None:
    """Build the turnledger runtime once, before any fork, when the handlers use it.

    Every environment then starts with its clients built (not connected: no
    socket is open before the fork), instead of paying for them on its first
    event. With ``clock_file`` the runtime reads the time from that file.
    """
    if "turnledger.runtime" not in sys.modules:
        return  # handlers that are not turnledger's (the runner's own tests)
    from turnledger.core.config import Settings
    from turnledger.runtime import Runtime, set_runtime

    if clock_file is not None:
        from .clock import FileClock

        set_runtime(Runtime.from_settings(Settings.from_env(), clock=FileClock(Path(clock_file))))
        return
    try:
        set_runtime(Runtime.from_settings(Settings.from_env()))
    except Exception:
        # A bad setting: each handler meets it on first use and answers it as it should.
        logger.debug("the runtime could not be prepared", exc_info=True)


def _run_hook(spec: str) -> None:
    module_name, _, attribute = spec.partition(":")
    hook = getattr(importlib.import_module(module_name), attribute)
    hook()


def _serve_events(function: FunctionBoot, handler: Handler, connection: Connection) -> None:
    """A worker's life: one event at a time until the front closes the channel."""
    while True:
        try:
            message = json.loads(connection.recv_bytes())
        except (EOFError, OSError):
            return
        context = LambdaContext(
            function_name=function.name,
            memory_limit_in_mb=function.memory_mb,
            timeout_seconds=function.timeout_seconds,
            region=function.region,
        )
        if isinstance(message.get("deadline"), float):
            # The front's own deadline (CLOCK_MONOTONIC is the machine's, not the
            # process's): the remaining time the handler sees ends when it is killed.
            context.set_deadline(message["deadline"])
        if getattr(handler, "streams", False):
            if not _stream_answer(function, handler, message["event"], context, connection):
                return
            continue
        try:
            result = handler(message["event"], context)
            answer = json.dumps({"result": result})
        except Exception as exc:
            logger.exception("%s failed", function.name)
            answer = json.dumps({"error": type(exc).__name__, "message": str(exc)})
        try:
            connection.send_bytes(answer.encode())
        except OSError:
            return


def _stream_answer(
    function: FunctionBoot, handler: Handler, event: dict[str, Any], context: Any, out: Connection
) -> bool:
    """Send a streaming handler's answer as it comes: its head (``H`` and the prelude's
    JSON), each piece of its body (``P`` and the bytes), then the end (``E`` and ``{}``, or
    the error it raised). Returns whether the channel still works."""
    end: dict[str, str] = {}
    try:
        for piece in handler(event, context):
            if isinstance(piece, bytes):
                out.send_bytes(b"P" + piece)
            else:
                out.send_bytes(b"H" + json.dumps(piece.prelude()).encode())
    except OSError:
        return False
    except Exception as exc:
        logger.exception("%s failed", function.name)
        end = {"error": type(exc).__name__, "message": str(exc)}
    try:
        out.send_bytes(b"E" + json.dumps(end).encode())
    except OSError:
        return False
    return True


def _fork_worker(
    function: FunctionBoot, handler: Handler, channel: int, control: socket.socket
) -> int:
    pid = os.fork()
    if pid:
        os.close(channel)
        return pid
    # The child: an execution environment of ``function``.
    status = 0
    try:
        control.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _serve_events(function, handler, Connection(channel))
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _reap(children: set[int]) -> None:
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                continue
        children.discard(pid)


def _stop_children(children: set[int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.02)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def zygote_main(control_fd: int) -> int:
    """The zygote: load the handlers, report, then fork a worker per request until EOF."""
    boot = Boot.from_json(sys.stdin.buffer.read())
    for entry in reversed(boot.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    logging.basicConfig(level=boot.log_level, format="%(asctime)s %(levelname)s %(message)s")
    control = socket.socket(fileno=control_fd)
    handlers: dict[str, Handler] = {}
    errors: dict[str, str] = {}
    for function in boot.functions:
        try:
            handlers[function.name] = _load_handler(function)
        except Exception as exc:
            logger.exception("%s: the handler did not load", function.name)
            errors[function.name] = f"{type(exc).__name__}: {exc}"
    try:
        _prepare_runtime(boot.clock_file)
        if boot.hook is not None:
            _run_hook(boot.hook)
    except Exception as exc:
        logger.exception("the local runner's set-up failed")
        errors = {function.name: f"set-up failed: {exc}" for function in boot.functions}
    try:
        control.sendall(b"ready " + json.dumps(errors).encode() + b"\n")
    except OSError:
        return 0  # the runner stopped while the handlers loaded
    specs = {function.name: function for function in boot.functions}
    children: set[int] = set()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            readable, _, _ = select.select([control], [], [], 1.0)
            _reap(children)
            if not readable:
                continue
            message, fds, _, _ = socket.recv_fds(control, 1024, 1)
            if not message:
                return 0
            name = message.decode().strip()
            if not fds or name not in handlers:
                for fd in fds:
                    os.close(fd)
                control.sendall(b"error unknown function\n")
                continue
            pid = _fork_worker(specs[name], handlers[name], fds[0], control)
            children.add(pid)
            control.sendall(f"pid {pid}\n".encode())
    finally:
        _stop_children(children)


if __name__ == "__main__":
    code = zygote_main(int(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing to finalize: the interpreter's teardown of every imported module would only
    # make the runner's stop() wait.
    os._exit(code)
