"""Start and stop DynamoDB Local (the real engine, in memory) for the integration tests.

``make test`` installs the jar under ``.tools/dynamodb-local`` and exports its
path as ``TURNLEDGER_DYNAMODB_LOCAL_JAR``; a plain ``pytest`` run finds it at
that default place. Each xdist worker starts its own instance on a free
loopback port: no lock files, nothing shared between workers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from turnledger_local.template import PROJECT_ROOT

JAR_ENV = "TURNLEDGER_DYNAMODB_LOCAL_JAR"
DEFAULT_JAR = PROJECT_ROOT / ".tools" / "dynamodb-local" / "DynamoDBLocal.jar"

#: How long the JVM may take to answer its first request.
STARTUP_SECONDS = 60.0
#: Starting on a port another process grabbed first fails fast; try a few ports.
_PORT_ATTEMPTS = 3


class DynamoDBLocalError(RuntimeError):
    """DynamoDB Local is missing or did not start."""


def find_jar() -> Path:
    """The DynamoDB Local jar: ``$TURNLEDGER_DYNAMODB_LOCAL_JAR`` or the ``make test`` default.

    Raises:
        DynamoDBLocalError: the jar is not there.
    """
    configured = os.environ.get(JAR_ENV)
    jar = Path(configured) if configured else DEFAULT_JAR
    if not jar.is_file():
        raise DynamoDBLocalError(
            f"DynamoDB Local is not installed (no {jar}). The integration and contract "
            f"tests need it: run `make test`, which installs it under .tools/dynamodb-local, "
            f"or set {JAR_ENV} to the path of DynamoDBLocal.jar."
        )
    return jar


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class DynamoDBLocal:
    """One DynamoDB Local process; use as a context manager or call :meth:`start`/:meth:`stop`.

    DynamoDB Local has no flag to choose its listening address; clients only
    ever reach it through ``127.0.0.1``.
    """

    def __init__(self, jar: Path, *, shared_db: bool = False) -> None:
        """Prepare (not start) an instance.

        Args:
            shared_db: one database for every access key (``-sharedDb``): needed by
                clients on assumed-role credentials, whose keys differ from the creator's.
        """
        self.jar = jar
        self.shared_db = shared_db
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The URL clients use."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DynamoDBLocal:
        """Start the engine and wait until it answers.

        Raises:
            DynamoDBLocalError: it exited or did not answer in time (with its output).
        """
        failures: list[str] = []
        for _ in range(_PORT_ATTEMPTS):
            try:
                self._start_on(free_port())
                return self
            except DynamoDBLocalError as exc:
                failures.append(str(exc))
                self.stop()
        raise DynamoDBLocalError("\n\n".join(failures))

    def _start_on(self, port: int) -> None:
        self.port = port
        # A file, not a pipe: nobody reads the JVM's output while tests run, and a
        # full pipe would block it.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        lib = self.jar.parent / "DynamoDBLocal_lib"
        self._process = subprocess.Popen(
            [
                "java",
                # A short-lived test server: quick JIT and a small collector start faster.
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                f"-Djava.library.path={lib}",
                "-jar",
                str(self.jar),
                "-inMemory",
                "-disableTelemetry",
                *(["-sharedDb"] if self.shared_db else []),
                "-port",
                str(port),
            ],
            cwd=self.jar.parent,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        client = boto3.client(
            "dynamodb",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}),
        )
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise DynamoDBLocalError(
                    f"DynamoDB Local exited with code {self._process.returncode} "
                    f"on port {self.port}:\n{self.output()}"
                )
            try:
                client.list_tables(Limit=1)
                return
            except (BotoCoreError, ClientError):
                pass
            if time.monotonic() > deadline:
                raise DynamoDBLocalError(
                    f"DynamoDB Local did not answer on port {self.port} within "
                    f"{STARTUP_SECONDS:.0f} s:\n{self.output()}"
                )
            time.sleep(0.1)  # polling a starting JVM, not timing a test

    def output(self) -> str:
        """What the process wrote so far (stdout and stderr)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        """Terminate the process (kill it if it does not exit) and drop its log."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> DynamoDBLocal:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
