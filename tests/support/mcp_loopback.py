"""A real MCP server on loopback and a local runner that reaches it, for HTTP tests.

:class:`McpProcess` runs a server of :mod:`tests.support.mcp_servers` in its own process
(it logs every call, and every ``tools/list``, to a file the test reads);
:func:`loopback` starts one with a local runner whose registry names it, and a client
of that runner, and stops them all. Kept apart from :mod:`.mcp_servers`, which the
server's own process imports: this one loads the runner.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.support.aws import unique_name

ANN = {"Authorization": "Bearer local:acme:ann"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class McpProcess:
    """A server of :mod:`tests.support.mcp_servers` in its own process on ``port``; its
    calls in ``calls_dir``."""

    def __init__(self, port: int, calls_dir: Path) -> None:
        self.port = port
        self.calls_dir = calls_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, *, changed: bool = False, asking: bool = False) -> None:
        """Start the files server (``changed``: with another ``delete_file`` schema), or
        the asking server."""
        args = [sys.executable, "-m", "tests.support.mcp_servers", str(self.port)]
        args += ["--changed"] if changed else []
        args += ["--asking"] if asking else []
        self.process = subprocess.Popen(
            args,
            cwd=PROJECT_ROOT,
            env={**os.environ, "MCP_CALLS_DIR": str(self.calls_dir)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the MCP server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def seen(self) -> list[dict[str, Any]]:
        """Every call (and ``tools/list``) the server logged, oldest first."""
        log = self.calls_dir / "calls.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]

    def calls(self, path: str) -> list[dict[str, Any]]:
        """The calls of ``path`` (each test uses paths of its own)."""
        return [c for c in self.seen() if c["arguments"].get("path") == path]

    def listings(self) -> int:
        """How many ``tools/list`` requests the files server answered."""
        return sum(1 for c in self.seen() if c["tool"] == "tools/list")


def files_entry(server: McpProcess, **overrides: Any) -> dict[str, Any]:
    """The registry entry of ``server`` (label ``files``; read-only tools need no approval)."""
    return {
        "type": "mcp",
        "server_label": "files",
        "server_url": server.url,
        "require_approval": {"never": {"read_only": True}},
        "timeout_seconds": 10,
        **overrides,
    }


def config_of(
    server: McpProcess,
    ddb_local_endpoint: str,
    folder: Path,
    *,
    entry: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> LocalConfig:
    """A runner's config (``overrides``: its fields to change) whose registry (in
    ``folder``) names ``server`` (``entry``: fields of its entry to change)."""
    tools = folder / "tools.json"
    listed = files_entry(server, **(entry or {}))
    tools.write_text(json.dumps({"tools": [listed]}), encoding="utf-8")
    return LocalConfig(
        port=0,
        tools_file=tools,
        dynamodb_endpoint=ddb_local_endpoint,
        table=unique_name("conversations"),
        bucket=unique_name("artifacts"),
        **overrides,
    )


@dataclass(frozen=True)
class Loopback:
    """A server on loopback, the runner that reaches it, and a client of the runner (as
    Ann, who holds the approver scope)."""

    server: McpProcess
    runner: LocalRunner
    http: httpx.Client


@contextmanager
def loopback(
    ddb_local_endpoint: str,
    folder: Path,
    *,
    asking: bool = False,
    entry: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Iterator[Loopback]:
    """Start a server (``asking``: the asking server) logging to ``folder``, a runner
    (``overrides``: fields of its config) whose registry names it (``entry``: fields of
    its entry to change), and a client; stop them all after the block."""
    server = McpProcess(free_port(), folder)
    server.start(asking=asking)
    config = config_of(server, ddb_local_endpoint, folder, entry=entry, **overrides)
    try:
        with (
            LocalRunner(config) as runner,
            httpx.Client(base_url=runner.url, headers=ANN, timeout=60) as http,
        ):
            yield Loopback(server, runner, http)
    finally:
        server.stop()
