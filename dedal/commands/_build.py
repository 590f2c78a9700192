"""Options the commands that build layers share (build, build-image): one definition of
``--executor``, ``-j`` and ``--keep-going`` (with ``--insecure``, for the layer cache and
the registry), so that both commands spell and apply them alike.
Not a subcommand (the leading underscore keeps the CLI from registering it)."""

from __future__ import annotations

import argparse
from typing import Any

from dedal.commands._registry import add_insecure_option, insecure_override
from dedal.model.config import Settings, from_args


def add_build_options(p: argparse.ArgumentParser) -> None:
    """``--executor``, ``-j/--jobs``, ``--keep-going`` and ``--insecure``: the settings
    ``executor``, ``jobs``, ``keep_going`` and ``registry_insecure`` for this run."""
    p.add_argument("--executor", choices=("local", "slurm"), help="where build jobs run (default: setting `executor`)")
    p.add_argument(
        "-j", "--jobs", type=int, help="parallel builds of the local executor (default: setting `jobs`, the CPU count)"
    )
    p.add_argument(
        "--keep-going", action="store_true", default=None, help="build every branch not blocked by a failure"
    )
    add_insecure_option(p)


def build_settings(args: argparse.Namespace, **more: Any) -> Settings:
    """The run's settings with the options of :func:`add_build_options` over them, and ``more``."""
    return from_args(
        args,
        executor=args.executor,
        jobs=args.jobs,
        keep_going=args.keep_going,
        registry_insecure=insecure_override(args),
        **more,
    )
