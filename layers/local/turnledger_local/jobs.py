"""A sample job server for deferred ``http`` tools, so they can be tried locally.

``POST /_local/job`` is a tool endpoint that takes the work and answers ``202
{"task_id"}`` at once; ``seconds`` later (the call's argument, default 1) the job POSTs
its result to the call's ``callback_url``, as a real job server would::

    {"status": "succeeded", "output": {"task_id": ..., "arguments": {...}}, "continue": true}

(``"status": "failed"`` when the call's arguments say ``"fail": true``). A callback
answered ``409 conversation_busy`` (the turn that made the call still commits) is sent
again after its ``Retry-After``. The same ``Idempotency-Key`` gets the same ``202`` and
task id, and runs no second job.

``GET /_local/jobs?conversation_id=ID&wait=S`` lists the jobs (of that conversation id),
oldest first, each with its state (``running``, ``called_back``, ``failed``) and the
callback's answer, waiting up to ``S`` seconds (at most 20) for the running ones to
call back. Like any tool server, the job knows no tenant: it lists what it was sent.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

import httpx
from turnledger.core.strict_json import BodyError, parse_object

from .gateway import GatewayError, HttpRequest, HttpResponse

#: The tool endpoint that starts a job.
JOB_PATH = "/_local/job"
#: The listing of the jobs.
JOBS_PATH = "/_local/jobs"
#: Seconds a job takes when its arguments do not say.
DEFAULT_SECONDS = 1.0
#: The longest a job may be asked to take, and the longest ``wait``.
MAX_SECONDS = 60.0
MAX_WAIT_SECONDS = 20.0
#: Callback attempts while the conversation is busy, and the longest pause between them.
_ATTEMPTS = 20
_MAX_PAUSE_SECONDS = 5.0
#: Jobs kept for the listing (oldest dropped first).
_KEPT = 200


@dataclass
class Job:
    """One job: what it was sent, and what became of its callback."""

    task_id: str
    tool: str | None
    call_id: str | None
    conversation_id: str | None
    arguments: Any
    state: Literal["running", "called_back", "failed"] = "running"
    #: The callback's HTTP status and JSON answer, once sent.
    callback_status: int | None = None
    callback: Any = None
    error: str | None = None


class SampleJobs:
    """The jobs of one runner; each runs on its own daemon thread until it called back."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._by_key: dict[str, str] = {}
        self._changed = threading.Condition()
        self._stopping = threading.Event()

    def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer ``POST /_local/job`` or ``GET /_local/jobs``."""
        method = request.method.upper()
        wanted = "POST" if request.raw_path == JOB_PATH else "GET"
        if method != wanted:
            error = GatewayError(
                405,
                "method_not_allowed",
                f"{method} is not allowed on {request.raw_path}",
                details={"allowed": [wanted]},
            )
            error.headers["allow"] = wanted
            raise error
        return self._start(request) if wanted == "POST" else self._list(request)

    def stop(self) -> None:
        """Stop waiting: jobs not yet called back give up (the runner is stopping)."""
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()

    def _start(self, request: HttpRequest) -> HttpResponse:
        try:
            payload = parse_object(request.body or b"{}")
        except BodyError as exc:
            raise GatewayError(400, "invalid_request", str(exc), details=exc.details) from exc
        raw = payload.get("arguments")
        arguments: dict[str, Any] = raw if isinstance(raw, dict) else {}
        seconds = arguments.get("seconds", DEFAULT_SECONDS)
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_SECONDS
        ):
            raise GatewayError(
                422,
                "validation_error",
                f"seconds must be a number from 0 to {MAX_SECONDS:g}",
                details={"field": "arguments.seconds"},
            )
        key = request.header("idempotency-key")
        with self._changed:
            if key is not None and key in self._by_key:
                return HttpResponse.json(202, {"task_id": self._by_key[key]})
            job = Job(
                task_id=f"job_{uuid.uuid4().hex[:16]}",
                tool=_text(payload.get("tool")),
                call_id=_text(payload.get("call_id")),
                conversation_id=_text(payload.get("conversation_id")),
                arguments=arguments,
            )
            self._jobs[job.task_id] = job
            if key is not None:
                self._by_key[key] = job.task_id
            while len(self._jobs) > _KEPT:
                del self._jobs[next(iter(self._jobs))]
        callback = _text(payload.get("callback_url"))
        threading.Thread(
            target=self._run,
            args=(job, callback, float(seconds), arguments.get("fail") is True),
            name=f"sample-job-{job.task_id}",
            daemon=True,
        ).start()
        return HttpResponse.json(202, {"task_id": job.task_id})

    def _run(self, job: Job, callback: str | None, seconds: float, fail: bool) -> None:
        if self._stopping.wait(seconds):
            return
        if callback is None:
            self._finish(job, "failed", error="the call carried no callback_url")
            return
        body = {
            "status": "failed" if fail else "succeeded",
            "output": "the job failed, as asked"
            if fail
            else {"task_id": job.task_id, "arguments": job.arguments},
            "continue": True,
        }
        # The callback goes to the runner that made the call, never through a proxy.
        with httpx.Client(timeout=60, trust_env=False) as client:
            for _ in range(_ATTEMPTS):
                try:
                    answer = client.post(callback, json=body)
                except httpx.HTTPError as exc:
                    self._finish(job, "failed", error=f"the callback failed: {exc}")
                    return
                if answer.status_code != 409 or self._stopping.wait(_pause(answer)):
                    break
        try:
            answered: Any = answer.json()
        except ValueError:
            answered = answer.text
        self._finish(
            job,
            "called_back" if answer.is_success else "failed",
            status=answer.status_code,
            answer=answered,
        )

    def _finish(
        self,
        job: Job,
        state: Literal["called_back", "failed"],
        *,
        status: int | None = None,
        answer: Any = None,
        error: str | None = None,
    ) -> None:
        with self._changed:
            job.state, job.callback_status, job.callback, job.error = state, status, answer, error
            self._changed.notify_all()

    def _list(self, request: HttpRequest) -> HttpResponse:
        query = parse_qs(request.raw_query)
        conversation = query["conversation_id"][0] if "conversation_id" in query else None
        try:
            wait = float((query.get("wait") or ["0"])[0])
        except ValueError:
            wait = math.nan
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            raise GatewayError(
                422,
                "validation_error",
                f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}",
                details={"field": "wait"},
            )
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                jobs = [
                    job
                    for job in self._jobs.values()
                    if conversation is None or job.conversation_id == conversation
                ]
                left = deadline - time.monotonic()
                running = any(job.state == "running" for job in jobs)
                if not running or left <= 0 or self._stopping.is_set():
                    return HttpResponse.json(200, {"jobs": [asdict(job) for job in jobs]})
                self._changed.wait(left)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _pause(answer: httpx.Response) -> float:
    """Seconds to wait before the next attempt: the answer's ``Retry-After``, bounded."""
    try:
        seconds = float(answer.headers.get("retry-after", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.1), _MAX_PAUSE_SECONDS)
