"""``dedal inspect IMAGE [--json]``: SIF objects, labels, layers, SBOM summary, sizes.

IMAGE is a local SIF, or ``oras://REGISTRY/REPO:TAG`` (asks the registry, through
``dedal.stages.publish.inspect_remote``).
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

from dedal.commands._registry import add_registry_options, registry_options
from dedal.model import sif
from dedal.ui.console import human_size as _size
from dedal.model.oci import (
    ANN_ARCH,
    ANN_CREATED,
    ANN_DESCRIPTION,
    ANN_ENVIRONMENT,
    ANN_LOCK_HASH,
    ANN_REVISION,
    ANN_SKIPPED,
    ANN_SOURCE,
    ANN_SPACK_COMMIT,
    ANN_TITLE,
    ANN_VERDICT,
    is_remote,
)


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="show what a SIF image holds (objects, labels, layers, SBOM, sizes)")
    p.add_argument("image", help="SIF file, or oras://registry/repo:tag")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--definition", action="store_true", help="also print the definition file")
    add_registry_options(p)  # for oras:// references
    p.set_defaults(func=cmd_inspect)


def _time(t: int) -> str:
    if t <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _remote(args: Any) -> int:
    # imported here: the registry client (requests) would add ~0.25 s to every `dedal` start, --help included
    from dedal.stages.publish import inspect_remote

    _, access = registry_options(args)
    result = inspect_remote(args.image, access=access)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
        return 0
    for line in remote_summary(result):
        print(line)
    return 0


_SHOWN = (
    ("created", ANN_CREATED),
    ("title", ANN_TITLE),
    ("description", ANN_DESCRIPTION),
    ("source", ANN_SOURCE),
    ("revision", ANN_REVISION),
    ("environment", ANN_ENVIRONMENT),
    ("spack", ANN_SPACK_COMMIT),
    ("lock", ANN_LOCK_HASH),
    ("arch", ANN_ARCH),
)


def remote_summary(info: Dict[str, Any]) -> List[str]:
    """What ``inspect_remote`` found, as a reader wants it: the image, whether Apptainer can
    pull it, its provenance, its verdict, and each attachment with its files."""
    lines = [str(info["reference"])]
    lines.append(f"  digest       {info['digest']} ({info.get('mediaType') or '?'}, {info.get('manifest_size', 0)} B)")
    sif = info.get("sif")
    if sif:
        lines.append(f"  SIF          {sif.get('title') or '(untitled)'}, {_size(int(sif['size']))}, {sif['digest']}")
    lines.append(
        "  apptainer    "
        + ("`apptainer pull oras://...` accepts it" if info.get("apptainer_pullable") else "not pullable as a SIF")
    )
    for problem in info.get("problems") or []:
        lines.append(f"    problem: {problem}")
    ann = dict(info.get("annotations") or {})
    for label, key in _SHOWN:
        if ann.get(key):
            lines.append(f"  {label:<12} {ann.pop(key)}")
    lines.append(f"  verdict      {info.get('verdict') or 'unverified'}")
    prov = info.get("provenance")
    if prov:
        lines.append(f"  provenance   {prov.get('predicateType')} ({str(prov.get('digest'))[:19]})")
        lines += [f"    {k}: {v}" for k, v in sorted(prov.items()) if k not in ("predicateType", "digest", "subject")]
    other = sorted(ann.items())
    if other:
        lines.append("  other annotations:")
        lines += [f"    {k}: {v if len(str(v)) <= 100 else str(v)[:97] + '...'}" for k, v in other]
    attachments = info.get("attachments") or []
    how = {"api": "referrers API", "tag-schema": "referrers tag"}.get(str(info.get("referrers")), info.get("referrers"))
    lines.append(f"  attachments  {len(attachments)}" + (f" (found through the {how})" if attachments and how else ""))
    for a in attachments:
        a_ann = a.get("annotations") or {}
        extra = f", verdict {a_ann[ANN_VERDICT]}" if a_ann.get(ANN_VERDICT) else ""
        extra += f" ({a_ann[ANN_SKIPPED]})" if extra and a_ann.get(ANN_SKIPPED) else ""
        lines.append(f"    {a.get('artifactType') or '?'} {str(a.get('digest'))[:19]}{extra}")
        if a.get("error"):
            lines.append(f"      unreadable: {a['error']}")
        for f in a.get("files") or []:
            size = _size(int(f["size"])) if f.get("size") is not None else "?"
            lines.append(f"      {f.get('title') or f.get('digest')} ({size})")
    return lines


def cmd_inspect(args: Any) -> int:
    if is_remote(args.image):
        return _remote(args)
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
    print(
        f"  created {_time(h['created'])}, {_size(info['sizes']['file'])} "
        f"(root filesystem {_size(info['sizes']['rootfs_partition'])}"
        + (f", {info['rootfs']['compression']}, {info['rootfs']['inodes']} inodes" if info["rootfs"] else "")
        + ")"
    )
    print("\nobjects:")
    print(f"  {'ID':<3} {'GROUP':<5} {'OFFSET':>12} {'SIZE':>11}  {'TYPE':<30} NAME")
    for o in info["objects"]:
        print(
            f"  {o['id']:<3} {o['group'] or 'NONE':<5} {o['offset']:>12} {_size(o['size']):>11}  "
            f"{o['type']:<30} {o['name']}"
        )
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
        print(
            f"\nSBOM: CycloneDX {s['spec_version']}, {s['components']} components"
            + (f" ({kinds})" if kinds else "")
            + (f", for {subject}" if subject else "")
        )
    if args.definition and info["definition"]:
        print("\ndefinition:\n" + info["definition"])
    return 0
