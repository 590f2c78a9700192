"""``dedal inspect IMAGE [--json]``: SIF objects, labels, layers, SBOM summary, sizes.

IMAGE is a local SIF, or ``oras://REGISTRY/REPO:TAG`` (asks the registry, through
``dedal.stages.publish.inspect_remote``).
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict

from dedal.errors import UserError


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="show what a SIF image holds (objects, labels, layers, SBOM, sizes)")
    p.add_argument("image", help="SIF file, or oras://registry/repo:tag")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--definition", action="store_true", help="also print the definition file")
    p.set_defaults(func=cmd_inspect)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _time(t: int) -> str:
    if t <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _remote(args: Any) -> int:
    try:
        from dedal.stages.publish import inspect_remote  # written alongside the publish stage
    except ImportError:
        raise UserError("remote inspect is unavailable in this dedal (dedal.stages.publish.inspect_remote is missing); "
                        "pull the image and inspect the file") from None
    from dedal.model import config

    result = inspect_remote(args.image, config.from_args(args))
    if args.json or not isinstance(result, dict):
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        for k, v in result.items():
            print(f"{k}: {v if not isinstance(v, (dict, list)) else json.dumps(v, sort_keys=True)}")
    return 0


def cmd_inspect(args: Any) -> int:
    if args.image.startswith("oras://"):
        return _remote(args)
    from dedal.model import sif

    info: Dict[str, Any] = sif.summarize(args.image)
    if not args.definition:
        info["definition_lines"] = len(info["definition"].splitlines())
    if args.json:
        if not args.definition:
            info.pop("definition")
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    h = info["header"]
    print(f"{info['path']}: SIF {h['version']}, {info['primary_arch']}, id {h['id']}")
    print(f"  created {_time(h['created'])}, {_size(info['sizes']['file'])} "
          f"(root filesystem {_size(info['sizes']['rootfs_partition'])}"
          + (f", {info['rootfs']['compression']}, {info['rootfs']['inodes']} inodes" if info["rootfs"] else "")
          + ")")
    print("\nobjects:")
    print(f"  {'ID':<3} {'GROUP':<5} {'OFFSET':>12} {'SIZE':>11}  {'TYPE':<30} NAME")
    for o in info["objects"]:
        print(f"  {o['id']:<3} {o['group'] or 'NONE':<5} {o['offset']:>12} {_size(o['size']):>11}  "
              f"{o['type']:<30} {o['name']}")
    print("\nlabels:" + ("" if info["labels"] else " (none)"))
    for k, v in sorted(info["labels"].items()):
        if k == "dedal.layers":
            continue
        text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        print(f"  {k}: {text if len(text) <= 100 else text[:97] + '...'}")
    layers = info["layers"]
    print(f"\nlayers: {len(layers)}" + (f", {_size(info['sizes']['layers'])}" if info["sizes"]["layers"] else ""))
    for layer in layers:
        if isinstance(layer, dict):
            name = layer.get("spec") or "@".join(str(layer[k]) for k in ("name", "version") if layer.get(k))
            key = layer.get("key") or layer.get("hash") or ""
            size = _size(int(layer["size"])) if layer.get("size") else ""
            print(f"  {name or '?':<40} {str(key)[:16]:<16} {size:>10}")
        else:
            print(f"  {layer}")
    s = info["sbom"]
    if s is None:
        print("\nSBOM: none")
    elif not s.get("valid"):
        print(f"\nSBOM: present but not a CycloneDX document ({s.get('error', s.get('format'))})")
    else:
        kinds = ", ".join(f"{n} {t}" for t, n in sorted(s["by_type"].items()))
        subject = " ".join(s["subject"].values())
        print(f"\nSBOM: CycloneDX {s['spec_version']}, {s['components']} components"
              + (f" ({kinds})" if kinds else "") + (f", for {subject}" if subject else ""))
    if args.definition and info["definition"]:
        print("\ndefinition:\n" + info["definition"])
    return 0
