"""What the store commands share (``export``, ``import``, ``replay``, ``seal-existing``):
the flags that name a store (a table and bucket, or a ``--data-dir``), the settings they
make, and the one line a failure prints (also ``turnledger quota``'s and the runner's).

The commands themselves are :mod:`.transfer_cli`'s and :mod:`.replay_cli`'s; each takes
what it needs from here and none imports another (``turnledger``'s :func:`.cli.main`
hands :func:`run` the command to run).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace

from botocore.exceptions import BotoCoreError, ClientError, NoRegionError
from turnledger.core.config import Settings
from turnledger.core.exceptions import TurnledgerError

#: A store command: its parsed flags and the store's settings in, the exit status out.
StoreCommand = Callable[[argparse.Namespace, Settings], int]


def add_store_arguments(command: argparse.ArgumentParser) -> None:
    """The flags that name the store a command works on (table and bucket, or a folder)."""
    defaults = Settings()
    command.add_argument(
        "--table", help=f"table name (default: TABLE_NAME, or {defaults.table_name})"
    )
    command.add_argument(
        "--bucket", help=f"bucket name (default: BUCKET_NAME, or {defaults.bucket_name})"
    )
    command.add_argument(
        "--dynamodb-endpoint", metavar="URL", help="DynamoDB endpoint (default: AWS's)"
    )
    command.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: AWS's)")
    command.add_argument("--region", help="AWS region (default: the AWS configuration's)")
    command.add_argument(
        "--data-dir", metavar="DIR", help="use the SQLite store in DIR, not a table"
    )


def store_settings(args: argparse.Namespace) -> Settings:
    """The environment's settings (as the functions read them), with the store's flags."""
    if args.region:
        os.environ["AWS_DEFAULT_REGION"] = args.region
    base = Settings.from_env()  # flags override the environment the functions would read
    return replace(
        base,
        table_name=args.table or base.table_name,
        bucket_name=args.bucket or base.bucket_name,
        dynamodb_endpoint=args.dynamodb_endpoint or base.dynamodb_endpoint,
        s3_endpoint=args.s3_endpoint or base.s3_endpoint,
        store="sqlite" if args.data_dir else base.store,
        data_dir=args.data_dir or base.data_dir,
    )


def run(args: argparse.Namespace, command: StoreCommand) -> int:
    """Run ``command`` (``export``, ``import``, ``replay`` or ``seal-existing``) on the
    store its flags name; returns the exit status.

    Every failure is one line on stderr, ``turnledger <command>: <code>: <message>``, and
    exit status 1: the store's errors with their API code, an unusable setting
    (``invalid_setting``), AWS that cannot be reached or is not configured
    (``aws_error``), a file that cannot be read or written (``file_error``).
    """
    try:
        return command(args, store_settings(args))
    except TurnledgerError as exc:
        return fail(args.command, exc.code, str(exc))
    except ValueError as exc:
        return fail(args.command, "invalid_setting", str(exc))
    except NoRegionError as exc:
        hint = "give --region or AWS_REGION, or --data-dir DIR for a local folder"
        return fail(args.command, "aws_error", f"{exc} ({hint})")
    except (BotoCoreError, ClientError) as exc:
        return fail(args.command, "aws_error", str(exc))
    except OSError as exc:
        return fail(args.command, "file_error", str(exc))


def fail(command: str, code: str, message: str, status: int = 1) -> int:
    """Print one error line, ``turnledger <command>: <code>: <message>`` (``turnledger:
    ...`` for no command); returns ``status``, the exit status to end with."""
    line = " ".join(message.split())  # one line, whatever the message holds
    print(f"{' '.join(filter(None, ['turnledger', command]))}: {code}: {line}", file=sys.stderr)
    return status
