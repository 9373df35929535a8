"""``turnledger export`` and ``turnledger import``: one conversation to or from NDJSON, straight
against a table and bucket (or a ``--data-dir``), for migrations and backups.

The format and its checks are :mod:`turnledger.ops.transfer`'s, the same as
``GET .../export`` and ``POST .../import``::

    turnledger export --table T --bucket B --tenant acme user-123 > user-123.ndjson
    turnledger import --table T2 --bucket B2 --tenant acme user-123 < user-123.ndjson

``turnledger seal-existing`` seals what was written before content sealing was on
(:mod:`turnledger.ops.reseal`), on the same table and bucket (or folder)::

    turnledger seal-existing --table T --bucket B --tenant acme
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from dataclasses import asdict
from typing import Any

from turnledger.core.config import Settings
from turnledger.core.exceptions import InvalidRequest
from turnledger.core.models import ConversationKey, validate_conversation_id
from turnledger.turn.session import utc_now

from .store_cli import add_store_arguments

#: The CLI's default cap on an import: far above the API's, which a Lambda payload bounds.
CLI_MAX_BYTES = 1024 * 1024 * 1024


def add_commands(commands: Any) -> None:
    """Add the ``export`` and ``import`` sub-commands to ``commands`` (argparse subparsers)."""
    defaults = Settings()
    for name, summary in (
        ("export", "write a conversation as NDJSON to stdout (or --file)"),
        ("import", "create a conversation from NDJSON on stdin (or --file)"),
    ):
        command = commands.add_parser(name, help=summary, description=summary)
        command.add_argument("conversation_id", metavar="ID", help="the conversation id")
        command.add_argument("--tenant", required=True, help="the conversation's tenant")
        command.add_argument("--file", metavar="FILE", help="read or write FILE, not stdio")
        add_store_arguments(command)
        if name == "import":
            command.add_argument(
                "--max-bytes",
                type=int,
                default=CLI_MAX_BYTES,
                help="the largest export to import (default: 1 GiB; the CLI is not bound by "
                "the API's MAX_INPUT_BYTES or IMPORT_MAX_EVENTS)",
            )
            command.add_argument(
                "--actor",
                default=f"cli:{getpass.getuser()}",
                help="who imports, recorded on the conversation_imported event "
                "(default: cli:<your user name>)",
            )
            command.add_argument(
                "--ttl-seconds",
                type=int,
                default=None,
                help="the imported conversation's idle TTL (default: TTL_SECONDS, or "
                f"{defaults.ttl_seconds})",
            )


def add_seal_command(commands: Any) -> None:
    """Add the ``seal-existing`` sub-command to ``commands`` (argparse subparsers)."""
    summary = "seal the content written before content sealing was on; print a JSON report"
    command = commands.add_parser("seal-existing", help=summary, description=summary)
    command.add_argument(
        "conversation_id",
        metavar="ID",
        nargs="*",
        help="the conversations to seal (default: every conversation of the tenant, its "
        "own items and its users' memory)",
    )
    command.add_argument("--tenant", required=True, help="the conversations' tenant")
    add_store_arguments(command)


def run_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``export``, ``import`` or ``seal-existing`` on the store ``settings`` name;
    returns the exit status (failures raise: :func:`.store_cli.run` reports them)."""
    from turnledger.ops.transfer import export_text, import_text
    from turnledger.runtime import store_from_settings

    if args.command == "seal-existing":
        return _seal(args, settings)
    key = ConversationKey(
        tenant=args.tenant, conversation_id=validate_conversation_id(args.conversation_id)
    )
    store = store_from_settings(settings)
    if args.command == "export":
        data = export_text(store, key, utc_now()).encode("utf-8")
        if args.file:
            with open(args.file, "wb") as out:
                out.write(data)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        return 0
    # Bytes, decoded as UTF-8 here: text-mode streams would use the locale's encoding
    # and translate newlines, and the export must read back exactly.
    if args.file:
        with open(args.file, "rb") as source:
            raw = source.read()
    else:
        raw = sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the export is not UTF-8") from exc
    ttl = settings.ttl_for(key.tenant) if args.ttl_seconds is None else args.ttl_seconds
    head = import_text(
        store,
        key,
        text,
        actor=args.actor,
        now=utc_now(),
        ttl_seconds=ttl,
        max_bytes=args.max_bytes,
    )
    print(
        f"imported {key.conversation_id}: {head.turn} turns, {head.event_count} events",
        file=sys.stderr,
    )
    return 0


def _seal(args: argparse.Namespace, settings: Settings) -> int:
    from turnledger.ops.reseal import seal_conversations, seal_tenant
    from turnledger.runtime import store_from_settings

    store = store_from_settings(settings)
    if args.conversation_id:
        conversations = [
            ConversationKey(tenant=args.tenant, conversation_id=validate_conversation_id(c))
            for c in args.conversation_id
        ]
        report = seal_conversations(store, conversations)
    else:
        report = seal_tenant(store, args.tenant)
    print(json.dumps(asdict(report)))
    return 0
