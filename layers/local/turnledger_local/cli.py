"""``turnledger`` command line: ``turnledger local`` serves the API on this machine;
``turnledger export``, ``import`` and ``seal-existing`` are :mod:`.transfer_cli`'s,
``turnledger replay`` :mod:`.replay_cli`'s (both run by :mod:`.store_cli`, which they
share), ``turnledger quota`` :mod:`.quota`'s.

Flags, defaults and behaviour are those of the "Local runner" section of the
HTTP contract; ``turnledger local --help`` lists them.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from botocore.exceptions import BotoCoreError, ClientError
from turnledger.context.policy import DataPolicy
from turnledger.context.redaction import Redactor
from turnledger.core.config import Settings
from turnledger.core.telemetry import ENV_OTLP_ENDPOINT
from turnledger.providers.factory import PROVIDERS, api_key_source

from .runner import LocalConfig, LocalRunner
from .store_cli import fail
from .template import TEMPLATE_PATH

#: The providers that send a key (``OPENAI_API_KEY`` or where it is kept).
KEYED_PROVIDERS = ("openai-chat", "openai-responses")

_EPILOG = """\
authentication: send 'Authorization: Bearer local:<tenant>' or
'Bearer local:<tenant>:<user>'; anything else is 401.
local routes:
  POST /_local/sweep            runs the expired-conversation sweep now (needs the same
                                Authorization header); a body of {"conversation_ids":
                                [...]} sweeps those conversations of your tenant only.
  POST /_local/provider/forget  drops the demo-stateful provider's stored responses
                                (needs the Authorization header).
  POST /_local/echo             a stand-in tool endpoint: answers the tool, arguments and
                                Idempotency-Key it was sent (events/local-tools.json).
  POST /_local/notifications    where the functions send approval notifications;
  GET /_local/notifications     lists the last 100.
  POST /_local/job              a sample job for deferred tools: answers 202 {"task_id"},
                                then POSTs its result to the call's callback_url.
  GET /_local/jobs              the sample jobs and their callbacks' answers
                                (?conversation_id=ID&wait=S).
In a tools file, ${LOCAL_URL} stands for this server's own base URL.
timeouts: an invocation that outruns its function's Timeout (or --function-timeout)
is killed with its environment, as Lambda does; the client gets API Gateway's
answer, 500 {"message": "Internal Server Error"}.
"""


def _non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def _positive(raw: str) -> int:
    value = _non_negative(raw)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0: {raw}")
    return value


def _port(raw: str) -> int:
    value = _non_negative(raw)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a port: {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``<prog>: usage_error: ...``
    (exit status 2), like every other error of the command; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        sys.exit(fail(self.prog.removeprefix("turnledger").strip(), "usage_error", message, 2))


def build_parser() -> argparse.ArgumentParser:
    """The ``turnledger`` argument parser."""
    parser = _Parser(
        prog="turnledger", description="Durable multi-turn conversation state for LLM apps."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    local = commands.add_parser(
        "local",
        help="serve the API locally",
        description=(
            "Serve the routes of template.yaml through the functions' own handlers,\n"
            "on embedded DynamoDB and S3 (moto) unless endpoints are given;\n"
            "with --data-dir, conversations are kept in a folder (SQLite) instead."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = LocalConfig()
    local.add_argument("--host", default=defaults.host, help="address to bind (%(default)s)")
    local.add_argument("--port", type=_port, default=defaults.port, help="port (%(default)s)")
    local.add_argument(
        "--ttl-seconds",
        type=_non_negative,
        metavar="N",
        help="idle expiry of conversations in seconds; 0 disables (default: 604800)",
    )
    local.add_argument("--tools", type=Path, metavar="FILE", help="tool registry JSON file")
    local.add_argument(
        "--provider",
        metavar="NAME",
        help=f"default model provider: {', '.join(PROVIDERS)} (default: demo)",
    )
    local.add_argument("--model", metavar="NAME", help="default model name (default: demo-1)")
    local.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help=(
            "keep conversations in DIR (a SQLite database, payload files and the wrapped "
            "content keys), across restarts; without it they live in the embedded storage "
            "and go when it stops. A copy of DIR keeps every conversation that was in it, "
            "sealed, even one deleted since: it opens with the master key only, kept "
            "outside DIR (--master-key)"
        ),
    )
    local.add_argument(
        "--master-key",
        type=Path,
        metavar="FILE",
        help=(
            "the master key of --data-dir's content, created if missing (default: "
            "$XDG_STATE_HOME/turnledger/master.key, ~/.local/state/turnledger/master.key "
            "without it; a master.key an older version left in DIR is used, with a warning)"
        ),
    )
    local.add_argument(
        "--dynamodb-endpoint", metavar="URL", help="use this DynamoDB instead of the embedded one"
    )
    local.add_argument(
        "--s3-endpoint", metavar="URL", help="use this S3 instead of the embedded one"
    )
    local.add_argument("--table", default=defaults.table, help="table name (%(default)s)")
    local.add_argument("--bucket", default=defaults.bucket, help="bucket name (%(default)s)")
    local.add_argument(
        "--tenant-claim",
        default=defaults.tenant_claim,
        metavar="CLAIM",
        help="claim the tenant is passed in (%(default)s)",
    )
    local.add_argument("--region", default=defaults.region, help="AWS region (%(default)s)")
    local.add_argument(
        "--template",
        type=Path,
        default=TEMPLATE_PATH,
        metavar="FILE",
        help="SAM template to read routes from (default: the project's template.yaml)",
    )
    context = local.add_argument_group("working context and budgets")
    context.add_argument(
        "--context-max-tokens",
        type=_non_negative,
        metavar="N",
        help="context budget in tokens (default: the model's window less its answer reserve)",
    )
    context.add_argument(
        "--conversation-token-budget",
        type=_non_negative,
        metavar="N",
        help="input + output tokens a conversation may use; then 409 budget_exceeded",
    )
    context.add_argument(
        "--turn-token-budget",
        type=_non_negative,
        metavar="N",
        help="input + output tokens one turn may use before its tool loop stops",
    )
    context.add_argument(
        "--redaction",
        type=Path,
        metavar="FILE",
        help="redaction rule set (JSON) applied to everything a model sees",
    )
    context.add_argument(
        "--data-policy",
        type=Path,
        metavar="FILE",
        help="data policy (JSON): classes, the models each may be sent to, detectors",
    )
    local.add_argument(
        "--log-level",
        default=defaults.log_level,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of the runner and the functions (%(default)s)",
    )
    local.add_argument(
        "--print-metrics",
        action="store_true",
        help="print each invocation's CloudWatch metrics (EMF JSON) on standard output",
    )
    local.add_argument(
        "--max-workers",
        type=_positive,
        default=defaults.max_workers,
        metavar="N",
        help="execution environments (processes) per function; more requests queue (%(default)s)",
    )
    local.add_argument(
        "--function-timeout",
        type=_seconds,
        metavar="SECONDS",
        help=(
            "stop every invocation after SECONDS instead of its function's Timeout in the "
            "template (for tests: a timeout in seconds, not minutes); the handlers' context "
            "reports the same, and the killed environment is replaced"
        ),
    )
    local.add_argument(
        "--read-timeout",
        type=_seconds,
        default=defaults.read_timeout_seconds,
        metavar="SECONDS",
        help=(
            "wait at most SECONDS for each read of a request (a stalled body gets 408 and "
            "the connection closes); also how long an idle connection stays open (%(default)s)"
        ),
    )
    streaming = local.add_argument_group("long and streamed turns (Prefer: respond-async)")
    streaming.add_argument(
        "--demo-token-delay-ms",
        type=_non_negative,
        metavar="MS",
        help="the demo models wait this long before each streamed word (default: 0)",
    )
    local.add_argument(
        "--memory",
        action="store_true",
        default=None,
        help="turns recall and write back each user's long-term memory (MEMORY_ENABLED)",
    )
    from . import quota, telemetry_cli
    from .replay_cli import add_command
    from .transfer_cli import add_commands, add_seal_command

    add_commands(commands)
    add_seal_command(commands)
    add_command(commands)
    quota.add_command(commands)
    telemetry_cli.add_flag(local)
    return parser


def _context_env(args: argparse.Namespace) -> dict[str, str]:
    """The functions' environment for the working-context flags that were given."""
    flags = {
        "CONTEXT_MAX_TOKENS": args.context_max_tokens,
        "CONVERSATION_TOKEN_BUDGET": args.conversation_token_budget,
        "TURN_TOKEN_BUDGET": args.turn_token_budget,
        "REDACTION_FILE": args.redaction.resolve() if args.redaction else None,
        "DATA_POLICY_FILE": args.data_policy.resolve() if args.data_policy else None,
        "DEMO_TOKEN_DELAY_MS": getattr(args, "demo_token_delay_ms", None),
        "MEMORY_ENABLED": "true" if getattr(args, "memory", None) else None,
    }
    return {name: str(value) for name, value in flags.items() if value is not None}


def config_from_args(args: argparse.Namespace) -> LocalConfig:
    """The runner configuration of parsed ``local`` arguments."""
    from .telemetry_cli import environment

    return LocalConfig(
        env={**_context_env(args), **environment(args)},
        host=args.host,
        port=args.port,
        template_path=args.template,
        ttl_seconds=args.ttl_seconds,
        tools_file=args.tools,
        provider=args.provider,
        model=args.model,
        dynamodb_endpoint=args.dynamodb_endpoint,
        s3_endpoint=args.s3_endpoint,
        table=args.table,
        bucket=args.bucket,
        tenant_claim=args.tenant_claim,
        region=args.region,
        log_level=args.log_level,
        data_dir=args.data_dir,
        master_key_file=args.master_key,
        print_metrics=args.print_metrics,
        max_workers=args.max_workers,
        function_timeout_seconds=args.function_timeout,
        read_timeout_seconds=args.read_timeout,
    )


def _banner(url: str, runner: LocalRunner) -> str:
    places = [f"{name} {endpoint}" for name, endpoint in runner.endpoints.items()]
    warning = ""
    if runner.config.data_dir is not None:
        from turnledger.core.config import Settings
        from turnledger.store.local_folder import local_master_key_file, master_key_in_data_dir

        settings = Settings.from_env(runner.environment)
        master = local_master_key_file(settings, runner.environment)
        places.insert(0, f"conversations in {runner.config.data_dir.resolve()}")
        places.insert(1, f"master key {master}")
        if master_key_in_data_dir(settings):
            warning = (
                f"warning: the master key is inside the data folder ({master}): a copy of "
                "the folder opens every conversation it holds, deleted ones too. Move it "
                "out and pass --master-key (docs/OPERATIONS.md, 'Local data folder').\n"
            )
    storage = ", ".join(places) or "none"
    body = shlex.quote('{"input": "My name is Ada."}')
    return (
        f"{warning}turnledger local: serving {url} (storage: {storage})\n"
        "try:\n"
        f"  curl -s -X POST {url}/v1/conversations/demo-1/turns \\\n"
        "    -H 'Authorization: Bearer local:acme' -H 'Content-Type: application/json' \\\n"
        f"    -d {body}\n"
        "Ctrl-C stops."
    )


def key_warnings(environment: Mapping[str, str]) -> list[str]:
    """What the functions' ``environment`` lacks for its providers to answer: the key of
    each OpenAI-style provider it enables (a turn would fail with ``502``)."""
    try:
        settings = Settings.from_env(environment)
    except ValueError:
        return []  # a setting the functions refuse: each request answers it
    if api_key_source(settings) is not None:
        return []
    return [
        f"provider {name} has no key (OPENAI_API_KEY, OPENAI_API_KEY_SECRET or "
        "OPENAI_API_KEY_PARAMETER): its turns fail with 502 unless its server "
        "(OPENAI_BASE_URL) needs none"
        for name in settings.allowed_providers
        if name in KEYED_PROVIDERS
    ]


def _serve(config: LocalConfig) -> int:
    if config.tools_file is not None and not config.tools_file.is_file():
        return fail("local", "invalid_setting", f"no such tools file: {config.tools_file}", 2)
    if config.env.get(ENV_OTLP_ENDPOINT):
        from .telemetry_cli import missing

        if absent := missing():
            need = ", ".join(absent)
            return fail("local", "invalid_setting", f"--otlp-endpoint needs {need}", 2)
    redaction = config.env.get("REDACTION_FILE")
    if redaction is not None:
        try:
            Redactor.parse(Path(redaction).read_bytes(), redaction)
        except (OSError, ValueError) as exc:
            return fail("local", "invalid_setting", str(exc), 2)
    data_policy = config.env.get("DATA_POLICY_FILE")
    if data_policy is not None:
        try:
            DataPolicy.parse(Path(data_policy).read_bytes(), data_policy)
        except (OSError, ValueError) as exc:
            return fail("local", "invalid_setting", str(exc), 2)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    runner = LocalRunner(config)
    try:
        try:
            url = runner.start()
        except OSError as exc:
            return fail(
                "local", "cannot_serve", f"cannot serve on {config.host}:{config.port}: {exc}"
            )
        except (BotoCoreError, ClientError) as exc:
            return fail("local", "aws_error", f"cannot prepare storage: {exc}")
        print(_banner(url, runner), flush=True)
        for warning in key_warnings(runner.environment):
            print(f"turnledger local: warning: {warning}", file=sys.stderr, flush=True)
        stop.wait()
        print("turnledger local: stopping", flush=True)
        return 0
    finally:
        runner.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``turnledger`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "replay":
        from .replay_cli import run_command as replay
        from .store_cli import run

        return run(args, replay)
    if args.command in {"export", "import", "seal-existing"}:
        from .store_cli import run
        from .transfer_cli import run_command as transfer

        return run(args, transfer)
    if args.command == "quota":
        from . import quota

        return quota.run(args)
    if args.command != "local":
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    # The embedded server's and botocore's request chatter hides the runner's own lines.
    chatter = logging.DEBUG if args.log_level == "DEBUG" else logging.WARNING
    for noisy in ("werkzeug", "botocore", "boto3"):
        logging.getLogger(noisy).setLevel(chatter)
    return _serve(config_from_args(args))


if __name__ == "__main__":
    sys.exit(main())
