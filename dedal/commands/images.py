"""`dedal images oras://HOST[:PORT]/REPO`: the tags of a repository with size, creation
date and verification verdict."""

from __future__ import annotations

import argparse

from rich.table import Table

from dedal.commands._registry import add_registry_options, registry_options
from dedal.ui.console import human_size, out, print_json
from dedal.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("images", help="list the images of a registry repository with their verdicts")
    p.add_argument(
        "repo",
        nargs="?",
        metavar="REGISTRY/REPO",
        help="oras://HOST[:PORT]/REPO or HOST[:PORT]/REPO (default: setting `registry`)",
    )
    add_registry_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported here: the registry client (requests) would add ~0.25 s to every `dedal` start, --help included
    from dedal.stages import publish as pub

    settings, access = registry_options(args)
    repo = args.repo or settings.registry
    if not repo:
        raise UserError("no repository given and setting `registry` is empty (dedal images oras://HOST/REPO)")
    ref = pub.parse_reference(repo, require_scheme=False)
    if ref.digest:
        raise UserError(f"{repo}: expected a repository, not a digest")
    ref = pub.Reference(ref.host, ref.repository)  # a tag in the setting `registry` is ignored here
    entries = pub.list_images(ref, access=access)
    if args.json:
        print_json([e.to_json() for e in entries])
        return 0
    table = Table(title=str(ref))
    for col in ("tag", "size", "created", "verdict", "arch", "digest"):
        table.add_column(col)
    for e in entries:
        table.add_row(
            e.tag,
            human_size(e.size) if e.size is not None else "(not a SIF)",
            e.created or "",
            e.verdict,
            e.arch or "",
            e.digest[:19],
        )
    out.print(table)
    out.print(f"{len(entries)} image(s)", markup=False)
    return 0
