"""Command line: parses arguments, calls the stage or model code, prints.

Subcommands live in ``dedal/commands/<name>.py``; each module has ``register(sub)``
that adds its parser and sets ``func(args) -> int``. Every DedalError becomes one
line on stderr and its exit code; argparse errors exit with 2.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import sys
from typing import List, Optional

from dedal import __version__
from dedal.errors import DedalError


# commands whose module is not named after them (``-`` becomes ``_`` otherwise)
_MODULE_OF = {"shell": "exec"}


def _command_module(argv: List[str]) -> Optional[str]:
    """The module of the command ``argv`` names, if there is one: the first word that is
    not a global option or its value."""
    takes_value = {"-c", "--config", "-s", "--set"}
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in takes_value:
            skip = True
        elif not word.startswith("-"):
            name = _MODULE_OF.get(word, word.replace("-", "_"))
            if name.startswith("_") or not name.isidentifier():
                return None
            return name
    return None


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The parser, with every command, or only the one ``argv`` names when it names one:
    each command imports the stages it runs, and importing them all cost every run of
    ``dedal`` half a second."""
    parser = argparse.ArgumentParser(
        prog="dedal",
        description="Turn a Spack environment into a portable, performance-verified Apptainer image.",
    )
    parser.add_argument("--version", action="version", version=f"dedal {__version__}")
    parser.add_argument("-c", "--config", metavar="FILE", help="configuration file (default: ./dedal.yaml, ~/.config/dedal/config.yaml)")
    parser.add_argument(
        "-s", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one setting (e.g. -s layer_store=/scratch/layers); repeatable",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import dedal.commands as pkg

    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))
    wanted = _command_module(argv) if argv is not None else None
    for name in [wanted] if wanted in names else names:
        importlib.import_module(f"dedal.commands.{name}").register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except DedalError as exc:
        print(f"dedal: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dedal: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
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


def _internal(exc: BaseException) -> int:
    """A defect of dedal's (every bad input is meant to be a UserError): one line, the
    traceback on request, and an exit code that tells it from a user's mistake (2)."""
    if os.environ.get("DEDAL_DEBUG"):
        raise exc
    text = " ".join(str(exc).split())[:300]
    print(f"dedal: internal error: {type(exc).__name__}: {text} (a bug; DEDAL_DEBUG=1 shows the traceback)",
          file=sys.stderr)
    return 70


if __name__ == "__main__":
    raise SystemExit(main())
