"""Publish SIF images to OCI registries, and pull, list and inspect them, the way
``apptainer push|pull oras://`` does (../shared/notes/prior-art.md section D1):

* an OCI image manifest; config ``application/vnd.sylabs.sif.config.v1+json`` with the
  content ``{}`` (size 2, sha256:44136fa3...); exactly one layer
  ``application/vnd.sylabs.sif.layer.v1.sif`` whose digest is the SIF's sha256, with
  the annotation ``org.opencontainers.image.title`` = the file name; manifest
  annotations ``org.opencontainers.image.created`` (from the SIF's creation time),
  description, source, and dedal's provenance (environment, lock hash, Spack commit);
* pulls accept that layer type and the legacy ``appliciation/vnd.sylabs.sif.layer.tar``
  (sic), refuse any other layer count or type, check size and sha256, that the file is
  a SIF for the host's architecture, and only then rename it into place;
* the verification report and SBOMs are attached as OCI 1.1 artifacts whose
  ``subject`` is the image manifest; where the registry has no referrers API (the
  ``OCI-Subject`` header is missing from the answer) dedal maintains the
  ``sha256-<hex>`` tag (the referrers tag schema) that ``oras discover`` reads too.

All registry traffic goes through ``dedal.adapters.registry``.
"""
from __future__ import annotations

import json
import mimetypes
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from dedal.model import sif as sifmod
from dedal.adapters import registry as reg
from dedal.adapters.registry import Credentials, RegistryClient, RegistryError, make_client
from dedal.errors import UserError
from dedal.model.oci import (
    ANN_ARCH,
    ANN_CREATED,
    ANN_DESCRIPTION,
    ANN_ENVIRONMENT,
    ANN_LOCK_HASH,
    ANN_REVISION,
    ANN_SOURCE,
    ANN_SPACK_COMMIT,
    ANN_TITLE,
    ANN_VERDICT,
    ARTIFACT_CYCLONEDX,
    ARTIFACT_FILE,
    ARTIFACT_SPDX,
    ARTIFACT_VERIFY,
    DOCKER_MANIFEST_LIST,
    EMPTY_JSON,
    EMPTY_JSON_DIGEST,
    FALLBACK_TAG,
    OCI_INDEX,
    OCI_MANIFEST,
    SIF_CONFIG_MEDIA_TYPE,
    SIF_LAYER_MEDIA_TYPE,
    SIF_LAYER_MEDIA_TYPE_PROTO,
    Manifest,
    Reference,
    artifact_manifest,
    canonical_json,
    check_sif_manifest,
    fallback_tag,
    is_remote,
    parse_reference,
    rfc3339,
    sha256_digest,
    sif_manifest,
    sif_problems,
    valid_tag,
)

Progress = Optional[Callable[[str], None]]


# --------------------------------------------------------------------------- helpers


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


_LABEL_SUFFIXES = {
    "environment": ("environment", "env_name", "env"),
    "lock_hash": ("lock_hash", "lock_sha256", "lockhash"),
    "spack_commit": ("spack_commit", "spack_ref", "spack_revision"),
    "source": ("image_source",),
    "description": ("image_description",),
}


def provenance_from_labels(labels: Dict[str, Any]) -> Dict[str, str]:
    """Pick environment, lock hash, Spack commit, source and description out of SIF labels
    whatever their prefix (``org.dedal.lock-hash``, ``dedal.lock_hash``, ...)."""
    found: Dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or str(value) == "":
            continue
        norm = _norm_key(str(key))
        for name, suffixes in _LABEL_SUFFIXES.items():
            if name not in found and any(norm == s or norm.endswith("_" + s) for s in suffixes):
                found[name] = str(value)
    return found


def sif_labels(path: Path, info: sifmod.SifInfo) -> Dict[str, Any]:
    """The JSON.Labels object of a SIF (empty when it has none or it is not an object)."""
    for d in info.by_type(sifmod.DATA_LABELS):
        try:
            data = sifmod.read_json_object(path, d)
        except UserError:
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def verdict_of(report: Any) -> str:
    """The verdict of a verify.json: ``verdict`` (string), else ``passed``/``ok`` (bool),
    else ``status``; "unknown" when there is none."""
    if not isinstance(report, dict):
        return "unknown"
    for key in ("verdict", "result", "status"):
        value = report.get(key)
        if isinstance(value, str) and value:
            return value.lower()
        if isinstance(value, dict) and isinstance(value.get("verdict"), str):
            return value["verdict"].lower()
    for key in ("passed", "ok", "pass"):
        if isinstance(report.get(key), bool):
            return "pass" if report[key] else "fail"
    return "unknown"


# --------------------------------------------------------------------------- attachments


@dataclass
class AttachmentFile:
    path: Path
    title: str
    media_type: str


@dataclass
class AttachmentGroup:
    artifact_type: str
    files: List[AttachmentFile] = field(default_factory=list)
    annotations: Dict[str, str] = field(default_factory=dict)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def classify_attachment(path: Path) -> Tuple[str, str]:
    """(group artifact type, layer media type) of one attached file."""
    name = path.name.lower()
    if name == "verify.json" or name.endswith(".verify.json"):
        return ARTIFACT_VERIFY, ARTIFACT_VERIFY
    if name.endswith(".json"):
        data = _read_json(path) if path.stat().st_size < (64 << 20) else None
        if name.endswith(".cdx.json") or (isinstance(data, dict) and data.get("bomFormat") == "CycloneDX"):
            return ARTIFACT_CYCLONEDX, ARTIFACT_CYCLONEDX
        if name.endswith(".spdx.json") or (isinstance(data, dict) and "spdxVersion" in data):
            return ARTIFACT_SPDX, ARTIFACT_SPDX
    if name.endswith(".md"):
        return ARTIFACT_VERIFY, "text/markdown"
    if name.endswith((".png", ".svg")):
        return ARTIFACT_VERIFY, mimetypes.guess_type(name)[0] or "application/octet-stream"
    return ARTIFACT_FILE, mimetypes.guess_type(name)[0] or "application/octet-stream"


def group_attachments(paths: Iterable[Union[str, os.PathLike]]) -> List[AttachmentGroup]:
    """Files (directories are expanded) grouped into artifacts: one verification report
    (verify.json, report.md, plots), one per SBOM, one per other file."""
    files: List[Tuple[Path, str]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith("."))
            if not found:
                raise UserError(f"--attach {p}: the directory holds no files")
            files += [(q, q.relative_to(p).as_posix()) for q in found]
        elif p.is_file():
            files.append((p, p.name))
        else:
            raise UserError(f"--attach {p}: no such file or directory")
    groups: Dict[str, AttachmentGroup] = {}
    for path, title in files:
        artifact_type, media_type = classify_attachment(path)
        key = artifact_type if artifact_type == ARTIFACT_VERIFY else f"{artifact_type}:{title}"
        group = groups.setdefault(key, AttachmentGroup(artifact_type))
        if any(f.title == title for f in group.files):
            raise UserError(f"--attach: two files named {title!r} in one attachment")
        group.files.append(AttachmentFile(path, title, media_type))
    result = list(groups.values())
    for group in result:
        newest = max(f.path.stat().st_mtime for f in group.files)
        group.annotations[ANN_CREATED] = rfc3339(newest)
        if group.artifact_type == ARTIFACT_VERIFY:
            report = next((f for f in group.files if f.media_type == ARTIFACT_VERIFY), None)
            if report is not None:
                data = _read_json(report.path)
                if data is None:
                    raise UserError(f"--attach {report.path}: not valid JSON")
                group.annotations[ANN_VERDICT] = verdict_of(data)
    return result


@dataclass
class Attachment:
    artifact_type: str
    digest: str
    size: int
    files: List[str]
    annotations: Dict[str, str]

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def _push_attachment(client: RegistryClient, repository: str, subject: Dict[str, Any],
                     group: AttachmentGroup, progress: Progress, uploaded: List[str], skipped: List[str]
                     ) -> Tuple[Attachment, bool]:
    """Push one artifact manifest referring to ``subject``; returns it and whether the
    registry indexed it itself (``OCI-Subject`` header)."""
    layers = []
    for f in group.files:
        digest, size = reg.file_digest(f.path)
        sent = client.push_blob(repository, f.path, digest, size, progress)
        (uploaded if sent else skipped).append(digest)
        layers.append({"mediaType": f.media_type, "digest": digest, "size": size,
                       "annotations": {ANN_TITLE: f.title}})
    _, _, sent = client.push_bytes(repository, EMPTY_JSON, None)
    (uploaded if sent else skipped).append(EMPTY_JSON_DIGEST)
    manifest = artifact_manifest(artifact_type=group.artifact_type, layers=layers, subject=subject,
                                 annotations=group.annotations)
    raw = canonical_json(manifest)
    digest = sha256_digest(raw)
    response = client.put_manifest(repository, digest, raw, OCI_MANIFEST)
    indexed = bool(response.headers.get("OCI-Subject"))
    return Attachment(group.artifact_type, digest, len(raw), [f.title for f in group.files],
                      dict(group.annotations)), indexed


def _add_to_fallback_index(client: RegistryClient, repository: str, subject_digest: str,
                           attachments: Sequence[Attachment]) -> None:
    """Referrers tag schema: the index tagged ``sha256-<hex>`` lists the referrers."""
    tag = fallback_tag(subject_digest)
    try:
        index = client.get_manifest_raw(repository, tag, (OCI_INDEX,)).json()
    except reg.NotFound:
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    manifests = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    known = {m.get("digest") for m in manifests}
    added = False
    for a in attachments:
        if a.digest in known:
            continue
        manifests.append({"mediaType": OCI_MANIFEST, "digest": a.digest, "size": a.size,
                          "artifactType": a.artifact_type, "annotations": dict(a.annotations)})
        added = True
    if added:
        index["manifests"] = manifests
        index.setdefault("schemaVersion", 2)
        index["mediaType"] = OCI_INDEX
        client.put_manifest(repository, tag, canonical_json(index), OCI_INDEX)


def list_referrers(client: RegistryClient, repository: str, digest: str) -> Tuple[str, List[Dict[str, Any]]]:
    """("api" | "tag-schema", descriptors of the manifests that refer to ``digest``)."""
    found = client.referrers(repository, digest)
    if found is not None:
        return "api", found
    try:
        index = client.get_manifest_raw(repository, fallback_tag(digest), (OCI_INDEX,)).json()
    except reg.NotFound:
        return "tag-schema", []
    return "tag-schema", [m for m in index.get("manifests") or [] if isinstance(m, dict)]


# --------------------------------------------------------------------------- publish


@dataclass
class PublishResult:
    references: List[str]
    digest: str  # of the image manifest
    manifest_size: int
    sif: str
    sif_digest: str
    sif_size: int
    arch: str
    created: str
    annotations: Dict[str, str]
    blobs_uploaded: List[str] = field(default_factory=list)
    blobs_skipped: List[str] = field(default_factory=list)
    attachments: List[Attachment] = field(default_factory=list)
    referrers: str = "none"  # "api", "tag-schema", or "none" (nothing attached)
    retries: int = 0

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["attachments"] = [a.to_json() for a in self.attachments]
        return data


def publish(
    sif: Union[str, os.PathLike],
    refs: Sequence[Union[str, Reference]],
    *,
    description: Optional[str] = None,
    source: Optional[str] = None,
    environment: Optional[str] = None,
    lock_hash: Optional[str] = None,
    spack_commit: Optional[str] = None,
    created: Optional[float] = None,
    annotations: Optional[Dict[str, str]] = None,
    attachments: Sequence[Union[str, os.PathLike]] = (),
    insecure: bool = False,
    creds: Optional[Credentials] = None,
    username: Optional[str] = None,
    password: Optional[str] = None,
    progress: Progress = None,
    client_options: Optional[Dict[str, Any]] = None,
) -> PublishResult:
    """Push ``sif`` under every reference in ``refs`` (a reference without a tag gets the
    SIF's file stem), then the attachments. Blobs the registry has are not sent again.

    Provenance not given explicitly is read from the SIF's JSON.Labels object.
    """
    path = Path(sif)
    info = sifmod.read_sif(path)  # UserError when missing / not a SIF
    sifmod.primary_partition(info)
    if not refs:
        raise UserError("no registry reference given (oras://HOST[:PORT]/REPO:TAG, or set `registry`)")
    stem = path.name[:-4] if path.name.endswith(".sif") else path.stem
    parsed: List[Reference] = []
    for r in refs:
        ref = r if isinstance(r, Reference) else parse_reference(r, allow_digest=False)
        if ref.digest:
            raise UserError(f"{ref}: publish needs a tag, not a digest")
        if not ref.tag:
            if not valid_tag(stem):
                raise UserError(f"{ref}: no tag given and the file name {path.name!r} is not a valid tag")
            ref = ref.with_tag(stem)
        parsed.append(ref)
    groups = group_attachments(attachments)  # validate before any network traffic

    labels = sif_labels(path, info)
    prov = provenance_from_labels(labels)
    environment = environment or prov.get("environment")
    lock_hash = lock_hash or prov.get("lock_hash")
    spack_commit = spack_commit or prov.get("spack_commit")
    description = description or prov.get("description")
    if not source:
        source = prov.get("source")
    if not source and environment:
        source = environment + (f" spack@{spack_commit}" if spack_commit else "")
    if created is None:
        created = float(info.created) if info.created > 0 else path.stat().st_mtime
    ann: Dict[str, str] = {ANN_CREATED: rfc3339(created)}
    for key, value in ((ANN_DESCRIPTION, description), (ANN_SOURCE, source), (ANN_ENVIRONMENT, environment),
                       (ANN_LOCK_HASH, lock_hash), (ANN_SPACK_COMMIT, spack_commit), (ANN_REVISION, spack_commit),
                       (ANN_ARCH, info.primary_arch)):
        if value:
            ann[key] = str(value)
    ann.update(annotations or {})

    if progress:
        progress(f"hashing {path} ({reg.human_size(info.file_size)})")
    sif_digest, sif_size = reg.file_digest(path)
    manifest = sif_manifest(sif_digest=sif_digest, sif_size=sif_size, title=path.name, annotations=ann)
    raw = canonical_json(manifest)
    digest = sha256_digest(raw)
    result = PublishResult(references=[str(r) for r in parsed], digest=digest, manifest_size=len(raw),
                           sif=str(path), sif_digest=sif_digest, sif_size=sif_size, arch=info.primary_arch,
                           created=ann[ANN_CREATED], annotations=ann)
    subject = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw)}

    clients: Dict[str, RegistryClient] = {}
    by_repo: Dict[Tuple[str, str], List[Reference]] = {}
    for ref in parsed:
        by_repo.setdefault((ref.host, ref.repository), []).append(ref)
    modes = set()
    for (host, repository), repo_refs in by_repo.items():
        client = clients.get(host)
        if client is None:
            client = make_client(host, insecure=insecure, creds=creds, repository=repository, username=username,
                                 password=password, **(client_options or {}))
            clients[host] = client
        _, _, sent = client.push_bytes(repository, EMPTY_JSON, None)
        (result.blobs_uploaded if sent else result.blobs_skipped).append(EMPTY_JSON_DIGEST)
        sent = client.push_blob(repository, path, sif_digest, sif_size, progress)
        (result.blobs_uploaded if sent else result.blobs_skipped).append(sif_digest)
        for ref in repo_refs:
            client.put_manifest(repository, ref.tag or "latest", raw, OCI_MANIFEST)
            if progress:
                progress(f"tagged {ref} -> {digest}")
        if groups:
            pushed: List[Attachment] = []
            indexed_all = True
            for group in groups:
                att, indexed = _push_attachment(client, repository, subject, group, progress,
                                                result.blobs_uploaded, result.blobs_skipped)
                indexed_all = indexed_all and indexed
                pushed.append(att)
                if progress:
                    progress(f"attached {', '.join(att.files)} ({att.artifact_type}) -> {att.digest}")
            if not indexed_all:
                _add_to_fallback_index(client, repository, digest, pushed)
            modes.add("api" if indexed_all else "tag-schema")
            if not result.attachments:
                result.attachments = pushed
    result.referrers = "/".join(sorted(modes)) if modes else "none"
    result.blobs_uploaded = list(dict.fromkeys(result.blobs_uploaded))
    result.blobs_skipped = [d for d in dict.fromkeys(result.blobs_skipped) if d not in result.blobs_uploaded]
    result.retries = sum(c.stats["retries"] for c in clients.values())
    return result


# --------------------------------------------------------------------------- pull


class IntegrityError(RegistryError):
    """What the registry sent is not what its manifest promises (size, digest, SIF)."""


@dataclass
class PullResult:
    reference: str
    path: str
    digest: str  # image manifest
    sif_digest: str
    size: int
    arch: str
    layer_media_type: str
    created: Optional[str] = None
    title: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def _resolve_image(client: RegistryClient, ref: Reference, arch: str) -> Manifest:
    """The image manifest for ``ref``; an image index is resolved by architecture."""
    m = client.get_manifest_raw(ref.repository, ref.ref)
    data = m.json()
    media_type = m.media_type or data.get("mediaType") or ""
    if media_type in (OCI_INDEX, DOCKER_MANIFEST_LIST) or ("manifests" in data and "layers" not in data):
        for entry in data.get("manifests") or []:
            platform = (entry.get("platform") or {}) if isinstance(entry, dict) else {}
            if platform.get("architecture") == arch and platform.get("os", "linux") == "linux":
                return client.get_manifest_raw(ref.repository, entry["digest"])
        raise RegistryError(f"{ref}: the image index has no manifest for linux/{arch}")
    return m


def default_pull_name(ref: Reference) -> str:
    """``<repository basename>_<tag>.sif``, like ``apptainer pull``."""
    name = ref.repository.rsplit("/", 1)[-1]
    return f"{name}_{ref.tag or (ref.digest or 'latest').replace(':', '-')[:19]}.sif"


def pull(
    ref: Union[str, Reference],
    out: Optional[Union[str, os.PathLike]] = None,
    *,
    insecure: bool = False,
    creds: Optional[Credentials] = None,
    username: Optional[str] = None,
    password: Optional[str] = None,
    arch: Optional[str] = None,
    force: bool = False,
    progress: Progress = None,
    client_options: Optional[Dict[str, Any]] = None,
) -> PullResult:
    """Download the SIF of ``ref`` to ``out`` (default ``<name>_<tag>.sif``; a directory
    gets the layer's title). The bytes go to a temporary file next to ``out`` and are
    renamed only after size, sha256, SIF header and architecture checks pass; nothing is
    left behind otherwise."""
    r = ref if isinstance(ref, Reference) else parse_reference(ref)
    if not r.tag and not r.digest:
        r = r.with_tag("latest")
    want_arch = arch or sifmod.host_arch()
    client = make_client(r.host, insecure=insecure, creds=creds, repository=r.repository, username=username,
                         password=password, **(client_options or {}))
    manifest = _resolve_image(client, r, want_arch)
    data = manifest.json()
    layer = check_sif_manifest(data, str(r))
    title = (layer.get("annotations") or {}).get(ANN_TITLE)
    target = Path(out) if out is not None else Path(default_pull_name(r))
    if target.is_dir():
        name = Path(title or default_pull_name(r)).name
        if not name or name in (".", ".."):
            name = default_pull_name(r)
        target = target / name
    if target.exists() and not force:
        raise UserError(f"{target}: already exists (pass --force to replace it)")
    if not target.parent.is_dir():
        raise UserError(f"{target.parent}: no such directory")
    expected_digest, expected_size = layer["digest"], layer["size"]
    if progress:
        progress(f"downloading {r} ({reg.human_size(expected_size)}) to {target}")
    tmp = target.parent / f".{target.name}.part-{os.getpid()}"
    try:
        _download(client, r.repository, expected_digest, expected_size, tmp, str(r))
        try:
            info = sifmod.read_sif(tmp)
            sifmod.primary_partition(info)
        except UserError as exc:
            msg = str(exc).replace(str(tmp), title or "the download")
            raise IntegrityError(f"{r}: the downloaded file is not a usable SIF image ({msg})") from None
        if info.primary_arch != want_arch:
            raise UserError(f"{r}: the image is for {info.primary_arch}, this host is {want_arch} "
                            f"(pass --arch {info.primary_arch} to download it anyway)")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
    ann = data.get("annotations") or {}
    return PullResult(reference=str(r), path=str(target), digest=manifest.digest, sif_digest=expected_digest,
                      size=expected_size, arch=info.primary_arch, layer_media_type=layer["mediaType"],
                      created=ann.get(ANN_CREATED), title=title)


def _download(client: RegistryClient, repository: str, digest: str, size: int, tmp: Path, what: str) -> None:
    """Stream a blob into ``tmp`` checking length and sha256; broken transfers restart."""
    import hashlib

    attempt = 0
    while True:
        h = hashlib.sha256()
        got = 0
        try:
            with client.get_blob_stream(repository, digest) as response, open(tmp, "wb") as fh:
                for chunk in response.iter_content(reg.CHUNK):
                    got += len(chunk)
                    if got > size:
                        raise IntegrityError(f"{what}: the registry sent more than the {size} bytes the "
                                             "manifest states; refusing the download")
                    h.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            break
        except reg.TRANSIENT_ERRORS as exc:
            attempt += 1
            if attempt > client.retries:
                raise RegistryError(f"{what}: download of {digest} broke off after {attempt} attempt(s) "
                                    f"({reg.short_reason(exc)})") from None
            client.wait_before_retry(attempt, f"download of {digest[:19]} broke off ({reg.short_reason(exc)})")
    if got != size:
        raise IntegrityError(f"{what}: size mismatch: the manifest states {size} bytes, the registry sent {got}; "
                             "refusing the download")
    actual = "sha256:" + h.hexdigest()
    if actual != digest:
        raise IntegrityError(f"{what}: sha256 mismatch: the manifest states {digest}, the downloaded bytes "
                             f"are {actual}; refusing the download")


# --------------------------------------------------------------------------- list / inspect


def _verify_verdict(client: RegistryClient, repository: str, referrers: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
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
    insecure: bool = False,
    creds: Optional[Credentials] = None,
    username: Optional[str] = None,
    password: Optional[str] = None,
    client_options: Optional[Dict[str, Any]] = None,
) -> List[ImageEntry]:
    """Every tag of a repository (referrers-schema tags left out) with the SIF size,
    the created annotation and the verdict of the newest verification attachment."""
    r = repo_ref if isinstance(repo_ref, Reference) else parse_reference(repo_ref, require_scheme=False,
                                                                         repository_only=True)
    client = make_client(r.host, insecure=insecure, creds=creds, repository=r.repository, username=username,
                         password=password, **(client_options or {}))
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
        entries.append(ImageEntry(
            tag=tag, digest=m.digest, size=layer["size"] if layer else None, created=ann.get(ANN_CREATED),
            verdict=v["verdict"] if v else "unverified", sif=layer is not None, arch=ann.get(ANN_ARCH),
            title=(layer.get("annotations") or {}).get(ANN_TITLE) if layer else None,
        ))
    return entries


def inspect_remote(
    ref: Union[str, Reference],
    settings: Any = None,
    *,
    insecure: Optional[bool] = None,
    creds: Optional[Credentials] = None,
    username: Optional[str] = None,
    password: Optional[str] = None,
    client_options: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """What the registry holds for ``ref``: the manifest (digest, media types, layers,
    annotations), whether Apptainer would pull it as a SIF, and its attachments.

    ``settings`` (a dedal.model.config.Settings) supplies ``registry_insecure`` when
    ``insecure`` is not given."""
    if insecure is None:
        insecure = bool(getattr(settings, "registry_insecure", False)) if settings is not None else False
    r = ref if isinstance(ref, Reference) else parse_reference(ref)
    if not r.tag and not r.digest:
        r = r.with_tag("latest")
    client = make_client(r.host, insecure=insecure, creds=creds, repository=r.repository, username=username,
                         password=password, **(client_options or {}))
    m = client.get_manifest_raw(r.repository, r.ref)
    data = m.json()
    problems = sif_problems(data) if "layers" in data else ["an image index, not a SIF image manifest"]
    mode, refs = list_referrers(client, r.repository, m.digest)
    attachments = []
    for d in refs:
        entry: Dict[str, Any] = {"artifactType": d.get("artifactType"), "digest": d.get("digest"),
                                 "size": d.get("size"), "annotations": d.get("annotations") or {}}
        try:
            art = client.get_manifest_raw(r.repository, d["digest"]).json()
            entry["files"] = [{"title": (layer.get("annotations") or {}).get(ANN_TITLE), "mediaType": layer.get("mediaType"),
                               "digest": layer.get("digest"), "size": layer.get("size")}
                              for layer in art.get("layers") or []]
            entry["annotations"] = art.get("annotations") or entry["annotations"]
            entry["artifactType"] = art.get("artifactType") or entry["artifactType"]
        except (RegistryError, KeyError) as exc:
            entry["error"] = str(exc)
        attachments.append(entry)
    verdict = _verify_verdict(client, r.repository, refs)
    sif_layer = None
    if not problems or all(p.startswith("legacy") for p in problems):
        layer = data["layers"][0]
        sif_layer = {"title": (layer.get("annotations") or {}).get(ANN_TITLE), "digest": layer["digest"],
                     "size": layer["size"], "mediaType": layer["mediaType"]}
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
    }


__all__ = [
    "Reference", "parse_reference", "publish", "PublishResult", "pull", "PullResult", "list_images",
    "ImageEntry", "inspect_remote", "is_remote", "Attachment", "group_attachments", "verdict_of",
    "IntegrityError", "SIF_CONFIG_MEDIA_TYPE", "SIF_LAYER_MEDIA_TYPE", "SIF_LAYER_MEDIA_TYPE_PROTO",
    "EMPTY_JSON_DIGEST",
]
