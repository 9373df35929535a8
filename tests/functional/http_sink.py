"""A real HTTP tool endpoint on 127.0.0.1, for tests of ``http`` tools.

It records every request (method, path, headers, body) and answers each path
with scripted replies: the first reply first, the last one for every request
after that. An unscripted path gets ``404`` with a JSON error that names it::

    with HttpSink() as sink:
        sink.respond("/weather", Reply(body={"temp": 21}))
        url = sink.url("/weather")
        ...
        [request] = sink.requests_for("/weather")
        assert request.idempotency_key == key

Other things a test can ask of it:

* ``Reply(delay=...)`` waits before answering, or until the sink is closed,
  whichever comes first: a timeout test never waits for it to end.
* ``Reply(raw=b"...")`` answers bytes that need not be JSON; ``Reply(echo=True)``
  answers the request's own body.
* ``Reply(trickle=0.5)`` sends the body one byte at a time, a byte every half
  second (``trickle_headers=True``: the status line and headers too), and
  ``Reply(length=False)`` sends no ``Content-Length`` (the body ends when the
  connection closes). A trickle stops when the client goes away or the sink closes.
* ``HttpSink(dedupe=True)`` behaves like a tool that honours ``Idempotency-Key``:
  a repeated key (per path) gets the first answer again and is not a new side
  effect; :meth:`HttpSink.side_effects` lists the requests that counted.
* :meth:`HttpSink.rendezvous` makes the requests of a path wait for each other:
  each answers only once ``parties`` of them are in flight together, and with
  ``503`` if they never are. A test that gets ``200`` from every one of them
  has proved the calls ran concurrently, with no clock involved. Once broken,
  a rendezvous stays broken; script it again to reset it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

#: The default answer to an unscripted path's request is a ``404`` that names it.
_NOT_SCRIPTED = 404

#: How long a repeated ``Idempotency-Key`` waits for the first request's answer.
_DEDUPE_WAIT_SECONDS = 10.0

_NO_BODY: Any = object()


@dataclass(frozen=True)
class RecordedRequest:
    """One request the sink received; header names are lower case."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    #: True when the sink answered a repeated ``Idempotency-Key`` from its record.
    replayed: bool = False

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """A header's value, by case-insensitive name."""
        return self.headers.get(name.lower())

    @property
    def idempotency_key(self) -> str | None:
        """The ``Idempotency-Key`` header."""
        return self.header("Idempotency-Key")


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    The body is ``raw`` if given, else the request's own body when ``echo``, else
    ``body`` serialized as JSON (``None`` is JSON ``null``), else empty.
    """

    body: Any = _NO_BODY
    status: int = 200
    delay: float = 0.0
    raw: bytes | None = None
    echo: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    #: Seconds between the bytes of a trickled answer (0: sent at once).
    trickle: float = 0.0
    #: Trickle the status line and headers too, not only the body.
    trickle_headers: bool = False
    #: Send ``Content-Length`` (without it, the body ends when the connection closes).
    length: bool = True

    def render(self, request_body: bytes) -> bytes:
        """The bytes this reply answers to a request with ``request_body``."""
        if self.raw is not None:
            return self.raw
        if self.echo:
            return request_body
        if self.body is _NO_BODY:
            return b""
        return json.dumps(self.body).encode("utf-8")


@dataclass
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    trickle: float = 0.0
    trickle_headers: bool = False
    length: bool = True


class _Slot:
    """The first answer to one idempotency key, awaited by its repeats."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.answer: _Answer | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    sink: HttpSink

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) is expected; keep test output clean.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        request = RecordedRequest(
            method=self.command,
            path=parts.path,
            query=parts.query,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        answer = self.server.sink._answer(request)
        try:
            if answer.trickle:
                self._trickle(answer)
                return
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            if answer.length:
                self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _trickle(self, answer: _Answer) -> None:
        lines = [f"HTTP/1.0 {answer.status} OK"]
        lines += [f"{name}: {value}" for name, value in answer.headers.items()]
        if answer.length:
            lines.append(f"Content-Length: {len(answer.body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if not answer.trickle_headers:
            self.wfile.write(head)
            head = b""
        closing = self.server.sink._closing
        for byte in head + answer.body:
            if closing.wait(answer.trickle):
                return
            self.wfile.write(bytes([byte]))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class HttpSink:
    """A threaded HTTP server on ``127.0.0.1`` (a free port) that records and answers.

    Use it as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, *, dedupe: bool = False) -> None:
        """Create the sink (not yet listening).

        Args:
            dedupe: answer a repeated ``Idempotency-Key`` (per path) with the first
                answer, as an idempotent tool would, without a new side effect.
        """
        self.dedupe = dedupe
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._requests: list[RecordedRequest] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._barriers: dict[str, tuple[threading.Barrier, float]] = {}
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._in_flight = 0
        self._max_in_flight = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> HttpSink:
        """Start listening; returns the sink."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.sink = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening; replies still waiting (delays, rendezvous) end at once."""
        self._closing.set()
        with self._lock:
            for barrier, _ in self._barriers.values():
                barrier.abort()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HttpSink:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- scripting ---------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._server is None:
            raise RuntimeError("the sink is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def url(self, path: str) -> str:
        """The absolute URL of ``path`` (which starts with ``/``) on this sink."""
        return self.base_url + path

    def respond(self, path: str, *replies: Reply) -> None:
        """Script the answers of ``path``: in order, the last one repeating."""
        if not replies:
            raise ValueError("give at least one reply")
        with self._lock:
            self._scripts[path] = list(replies)

    def rendezvous(self, path: str, parties: int, *, timeout: float = 5.0) -> None:
        """Make requests of ``path`` wait until ``parties`` of them are in flight.

        A request that waits ``timeout`` seconds without the others gets ``503``.
        """
        with self._lock:
            self._barriers[path] = (threading.Barrier(parties), timeout)

    # --- what happened -----------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, path: str) -> list[RecordedRequest]:
        """The requests of ``path``, in arrival order."""
        return [r for r in self.requests if r.path == path]

    def side_effects(self, path: str) -> list[RecordedRequest]:
        """The requests of ``path`` that counted (all of them unless ``dedupe``)."""
        return [r for r in self.requests_for(path) if not r.replayed]

    @property
    def max_in_flight(self) -> int:
        """The most requests the sink was answering at the same time."""
        with self._lock:
            return self._max_in_flight

    # --- serving (called on the server's threads) --------------------------------

    def _answer(self, request: RecordedRequest) -> _Answer:
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            return self._answer_once(request)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer_once(self, request: RecordedRequest) -> _Answer:
        key = request.idempotency_key
        if not self.dedupe or key is None:
            self._record(request)
            return self._run_script(request)
        with self._lock:
            slot = self._slots.get((request.path, key))
            first = slot is None
            if slot is None:
                slot = self._slots[(request.path, key)] = _Slot()
        if first:
            self._record(request)
            slot.answer = self._run_script(request)
            slot.ready.set()
            return slot.answer
        self._record(replace(request, replayed=True))
        if not slot.ready.wait(_DEDUPE_WAIT_SECONDS) or slot.answer is None:
            return _json_answer(409, {"error": "the first request of this key never finished"})
        return slot.answer

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _run_script(self, request: RecordedRequest) -> _Answer:
        with self._lock:
            script = self._scripts.get(request.path)
            reply = (script.pop(0) if len(script) > 1 else script[0]) if script else None
            rendezvous = self._barriers.get(request.path)
        if rendezvous is not None:
            barrier, timeout = rendezvous
            try:
                barrier.wait(timeout)
            except threading.BrokenBarrierError:
                return _json_answer(503, {"error": f"rendezvous of {request.path} broken"})
        if reply is None:
            return _json_answer(_NOT_SCRIPTED, {"error": f"no reply scripted for {request.path}"})
        if reply.delay:
            self._closing.wait(reply.delay)
        headers = {"Content-Type": reply.content_type, **reply.headers}
        return _Answer(
            reply.status,
            headers,
            reply.render(request.body),
            trickle=reply.trickle,
            trickle_headers=reply.trickle_headers,
            length=reply.length,
        )


def _json_answer(status: int, body: Any) -> _Answer:
    return _Answer(status, {"Content-Type": "application/json"}, json.dumps(body).encode())
