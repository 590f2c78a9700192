"""What a registry holds: the images of a repository (``dedal images``) and everything
about one of them (``dedal inspect oras://...``).

Read-only: tags (the referrers-schema ``sha256-<hex>`` tags left out), manifests and
whether Apptainer would pull them as a SIF, attachments found through the referrers API
or the tag schema, and the verdict of the newest verification report attached.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Union

from dedal.adapters import registry as reg
from dedal.adapters.registry import Access, RegistryClient, RegistryError
from dedal.model import provenance as prov_mod
from dedal.model.oci import (
    ANN_ARCH,
    ANN_CREATED,
    ANN_TITLE,
    ANN_VERDICT,
    ARTIFACT_INTOTO,
    ARTIFACT_VERIFY,
    FALLBACK_TAG,
    Reference,
    check_sif_manifest,
    parse_reference,
    sif_problems,
)
from dedal.stages.publish.attachments import list_referrers, verdict_of


def _verify_verdict(
    client: RegistryClient, repository: str, referrers: List[Dict[str, Any]]
) -> Optional[Dict[str, Any]]:
    """The newest verification attachment: its digest, created time and verdict."""
    verify = [d for d in referrers if d.get("artifactType") == ARTIFACT_VERIFY]
    if not verify:
        return None
    verify.sort(key=lambda d: (d.get("annotations") or {}).get(ANN_CREATED, ""))
    newest = verify[-1]
    ann = newest.get("annotations") or {}
    verdict = ann.get(ANN_VERDICT)
    if not verdict:
        try:
            art = client.get_manifest_raw(repository, newest["digest"]).json()
            ann = art.get("annotations") or ann
            verdict = ann.get(ANN_VERDICT)
            if not verdict:
                for layer in art.get("layers") or []:
                    if layer.get("mediaType") == ARTIFACT_VERIFY:
                        verdict = verdict_of(json.loads(client.get_blob_bytes(repository, layer["digest"])))
                        break
        except (RegistryError, ValueError, KeyError):
            verdict = None
    return {"digest": newest.get("digest"), "created": ann.get(ANN_CREATED), "verdict": verdict or "unknown"}


def _provenance(client: RegistryClient, repository: str, attachments: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The newest provenance statement attached (:mod:`dedal.model.provenance`): the
    inputs it records, flat; None where there is none or it cannot be read."""
    found = [a for a in attachments if a.get("artifactType") == ARTIFACT_INTOTO and a.get("files")]
    found.sort(key=lambda a: (a.get("annotations") or {}).get(ANN_CREATED, ""))
    for entry in reversed(found):
        blob = next((f for f in entry["files"] if f.get("mediaType") == ARTIFACT_INTOTO), None)
        if blob is None:
            continue
        try:
            data = json.loads(client.get_blob_bytes(repository, str(blob["digest"]), limit=1 << 20))
        except (RegistryError, ValueError, KeyError):
            continue
        summary = prov_mod.summary(data)
        if summary is not None:
            return dict(summary, digest=entry.get("digest"))
    return None


@dataclass
class ImageEntry:
    tag: str
    digest: str
    size: Optional[int]
    created: Optional[str]
    verdict: str
    sif: bool
    arch: Optional[str] = None
    title: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def list_images(
    repo_ref: Union[str, Reference],
    *,
    access: Access = Access(),
) -> List[ImageEntry]:
    """Every tag of a repository (referrers-schema tags left out) with the SIF size,
    the created annotation and the verdict of the newest verification attachment."""
    r = (
        repo_ref
        if isinstance(repo_ref, Reference)
        else parse_reference(repo_ref, require_scheme=False, repository_only=True)
    )
    client = access.client(r.host, r.repository)
    entries: List[ImageEntry] = []
    verdicts: Dict[str, Optional[Dict[str, Any]]] = {}
    for tag in sorted(client.tags(r.repository)):
        if FALLBACK_TAG.match(tag):
            continue
        try:
            m = client.get_manifest_raw(r.repository, tag)
        except reg.NotFound:
            continue  # deleted between the listing and now
        data = m.json()
        ann = data.get("annotations") or {}
        try:
            layer: Optional[Dict[str, Any]] = check_sif_manifest(data, tag)
        except RegistryError:
            layer = None
        if m.digest not in verdicts:
            _, refs = list_referrers(client, r.repository, m.digest)
            verdicts[m.digest] = _verify_verdict(client, r.repository, refs)
        v = verdicts[m.digest]
        entries.append(
            ImageEntry(
                tag=tag,
                digest=m.digest,
                size=layer["size"] if layer else None,
                created=ann.get(ANN_CREATED),
                verdict=v["verdict"] if v else "unverified",
                sif=layer is not None,
                arch=ann.get(ANN_ARCH),
                title=(layer.get("annotations") or {}).get(ANN_TITLE) if layer else None,
            )
        )
    return entries


def inspect_remote(ref: Union[str, Reference], *, access: Access = Access()) -> Dict[str, Any]:
    """What the registry holds for ``ref``: the manifest (digest, media types, layers,
    annotations), whether Apptainer would pull it as a SIF, and its attachments."""
    r = ref if isinstance(ref, Reference) else parse_reference(ref)
    if not r.tag and not r.digest:
        r = r.with_tag("latest")
    client = access.client(r.host, r.repository)
    m = client.get_manifest_raw(r.repository, r.ref)
    data = m.json()
    problems = sif_problems(data) if "layers" in data else ["an image index, not a SIF image manifest"]
    mode, refs = list_referrers(client, r.repository, m.digest)
    attachments = []
    for d in refs:
        entry: Dict[str, Any] = {
            "artifactType": d.get("artifactType"),
            "digest": d.get("digest"),
            "size": d.get("size"),
            "annotations": d.get("annotations") or {},
        }
        try:
            art = client.get_manifest_raw(r.repository, d["digest"]).json()
            entry["files"] = [
                {
                    "title": (layer.get("annotations") or {}).get(ANN_TITLE),
                    "mediaType": layer.get("mediaType"),
                    "digest": layer.get("digest"),
                    "size": layer.get("size"),
                }
                for layer in art.get("layers") or []
            ]
            entry["annotations"] = art.get("annotations") or entry["annotations"]
            entry["artifactType"] = art.get("artifactType") or entry["artifactType"]
        except (RegistryError, KeyError) as exc:
            entry["error"] = str(exc)
        attachments.append(entry)
    verdict = _verify_verdict(client, r.repository, refs)
    provenance = _provenance(client, r.repository, attachments)
    sif_layer = None
    if not problems or all(p.startswith("legacy") for p in problems):
        layer = data["layers"][0]
        sif_layer = {
            "title": (layer.get("annotations") or {}).get(ANN_TITLE),
            "digest": layer["digest"],
            "size": layer["size"],
            "mediaType": layer["mediaType"],
        }
    return {
        "reference": str(r),
        "digest": m.digest,
        "mediaType": m.media_type,
        "manifest_size": len(m.raw),
        "config": data.get("config"),
        "layers": data.get("layers"),
        "annotations": data.get("annotations") or {},
        "sif": sif_layer,
        "apptainer_pullable": sif_layer is not None,
        "problems": problems,
        "referrers": mode,
        "attachments": attachments,
        "verdict": verdict["verdict"] if verdict else "unverified",
        "provenance": provenance,
    }
