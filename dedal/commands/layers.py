"""`dedal layers list|show|verify|gc|push`: the content-addressed layer store (push: into
a remote layer cache, the same push `dedal build --cache` does)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Set

from rich.table import Table

from dedal.commands import needs_action
from dedal.commands._registry import add_registry_options, progress_printer, registry_options
from dedal.model.config import from_args
from dedal.ui.console import human_seconds, human_size, out, print_json
from dedal.errors import UserError
from dedal.model.layers import LayerStore
from dedal.model.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layers", help="list, show, verify, garbage-collect the layer store or push it to a cache")
    p.add_argument("--layers", metavar="DIR", help="layer store (default: setting `layer_store`)")
    lsub = p.add_subparsers(dest="layers_command", metavar="ACTION")
    p.set_defaults(func=needs_action(p))
    ls = lsub.add_parser("list", help="every layer with package, size and build time")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_list)
    show = lsub.add_parser("show", help="one layer's manifest")
    show.add_argument("key", help="layer key, or a unique prefix / package name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=run_show)
    ver = lsub.add_parser("verify", help="re-hash and audit every layer; report corrupt, refused and orphaned entries")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=run_verify)
    gc = lsub.add_parser("gc", help="remove layers no environment references")
    gc.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="PLAN",
        help="also keep the layers of this plan.json (repeatable); the plans under work_dir are always kept",
    )
    gc.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=run_gc)
    push = lsub.add_parser(
        "push",
        help="seed a remote layer cache with layers of the store",
        description="Push layers of the store into a remote layer cache (the repository "
        "`dedal build --cache` pulls from): every layer, or the given ones and those "
        "of --plan. Layers the cache has are not sent again.",
    )
    push.add_argument("ref", metavar="oras://HOST/REPO", help="the layer cache's repository")
    push.add_argument("keys", nargs="*", metavar="KEY", help="layer key, or a unique prefix (default: every layer)")
    push.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="PLAN",
        help="push the layers of this plan.json (repeatable); each must be in the store",
    )
    add_registry_options(push)
    push.add_argument("--json", action="store_true")
    push.set_defaults(func=run_push)


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
        table.add_row(
            m.key, f"{m.name}@{m.version}", human_size(m.size), str(m.files), human_seconds(m.build_seconds), m.built_at
        )
    out.print(table)
    out.print(f"{len(manifests)} layers, {human_size(sum(m.size for m in manifests))}")
    return 0


def _match(store: LayerStore, key: str, keys: List[str]) -> str:
    """The one key of ``keys`` (the store's) that ``key`` names, exactly or as a prefix."""
    matches = [k for k in keys if k == key] or [k for k in keys if k.startswith(key)]
    if len(matches) != 1:
        raise UserError(
            f"{key!r} matches {len(matches)} layers in {store.root}"
            + (f": {', '.join(matches[:5])}" if matches else "")
        )
    return matches[0]


def run_show(args: argparse.Namespace) -> int:
    store = _store(args)
    man = store.manifest(_match(store, args.key, store.keys()))
    if args.json:
        print_json(man.to_json())
    else:
        for k, v in man.to_json().items():
            out.print(f"{k:15} {v}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from dedal.stages.layer_audit import audit_store

    settings = from_args(args, layer_store=args.layers)
    store = LayerStore(Path(settings.layer_store))
    # the sha256 of every layer, then the entry audit the build and the assembly apply
    # (remembered by sha256 where the assembly remembers it)
    check = audit_store(store, memo=Path(settings.cache_dir) / "assemble" / "audited")
    if args.json:
        print_json(check.to_json())
    else:
        out.print(f"{len(check.ok)} layers ok in {store.root}", markup=False)
        for tag, lines in (
            ("CORRUPT ", check.corrupt),
            ("REFUSED ", check.refused),
            ("ORPHANED", check.orphaned),
            ("TEMP    ", check.temporaries),
        ):
            for line in lines:
                out.print(f"{tag} {line}", markup=False)
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


def _to_push(args: argparse.Namespace, store: LayerStore) -> List[str]:
    """The keys ``layers push`` sends: the given ones and the plans', else every layer."""
    keys = store.keys()
    chosen = [_match(store, k, keys) for k in args.keys]
    for path in args.plan:
        plan = Plan.read(Path(path))
        wanted = [n for n in plan.nodes.values() if n.key]
        absent = [n.label for n in wanted if not store.has(n.key or "")]
        if absent:
            raise UserError(
                f"{path}: {len(absent)} of its layers are not in {store.root}: "
                f"{', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''} (build them first)"
            )
        chosen += [n.key or "" for n in wanted]
    if not args.keys and not args.plan:
        chosen = keys
        if not chosen:
            raise UserError(f"the layer store {store.root} holds no layers")
    return list(dict.fromkeys(chosen))


def run_push(args: argparse.Namespace) -> int:
    # imported here: the registry client (requests) would add ~0.25 s to every `dedal` start
    from dedal.stages.building.cache import CacheReport, LayerCache
    from dedal.stages.layer_audit import audit_stored

    store = _store(args)
    _, access = registry_options(args)
    # every check before the first request: the reference, the keys, the plans
    cache = LayerCache(
        args.ref,
        access=access,
    )
    manifests = [store.manifest(k) for k in _to_push(args, store)]
    cache.say = progress_printer(quiet=args.json)
    report = CacheReport()
    layers = [(f"{m.name}@{m.version}/{m.hash[:7]}", m.key) for m in manifests]
    sendable = []
    for label, key in layers:  # what a build would refuse to store is not offered to the machines sharing the cache
        check = store.verify([key])
        problem = "; ".join(check.corrupt) if check.corrupt else ""
        if not problem:
            try:
                audit_stored(store, key)
            except UserError as exc:
                problem = exc.one_line()
        if problem:
            report.problems.append(f"{label}: not pushed: {problem}")
            cache.say(f"layer cache {cache.ref}: {label} not pushed ({problem})")
        else:
            sendable.append((label, key))
    cache.push_layers(sendable, store, report)
    answered = set(report.pushed) | set(report.skipped) | {p.split(": ", 1)[0] for p in report.problems}
    unsent = [label for label, _ in layers if label not in answered]  # after the registry stopped answering
    if args.json:
        data = dict(report.to_json(), ref=cache.ref, not_sent=unsent)
        for k in ("pulled", "bytes_pulled"):
            data.pop(k)
        print_json(data)
    else:
        out.print(
            f"layer cache {cache.ref}: {len(report.pushed)} pushed ({human_size(report.bytes_pushed)}), "
            f"{len(report.skipped)} there already"
            + (f", {len(report.problems)} failed" if report.problems else "")
            + (f", {len(unsent)} not sent" if unsent else ""),
            markup=False,
        )
        for line in report.problems:
            out.print(f"  FAILED {line}", markup=False)
    return 1 if report.problems or unsent else 0
