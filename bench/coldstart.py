"""Cold start: how long each Lambda handler takes to import, in fresh interpreters.

Lambda imports the handler module once per execution environment, before the
first request, and the caller waits for it. This benchmark does the same in a
fresh subprocess per sample (median of ``--runs``): the handler's folder first
on ``sys.path``, the environment the template gives the function (parameters
at their defaults, resources as placeholder names) plus what the Lambda runtime
sets. For comparison it times a few heavy imports alone, and it lists the ten
largest cumulative imports of the turn handler (``python -X importtime``).

Writes the section ``## Cold start`` of ``bench/RESULTS.md``.
Run from the repository root: ``.venv/bin/python -m bench.coldstart``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnledger_local.template import PROJECT_ROOT, functions, load_template

from bench.results import command_line, machine_line, write_section

SECTION = "Cold start"
HANDLERS = ("turn", "read", "clear", "approve", "sweep")
REGION = "us-east-1"

#: Runs in the fresh interpreter: executes each step (Python source given as an
#: argument) in one namespace and prints the milliseconds of each as JSON. Nothing
#: is imported before the first step that the steps could need (``json`` comes after).
_PROBE = """
import sys, time
sys.stderr.write("### steps begin\\n")
spent = []
scope = {"sys": sys}
for step in sys.argv[1:]:
    started = time.perf_counter()
    try:
        exec(step, scope)
    except BaseException as exc:
        sys.stderr.write(f"### failed: {type(exc).__name__}: {exc}\\n")
        raise SystemExit(3)
    spent.append((time.perf_counter() - started) * 1000)
    sys.stderr.write("### step done\\n")
import json
print(json.dumps(spent))
"""

#: Imports timed alone, for comparison with the handlers.
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("`import boto3`", "import boto3"),
    (
        "`boto3` DynamoDB + S3 clients (import and create)",
        "import boto3\nsession = boto3.session.Session()\n"
        "session.client('dynamodb')\nsession.client('s3')",
    ),
    (
        "Powertools `Tracer()` (import and create; X-Ray SDK, patches boto3 and httpx)",
        "from aws_lambda_powertools import Tracer\nTracer()",
    ),
    (
        "Powertools idempotency (`aws_lambda_powertools.utilities.idempotency`)",
        "import aws_lambda_powertools.utilities.idempotency",
    ),
    ("`import pydantic`", "import pydantic"),
)


class ProbeFailed(RuntimeError):
    """A step raised in the subprocess (the handler is not importable yet, for one)."""


@dataclass(frozen=True)
class Handler:
    """One function of the template: where its code is and what Lambda imports."""

    name: str
    logical_id: str
    folder: Path
    module: str
    environment: dict[str, str]


def _resolve(value: Any, parameters: Mapping[str, Any], stack: str) -> str:
    """A template environment value as a string: ``Ref`` to a parameter is its default."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        name = str(value["Ref"])
        if name in parameters:
            default = parameters[name].get("Default", "")
            return ",".join(map(str, default)) if isinstance(default, list) else str(default)
        return f"{stack}-{name}"  # a resource: a placeholder physical name
    if isinstance(value, dict):
        return f"{stack}-unresolved"  # another intrinsic; no function reads these at import
    return str(value)


def handlers(stack: str = "bench") -> dict[str, Handler]:
    """Every function of ``template.yaml`` by its folder name, with its Lambda environment."""
    template = load_template()
    parameters = template.get("Parameters", {})
    shared = ((template.get("Globals") or {}).get("Function") or {}).get("Environment") or {}
    found: dict[str, Handler] = {}
    for logical_id, spec in functions(template).items():
        props = template["Resources"][logical_id]["Properties"]
        variables = {
            **shared.get("Variables", {}),
            **(props.get("Environment") or {}).get("Variables", {}),
        }
        environment = {k: _resolve(v, parameters, stack) for k, v in variables.items()}
        folder = PROJECT_ROOT / spec.code_uri
        found[folder.name] = Handler(
            name=folder.name,
            logical_id=logical_id,
            folder=folder,
            module=spec.handler.rsplit(".", 1)[0],
            environment=environment,
        )
    return found


def imported_modules(handler: Handler) -> tuple[str, ...]:
    """The modules the handler's source imports at its top level, sorted."""
    tree = ast.parse((handler.folder / f"{handler.module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return tuple(sorted(found - {"__future__"}))


def twins(chosen: Sequence[Handler]) -> list[tuple[list[str], tuple[str, ...]]]:
    """Groups of two or more handlers whose sources import exactly the same modules."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for handler in chosen:
        groups.setdefault(imported_modules(handler), []).append(handler.name)
    return [(names, modules) for modules, names in groups.items() if len(names) > 1]


def lambda_environment(handler: Handler | None) -> dict[str, str]:
    """What a fresh Lambda execution environment holds (fake credentials, no config files)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        # Never read the machine's own AWS configuration.
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.13",
        "PYTHONUNBUFFERED": "1",
    }
    if handler is not None:
        env.update(handler.environment)
        env["AWS_LAMBDA_FUNCTION_NAME"] = f"bench-{handler.logical_id}"
        env["LAMBDA_TASK_ROOT"] = str(handler.folder)
        env["_HANDLER"] = f"{handler.module}.lambda_handler"
    else:
        env["AWS_LAMBDA_FUNCTION_NAME"] = "bench-comparison"
    return env


def probe(
    steps: Sequence[str], env: Mapping[str, str], *, importtime: bool = False
) -> tuple[list[float], str]:
    """Run ``steps`` in a fresh interpreter; the milliseconds of each, and its stderr.

    Raises:
        ProbeFailed: a step raised (the message says which exception).
    """
    flags = ["-X", "importtime"] if importtime else []
    done = subprocess.run(
        [sys.executable, *flags, "-c", _PROBE, *steps],
        env=dict(env),
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        failure = [line for line in done.stderr.splitlines() if line.startswith("### failed")]
        reason = failure[-1].removeprefix("### failed: ") if failure else done.stderr[-500:]
        raise ProbeFailed(reason)
    return [float(x) for x in json.loads(done.stdout)], done.stderr


def _handler_steps(handler: Handler) -> list[str]:
    return [
        f"sys.path.insert(0, {str(handler.folder)!r})\nimport {handler.module}",
        "from turnledger.runtime import get_runtime\nget_runtime()",
    ]


@dataclass
class Timing:
    """Milliseconds over fresh interpreters, or why it could not be measured."""

    label: str
    import_ms: list[float] = field(default_factory=list)
    runtime_ms: list[float] = field(default_factory=list)
    error: str | None = None


def _sample_handler(handler: Handler, timing: Timing) -> None:
    try:
        spent, _ = probe(_handler_steps(handler), lambda_environment(handler))
    except ProbeFailed as exc:
        timing.error = str(exc)
        return
    timing.import_ms.append(spent[0])
    timing.runtime_ms.append(spent[1])


def _sample_snippet(code: str, timing: Timing) -> None:
    try:
        spent, _ = probe([code], lambda_environment(None))
    except ProbeFailed as exc:
        timing.error = str(exc)
        return
    timing.import_ms.append(spent[0])


def measure(
    chosen: Sequence[Handler], comparisons: Sequence[tuple[str, str]], runs: int
) -> tuple[list[Timing], list[Timing]]:
    """Time every handler and comparison ``runs`` times, one fresh interpreter each.

    The rounds go over all of them in turn, so a burst of load on the machine
    spreads over every figure instead of skewing one.
    """
    handler_timings = [Timing(h.name) for h in chosen]
    snippet_timings = [Timing(label) for label, _ in comparisons]
    for round_number in range(runs):
        print(f"  round {round_number + 1}/{runs}", flush=True)
        for handler, timing in zip(chosen, handler_timings, strict=True):
            if timing.error is None:
                _sample_handler(handler, timing)
        for (_, code), timing in zip(comparisons, snippet_timings, strict=True):
            if timing.error is None:
                _sample_snippet(code, timing)
    return handler_timings, snippet_timings


@dataclass(frozen=True)
class ImportLine:
    """One line of ``-X importtime``."""

    module: str
    depth: int
    self_us: int
    cumulative_us: int


def import_tree(handler: Handler) -> list[ImportLine]:
    """The imports the handler's own import triggers, from ``python -X importtime``.

    Raises:
        ProbeFailed: the handler does not import.
    """
    _, stderr = probe(_handler_steps(handler)[:1], lambda_environment(handler), importtime=True)
    lines = stderr.splitlines()
    begin = lines.index("### steps begin")
    end = lines.index("### step done")
    found = []
    for line in lines[begin + 1 : end]:
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        stripped = name.lstrip()
        found.append(
            ImportLine(
                module=stripped.strip(),
                depth=(len(name) - len(stripped) - 1) // 2,
                self_us=int(self_us),
                cumulative_us=int(cumulative_us),
            )
        )
    return found


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


def _range(values: Sequence[float]) -> str:
    return f"{min(values):.0f}..{max(values):.0f}" if values else "-"


def render(found: ColdStart, runs: int, command: str) -> str:
    """The markdown of the section (without its ``## `` heading)."""
    timings, comparisons, tree = found.handlers, found.comparisons, found.tree
    out = [
        f"Command: {command}. Run: {machine_line()}.",
        "",
        f"Median of {runs} fresh interpreters each (`{Path(sys.executable).name}` of the "
        "project venv, bytecode caches warm as in a built layer): the handler's folder "
        "first on `sys.path`, the template's environment (parameter defaults; resource "
        "names as placeholders) and what the Lambda runtime sets, with fake credentials. "
        "**import** is what Lambda's init phase runs before the first request; **first "
        "request setup** is building the shared runtime on that request "
        "(`turnledger.runtime.get_runtime()`: boto3 clients, provider, tool runner), also "
        "paid once per cold start. Interpreter start-up itself is not counted. The rounds "
        "alternate between all figures, so load from other processes spreads over all of "
        "them. Measured on this machine, not on Lambda's arm64 CPUs.",
        "",
        "| handler | import ms (median) | range | first request setup ms (median) | "
        "cold start ms (sum) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for t in timings:
        if t.error is not None:
            out.append(f"| `{t.label}` | not importable: {t.error} | | | |")
            continue
        total = statistics.median(t.import_ms) + statistics.median(t.runtime_ms)
        out.append(
            f"| `{t.label}` | {_ms(t.import_ms)} | {_range(t.import_ms)} | "
            f"{_ms(t.runtime_ms)} | {total:.0f} |"
        )
    for names, modules in found.twins:
        out += [
            "",
            f"{', '.join(f'`{n}`' for n in names)} import exactly the same modules "
            f"({', '.join(f'`{m}`' for m in modules)}): their differences are this machine's "
            "noise, not their code.",
        ]
    out += [
        "",
        "### For comparison (each alone in a fresh interpreter)",
        "",
        "| what | ms (median) | range |",
        "| --- | ---: | ---: |",
    ]
    for t in comparisons:
        if t.error is not None:
            out.append(f"| {t.label} | failed: {t.error} | |")
        else:
            out.append(f"| {t.label} | {_ms(t.import_ms)} | {_range(t.import_ms)} |")
    out += ["", "### Largest imports of the turn handler (`python -X importtime`, one run)", ""]
    if isinstance(tree, str):
        out.append(f"Not measured: {tree}")
    else:
        top = sorted(tree, key=lambda line: line.cumulative_us, reverse=True)
        handler_total = top[0] if top else None
        if handler_total is not None:
            out.append(
                f"`{handler_total.module}` (the handler module) takes "
                f"{handler_total.cumulative_us / 1000:.0f} ms cumulative under `-X importtime` "
                "(which adds its own overhead); the ten largest imports inside it "
                "(cumulative includes what each imports; depth 1 = imported by the handler):"
            )
        out += [
            "",
            "| module | depth | cumulative ms | self ms |",
            "| --- | ---: | ---: | ---: |",
        ]
        for line in top[1:11]:
            out.append(
                f"| `{line.module}` | {line.depth} | {line.cumulative_us / 1000:.1f} | "
                f"{line.self_us / 1000:.1f} |"
            )
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class ColdStart:
    """Everything the section reports."""

    handlers: list[Timing]
    comparisons: list[Timing]
    #: The turn handler's imports, or why they could not be listed.
    tree: list[ImportLine] | str
    #: Handlers that import the same modules: their differences are noise.
    twins: list[tuple[list[str], tuple[str, ...]]]


def run(names: Sequence[str], runs: int) -> ColdStart:
    """Time the handlers and the comparisons; take the turn handler's import tree."""
    found = handlers()
    chosen = [found[n] for n in names if n in found]
    absent = "no such function in template.yaml"
    missing = [Timing(n, error=absent) for n in names if n not in found]
    timings, comparisons = measure(chosen, COMPARISONS, runs)
    tree: list[ImportLine] | str
    try:
        tree = import_tree(found["turn"]) if "turn" in found else "no turn function"
    except ProbeFailed as exc:
        tree = str(exc)
    return ColdStart([*timings, *missing], comparisons, tree, twins(chosen))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per figure")
    parser.add_argument(
        "--handlers", nargs="+", default=list(HANDLERS), help="function folders to time"
    )
    parser.add_argument(
        "--print-only", action="store_true", help="print the section, leave RESULTS.md alone"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(f"cold start benchmark: {args.runs} runs each", flush=True)
    found = run(args.handlers, args.runs)
    command = command_line("bench.coldstart", sys.argv[1:] if argv is None else argv)
    markdown = render(found, args.runs, command)
    if args.print_only:
        print(markdown)
    else:
        write_section(SECTION, markdown)
        print(f"wrote '## {SECTION}' of bench/RESULTS.md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
