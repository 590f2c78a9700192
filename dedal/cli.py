"""Command line: parses arguments, calls the stage or model code, prints.

Subcommands live in ``dedal/commands/<name>.py``; each module has ``register(sub)``
that adds its parser and sets ``func(args) -> int`` (``dedal.commands.build_parser``
assembles them). Every DedalError becomes one
line on stderr and its exit code (a stop by a signal says "interrupted", not "error");
argparse errors exit with 2.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import List, Optional

from dedal.commands import build_parser, command_word, needs_action
from dedal.errors import DedalError, Interrupted

__all__ = ["build_parser", "main"]


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # importing the command's stages takes up to half a second: a Ctrl-C typed meanwhile
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            return needs_action(parser)(args)
        from dedal.ui.activity import set_quiet

        set_quiet(bool(getattr(args, "json", False)))  # --json: no step shown on stderr while it runs
    except KeyboardInterrupt:
        return _stopped_by_ctrl_c(command_word(argv) or "")
    try:
        return int(args.func(args) or 0)
    except Interrupted as exc:  # Ctrl-C, scancel: a stop, not an error
        print(f"dedal: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except DedalError as exc:
        print(f"dedal: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return _stopped_by_ctrl_c(getattr(args, "command", None) or "")
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the machine's state, not a defect nor the input's
            where = f" writing {exc.filename}" if exc.filename else ""
            print(
                f"dedal: error: {exc.strerror}{where}: free some space, or set DEDAL_CACHE_DIR or "
                "DEDAL_DATA_DIR to a larger file system (`dedal config show` says where they are)",
                file=sys.stderr,
            )
            return 1
        if exc.errno != errno.ENAMETOOLONG:
            return _internal(exc)
        # only a path from the input can be too long: a user's mistake, wherever it is noticed
        name = str(exc.filename or "")
        print(f"dedal: error: {name[:60] + '...' if len(name) > 60 else name}: file name too long", file=sys.stderr)
        return 2
    except ValueError as exc:
        if "embedded null byte" not in str(exc):
            return _internal(exc)
        print("dedal: error: a path given holds a NUL character", file=sys.stderr)
        return 2
    except (RecursionError, UnicodeError, TypeError, KeyError) as exc:
        return _internal(exc)


def _stopped_by_ctrl_c(command: str) -> int:
    """Ctrl-C where no Signals block holds it: the same line and exit code as inside one."""
    stop = Interrupted.by(signal.SIGINT, command)
    print(f"dedal: {stop.one_line()}", file=sys.stderr)
    return stop.exit_code


def _internal(exc: BaseException) -> int:
    """A defect of dedal's (every bad input is meant to be a UserError): one line, the
    traceback on request, and an exit code that tells it from a user's mistake (2)."""
    if os.environ.get("DEDAL_DEBUG"):
        raise exc
    text = " ".join(str(exc).split())[:300]
    print(
        f"dedal: internal error: {type(exc).__name__}: {text} (a bug; DEDAL_DEBUG=1 shows the traceback)",
        file=sys.stderr,
    )
    return 70


if __name__ == "__main__":
    raise SystemExit(main())
