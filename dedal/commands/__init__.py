"""CLI subcommands, one module each: ``register(sub)`` adds its parser and sets
``func(args) -> int``. :func:`build_parser` assembles them (for ``dedal.cli`` and for
``dedal completion``, which describes every command)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Callable, List, Optional

from dedal import __version__

__all__ = ["build_parser", "command_word", "needs_action"]


# commands whose module is not named after them (``-`` becomes ``_`` otherwise)
_MODULE_OF = {"shell": "exec", "run": "exec"}


def command_word(argv: List[str]) -> Optional[str]:
    """The command ``argv`` names, as typed: the first word that is not a global option or
    its value (None without one)."""
    takes_value = {"-c", "--config", "-s", "--set"}
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in takes_value:
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def _command_module(argv: List[str]) -> Optional[str]:
    """The module of the command ``argv`` names, if there is one."""
    word = command_word(argv)
    if word is None:
        return None
    name = _MODULE_OF.get(word, word.replace("-", "_"))
    if name.startswith("_") or not name.isidentifier():
        return None
    return name


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The parser, with every command, or only the one ``argv`` names when it names one:
    each command imports the stages it runs, and importing them all cost every run of
    ``dedal`` half a second."""
    parser = argparse.ArgumentParser(
        prog="dedal",
        description="Turn a Spack environment into a portable, performance-verified Apptainer image.",
    )
    parser.add_argument("--version", action="version", version=f"dedal {__version__}")
    parser.add_argument(
        "-c", "--config", metavar="FILE", help="configuration file (default: ./dedal.yaml, ~/.config/dedal/config.yaml)"
    )
    parser.add_argument(
        "-s",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting (e.g. -s layer_store=/scratch/layers); repeatable",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    wanted = _command_module(argv) if argv is not None else None
    for name in [wanted] if wanted in names else names:
        importlib.import_module(f"dedal.commands.{name}").register(sub)
    return parser


def needs_action(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """What a command of actions does when given none (``dedal layers``, ``dedal`` alone):
    its help, which lists the actions, on stderr, and exit 2. One way for every such
    command: before, two answered with argparse's "arguments are required: ACTION", which
    names none of them, and three printed the help on stdout."""

    def func(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return func
