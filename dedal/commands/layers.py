"""`dedal layers list|show|verify|gc`: the content-addressed layer store."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Set

from rich.table import Table

from dedal.model.config import from_args
from dedal.ui.console import human_seconds, human_size, out, print_json
from dedal.errors import UserError
from dedal.model.layers import LayerStore
from dedal.model.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layers", help="list, show, verify or garbage-collect the layer store")
    p.add_argument("--layers", metavar="DIR", help="layer store (default: setting `layer_store`)")
    lsub = p.add_subparsers(dest="layers_command", metavar="ACTION", required=True)
    ls = lsub.add_parser("list", help="every layer with package, size and build time")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_list)
    show = lsub.add_parser("show", help="one layer's manifest")
    show.add_argument("key", help="layer key, or a unique prefix / package name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=run_show)
    ver = lsub.add_parser("verify", help="re-hash every layer; report corrupt and orphaned entries")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=run_verify)
    gc = lsub.add_parser("gc", help="remove layers no environment references")
    gc.add_argument("--plan", action="append", default=[], metavar="PLAN",
                    help="also keep the layers of this plan.json (repeatable); the plans under work_dir are always kept")
    gc.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=run_gc)


def _store(args: argparse.Namespace) -> LayerStore:
    settings = from_args(args, layer_store=args.layers)
    return LayerStore(Path(settings.layer_store))


def run_list(args: argparse.Namespace) -> int:
    store = _store(args)
    manifests = store.manifests()
    if args.json:
        print_json([m.to_json() for m in manifests])
        return 0
    table = Table(title=f"layers in {store.root}")
    for col in ("key", "package", "size", "files", "build time", "built"):
        table.add_column(col)
    for m in manifests:
        table.add_row(m.key, f"{m.name}@{m.version}", human_size(m.size), str(m.files), human_seconds(m.build_seconds), m.built_at)
    out.print(table)
    out.print(f"{len(manifests)} layers, {human_size(sum(m.size for m in manifests))}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    store = _store(args)
    keys = store.keys()
    matches = [k for k in keys if k == args.key] or [k for k in keys if k.startswith(args.key)]
    if len(matches) != 1:
        raise UserError(f"{args.key!r} matches {len(matches)} layers in {store.root}" + (f": {', '.join(matches[:5])}" if matches else ""))
    man = store.manifest(matches[0])
    if args.json:
        print_json(man.to_json())
    else:
        for k, v in man.to_json().items():
            out.print(f"{k:15} {v}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    store = _store(args)
    check = store.verify()
    if args.json:
        print_json(check.to_json())
    else:
        out.print(f"{len(check.ok)} layers ok in {store.root}")
        for line in check.corrupt:
            out.print(f"CORRUPT  {line}")
        for line in check.orphaned:
            out.print(f"ORPHANED {line}")
    return 0 if check.clean else 1


def _referenced(args: argparse.Namespace) -> Set[str]:
    settings = from_args(args)
    plans = [Path(p) for p in args.plan]
    work = Path(settings.work_dir)
    if work.is_dir():
        plans += sorted(work.glob("*/plan.json"))
    keys: Set[str] = set()
    for path in plans:
        plan = Plan.read(path)
        keys |= {n.key for n in plan.nodes.values() if n.key}
    return keys


def run_gc(args: argparse.Namespace) -> int:
    store = _store(args)
    removed = store.gc(_referenced(args), dry_run=args.dry_run)
    if args.json:
        print_json({"removed": removed, "dry_run": args.dry_run})
    else:
        verb = "would remove" if args.dry_run else "removed"
        for k in removed:
            out.print(f"{verb} {k}")
        out.print(f"{len(removed)} entries {verb}")
    return 0
