"""``dedal base build [NAME] | list | show NAME``: the base images builds run in."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from dedal.commands import needs_action
from dedal.model import base
from dedal.model import config


def register(sub: Any) -> None:
    p = sub.add_parser(
        "base",
        help="build, list and show base images (base-images/)",
        description="Base images: the root filesystems builds run in and images start from.",
    )
    bsub = p.add_subparsers(dest="base_command", metavar="ACTION")
    b = bsub.add_parser("build", help="build a base image (debootstrap + apt), unless it is cached")
    b.add_argument("name", nargs="?", default=None, help="definition name (default: the base_image setting)")
    b.add_argument("--rebuild", action="store_true", help="build again even when cached")
    b.add_argument("--mirror", default=None, help="Debian mirror URL (setting debian_mirror)")
    b.add_argument("--json", action="store_true", help="print the built base as JSON")
    b.set_defaults(func=cmd_build)
    ls = bsub.add_parser("list", help="list base definitions and cached bases")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    sh = bsub.add_parser("show", help="show a definition and what its built base holds")
    sh.add_argument("name")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)
    p.set_defaults(func=needs_action(p))


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n else "-"


def cmd_build(args: Any) -> int:
    from dedal.stages.base import ensure_base  # debootstrap and the runtimes: only to build

    settings = config.from_args(args, debian_mirror=args.mirror)
    name = args.name or settings.base_image
    t0 = time.monotonic()
    quiet = args.json

    def progress(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    cached = None if args.rebuild else base.find_base(name, settings)
    img = cached or ensure_base(name, settings, progress=progress, rebuild=args.rebuild)
    if args.json:
        data = img.to_json()
        data.pop("packages", None)
        data["cached"] = cached is not None
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    state = "cached" if cached else f"built in {time.monotonic() - t0:.0f} s"
    print(f"{img.id}: {state}")
    print(f"  rootfs:   {img.rootfs_dir} ({_mb(img.rootfs_bytes)})")
    print(f"  squashfs: {img.squashfs} ({_mb(img.squashfs_bytes)})")
    print(f"  os:       {img.os_release.get('PRETTY_NAME', '?')} ({img.os_release.get('DEBIAN_VERSION', '')})")
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(img.versions.items())))
    return 0


def cmd_list(args: Any) -> int:
    settings = config.from_args(args)
    rows = base.list_bases(settings)
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    print(f"{'NAME':<18} {'KIND':<10} {'STATE':<12} {'SIZE':>8}  ID / DESCRIPTION")
    for r in rows:
        state = (
            "stale"
            if r.get("stale")
            else ("built" if r["built"] else ("not built" if r.get("buildable_here") else "needs apptainer"))
        )
        if r.get("error"):
            state = "invalid"
        print(
            f"{r['name']:<18} {r['kind']:<10} {state:<12} {_mb(r.get('squashfs_bytes', 0)):>8}  "
            f"{r['id']}  {r.get('description') or r.get('error', '')}"
        )
    print(f"(cache: {settings.base_cache})")
    return 0


def cmd_show(args: Any) -> int:
    settings = config.from_args(args)
    info = base.show_base(args.name, settings)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    d = info["definition"]
    print(f"{d['name']} ({d['kind']}): {d['description']}")
    print(f"  definition: {d['path']}")
    print(f"  id:         {d['id']}")
    if d["kind"] == "debian":
        print(
            f"  debian:     {d['suite']} --variant={d['variant']} {d['arch']}"
            f"{' +updates' if d['updates'] else ''}{' +security' if d['security'] else ''}"
            f" ({' '.join(d.get('components') or ['main'])})"
        )
        for group, pkgs in d["packages"].items():
            print(f"  {group + ':':<11} {' '.join(pkgs)}")
    b = info["base"]
    if not b:
        print(f"  built:      no (dedal base build {d['name']})")
        return 0
    print(
        f"  built:      {b['path']} in {b['build_seconds']:.0f} s, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(b['built_at']))}"
    )
    print(f"  os:         {b['os_release'].get('PRETTY_NAME', '?')} ({b['os_release'].get('DEBIAN_VERSION', '')})")
    print(
        f"  size:       rootfs {_mb(b['rootfs_bytes'])}, squashfs {_mb(b['squashfs_bytes'])}, "
        f"{len(b['packages'])} packages"
    )
    for k, v in sorted(b["versions"].items()):
        print(f"  {k + ':':<11} {v}")
    return 0
