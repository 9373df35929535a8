"""MCP servers as tools: the registry entry, naming, the listing and its reuse, the
approval rule, and one call through the ``mcp`` package's client on an in-process server."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from turnledger.core.exceptions import ToolServerUnavailable, UnknownTool
from turnledger.core.models import Elicitation, ToolCall
from turnledger.tools import InvalidToolRegistry, ToolRegistry, requirement
from turnledger.tools.calls import ToolInvocation
from turnledger.tools.executors import ToolRunner
from turnledger.tools.mcp import (
    CALL_ID_META,
    REQUEST_STATE_MAX_BYTES,
    McpApprovalRule,
    McpError,
    McpListing,
    McpServerEntry,
    approval_needed,
    split_name,
    tool_name,
)
from turnledger.tools.mcp_client import InMemoryMcp
from turnledger.tools.mcp_link import McpLink
from turnledger.tools.registry import McpExecutorConfig

from tests.support.mcp_servers import FilesServer, asking_server, files_server

URL = "http://127.0.0.1:9/mcp"


def entry(**overrides: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "files", "server_url": URL, **overrides}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingPort(InMemoryMcp):
    """The in-memory port, counting listings."""

    def __init__(self, servers: dict[str, Any]) -> None:
        super().__init__(servers)
        self.listings = 0

    def list_tools(self, server: McpServerEntry, timeout: float) -> McpListing:
        self.listings += 1
        return super().list_tools(server, timeout)


@pytest.fixture
def files() -> FilesServer:
    return files_server()


def registry_of(port: InMemoryMcp, clock: Clock | None = None, **overrides: Any) -> ToolRegistry:
    link = McpLink(lambda: port, clock=clock or Clock())
    return ToolRegistry.from_json(json.dumps({"tools": [entry(**overrides)]}), mcp=link)


def test_names_are_mcp_label_tool_and_split_back() -> None:
    assert tool_name("files", "read_file") == "mcp__files__read_file"
    assert split_name("mcp__files__read_file") == ("files", "read_file")
    assert split_name("read_file") is None
    assert split_name("mcp__files") is None


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"server_label": "a__b"}, "server_label"),
        ({"server_url": "ftp://x/mcp"}, "server_url"),
        ({"require_approval": "sometimes"}, "require_approval"),
        ({"require_approval": {"never": {"tool_name": ["x"]}}}, "require_approval"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"secret": "x"}, "secret"),
    ],
)
def test_a_bad_entry_fails_the_load_naming_the_server(
    overrides: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidToolRegistry) as caught:
        ToolRegistry.from_json(json.dumps({"tools": [entry(**overrides)]}))
    assert fragment in str(caught.value)
    assert "MCP server" in str(caught.value)


def test_two_servers_with_one_label_fail_the_load() -> None:
    with pytest.raises(InvalidToolRegistry, match="duplicate server_label"):
        ToolRegistry.from_json(json.dumps({"tools": [entry(), entry()]}))


def test_the_default_rule_is_always() -> None:
    server = McpServerEntry.model_validate(entry())
    assert server.require_approval == "always"
    assert approval_needed(server.require_approval, "read_file", True)


@pytest.mark.parametrize(
    ("rule", "read_file", "delete_file"),
    [
        ("always", True, True),
        ("never", False, False),
        ({"never": {"read_only": True}}, False, True),
        ({"never": {"tool_names": ["delete_file"]}}, True, False),
        ({"always": {"tool_names": ["read_file"]}}, True, True),
        # always wins where both cover a tool
        ({"never": {"read_only": True}, "always": {"tool_names": ["read_file"]}}, True, True),
    ],
)
def test_require_approval_rules(rule: Any, read_file: bool, delete_file: bool) -> None:
    parsed = rule if isinstance(rule, str) else McpApprovalRule.model_validate(rule)
    assert approval_needed(parsed, "read_file", True) is read_file
    assert approval_needed(parsed, "delete_file", False) is delete_file


def test_tools_reach_the_registry_with_their_rule_and_hash(files: FilesServer) -> None:
    registry = registry_of(
        InMemoryMcp({"files": files.server}), require_approval={"never": {"read_only": True}}
    )
    names = [t.name for t in registry.select()]
    assert names == ["mcp__files__read_file", "mcp__files__delete_file"]
    read, delete = registry.select(names)
    assert requirement(read, {"path": "a"}) == "none"
    assert requirement(delete, {"path": "a"}) == "approval"
    assert read.idempotent and not delete.idempotent  # a crash after dispatch goes to a person
    assert isinstance(delete.executor, McpExecutorConfig)
    assert len(delete.executor.definition_sha256) == 64
    assert delete.validate_arguments({}) is not None  # the server's schema is enforced here
    assert "mcp__files__delete_file" in registry
    assert "mcp__other__delete_file" not in registry


def test_allowed_tools_narrow_the_server(files: FilesServer) -> None:
    registry = registry_of(InMemoryMcp({"files": files.server}), allowed_tools=["read_file"])
    assert [t.name for t in registry.select()] == ["mcp__files__read_file"]
    with pytest.raises(UnknownTool):
        registry.get("mcp__files__delete_file")


def test_a_listing_is_reused_while_young_and_recorded_only_when_its_hash_changes(
    files: FilesServer,
) -> None:
    clock = Clock()
    port = CountingPort({"files": files.server})
    link = McpLink(lambda: port, clock=clock)
    heard: list[McpListing] = []
    link.on_listing = heard.append
    server = McpServerEntry.model_validate(entry(max_list_age_seconds=60))
    first = link.listing(server, 5)
    clock.now += 59
    assert link.listing(server, 5) is first
    assert port.listings == 1
    clock.now += 2
    again = link.listing(server, 5)
    assert port.listings == 2
    assert again is first  # the same hash: the kept listing stays, nothing new is heard
    assert heard == [first]
    port.servers["files"] = files_server(changed=True).server
    changed = link.listing(server, 5, read_since=clock.now + 1)  # no kept one is as new
    assert changed.sha256 != first.sha256
    assert heard == [first, changed]
    assert changed.tool("read_file") == first.tool("read_file")
    assert changed.tool("delete_file") != first.tool("delete_file")


def test_an_unreachable_server_is_a_clear_error(files: FilesServer) -> None:
    registry = registry_of(InMemoryMcp({}))
    with pytest.raises(ToolServerUnavailable) as caught:
        registry.get("mcp__files__read_file")
    assert caught.value.details == {"server_label": "files"}
    # Offering every tool leaves a server that is down out; the others stay usable.
    assert registry.select() == []


def invocation(registry: ToolRegistry, name: str, arguments: dict[str, Any]) -> ToolInvocation:
    return ToolInvocation(
        tool=registry.get(name),
        call=ToolCall(id="call_1", name=name, arguments=arguments),
        tenant="t",
        conversation_id="c",
        idempotency_key="k" * 32,
    )


def test_one_call_carries_its_id_in_meta(files: FilesServer) -> None:
    port = InMemoryMcp({"files": files.server})
    link = McpLink(lambda: port)
    registry = ToolRegistry.from_json(json.dumps({"tools": [entry()]}), mcp=link)
    runner = ToolRunner(lambda: pytest.fail("no http"), None, mcp=link)
    outcome = runner.run_one(invocation(registry, "mcp__files__delete_file", {"path": "/a"}))
    assert outcome.output == "deleted /a" and not outcome.is_error
    [(tool, arguments, meta)] = files.calls
    assert (tool, arguments) == ("delete_file", {"path": "/a"})
    assert meta[CALL_ID_META] == "call_1"


def test_invalid_arguments_never_reach_the_server(files: FilesServer) -> None:
    link = McpLink(lambda: InMemoryMcp({"files": files.server}))
    registry = ToolRegistry.from_json(json.dumps({"tools": [entry()]}), mcp=link)
    runner = ToolRunner(lambda: pytest.fail("no http"), None, mcp=link)
    outcome = runner.run_one(invocation(registry, "mcp__files__delete_file", {"file": "/a"}))
    assert outcome.is_error and "path" in outcome.output
    assert files.calls == []


def asking_runner(
    asking: FilesServer, port: InMemoryMcp | None = None
) -> tuple[ToolRegistry, ToolRunner]:
    link = McpLink(lambda: port or InMemoryMcp({"asking": asking.server}))
    registry = ToolRegistry.from_json(
        json.dumps({"tools": [entry(server_label="asking")]}), mcp=link
    )
    return registry, ToolRunner(lambda: pytest.fail("no http"), None, mcp=link)


def test_an_older_servers_elicitation_is_cancelled_and_the_output_says_what_was_asked() -> None:
    """Before 2026-07-28 the server asks while its call is open (``elicitation/create``):
    nobody can be asked then, so it is answered ``cancel``."""
    asking = asking_server()
    registry, runner = asking_runner(asking, InMemoryMcp({"asking": asking.server}, mode="legacy"))
    outcome = runner.run_one(invocation(registry, "mcp__asking__rename_file", {"path": "/a"}))
    assert not outcome.is_error and outcome.elicitation is None
    assert outcome.output == (
        "not renamed (cancel)\n[the server asked for input (Rename /a?); it was cancelled: "
        "a person is asked only by servers of the 2026-07-28 protocol, not in the middle of "
        "a call]"
    )
    [(tool, seen, _)] = asking.calls
    assert (tool, seen) == ("rename_file", {"path": "/a", "action": "cancel"})


def test_an_elicitation_is_the_outcome_and_the_answer_resumes_the_call() -> None:
    asking = asking_server()
    registry, runner = asking_runner(asking)
    call = invocation(registry, "mcp__asking__delete_file", {"path": "/d/a.txt"})
    outcome = runner.run_one(call)
    asked = outcome.elicitation
    assert asked is not None and (outcome.output, outcome.is_error) == ("", False)
    assert (asked.message, asked.round) == ("Type the name of /d/a.txt to delete it", 1)
    assert asked.requested_schema["required"] == ["name"]
    assert asked.request_state and asked.answer is None
    assert asking.calls == []

    answered = asked.model_copy(
        update={"answer": {"action": "accept", "content": {"name": "a.txt"}}}
    )
    done = runner.run_one(dataclasses.replace(call, elicitation=answered))
    assert (done.output, done.is_error, done.elicitation) == ("deleted /d/a.txt", False, None)
    [(tool, seen, _)] = asking.calls
    assert tool == "delete_file"
    assert seen == {"path": "/d/a.txt", "action": "accept", "name": "a.txt"}


class HugeStatePort(InMemoryMcp):
    """Asks with a ``request_state`` over the bound kept."""

    def call_tool(self, *args: Any, **kwargs: Any) -> Any:
        asked = super().call_tool(*args, **kwargs)
        assert isinstance(asked, Elicitation)
        return asked.model_copy(update={"request_state": "x" * (REQUEST_STATE_MAX_BYTES + 1)})


def test_a_request_state_over_the_bound_is_refused_clearly() -> None:
    asking = asking_server()
    registry, runner = asking_runner(asking, HugeStatePort({"asking": asking.server}))
    outcome = runner.run_one(invocation(registry, "mcp__asking__delete_file", {"path": "/a"}))
    assert outcome.is_error and outcome.elicitation is None
    assert outcome.output == (
        "tool mcp__asking__delete_file asked for input that cannot be kept: its request_state "
        f"is {REQUEST_STATE_MAX_BYTES + 1} bytes, over the {REQUEST_STATE_MAX_BYTES} kept"
    )


class SlowPort(InMemoryMcp):
    def call_tool(self, *args: Any, **kwargs: Any) -> Any:
        raise McpError("no answer within 0.5s", timed_out=True)


def test_a_timeout_is_an_error_outcome(files: FilesServer) -> None:
    link = McpLink(lambda: SlowPort({"files": files.server}))
    registry = ToolRegistry.from_json(json.dumps({"tools": [entry(timeout_seconds=0.5)]}), mcp=link)
    runner = ToolRunner(lambda: pytest.fail("no http"), None, mcp=link)
    outcome = runner.run_one(invocation(registry, "mcp__files__read_file", {"path": "/a"}))
    assert outcome.is_error and outcome.output == "tool mcp__files__read_file timed out after 0.5s"


def test_the_deadline_bounds_a_real_session() -> None:
    """A server that never answers: the port's deadline ends the session."""
    import anyio
    from mcp.server import MCPServer

    stuck = MCPServer("stuck")

    @stuck.tool()
    async def wait() -> str:
        await anyio.sleep(30)
        return "late"

    port = InMemoryMcp({"files": stuck})
    server = McpServerEntry.model_validate(entry())
    with pytest.raises(McpError) as caught:
        port.call_tool(server, "wait", {}, meta={}, timeout=0.3)
    assert caught.value.timed_out
