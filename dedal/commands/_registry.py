"""Options every command that talks to an OCI registry shares (publish, pull, images,
inspect oras://, build-image, build with a remote layer cache): one definition of
``--insecure`` and the credentials, so that each command spells and applies them alike.
Not a subcommand (the leading underscore keeps the CLI from registering it)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import TYPE_CHECKING, Optional, Tuple

from dedal.errors import UserError
from dedal.model.config import Settings, from_args
from dedal.ui.console import err

if TYPE_CHECKING:
    from dedal.adapters.registry import Access  # requests and oras-py: imported when used


def add_insecure_option(p: argparse.ArgumentParser) -> None:
    """``--insecure``: the setting ``registry_insecure`` for this run."""
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow plain HTTP and unverified TLS to the registry (setting registry_insecure)",
    )


def add_registry_options(p: argparse.ArgumentParser) -> None:
    """--insecure, --username, --password-stdin (credentials otherwise come from
    DEDAL_REGISTRY_USER/DEDAL_REGISTRY_PASSWORD, $REGISTRY_AUTH_FILE or ~/.docker/config.json)."""
    add_insecure_option(p)
    p.add_argument(
        "--username", metavar="USER", help="registry user name (default: $DEDAL_REGISTRY_USER, else the auth files)"
    )
    p.add_argument(
        "--password-stdin", action="store_true", help="read the registry password (or token) from standard input"
    )


def insecure_override(args: argparse.Namespace) -> Optional[bool]:
    """The ``registry_insecure`` override ``from_args`` takes: True with --insecure, else
    None (the setting decides)."""
    return True if getattr(args, "insecure", None) else None


def registry_options(args: argparse.Namespace) -> Tuple[Settings, Access]:
    """The run's settings, and how its registry operations reach the registry: --insecure
    (over setting registry_insecure), --username, --password-stdin, the settings' bounds."""
    settings = from_args(args, registry_insecure=insecure_override(args))
    password: Optional[str] = None
    if getattr(args, "password_stdin", False):
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError("--password-stdin: pipe the password into standard input")
        password = sys.stdin.read().rstrip("\r\n")
        if not password:
            raise UserError("--password-stdin: standard input was empty")
    from dedal.adapters.registry import registry_access  # requests and oras-py: only when used

    return settings, registry_access(settings, username=getattr(args, "username", None), password=password)


class _ToPrinter(logging.Handler):
    def __init__(self, printer) -> None:
        super().__init__(logging.WARNING)
        self.printer = printer

    def emit(self, record: logging.LogRecord) -> None:
        self.printer(f"warning: {record.getMessage()}")


def progress_printer(quiet: bool = False):
    """Timestamped progress lines on stderr; the registry adapter's warnings (retries)
    are shown the same way."""
    start = time.monotonic()

    def _print(msg: str) -> None:
        if not quiet:
            err.print(f"[{time.monotonic() - start:6.1f}s] {msg}", markup=False, highlight=False)

    logger = logging.getLogger("dedal.registry")
    for h in [h for h in logger.handlers if isinstance(h, _ToPrinter)]:
        logger.removeHandler(h)
    logger.addHandler(_ToPrinter(_print))
    return _print
