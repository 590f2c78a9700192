"""`dedal config show`: the effective settings and where each value came from."""

from __future__ import annotations

import argparse
from typing import Optional, Tuple

from rich.table import Table

from dedal.commands import needs_action
from dedal.model.config import BY_KEY, from_args
from dedal.ui.console import out, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the effective configuration")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", help="print every setting, its value and its source")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=run_show)
    p.set_defaults(func=needs_action(p))


def _runtime_choice(setting: str) -> Tuple[Optional[str], str]:
    """The backend the ``runtime`` setting stands for here and why (None: none usable)."""
    from dedal.adapters import runtime
    from dedal.errors import DedalError

    try:
        return runtime.choose_runtime(setting)
    except DedalError as exc:
        return None, str(exc)


def run_show(args: argparse.Namespace) -> int:
    settings = from_args(args)
    rows = settings.as_rows()
    backend, why = _runtime_choice(settings.runtime)
    if args.json:
        shown = {key: {"value": value, "source": source, "env": BY_KEY[key].env_var} for key, value, source in rows}
        shown["runtime"].update(resolved=backend, why=why)
        print_json(shown)
        return 0
    table = Table(title="dedal settings", show_lines=False)
    for col in ("setting", "value", "source", "environment variable"):
        table.add_column(col)
    for key, value, source in rows:
        table.add_row(key, "" if value is None else str(value), source, BY_KEY[key].env_var)
    out.print(table)
    out.print(f"runtime: {backend or 'none'} ({why})", highlight=False, markup=False)
    return 0
