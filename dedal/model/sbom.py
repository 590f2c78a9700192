"""The image's software bill of materials: CycloneDX 1.5 JSON made from the plan (and lock).

One component per package of the image (the runtime closure, or what the assembler
put in), identified by its Spack DAG hash (``bom-ref``) and a package URL
``pkg:spack/<name>@<version>?arch=...&hash=...&namespace=...``; packages built into
layers carry the layer's sha256, externals (provided by the base image) say so. A package
whose source was archived from a git repository at a pinned commit (``recipes/gitsrc``,
:mod:`dedal.model.git_sources`) names its origin: the repository (``vcs``, with the commit)
and the archive (``distribution``, with its sha256) as external references, and the same as
``dedal:source_*`` properties. The
``dependencies`` section is the link/run graph between those components; the metadata
names the image (environment, tag), the lock hash, the Spack commit and the base.

Deterministic: the same plan, layers and time give the same bytes (sorted components,
a serial number derived from the content, the time from the caller).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional
from urllib.parse import quote

from dedal import __version__
from dedal.model.plan import Plan

if TYPE_CHECKING:
    from dedal.model.spack_lock import SpackLock


SPEC_VERSION = "1.5"
SCHEMA = "http://cyclonedx.org/schema/bom-1.5.schema.json"
RUNTIME_TYPES = ("link", "run")


def _q(text: str) -> str:
    """Percent-encoding for purl parts (purl spec: only unreserved characters stay)."""
    return quote(str(text), safe=".-_~")


def purl(name: str, version: str, qualifiers: Mapping[str, str]) -> str:
    quals = "&".join(f"{k}={_q(v)}" for k, v in sorted(qualifiers.items()) if v)
    return f"pkg:spack/{_q(name)}@{_q(version)}" + (f"?{quals}" if quals else "")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _variants(raw: Mapping[str, Any]) -> Dict[str, str]:
    """Scalar variants and non-empty list parameters of a lock node (flags, patches left out)."""
    params = raw.get("parameters") if isinstance(raw.get("parameters"), dict) else {}
    found: Dict[str, str] = {}
    for k, v in sorted(params.items()):
        if k == "patches" or k.endswith("flags"):
            continue
        if isinstance(v, bool):
            found[k] = "true" if v else "false"
        elif isinstance(v, (str, int, float)):
            found[k] = str(v)
        elif isinstance(v, list) and v and all(isinstance(x, (str, int, float, bool)) for x in v):
            found[k] = ",".join(str(x) for x in v)
    return found


def _origin_references(origin: Mapping[str, str]) -> List[Dict[str, Any]]:
    """CycloneDX external references of a source archived from a git repository: the
    repository at its commit, and the archive with its sha256."""
    refs: List[Dict[str, Any]] = []
    if origin.get("repository"):
        ref = f" ({origin['ref']})" if origin.get("ref") and origin.get("ref") != origin.get("commit") else ""
        refs.append(
            {"type": "vcs", "url": origin["repository"], "comment": f"source: commit {origin.get('commit', '?')}{ref}"}
        )
    if origin.get("url"):
        ref_doc: Dict[str, Any] = {
            "type": "distribution",
            "url": origin["url"],
            "comment": f"source archive: {origin.get('archive') or 'as downloaded'}",
        }
        if origin.get("sha256"):
            ref_doc["hashes"] = [{"alg": "SHA-256", "content": origin["sha256"]}]
        refs.append(ref_doc)
    return refs


def make_sbom(
    plan: Plan,
    hashes: Iterable[str],
    *,
    layers: Optional[Mapping[str, Mapping[str, Any]]] = None,
    lock: Optional[SpackLock] = None,
    created: float = 0,
    image_name: Optional[str] = None,
    image_version: Optional[str] = None,
    properties: Optional[Mapping[str, str]] = None,
    roots: Optional[Iterable[str]] = None,
    origins: Optional[Mapping[str, Mapping[str, str]]] = None,
) -> Dict[str, Any]:
    """The CycloneDX document for the packages ``hashes`` of ``plan``.

    ``layers``: DAG hash -> {key, sha256, size} of the layer it came from; ``lock``: the
    SpackLock (adds architecture and variants); ``created``: seconds since 1970 (the
    image's build date); ``properties``: extra metadata properties (base id, ...);
    ``roots``: what the image was made for (default: the plan's roots); ``origins``: DAG
    hash -> where its source came from (:func:`dedal.model.git_sources.origin_record`:
    repository, ref, commit, url, sha256, archive)."""
    selected = [h for h in dict.fromkeys(hashes) if h in plan.nodes]
    chosen = set(selected)
    top = [h for h in (plan.roots if roots is None else roots) if h in chosen]
    layers = layers or {}
    components: List[Dict[str, Any]] = []
    for h in selected:
        node = plan.nodes[h]
        lnode = lock.nodes.get(h) if lock is not None and hasattr(lock, "nodes") else None
        arch = ""
        if lnode is not None and lnode.platform_os:
            platform = ""
            raw_arch = lnode.raw.get("arch") if isinstance(lnode.raw.get("arch"), dict) else {}
            platform = str(raw_arch.get("platform", "") or "")
            arch = "-".join(p for p in (platform, lnode.platform_os, lnode.target) if p)
        comp: Dict[str, Any] = {
            "type": "application" if h in top else "library",
            "bom-ref": h,
            "name": node.name,
            "version": node.version,
            "purl": purl(node.name, node.version, {"arch": arch, "hash": h, "namespace": node.namespace}),
            "scope": "required",
        }
        props = [{"name": "spack:dag_hash", "value": h}, {"name": "spack:namespace", "value": node.namespace}]
        if arch:
            props.append({"name": "spack:arch", "value": arch})
        if node.external:
            props.append({"name": "spack:external", "value": "true"})
            if node.external_path:
                props.append({"name": "spack:external_path", "value": node.external_path})
        layer = layers.get(h)
        if layer:
            if layer.get("sha256"):
                comp["hashes"] = [{"alg": "SHA-256", "content": layer["sha256"]}]
            props.append({"name": "dedal:layer_key", "value": str(layer.get("key", ""))})
            if layer.get("size"):
                props.append({"name": "dedal:layer_size", "value": str(layer["size"])})
        origin = (origins or {}).get(h)
        if origin:
            comp["externalReferences"] = _origin_references(origin)
            props += [{"name": f"dedal:source_{k}", "value": str(v)} for k, v in sorted(origin.items()) if v]
        if lnode is not None:
            for k, v in _variants(lnode.raw).items():
                props.append({"name": f"spack:variant:{k}", "value": v})
        comp["properties"] = props
        components.append(comp)
    components.sort(key=lambda c: (c["name"], c["version"], c["bom-ref"]))
    dependencies = []
    for h in sorted(selected):
        children = sorted(
            c for c, types in plan.nodes[h].deps.items() if c in chosen and set(types) & set(RUNTIME_TYPES)
        )
        dependencies.append({"ref": h, "dependsOn": children})
    meta_props = [
        {"name": "dedal:env", "value": plan.env_name},
        {"name": "dedal:lock_sha256", "value": plan.lock_sha256},
        {"name": "spack:version", "value": plan.spack_version},
        {"name": "spack:commit", "value": plan.spack_commit},
        {"name": "dedal:install_root", "value": plan.install_root},
        {"name": "dedal:view", "value": plan.view},
    ]
    for k, v in sorted((properties or {}).items()):
        meta_props.append({"name": k, "value": str(v)})
    doc: Dict[str, Any] = {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "timestamp": _iso(created),
            "tools": {"components": [{"type": "application", "name": "dedal", "version": __version__}]},
            "component": {
                "type": "container",
                "bom-ref": "image",
                "name": image_name or plan.env_name,
                "version": image_version or plan.tag,
            },
            "properties": [p for p in meta_props if p["value"]],
        },
        "components": components,
        "dependencies": [{"ref": "image", "dependsOn": sorted(top)}] + dependencies,
    }
    digest = hashlib.sha256(dumps(doc)).digest()
    doc["serialNumber"] = f"urn:uuid:{uuid.UUID(bytes=digest[:16], version=5)}"
    return doc


def dumps(doc: Mapping[str, Any]) -> bytes:
    """The document's bytes (stable: sorted keys, two-space indent, final newline)."""
    return json.dumps(doc, indent=2, sort_keys=True).encode("utf-8") + b"\n"
