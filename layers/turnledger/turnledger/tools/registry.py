"""The tool registry: which tools exist, what they take, how they run.

The registry is a JSON document (a bundled file, or an SSM parameter)::

    {"tools": [
      {"name": "send_email", "description": "...", "parameters": {"type": "object"},
       "require_approval": true,
       "executor": {"type": "http", "url": "https://..."}},
      ...
    ]}

It is validated whole at load time: a bad name, an unknown key, an invalid
JSON Schema or a duplicate name fails the load with
:class:`InvalidToolRegistry`, naming the tool, instead of failing a turn later.
Each tool's JSON Schema is compiled once, at load, and reused for every call.
:func:`requirement` says what a call of a registered tool waits for (its rule is
:mod:`.approval`'s).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import fastjsonschema
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..core.config import Settings
from ..core.exceptions import InternalError, ToolServerUnavailable, UnknownTool
from ..core.models import TOOL_NAME_PATTERN, ClientTool, Requirement, ToolCall
from ..core.strict_json import arguments_refusal
from ..providers.base import ToolSpec
from .approval import ApprovalRule, approval_required
from .mcp import McpServerEntry, approval_needed, split_name, tool_name
from .mcp_link import McpCatalog, McpLink

if TYPE_CHECKING:
    from mypy_boto3_ssm import SSMClient


#: How long a registry read from SSM is cached by Powertools (seconds).
PARAMETER_MAX_AGE_SECONDS = 300


class InvalidToolRegistry(InternalError):
    """The tool registry cannot be read or fails validation (a deployment misconfiguration)."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HttpExecutorConfig(_Config):
    """Run the tool by POSTing the call to ``url``."""

    type: Literal["http"]
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    #: The whole call's bound (connect, send and every read), cut to the request's
    #: remaining time; the deployment's ``TOOL_TIMEOUT_SECONDS`` when ``None``.
    timeout_seconds: float | None = Field(default=None, gt=0)
    #: The endpoint may answer ``202 {"task_id"}`` and finish the call elsewhere: only
    #: such a tool is sent a ``callback_url`` (a credential that settles the call), and
    #: a ``202`` from any other is an error result.
    deferred: bool = False
    #: How long a deferred call may wait for its callback before it is recorded as
    #: failed (``turnledger.turn.callbacks.DEFAULT_DEFERRED_SECONDS`` when ``None``), never
    #: past the conversation's TTL. Only with ``deferred``.
    deferred_ttl_seconds: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ttl_of_a_deferred_tool(self) -> HttpExecutorConfig:
        if self.deferred_ttl_seconds is not None and not self.deferred:
            raise ValueError('deferred_ttl_seconds is for a tool declared "deferred": true')
        return self

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        import httpx  # here: only a registry with an http tool needs it

        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a valid URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an absolute http:// or https:// URL")
        return value


class LambdaExecutorConfig(_Config):
    """Run the tool by invoking a Lambda function synchronously."""

    type: Literal["lambda"]
    #: A function name or ARN, optionally with a version or alias.
    function_name: str = Field(min_length=1)
    #: The function's own timeout: the single Invoke is awaited this long plus a second
    #: (for the function's own "Task timed out" answer), cut to the request's remaining
    #: time; the deployment's ``TOOL_TIMEOUT_SECONDS`` when ``None``.
    timeout_seconds: float | None = Field(default=None, gt=0)


class ClientExecutorConfig(_Config):
    """The caller runs the tool and sends its result as a ``function_call_output``."""

    type: Literal["client"]


class HumanExecutorConfig(_Config):
    """A person supplies the call's output (``outputs`` on the approvals route, or a
    ``function_call_output`` item): the turn waits as ``awaiting_hitl``."""

    type: Literal["human"]


class McpExecutorConfig(_Config):
    """A tool of a registered MCP server (:mod:`.mcp`): never written in a registry
    document, made from the server's listing."""

    type: Literal["mcp"]
    server: McpServerEntry
    #: The tool's name on its server.
    tool: str
    read_only: bool = False
    #: The sha256 of the tool's definition as listed: approvals are asked for it.
    definition_sha256: str
    timeout_seconds: float | None = None


ExecutorConfig = Annotated[
    HttpExecutorConfig
    | LambdaExecutorConfig
    | ClientExecutorConfig
    | HumanExecutorConfig
    | McpExecutorConfig,
    Field(discriminator="type"),
]


def _refuse_remote_ref(uri: str) -> NoReturn:
    # fastjsonschema would fetch remote $refs with urlopen: a registry must be self-contained.
    raise ValueError(f"remote $ref {uri!r} is not allowed; the schema must be self-contained")


_NO_REMOTE_REFS = {"http": _refuse_remote_ref, "https": _refuse_remote_ref}


def _compile(schema: dict[str, Any]) -> Callable[[Any], Any]:
    try:
        validator: Callable[[Any], Any] = fastjsonschema.compile(
            schema,
            handlers=_NO_REMOTE_REFS,
            # Defaults must not be written into the caller's arguments while validating.
            use_default=False,
        )
    # fastjsonschema reports malformed schemas with whatever its code generator
    # trips on (AttributeError, TypeError, ...), not only JsonSchemaDefinitionException.
    except Exception as exc:
        raise ValueError(f"parameters is not a valid JSON Schema: {exc}") from None
    return validator


def _describe(exc: fastjsonschema.JsonSchemaValueException) -> str:
    """Say which field failed and why, naming the root ``arguments``."""
    if exc.rule == "required" and isinstance(exc.value, dict):
        required = exc.rule_definition if isinstance(exc.rule_definition, list) else []
        missing = [name for name in required if name not in exc.value]
        where = ".".join(["arguments", *(str(p) for p in exc.path[1:])])
        if missing:
            names = ", ".join(repr(name) for name in missing)
            return f"{where} is missing required property {names}"
    message = str(exc.message)
    if message.startswith("data"):
        message = "arguments" + message[len("data") :]
    return message


def schema_refusal(schema: dict[str, Any], value: Any, root: str) -> str | None:
    """Why ``value`` fails the JSON Schema ``schema`` (no remote ``$ref``), naming its
    root ``root``; ``None`` when it passes. A schema that does not compile refuses too."""
    try:
        validate = _compile(schema)
    except ValueError as exc:
        return str(exc).replace("parameters is", "the schema is", 1)
    try:
        validate(value)
    except fastjsonschema.JsonSchemaValueException as exc:
        return _describe(exc).replace("arguments", root, 1)
    return None


class ToolDefinition(_Config):
    """One registered tool.

    ``parameters`` is the JSON Schema of the call's arguments, as the model sees
    it; a schema without a ``type`` gets ``"type": "object"`` (providers require it).
    """

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    require_approval: ApprovalRule = False
    executor: ExecutorConfig
    #: Whether the tool deduplicates calls by their idempotency key (the
    #: ``Idempotency-Key`` header of ``http`` tools, ``idempotency_key`` in a ``lambda``
    #: tool's payload). True by default: every call keeps one key across every resume
    #: and both executors send it, so a call that runs again after a crash is a repeat
    #: the tool recognises. False: the tool cannot deduplicate, so a call that was
    #: running when its request died is never run again by itself; it becomes
    #: ``outcome_unknown`` and a person decides.
    idempotent: bool = True
    #: A webhook told (signed, see :mod:`turnledger.ops.notifications`) when a call of this
    #: tool waits for approval, is decided or expires.
    notify: str | None = Field(default=None, pattern=r"^https?://\S+$")
    #: Four-eyes: a call of this tool is approved only by someone other than the actor of
    #: the turn that asked for it (``403 approver_is_requester``; ``APPROVAL_FOUR_EYES``
    #: turns it on for every tool).
    four_eyes: bool = False
    #: The data class its results are (``turnledger.context.policy``): a result raises
    #: the conversation's class to it. ``None``: as the detectors find.
    result_class: str | None = Field(default=None, min_length=1)

    _validator: Callable[[Any], Any] = PrivateAttr()

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "type" not in value:
            return {"type": "object", **value}
        if value["type"] != "object":
            raise ValueError('must describe a JSON object ("type": "object")')
        return value

    @model_validator(mode="after")
    def _compile_schema(self) -> ToolDefinition:
        self._validator = _compile(self.parameters)
        return self

    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def validate_arguments(self, arguments: dict[str, Any]) -> str | None:
        """Check ``arguments`` against ``parameters``.

        Returns:
            ``None`` when valid, else a message naming the tool, the field and the reason.
        """
        try:
            self._validator(arguments)
        except fastjsonschema.JsonSchemaValueException as exc:
            return f"invalid arguments for tool {self.name}: {_describe(exc)}"
        return None

    def validate_call(self, call: ToolCall) -> str | None:
        """Check a model's call of this tool, including arguments that were not JSON.

        Returns:
            ``None`` when the call may run, else the error text the model should see.
        """
        if call.raw_arguments is not None:
            return (
                f"invalid arguments for tool {self.name}: "
                f"{arguments_refusal(call.raw_arguments)}: {call.raw_arguments[:200]!r}"
            )
        return self.validate_arguments(call.arguments)


def client_tool(declared: ClientTool) -> ToolDefinition:
    """A tool a request declared (and the registry lacks) as a ``client`` tool: offered to
    the model, never run here.

    Raises:
        ValueError: its ``parameters`` are no JSON Schema of an object.
    """
    return ToolDefinition(
        name=declared.name,
        description=declared.description,
        parameters=declared.parameters,
        executor=ClientExecutorConfig(type="client"),
    )


class _RegistryDocument(_Config):
    tools: list[Any]


def _error_lines(exc: ValidationError) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return lines


def _duplicate_errors(tools: list[ToolDefinition]) -> list[str]:
    seen: set[str] = set()
    errors = []
    for tool in tools:
        if tool.name in seen:
            errors.append(f"tool {tool.name!r}: duplicate name")
        seen.add(tool.name)
    return errors


def mcp_tool(
    catalog: McpCatalog, label: str, tool: str, *, read_since: float | None = None
) -> ToolDefinition:
    """The registered tool ``mcp__<label>__<tool>``, from its server's listing.

    Raises:
        UnknownTool: the server is not registered, or does not offer that tool.
        ToolServerUnavailable: the server could not list its tools.
    """
    server = catalog.server(label)
    listed = (
        next((t for t in catalog.tools(label, read_since=read_since) if t.name == tool), None)
        if server is not None
        else None
    )
    name = tool_name(label, tool)
    if server is None or listed is None:
        raise UnknownTool(f"tool {name!r} is not registered", details={"tool": name})
    try:
        return ToolDefinition(
            name=name,
            description=listed.description,
            parameters=dict(listed.input_schema),
            require_approval=approval_needed(server.require_approval, tool, listed.read_only),
            executor=McpExecutorConfig(
                type="mcp",
                server=server,
                tool=tool,
                read_only=listed.read_only,
                definition_sha256=listed.definition_sha256,
                timeout_seconds=server.timeout_seconds,
            ),
            idempotent=listed.read_only,
            notify=server.notify,
            four_eyes=server.four_eyes,
        )
    except ValidationError as exc:
        raise UnknownTool(
            f"tool {name!r} has a definition that cannot be offered: "
            + "; ".join(_error_lines(exc)),
            details={"tool": name},
        ) from None


class ToolRegistry:
    """The registered tools, by name, in registry order; then the tools of the registered
    MCP servers (``mcp__<server_label>__<tool>``), from their listings (:mod:`.mcp`)."""

    def __init__(
        self,
        tools: Iterable[ToolDefinition] = (),
        servers: Iterable[McpServerEntry] = (),
        *,
        mcp: McpLink | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        """Register ``tools`` and the MCP ``servers``.

        Args:
            mcp: the process's link to MCP servers (its listings are reused across the
                registries it loads); a new one when ``None``.
            timeout_seconds: the call deadline of servers that set none.

        Raises:
            InvalidToolRegistry: two tools, or two servers, have the same name.
        """
        tools = list(tools)
        servers = list(servers)
        errors = _duplicate_errors(tools)
        labels: set[str] = set()
        for server in servers:
            if server.server_label in labels:
                errors.append(f"MCP server {server.server_label!r}: duplicate server_label")
            labels.add(server.server_label)
        if errors:
            raise InvalidToolRegistry(
                f"tool registry is invalid: {'; '.join(errors)}", details={"errors": errors}
            )
        self._tools: dict[str, ToolDefinition] = {tool.name: tool for tool in tools}
        self.mcp = McpCatalog(
            servers={s.server_label: s for s in servers},
            link=mcp if mcp is not None else McpLink(),
            timeout_seconds=timeout_seconds,
        )

    # --- loaders -----------------------------------------------------------------

    @classmethod
    def empty(cls) -> ToolRegistry:
        """A registry with no tools."""
        return cls()

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        source: str = "tool registry",
        mcp: McpLink | None = None,
    ) -> ToolRegistry:
        """Parse and validate a registry document.

        Args:
            text: the JSON document ``{"tools": [...]}``.
            source: where it came from, for error messages.

        Raises:
            InvalidToolRegistry: the document is not JSON, not of the registry's shape,
                or a tool is invalid (every problem is listed, each naming its tool).
        """
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise InvalidToolRegistry(f"{source} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidToolRegistry(f'{source} must be a JSON object {{"tools": [...]}}')
        try:
            document = _RegistryDocument.model_validate(raw)
        except ValidationError as exc:
            errors = _error_lines(exc)
            raise InvalidToolRegistry(
                f'{source} must be an object {{"tools": [...]}}: {"; ".join(errors)}',
                details={"errors": errors},
            ) from None
        tools: list[ToolDefinition] = []
        servers: list[McpServerEntry] = []
        errors = []
        for index, entry in enumerate(document.tools):
            if isinstance(entry, dict) and entry.get("type") == "mcp":
                server = entry.get("server_label")
                label = f"MCP server {server!r}" if isinstance(server, str) else f"tool #{index}"
                try:
                    servers.append(McpServerEntry.model_validate(entry))
                except ValidationError as exc:
                    errors.extend(f"{label}: {line}" for line in _error_lines(exc))
                continue
            name = entry.get("name") if isinstance(entry, dict) else None
            label = f"tool {name!r}" if isinstance(name, str) else f"tool #{index}"
            try:
                tools.append(ToolDefinition.model_validate(entry))
            except ValidationError as exc:
                errors.extend(f"{label}: {line}" for line in _error_lines(exc))
        errors.extend(_duplicate_errors(tools))
        if errors:
            raise InvalidToolRegistry(
                f"{source} is invalid: {'; '.join(errors)}", details={"errors": errors}
            )
        return cls(tools, servers, mcp=mcp)

    @classmethod
    def from_file(cls, path: str | Path, *, mcp: McpLink | None = None) -> ToolRegistry:
        """Load a registry from a JSON file.

        Raises:
            InvalidToolRegistry: the file cannot be read or is invalid.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidToolRegistry(f"cannot read tool registry {path}: {exc}") from None
        return cls.from_json(text, source=f"tool registry {path}", mcp=mcp)

    @classmethod
    def from_parameter(
        cls,
        name: str,
        *,
        ssm_client: SSMClient | None = None,
        max_age: int = PARAMETER_MAX_AGE_SECONDS,
        mcp: McpLink | None = None,
    ) -> ToolRegistry:
        """Load a registry from an SSM parameter (``String`` or ``SecureString``).

        Read through Powertools Parameters, which caches it for ``max_age`` seconds.

        Args:
            name: the parameter name.
            ssm_client: the SSM client to use; Powertools' default one otherwise.
            max_age: seconds a fetched value is reused.

        Raises:
            InvalidToolRegistry: the parameter cannot be read or is invalid.
        """
        # Imported here: only deployments that keep the registry in SSM pay for it.
        from aws_lambda_powertools.utilities import parameters

        value: str | bytes | dict[Any, Any] | None
        try:
            if ssm_client is None:
                value = parameters.get_parameter(name, decrypt=True, max_age=max_age)
            else:
                provider = parameters.SSMProvider(boto3_client=ssm_client)
                value = provider.get(name, decrypt=True, max_age=max_age)
        except parameters.exceptions.GetParameterError as exc:
            raise InvalidToolRegistry(
                f"cannot read tool registry parameter {name}: {exc}"
            ) from None
        if not isinstance(value, str | bytes):
            raise InvalidToolRegistry(f"tool registry parameter {name} is not text")
        return cls.from_json(value, source=f"tool registry parameter {name}", mcp=mcp)

    @classmethod
    def from_settings(cls, settings: Settings, *, mcp: McpLink | None = None) -> ToolRegistry:
        """The deployment's registry: ``TOOLS_FILE``, ``TOOLS_PARAMETER``, or none.

        ``mcp``: the process's link to MCP servers (see :class:`ToolRegistry`).

        Raises:
            InvalidToolRegistry: both are set, or the registry cannot be loaded.
        """
        if settings.tools_file and settings.tools_parameter:
            raise InvalidToolRegistry("set TOOLS_FILE or TOOLS_PARAMETER, not both")
        if settings.tools_file:
            registry = cls.from_file(settings.tools_file, mcp=mcp)
        elif settings.tools_parameter:
            registry = cls.from_parameter(settings.tools_parameter, mcp=mcp)
        else:
            return cls.empty()
        registry.mcp.timeout_seconds = settings.tool_timeout_seconds
        return registry

    # --- lookups -----------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The registered names, in registry order."""
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[ToolDefinition]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and (parts := split_name(name)) is not None:
            return self.mcp.server(parts[0]) is not None
        return name in self._tools

    def get(self, name: str, *, read_since: float | None = None) -> ToolDefinition:
        """The tool called ``name``.

        Args:
            read_since: an MCP tool's definition is from a listing read at or after this
                instant (:meth:`~.mcp_link.McpCatalog.now`), never an older kept one's.

        Raises:
            UnknownTool: no tool has that name.
            ToolServerUnavailable: an MCP tool's server could not list its tools.
        """
        parts = split_name(name)
        if parts is not None and self.mcp.server(parts[0]) is not None:
            return mcp_tool(self.mcp, *parts, read_since=read_since)
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(
                f"tool {name!r} is not registered",
                details={"tool": name, "registered": self.names},
            ) from None

    def select(self, names: list[str] | None = None) -> list[ToolDefinition]:
        """The tools a turn offers the model.

        Args:
            names: the turn's ``tools`` list (order kept, repeats dropped); ``None``
                means every registered tool, with every tool its MCP servers offer (a
            server that cannot list its tools now is left out).

        Raises:
            UnknownTool: a name is not registered (``details.unknown`` lists them all).
            ToolServerUnavailable: a named tool's MCP server cannot list its tools.
        """
        if names is None:
            offered = list(self._tools.values())
            for label in self.mcp.servers:
                try:
                    listed = self.mcp.tools(label)
                except ToolServerUnavailable:
                    # Logged by the catalog; a server that is down leaves every other
                    # tool (and a rejection of its own calls) usable.
                    continue
                offered.extend(mcp_tool(self.mcp, label, tool.name) for tool in listed)
            return offered
        unknown = [name for name in dict.fromkeys(names) if name not in self]
        if unknown:
            raise UnknownTool(
                f"tools not registered: {', '.join(unknown)}",
                details={"tool": unknown[0], "unknown": unknown, "registered": self.names},
            )
        return [self.get(name) for name in dict.fromkeys(names)]

    def specs(self, names: list[str] | None = None) -> list[ToolSpec]:
        """The :class:`ToolSpec` of :meth:`select` ``(names)``.

        Raises:
            UnknownTool: a name is not registered.
        """
        return [tool.spec() for tool in self.select(names)]


def requirement(
    tool: ToolDefinition,
    arguments: Mapping[str, Any],
    *,
    extra_approval: Collection[str] = frozenset(),
) -> Requirement:
    """What a call of ``tool`` with ``arguments`` waits for before it has a result.

    Args:
        tool: the registered tool.
        arguments: the call's (valid) arguments.
        extra_approval: tool names the turn's ``require_approval`` lists; they can
            only add an approval requirement, never waive one.

    Returns:
        ``"client"`` for a client-side tool (the caller runs it), ``"input"`` for a
        human-input tool (a person supplies its output), ``"approval"`` when
        the registry's rule or ``extra_approval`` asks for a human decision, else
        ``"none"``.
    """
    if tool.executor.type == "client":
        return "client"
    if tool.executor.type == "human":
        return "input"  # the person who answers it is the decision
    if approval_required(tool.require_approval, arguments) or tool.name in extra_approval:
        return "approval"
    return "none"
